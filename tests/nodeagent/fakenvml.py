"""A fake NVML: the subset of NVIDIA's ``pynvml`` (nvidia-ml-py) that the node agent calls, same names.

Constants and exception classes carry the real binding's names and values (a test checks them against
``pynvml`` itself), so the agent catches the same errors here as on a GPU node, and the real module can
replace an instance of :class:`FakeNvml` unchanged. The GPUs come from a recorded server
(:mod:`tests.nodeagent.servers`); tests drive what a real node does to NVML: an XID error
(:meth:`FakeNvml.xid`), a GPU lost from the bus (:meth:`FakeNvml.lose`), NVML absent (``library=False``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tests.nodeagent import servers

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_DEVICE_MIG_ENABLE = 1
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
nvmlEventTypeSingleBitEccError = 1
nvmlEventTypeDoubleBitEccError = 2
nvmlEventTypeXidCriticalError = 8

_LEVEL = {"PIX": NVML_TOPOLOGY_SINGLE, "PXB": NVML_TOPOLOGY_MULTIPLE, "PHB": NVML_TOPOLOGY_HOSTBRIDGE,
          "NODE": NVML_TOPOLOGY_NODE, "SYS": NVML_TOPOLOGY_SYSTEM}


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return f"{type(self).__name__.removeprefix('NVMLError_')} ({self.value})"


class NVMLError_Uninitialized(NVMLError):
    value = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    value = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_DriverNotLoaded(NVMLError):
    value = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_Timeout(NVMLError):
    value = NVML_ERROR_TIMEOUT


class NVMLError_LibraryNotFound(NVMLError):
    value = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    value = NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True)
class Handle:
    row: int  # the GPU's row in the server's matrix


class EventSet:
    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.queue: list[SimpleNamespace] = []
        self.registered: dict[int, int] = {}  # row -> event mask


_NAMES = {k: v for k, v in globals().items() if k.startswith(("NVML_", "nvmlEventType", "NVMLError"))}


class FakeNvml:
    """One node's NVML. Its attributes mirror the module's: ``FakeNvml(server).nvmlDeviceGetCount()``."""

    def __init__(self, server: servers.Server, *, library: bool = True, driver: bool = True) -> None:
        self.__dict__.update(_NAMES)
        self.server = server
        self.library, self.driver = library, driver
        self.initialized = False
        self.order = list(server.order or range(server.gpus))  # NVML index -> row
        self.lost: set[int] = set()
        self.mig: set[int] = set()
        self.calls = 0
        self.link_queries = 0  # NVLink and PCIe-topology calls
        self._sets: list[EventSet] = []

    # -- what a test does to the node -------------------------------------------------------------
    def xid(self, index: int, code: int) -> None:
        """The GPU at NVML ``index`` reports XID ``code`` (to every event set it is registered with)."""
        row = self.order[index]
        for events in self._sets:
            if events.registered.get(row, 0) & nvmlEventTypeXidCriticalError:
                with events.ready:
                    events.queue.append(SimpleNamespace(
                        device=Handle(row), eventType=nvmlEventTypeXidCriticalError, eventData=code,
                        gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))
                    events.ready.notify_all()

    def lose(self, index: int) -> None:
        """The GPU at NVML ``index`` fell off the bus: every call on it fails with GPU_IS_LOST."""
        self.lost.add(self.order[index])

    def uuid_at(self, index: int) -> str:
        return self.server.uuid(self.order[index])

    # -- the binding's functions ------------------------------------------------------------------
    def _check(self, handle: Handle | None = None) -> None:
        self.calls += 1
        if not self.initialized:
            raise NVMLError_Uninitialized()
        if handle is not None and handle.row in self.lost:
            raise NVMLError_GpuIsLost()

    def nvmlInit(self) -> None:
        if not self.library:
            raise NVMLError_LibraryNotFound()
        if not self.driver:
            raise NVMLError_DriverNotLoaded()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.order)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check()
        if not 0 <= index < len(self.order):
            raise NVMLError_InvalidArgument()
        handle = Handle(self.order[index])
        self._check(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._check(handle)
        return self.server.uuid(handle.row)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._check(handle)
        return self.server.model

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        self._check(handle)
        total = self.server.memory_mib * 2**20
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._check(handle)
        return SimpleNamespace(busId=self.server.bus_id(handle.row))

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        self._check(handle)
        return self.server.numa[handle.row]

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._check(handle)
        if handle.row not in self.mig:
            raise NVMLError_NotSupported()
        return [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self.link_queries += 1
        self._check(a)
        self._check(b)
        return _LEVEL[self.server.pcie[a.row][b.row]]

    def _links(self, row: int) -> list[int | None]:
        """Each NVLink of the GPU: the row of the GPU at its other end, or None for an NVSwitch."""
        if self.server.nvswitch_links:
            return [None] * self.server.nvswitch_links
        out: list[int | None] = []
        for peer, link in enumerate(self.server.matrix[row]):
            if link.startswith("NV"):
                out += [peer] * int(link[2:])
        return out

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self.link_queries += 1
        self._check(handle)
        links = self._links(handle.row)
        if not links:
            raise NVMLError_NotSupported()
        if link >= len(links):
            raise NVMLError_InvalidArgument()
        return NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        self._check(handle)
        peer = self._links(handle.row)[link]
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if peer is None else NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        self._check(handle)
        peer = self._links(handle.row)[link]
        return SimpleNamespace(busId="00000000:E0:00.0" if peer is None else self.server.bus_id(peer))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._check(handle)
        return nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeSingleBitEccError

    def nvmlEventSetCreate(self) -> EventSet:
        self._check()
        events = EventSet()
        self._sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, events: EventSet) -> None:
        self._check(handle)
        events.registered[handle.row] = events.registered.get(handle.row, 0) | mask

    def nvmlEventSetWait_v2(self, events: EventSet, timeout_ms: int) -> SimpleNamespace:
        with events.ready:
            if not events.queue:
                events.ready.wait(timeout_ms / 1000)
            if not events.queue:
                raise NVMLError_Timeout()
            return events.queue.pop(0)

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, events: EventSet) -> None:
        self._sets.remove(events)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the fake NVML has no {name}: the agent calls something the fake does not cover")
