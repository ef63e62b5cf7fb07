"""The node's NVIDIA GPUs as NVML reports them, through NVIDIA's own bindings (``nvidia-ml-py``).

The bindings are imported only when this source starts (:func:`load`): the operator image and the tests
run without them, and a node agent started without them says what to install. ``nvml`` is the binding
module, or anything with the same functions, constants and exception classes (the tests' fake NVML,
fed from recorded server topologies, is such a thing); nothing here knows the difference.

Per GPU: UUID (the device ID published, NVIDIA_VISIBLE_DEVICES accepts it), total memory, PCI bus ID,
NUMA node, MIG mode (a GPU in MIG mode cannot be handed out whole, so it is left out, as the device
plugin's mixed strategy leaves it out of ``nvidia.com/gpu``). Between every pair: the link
``nvidia-smi topo -m`` prints: ``NV#`` when NVLinks join them (directly, or both through NVSwitches: then
the fewer of their switch links, as nvidia-smi shows NV12 on a DGX A100), else the PCIe relation from
``nvmlDeviceGetTopologyCommonAncestor``. Links are read once per set of GPUs (they do not change while
the driver runs); a GPU whose calls fail with "GPU is lost", or that disappeared, is reported unhealthy
and stays listed, so the group holding it learns of it (CONTRACT §9).
"""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any, cast

from deviceshare import errors
from deviceshare.api import names
from deviceshare.nodeagent import readings

logger = logging.getLogger("deviceshare.nodeagent.nvml")

# NVML's nvmlGpuTopologyLevel_t -> the words of `nvidia-smi topo -m`.
LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class NvmlUnavailable(errors.ConfigError):
    """NVML cannot be used on this node: the bindings, the library or the driver is missing."""


def load() -> types.ModuleType:
    """NVIDIA's bindings (``import pynvml`` from the ``nvidia-ml-py`` package), or a clear error."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(
            "the NVML bindings are not installed: install deviceshare with the node-agent extra "
            "(pip install 'deviceshare[nodeagent]', which brings nvidia-ml-py), or read a file with --source file"
        ) from e
    return cast(types.ModuleType, pynvml)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Reads the GPUs of one node; :meth:`read` blocks on NVML (call it from a worker thread)."""

    def __init__(self, nvml: Any, resource: str = names.NVIDIA_GPU_RESOURCE) -> None:
        self.nvml = nvml
        self.resource = resource
        self._seen: list[str] = []  # every GPU UUID seen since start, in first-seen (NVML index) order
        self._links_for: tuple[str, ...] = ()
        self._links: dict[tuple[str, str], str] = {}
        self._numa: dict[str, int] = {}

    def start(self) -> None:
        """``nvmlInit``, with a message that says what is missing when it fails."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(self._why(e)) from e
        logger.info("NVML ready (driver %s)", _text(nvml.nvmlSystemGetDriverVersion()))

    def _why(self, e: Exception) -> str:
        nvml = self.nvml
        value = getattr(e, "value", None)
        if value == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return ("NVML library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed on this node, and "
                    "does the agent's container run with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=all, "
                    "NVIDIA_DRIVER_CAPABILITIES=utility)? Or read a file with --source file")
        if value == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return "the NVIDIA kernel driver is not loaded on this node (nvidia-smi says the same): NVML cannot start"
        return f"NVML failed to start: {e}"

    def stop(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as e:
            logger.warning("nvmlShutdown: %s", e)

    def read(self) -> readings.NodeReading:
        """The GPUs now: IDs in NVML index order (lost ones kept, unhealthy), memory, links, NUMA nodes."""
        nvml = self.nvml
        handles: list[Any] = []
        uuids: list[str] = []
        bus_ids: list[str] = []
        lost: set[str] = set()
        memory: list[int] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                if self._mig_enabled(handle):
                    logger.debug("GPU %s is in MIG mode: not offered whole as %s", uuid, self.resource)
                    continue
                memory.append(int(nvml.nvmlDeviceGetMemoryInfo(handle).total))
                bus_ids.append(_text(nvml.nvmlDeviceGetPciInfo(handle).busId).upper())
            except nvml.NVMLError as e:
                known = self._seen[index] if index < len(self._seen) else None
                logger.warning("GPU %d (%s) does not answer NVML: %s; reported unhealthy", index, known or "?", e)
                if known is not None:
                    lost.add(known)
                continue
            handles.append(handle)
            uuids.append(uuid)
        for uuid in uuids:
            if uuid not in self._seen:
                self._seen.append(uuid)
        lost |= set(self._seen) - set(uuids)  # fell off the bus since we first saw it
        if tuple(uuids) != self._links_for:
            self._read_links(handles, uuids, bus_ids)
        gpus = readings.ResourceReading(
            devices=tuple(self._seen),
            memory_bytes=min(memory) if memory else None,
            links=dict(self._links),
            numa=dict(self._numa),
            unhealthy=frozenset(lost),
        )
        return readings.NodeReading({self.resource: gpus})

    def _mig_enabled(self, handle: Any) -> bool:
        nvml = self.nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:  # NotSupported: not a MIG-capable GPU
            return False
        return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)

    def _read_links(self, handles: list[Any], uuids: list[str], bus_ids: list[str]) -> None:
        nvml = self.nvml
        by_bus = {bus: i for i, bus in enumerate(bus_ids)}
        direct: dict[tuple[int, int], int] = {}
        to_switch = [0] * len(handles)
        for i, handle in enumerate(handles):
            for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
                peer = self._nvlink_peer(handle, link, by_bus)
                if peer is None:
                    break
                if peer == "switch":
                    to_switch[i] += 1
                elif isinstance(peer, int):
                    direct[(i, peer)] = direct.get((i, peer), 0) + 1
        links: dict[tuple[str, str], str] = {}
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                count = max(direct.get((i, j), 0), direct.get((j, i), 0))
                if not count and to_switch[i] and to_switch[j]:
                    count = min(to_switch[i], to_switch[j])
                if count:
                    links[(uuids[i], uuids[j])] = f"NV{count}"
                    continue
                try:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                except nvml.NVMLError as e:
                    logger.warning("no PCIe topology between %s and %s: %s", uuids[i], uuids[j], e)
                    continue
                links[(uuids[i], uuids[j])] = LEVELS.get(level, "SYS")
        self._links = links
        self._numa = {u: self._numa_node(h, bus) for u, h, bus in zip(uuids, handles, bus_ids, strict=True)}
        self._links_for = tuple(uuids)

    def _nvlink_peer(self, handle: Any, link: int, by_bus: dict[str, int]) -> int | str | None:
        """The GPU index (or "switch") an active NVLink leads to; "" for an inactive link; None: no more links."""
        nvml = self.nvml
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                return ""
        except nvml.NVMLError:  # NotSupported (no NVLink) or InvalidArgument (past the GPU's last link)
            return None
        try:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except (nvml.NVMLError, AttributeError):  # older drivers: assume a GPU at the other end
            kind = nvml.NVML_NVLINK_DEVICE_TYPE_GPU
        if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return "switch"
        try:
            remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).upper()
        except nvml.NVMLError:
            return ""
        return by_bus.get(remote, "")

    def _numa_node(self, handle: Any, bus_id: str) -> int:
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetNumaNodeId(handle))
        except (nvml.NVMLError, AttributeError):
            return sysfs_numa(bus_id)


def sysfs_numa(bus_id: str, root: Path = Path("/sys/bus/pci/devices")) -> int:
    """The NUMA node the kernel gives a PCI device (NVML's ``00000000:07:00.0`` is sysfs' ``0000:07:00.0``)."""
    domain, _, rest = bus_id.lower().partition(":")
    try:
        return int((root / f"{domain[-4:]}:{rest}" / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return -1

