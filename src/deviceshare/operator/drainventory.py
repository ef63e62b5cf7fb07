"""What Dynamic Resource Allocation (``resource.k8s.io/v1``, CONTRACT §13) offers on each node, folded into the
ledger's :class:`~deviceshare.core.inventory.NodeInfo` so that the same core places DRA groups.

The mapping: a DRA group's *resource* is its DeviceClass name, its device IDs are ``<pool>/<device>``, and a node
offers, per class, the devices of the ResourceSlices whose ``spec.nodeName`` is that node and which the class's
selectors match. Devices the core must not give to anyone new are ``NodeInfo.withheld``:

- tainted ``NoSchedule`` / ``NoExecute`` (DRA device taints; a group holding one keeps it);
- in the ``status.allocation`` of any claim that is not one of ours (kube-scheduler's, another scheduler's, a
  tenant's): a claim counts as ours only when a group owns it (controller reference), it is named
  ``<group>-devices`` and the ledger holds exactly its devices for that group. Anything else is somebody else's
  allocation: never truth for what deviceshare gave, always a device taken.

Not offered: devices of slices with ``nodeSelector``, ``allNodes`` or ``perDeviceNodeSelection`` (network-attached
devices): a group lives on one node and its devices must be that node's, which only ``nodeName`` slices say.
They are ignored, not withheld, as is a pool whose slices disagree on the generation (only the newest generation
counts, as kube-scheduler's allocator does).

**One GPU is never offered twice.** With DRA a node may *also* advertise ``nvidia.com/gpu`` (the device plugin, or
the class's ``extendedResourceName``) for the same GPUs. The rule: on a node with DRA devices of a class, the
extended resource that class names (``spec.extendedResourceName``) is not offered to device-plugin groups; those
GPUs are DRA devices there. A node without slices keeps its extended resources as before, except one whose slices
went away (its driver unregistered) while a claim still allocates its DRA devices: those GPUs stay withheld.

Selectors are evaluated here (cel-python through ``core.deviceselectors``), once per (class, slice version): the
core stays pure and fast and sees only device IDs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from deviceshare.api import names
from deviceshare.core import deviceselectors, eligibility, inventory

from . import dragpus
from .draobjects import (
    ClaimAllocation,
    ClaimBodies,
    ClaimKey,
    DeviceClass,
    GroupKey,
    ResourceSlice,
    SliceDevice,
    device_id,
    read_claim,
    read_class,
    read_slice,
)

logger = logging.getLogger(__name__)

__all__ = ["ClaimAllocation", "DraInventory", "SliceDevice", "device_id"]


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class DraInventory:
    """ResourceSlices, DeviceClasses and claims' allocations, and each node's :class:`NodeInfo` with them folded in.

    ``held(group)``: the devices the ledger holds for a group (None: nothing), to tell our claims from others'."""

    def __init__(self, held: Callable[[GroupKey], Mapping[str, Sequence[str]] | None]) -> None:
        self._held = held
        self.bodies = ClaimBodies()
        self._slices: dict[str, ResourceSlice] = {}
        self._by_node: dict[str, set[str]] = {}  # node -> names of its nodeName slices
        self._device_nodes: dict[str, str] = {}  # device id -> the node of its slice
        self._classes: dict[str, DeviceClass] = {}
        self._claims: dict[ClaimKey, ClaimAllocation] = {}
        self._allocated: dict[str, set[ClaimKey]] = {}  # device id -> the claims allocating it
        self._bases: dict[str, inventory.NodeInfo] = {}  # what the Node object says, before DRA
        # node -> (the extended resources its DRA devices stood for, those devices) as last seen with slices: while
        # a claim still allocates one of them, a node whose slices went away (driver restart) does not offer them.
        self._dra_gpus = dragpus.DraGpus()
        # (class, slice) -> (the slice's version, the device ids the class matches): one entry per slice, replaced
        # when the slice changes, dropped when it goes (keyed by version, every update would leave one behind).
        self._matches: dict[tuple[str, str], tuple[str, frozenset[str]]] = {}
        # A claim's selectors -> the devices of its class they match; cleared when a slice or class changes.
        self._excluded: dict[tuple[str, tuple[str, ...]], dict[str, frozenset[str]]] = {}
        self._narrowed: dict[tuple[str, tuple[str, ...]], eligibility.Narrowed] = {}  # restrict's memo per key
        self.generation = 0  # bumped when a slice or class changes: claim selectors' answers are stale then

    # -- what the watches say --------------------------------------------------------------------

    def node(self, base: inventory.NodeInfo) -> inventory.NodeInfo:
        """The node as the ledger takes it: ``base`` (read from the Node) with its DRA devices."""
        self._bases[base.name] = base
        return self.view(base.name) or base

    def node_gone(self, name: str) -> None:
        self._bases.pop(name, None)
        self._dra_gpus.remember(name, None)

    def on_slice(self, event_type: str, body: Mapping[str, Any]) -> set[str]:
        """A ResourceSlice event; returns the nodes whose view changed."""
        name = str(_meta(body).get("name") or "")
        old = self._slices.pop(name, None)
        self._excluded.clear()
        self._narrowed.clear()
        self.generation += 1
        touched: set[str] = set()
        if event_type == "DELETED":
            for cls in self._classes:
                self._matches.pop((cls, name), None)
        if old is not None and old.node:
            self._by_node.get(old.node, set()).discard(name)
            for d in old.devices:
                if self._device_nodes.get(d.id) == old.node:
                    del self._device_nodes[d.id]
            touched.add(old.node)
        if event_type != "DELETED":
            new = read_slice(body)
            self._slices[name] = new
            if new.node:
                self._by_node.setdefault(new.node, set()).add(name)
                self._device_nodes.update((d.id, new.node) for d in new.devices)
                touched.add(new.node)
        return touched

    def on_class(self, event_type: str, body: Mapping[str, Any]) -> set[str]:
        name = str(_meta(body).get("name") or "")
        if event_type == "DELETED":
            self._classes.pop(name, None)
        else:
            self._classes[name] = read_class(body)
        self._matches = {k: v for k, v in self._matches.items() if k[0] != name}
        self._excluded.clear()
        self._narrowed.clear()
        self.generation += 1
        return set(self._by_node)

    def on_claim(self, event_type: str, body: Mapping[str, Any]) -> set[str]:
        meta = _meta(body)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._claims.pop(key, None)
        touched: set[str] = set()
        if old is not None:
            for device in old.devices:
                claimants = self._allocated.get(device)
                if claimants is not None:
                    claimants.discard(key)
                    if not claimants:
                        del self._allocated[device]
            touched |= self._nodes_of(old.devices)
        new = None if event_type == "DELETED" else read_claim(body)
        if new is not None:
            self._claims[key] = new
            for device in new.devices:
                self._allocated.setdefault(device, set()).add(key)
            touched |= self._nodes_of(new.devices)
        return touched

    def replace(self, kind: str, bodies: Iterable[Mapping[str, Any]]) -> set[str]:
        """A whole list of ``kind`` (``resourceslices``, ``deviceclasses``, ``resourceclaims``)."""
        handlers: dict[str, Callable[[str, Mapping[str, Any]], set[str]]] = {
            "resourceslices": self.on_slice, "deviceclasses": self.on_class, "resourceclaims": self.on_claim}
        apply = handlers[kind]
        held: list[Mapping[str, Any]] = (
            [{"metadata": {"name": n}} for n in self._slices] if kind == "resourceslices"
            else [{"metadata": {"name": n}} for n in self._classes] if kind == "deviceclasses"
            else [{"metadata": {"namespace": k[0], "name": k[1]}} for k in self._claims])
        touched: set[str] = set()
        for gone in held:
            touched |= apply("DELETED", gone)
        for body in bodies:
            touched |= apply("ADDED", body)
        return touched

    # -- what the ledger gets ----------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return sorted(self._bases)

    def view(self, node: str) -> inventory.NodeInfo | None:
        """The node's NodeInfo with its DRA devices per class and what DRA withholds; None: node unknown."""
        base = self._bases.get(node)
        if base is None:
            return None
        slices = self._current_slices(node)
        if not slices:
            return self._without_slices(base)
        devices = dict(base.devices)
        memory = dict(base.device_memory)
        withheld: dict[str, frozenset[str]] = {}
        extended: set[str] = set()
        dra_ids: set[str] = set()
        by_id = {d.id: d for s in slices for d in s.devices}
        for cls in sorted(self._classes.values(), key=lambda c: c.name):
            ids = [d for s in slices for d in self._class_devices(cls, s)]
            if not ids:
                continue
            if cls.extended_resource:
                devices.pop(cls.extended_resource, None)  # those GPUs are DRA devices here: never offered twice
                extended.add(cls.extended_resource)
                dra_ids.update(ids)
            devices[cls.name] = tuple(ids)
            blocked = frozenset(d for d in ids if by_id[d].tainted or self._taken_by_others(d))
            if blocked:
                withheld[cls.name] = blocked
            # Shares (consumable capacity, KEP-5075): only where every device of the class allows multiple
            # allocations and publishes one memory capacity (the ledger keeps one per node and resource).
            sizes = {by_id[d].memory_bytes for d in ids}
            size = sizes.pop() if len(sizes) == 1 else None
            if size and all(by_id[d].shared for d in ids):
                memory[cls.name] = size
            else:
                memory.pop(cls.name, None)
        if extended:
            self._dra_gpus.remember(node, (frozenset(extended), frozenset(dra_ids)))
        return dataclasses.replace(base, devices=devices, withheld=withheld, device_memory=memory)

    def _without_slices(self, base: inventory.NodeInfo) -> inventory.NodeInfo:
        """A node with no slice (now): its extended resources, but not those its DRA devices stood for while a
        claim still allocates one of those devices (the kubelet deletes a node's slices when its driver
        unregisters; the GPUs a group holds there stay that group's)."""
        memo = self._dra_gpus.get(base.name)
        if memo is None:
            return base
        extended, ids = memo
        if not any(d in self._allocated for d in ids):
            self._dra_gpus.remember(base.name, None)
            return base
        devices = {r: ids_ for r, ids_ in base.devices.items() if r not in extended}
        return dataclasses.replace(base, devices=devices)

    def device(self, device: str) -> SliceDevice | None:
        """A device by ID among the nodeName slices."""
        for slice_name in sorted(self._by_node.get(self._device_nodes.get(device, ""), ())):
            for d in self._slices[slice_name].devices:
                if d.id == device:
                    return d
        return None

    def excluded(self, class_name: str, selectors: Sequence[str]) -> dict[str, frozenset[str]]:
        """Per node, the devices of the class a claim's ``selectors`` do not match (nodes where they match every
        device are absent), evaluated once per (class, selectors) until a slice or class changes (see
        :meth:`excluded_work` to evaluate them off the event loop first). Selectors that do not compile match
        nothing; one that fails on a device (a missing attribute) fails that device, as kube-scheduler's
        allocator does."""
        key = (class_name, tuple(selectors))
        cached = self._excluded.get(key)
        if cached is None:
            cached = self._excluded[key] = self.excluded_work(class_name, selectors)()
        return cached

    def excluded_work(self, class_name: str, selectors: Sequence[str]) -> Callable[[], dict[str, frozenset[str]]]:
        """The evaluation behind :meth:`excluded`, over a copy of what it reads (frozen slices and class): safe to
        run in a worker thread while the watches change the inventory. cel-python takes milliseconds per device
        whose attributes differ (a ``uuid`` selector: minutes at 40,000 devices): not on the event loop, whose
        Lease renewals cannot wait that long."""
        cls = self._classes.get(class_name)
        slices = [(s, tuple(self._class_devices(cls, s))) for s in self._slices.values()
                  if s.node is not None] if cls is not None else []

        def work() -> dict[str, frozenset[str]]:
            try:
                compiled: deviceselectors.Selectors | None = deviceselectors.compile_selectors(list(selectors))
            except deviceselectors.SelectorError as e:
                logger.warning("claim selectors %s do not compile: %s", list(selectors), e)
                compiled = None
            claim = DeviceClass(class_name, compiled, None)
            found: dict[str, set[str]] = {}
            for resource_slice, ids in slices:
                for device in resource_slice.devices:
                    if device.id in ids and not self._matches_class(claim, device):
                        found.setdefault(str(resource_slice.node), set()).add(device.id)
            return {node: frozenset(ids) for node, ids in found.items()}

        return work

    def has_excluded(self, class_name: str, selectors: Sequence[str]) -> bool:
        return (class_name, tuple(selectors)) in self._excluded

    def evaluated(self, class_name: str, selectors: Sequence[str]) -> dict[str, frozenset[str]] | None:
        """What :meth:`excluded` would answer, if it is known for the slices as they are now; None: it is not (never
        evaluated, or a slice or class changed since), and the scheduler must not evaluate it on the event loop."""
        return self._excluded.get((class_name, tuple(selectors)))

    def keep_excluded(
        self, class_name: str, selectors: Sequence[str], generation: int, found: dict[str, frozenset[str]]
    ) -> None:
        """What :meth:`excluded_work` found, kept unless a slice or class changed since ``generation``."""
        if generation == self.generation:
            self._excluded[(class_name, tuple(selectors))] = found

    def narrowed(self, class_name: str, selectors: Sequence[str]) -> eligibility.Narrowed:
        """The memo of ``core.eligibility.restrict`` for these selectors (emptied when a slice or class changes)."""
        return self._narrowed.setdefault((class_name, tuple(selectors)), {})

    def node_of(self, device: str) -> str | None:
        """The node whose slice publishes ``device``."""
        return self._device_nodes.get(device)

    def allocation(self, claim: ClaimKey) -> ClaimAllocation | None:
        return self._claims.get(claim)

    def claims(self) -> list[ClaimAllocation]:
        return [self._claims[k] for k in sorted(self._claims)]

    def ours(self, claim: ClaimAllocation) -> bool:
        """A claim deviceshare allocated: owned by a group, named after it, its devices what the ledger holds."""
        if claim.owner is None or claim.key != (claim.owner[0], names.claim_name(claim.owner[1])):
            return False
        held = self._held(claim.owner)
        return held is not None and frozenset(d for ids in held.values() for d in ids) == claim.devices

    # -- internals ---------------------------------------------------------------------------------

    def _current_slices(self, node: str) -> list[ResourceSlice]:
        """The node's slices, of each (driver, pool) only those of its newest generation."""
        slices = [self._slices[n] for n in sorted(self._by_node.get(node, ()))]
        newest: dict[tuple[str, str], int] = {}
        for s in slices:
            newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), s.generation), s.generation)
        return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]

    def _class_devices(self, cls: DeviceClass, resource_slice: ResourceSlice) -> frozenset[str] | list[str]:
        key = (cls.name, resource_slice.name)
        version, cached = self._matches.get(key, (None, frozenset()))
        if version != resource_slice.version:
            cached = frozenset(d.id for d in resource_slice.devices if self._matches_class(cls, d))
            self._matches[key] = (resource_slice.version, cached)
        return [d.id for d in resource_slice.devices if d.id in cached]  # in slice order

    @staticmethod
    def _matches_class(cls: DeviceClass, device: SliceDevice) -> bool:
        if cls.selectors is None or device.parsed is None:
            return False
        try:
            return cls.selectors.matches(device.parsed)
        except deviceselectors.SelectorRuntimeError as e:
            # kube-scheduler: a runtime error in a class's selector fails the device (and says so).
            logger.warning("DeviceClass %s on device %s: %s", cls.name, device.id, e)
            return False

    def _taken_by_others(self, device: str) -> bool:
        return any(not self.ours(self._claims[k]) for k in self._allocated.get(device, ()))

    def _nodes_of(self, devices: Iterable[str]) -> set[str]:
        wanted = set(devices)
        return ({self._device_nodes[d] for d in wanted if d in self._device_nodes}
                | self._dra_gpus.nodes_of(wanted))
