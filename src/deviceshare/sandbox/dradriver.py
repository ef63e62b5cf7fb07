"""A simulated DRA driver, ``gpu.nvidia.com``: the DeviceClass, one ResourceSlice per GPU node, and what its
kubelet plugin answers to ``NodePrepareResources`` (the CDI devices a container gets).

Modelled on NVIDIA/k8s-dra-driver-gpu (2026, cmd/gpu-kubelet-plugin):

- deployments/helm/.../deviceclass-gpu.yaml: the DeviceClass ``gpu.nvidia.com`` selects
  ``device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`` and, on
  ``resource.k8s.io/v1``, names ``extendedResourceName: nvidia.com/gpu``.
- deviceinfo.go: a full GPU is the device ``gpu-<minor>`` with the attributes ``type`` ("gpu"), ``uuid``,
  ``productName``, ``brand``, ``architecture`` (strings) and ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` (versions); partitions.go: its capacity ``memory`` in bytes (BinarySI). The driver
  publishes no ``index`` attribute: the minor is in the device name.
- The kubelet-plugin helper (k8s.io/dynamic-resource-allocation/kubeletplugin) publishes the node's devices in
  one pool named after the node, in a slice owned by the Node (so it goes with it) and named
  ``<node>-<driver>-<random>``.
- cdi.go: a prepared device is handed over as the CDI device ``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-<minor>``;
  device_state.go: a result for a device this node does not have fails the prepare with
  ``allocatable not found for device "<name>"``, an unallocated claim with ``claim not yet allocated``. The real
  plugin looks a result up by device name among its own devices; as every node has a ``gpu-0``, the sandbox also
  requires the result's pool to be this node's, so a result meant for another node fails the same way. A device
  another claim prepared on the node is refused (``requested device gpu-0 is already allocated to different claim
  <uid>``, validateNoOverlappingPreparedDevices: kubernetes#136269's guard against two claims on one GPU).

``shared=True`` publishes each GPU with ``allowMultipleAllocations`` (consumable capacity, KEP-5075), its memory
requestable in steps of 1Gi, as kubernetes-sigs/dra-example-driver does with ``gpuAllowMultipleAllocations``
(internal/profiles/gpu/gpu.go); NVIDIA's driver has no such mode. A shared result's CDI device name then ends
in ``-<shareID>`` (the example driver's GetCDIDeviceID).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import dra, errors, store

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
CDI_VENDOR, CDI_CLASS = f"k8s.{DRIVER}", "claim"
NODE_RESOURCE = "nvidia.com/gpu"  # a node with this capacity runs the driver's kubelet plugin here
PRODUCT_NAME = "NVIDIA H100 80GB HBM3"


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                 f"device.attributes['{DRIVER}'].type == 'gpu'"}}],
            "extendedResourceName": NODE_RESOURCE,
        },
    }


def gpu_uuid(node_name: str, minor: int) -> str:
    """A stable ``GPU-...`` UUID per node and minor, as nvidia-smi shows one."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{minor}.{node_name}.sandbox')}"


def _memory(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def gpu_device(node_name: str, minor: int, memory_mib: int, *, shared: bool) -> dict[str, Any]:
    memory: dict[str, Any] = {"value": _memory(memory_mib)}
    if shared:
        memory["requestPolicy"] = {"default": memory["value"],
                                   "validRange": {"min": "1Gi", "step": "1Gi", "max": memory["value"]}}
    device: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu_uuid(node_name, minor)},
            "productName": {"string": PRODUCT_NAME},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
        },
        "capacity": {"memory": memory},
    }
    if shared:
        device["allowMultipleAllocations"] = True
    return device


def gpu_count(node: Mapping[str, Any]) -> int:
    raw = dra.mapping(dra.mapping(node.get("status")).get("capacity")).get(NODE_RESOURCE, 0)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


class GpuDriver:
    """Publishes the DeviceClass and a slice for every node with GPUs (added later too); the slice goes with
    its node. Off unless ``Sandbox(dra=True)``."""

    def __init__(
        self, objects: store.ObjectStore, *, memory_mib: int, shared: bool = False,
        node_selector: Mapping[str, str] | None = None,
    ) -> None:
        self.store = objects
        self.memory_mib = memory_mib
        self.shared = shared
        # The driver's kubelet plugin is a DaemonSet: its Helm chart's ``kubeletPlugin.nodeSelector`` /
        # ``affinity`` (k8s-dra-driver-gpu, deployments/helm) keep it to some nodes, and only those get a slice.
        self.node_selector = dict(node_selector or {})
        self._nodes = objects.catalog.lookup("nodes")
        self._slices = objects.catalog.lookup("resourceslices")
        self._classes = objects.catalog.lookup("deviceclasses")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._devices: dict[str, set[str]] = {}  # node -> the devices of its slice, from the slices' events

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.listeners.append(self._on_event)
        for resource_slice in self.store.list_objects(self._slices)[0]:
            self._index(resource_slice, gone=False)
        if ("", DEVICE_CLASS) not in self.store.keys(self._classes, None):
            self.store.create(self._classes, None, device_class())
        for node in self.store.list_objects(self._nodes)[0]:
            self.publish(node)

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)

    def _on_event(self, event: store.WatchEvent) -> None:
        if event.key == self._slices.key:
            self._index(event.obj, gone=event.type == "DELETED")
        elif event.key == self._nodes.key and event.type != "DELETED" and self._loop is not None:
            # A node's GPUs appear with its status (after its creation): publish then, outside the write.
            self._loop.call_soon(self.publish, event.obj)

    def _index(self, resource_slice: Mapping[str, Any], *, gone: bool) -> None:
        spec = dra.mapping(resource_slice.get("spec"))
        if spec.get("driver") == DRIVER and spec.get("nodeName"):
            node = str(spec["nodeName"])
            if gone:
                self._devices.pop(node, None)
            else:
                self._devices[node] = {str(dra.mapping(d).get("name")) for d in dra.listed(spec.get("devices"))}

    def devices_on(self, node_name: str) -> set[str] | None:
        """The devices this driver's slice publishes for the node; None: no slice there (no plugin runs)."""
        return self._devices.get(node_name)

    def publish(self, node: Mapping[str, Any]) -> None:
        """The node's slice, unless it has one already or no GPUs (or is gone)."""
        md = store.meta(node)
        count = gpu_count(node)
        if not count or md["name"] in self._devices:
            return
        labels = md.get("labels") or {}
        if any(labels.get(k) != v for k, v in self.node_selector.items()):
            return  # the plugin does not run there
        try:
            self.store.get(self._nodes, None, md["name"])
        except errors.ApiError:  # deleted before this deferred publish
            return
        self.store.create(self._slices, None, {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{md['name']}-{DRIVER}-",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": md["name"], "uid": md.get("uid"),
                                     "controller": True}],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": md["name"],
                "pool": {"name": md["name"], "generation": 1, "resourceSliceCount": 1},
                "devices": [gpu_device(md["name"], minor, self.memory_mib, shared=self.shared)
                            for minor in range(count)],
            },
        })


def plugins_on(driver: GpuDriver | None, node_name: str) -> dict[str, set[str]]:
    """The DRA kubelet plugins registered on a node: driver -> the devices it has there (its slice's)."""
    devices = None if driver is None else driver.devices_on(node_name)
    return {} if devices is None else {DRIVER: devices}


class Checkpoint:
    """What the plugin on each node has prepared: claim uid -> its devices not shared (no ``shareID``), and the
    pods using it, so that a claim is unprepared once no pod on the node uses it any more (the kubelet's
    reconcile of inactive pods)."""

    def __init__(self) -> None:
        self._claims: dict[str, dict[str, tuple[set[str], set[tuple[str, str]]]]] = {}

    def others(self, node: str, claim_uid: str) -> dict[str, set[str]]:
        """The devices prepared on ``node`` for claims other than ``claim_uid``."""
        return {uid: devices for uid, (devices, _) in self._claims.get(node, {}).items() if uid != claim_uid}

    def add(self, node: str, claim_uid: str, devices: set[str], pod: tuple[str, str]) -> None:
        self._claims.setdefault(node, {}).setdefault(claim_uid, (devices, set()))[1].add(pod)

    def release(self, pod: tuple[str, str]) -> None:
        """The pod stopped or is gone: every claim no other pod there uses is unprepared."""
        for claims in self._claims.values():
            for uid, (_, pods) in list(claims.items()):
                pods.discard(pod)
                if not pods:
                    del claims[uid]


def exclusive_devices(claim: Mapping[str, Any]) -> set[str]:
    """This driver's devices in the claim's allocation that are not a share of a device (no ``shareID``)."""
    results = dra.mapping(dra.mapping(dra.mapping(claim.get("status")).get("allocation")).get("devices"))
    return {str(dra.mapping(r).get("device")) for r in dra.listed(results.get("results"))
            if dra.mapping(r).get("driver") == DRIVER and not dra.mapping(r).get("shareID")}


def prepare(
    claim: Mapping[str, Any], node_name: str, node_devices: set[str], others: Mapping[str, set[str]] | None = None
) -> list[str]:
    """NodePrepareResources for one claim on ``node_name``: the CDI device IDs of this driver's results, or
    ValueError with the driver's message (driver.go wraps device_state.go's in ``error preparing devices for
    claim <ns>/<name>:<uid>: ...``). ``node_devices``: the devices of this node; ``others``: what other claims
    have prepared there, which a device not shared must not be in (validateNoOverlappingPreparedDevices)."""
    md = store.meta(claim)
    claim_uid = md.get("uid")
    claim_ref = f"{md.get('namespace')}/{md.get('name')}:{claim_uid}"  # ResourceClaimToString
    for device in sorted(exclusive_devices(claim)):
        for other_uid, devices in sorted((others or {}).items()):
            if device in devices:
                raise ValueError(f"error preparing devices for claim {claim_ref}: unable to prepare claim "
                                 f"{claim_uid}: requested device {device} is already allocated to different claim "
                                 f"{other_uid}")
    failed = f"error preparing devices for claim {claim_ref}: prepare devices failed"
    allocation = dra.mapping(claim.get("status")).get("allocation")
    if allocation is None:
        raise ValueError(f"{failed}: claim not yet allocated")
    ids: list[str] = []
    for result in dra.listed(dra.mapping(dra.mapping(allocation).get("devices")).get("results")):
        result = dra.mapping(result)
        if result.get("driver") != DRIVER:
            continue  # another driver's device: its own plugin prepares it
        if result.get("pool") != node_name or result.get("device") not in node_devices:
            raise ValueError(f'{failed}: allocatable not found for device "{result.get("device")}"')
        name = str(result["device"]) + (f"-{result['shareID']}" if result.get("shareID") else "")
        ids.append(f"{CDI_VENDOR}/{CDI_CLASS}={claim_uid}-{name}")
    return ids
