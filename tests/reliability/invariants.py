"""The no-double-allocation invariant, judged from API state only (never from the operator's memory).

Who holds a device is what the API says: a SharedDeviceGroup's ``status.allocatedDevices`` on
``status.nodeName``, and every bound, not-yet-terminated pod's ``deviceshare.io/selected-devices``
annotation (attributed to the group it names). A node offers the IDs of its ``deviceshare.io/devices``
annotation when that parses, none when it is present but malformed (CONTRACT §2), else ``"0".."N-1"``
from ``status.allocatable``. The checker is written independently of ``deviceshare.core`` so a bug
there cannot hide itself here.

For each node and resource:
- no device ID is claimed by two different groups, unless all of them are sharing groups of one kind
  (CONTRACT §7): compute/memory sharers whose compute sums to at most 1 and whose memory sums to at most
  the memory the node declares per device; or tile holders (``status.allocatedTiles``), no tile held
  twice and none beyond the device's tiles. Whole and shared, or shared and tiles, on one device is a
  breach. A group's share is read from its spec, quantities parsed here, not by ``deviceshare``;
- every claimed ID exists on the node, so the count claimed never exceeds capacity.
``half_bound`` is the quiescent-state check used after crashes: a bound member's devices and node
agree with its group's status.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from deviceshare.api import names

GroupKey = tuple[str, str]
Slot = tuple[str, str]  # (node, resource)

_TERMINATED = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class Claim:
    group: GroupKey
    node: str
    resource: str
    device: str
    source: str  # "status of ns/g" or "pod ns/p"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def node_capacity(node: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """resource -> device IDs the node offers."""
    meta = node.get("metadata") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    devices: dict[str, frozenset[str]] = {}
    for resource, quantity in allocatable.items():
        if "/" in resource and not resource.startswith(("kubernetes.io/", "hugepages-")):
            try:
                devices[resource] = frozenset(str(i) for i in range(int(str(quantity))))
            except ValueError:
                return {}
    raw = (meta.get("annotations") or {}).get(names.NODE_DEVICES_ANNOTATION)
    if raw is None:
        return devices
    try:
        listed = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(listed, dict):
        return {}
    for resource, ids in listed.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
            return {}
        devices[resource] = frozenset(ids)
    return devices


def pod_devices(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.POD_SELECTED_DEVICES_ANNOTATION)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(r): [i for i in str(ids).split(",") if i] for r, ids in data.items()}


def is_running_member(pod: Mapping[str, Any]) -> bool:
    """Bound, not finished: its devices are in use."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in _TERMINATED


def pod_group(pod: Mapping[str, Any]) -> GroupKey | None:
    meta = pod.get("metadata") or {}
    group = (meta.get("annotations") or {}).get(names.POD_GROUP_ANNOTATION)
    return (str(meta.get("namespace", "")), str(group)) if group else None


def claims(snapshot: Snapshot) -> list[Claim]:
    out: list[Claim] = []
    for g in snapshot.groups:
        meta, st = g.get("metadata") or {}, g.get("status") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        node, allocated = st.get("nodeName"), st.get("allocatedDevices") or {}
        if node and allocated:
            for resource, ids in allocated.items():
                out += [Claim(key, node, resource, str(i), f"status of {key[0]}/{key[1]}") for i in ids]
    for p in snapshot.pods:
        group = pod_group(p)
        if group is None or not is_running_member(p):
            continue
        meta = p.get("metadata") or {}
        node = p["spec"]["nodeName"]
        for resource, ids in pod_devices(p).items():
            out += [Claim(group, node, resource, i, f"pod {meta.get('namespace')}/{meta.get('name')}") for i in ids]
    return out


_UNITS = {"": 1, "m": decimal.Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY = re.compile(r"^([0-9]*\.?[0-9]*)(Ki|Mi|Gi|Ti|[mkMGT]?)$")


def quantity(value: object) -> decimal.Decimal:
    """The subset of Kubernetes quantities the tests write (460m, 0.5, 12Gi, 16G, 1)."""
    match = _QUANTITY.match(str(value))
    if not match or not match.group(1).strip("."):
        raise ValueError(f"not a quantity: {value!r}")
    return decimal.Decimal(match.group(1)) * _UNITS[match.group(2)]


@dataclasses.dataclass(frozen=True)
class Share:
    compute_milli: int = 0
    memory: int = 0
    tiles: int = 0


def group_shares(group: Mapping[str, Any]) -> dict[str, Share]:
    """resource -> the share the group's spec asks of each device; absent: whole devices."""
    out: dict[str, Share] = {}
    for resource, entry in ((group.get("spec") or {}).get("share") or {}).items():
        entry = entry or {}
        out[resource] = Share(
            compute_milli=math.ceil(quantity(entry["compute"]) * 1000) if "compute" in entry else 0,
            memory=math.ceil(quantity(entry["memory"])) if "memory" in entry else 0,
            tiles=int(entry.get("tiles") or 0),
        )
    return out


def device_memory(node: Mapping[str, Any], resource: str) -> int | None:
    """Bytes per device the node declares for ``resource`` (annotation over NVIDIA's label), None if none."""
    meta = node.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(names.NODE_DEVICE_MEMORY_ANNOTATION)
    if raw:
        declared = json.loads(raw)
        if resource in declared:
            return math.ceil(quantity(declared[resource]))
    label = (meta.get("labels") or {}).get(names.NVIDIA_GPU_MEMORY_LABEL)
    if label and resource == names.NVIDIA_GPU_RESOURCE:
        return int(label) * 2**20
    return None


def device_tiles(node: Mapping[str, Any], resource: str, devices: int) -> int:
    meta = node.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(names.NODE_DEVICE_TILES_ANNOTATION)
    if raw and resource in json.loads(raw):
        return int(json.loads(raw)[resource])
    label = (meta.get("labels") or {}).get(names.INTEL_TILES_LABEL)
    if label and resource.startswith(names.INTEL_RESOURCE_PREFIX) and devices:
        return int(label) // devices
    return 0


def _sharing_breaches(
    node: Mapping[str, Any] | None, resource: str, device: str, groups: Mapping[GroupKey, str],
    shares: Mapping[GroupKey, dict[str, Share]], tiles: Mapping[GroupKey, list[int]],
) -> list[str]:
    """What is wrong with several groups on one device: kinds mixed, or more given out than it has."""
    where = f"{(node or {}).get('metadata', {}).get('name')} {resource} device {device}"
    parts = {g: shares.get(g, {}).get(resource) for g in groups}
    if any(s is None for s in parts.values()):
        return [f"{where} held by {len(groups)} groups: {sorted(groups.values())}"]
    kinds = {"tiles" if s.tiles else "shared" for s in parts.values() if s is not None}
    if len(kinds) > 1:
        return [f"{where} mixes compute/memory sharers and tile holders: {sorted(groups.values())}"]
    found: list[str] = []
    if kinds == {"tiles"}:
        taken = [t for g in groups for t in tiles.get(g, [])]
        per_device = device_tiles(node or {}, resource, len(node_capacity(node or {}).get(resource, ())))
        if len(set(taken)) != len(taken):
            found.append(f"{where}: a tile is held twice {sorted(taken)} by {sorted(groups.values())}")
        if node is not None and any(t >= per_device for t in taken):
            found.append(f"{where}: tiles {sorted(taken)} beyond its {per_device} tiles")
        return found
    compute = sum(s.compute_milli for s in parts.values() if s is not None)
    memory = sum(s.memory for s in parts.values() if s is not None)
    if compute > 1000:
        found.append(f"{where} over-committed: compute {compute}m given to {sorted(groups.values())}")
    cap = device_memory(node, resource) if node is not None else None
    if node is not None and memory and (cap is None or memory > cap):
        found.append(f"{where} over-committed: memory {memory} bytes (declared {cap}) given to "
                     f"{sorted(groups.values())}")
    return found


def violations(snapshot: Snapshot) -> list[str]:
    """Every breach of the invariant, as readable lines; empty means none."""
    capacity = {str((n.get("metadata") or {}).get("name")): node_capacity(n) for n in snapshot.nodes}
    node_bodies = {str((n.get("metadata") or {}).get("name")): n for n in snapshot.nodes}
    holders: dict[tuple[str, str, str], dict[GroupKey, str]] = {}
    found: list[str] = []
    shares: dict[GroupKey, dict[str, Share]] = {}
    # (node, resource, device) -> group -> tile indices of its status.allocatedTiles
    tiles: dict[tuple[str, str, str], dict[GroupKey, list[int]]] = {}
    for g in snapshot.groups:
        meta, st = g.get("metadata") or {}, g.get("status") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        shares[key] = group_shares(g)
        for resource, ids in (st.get("allocatedTiles") or {}).items():
            for tile_id in ids:
                dev, _, index = str(tile_id).rpartition(".")
                tiles.setdefault((str(st.get("nodeName")), resource, dev), {}).setdefault(key, []).append(int(index))
    for c in claims(snapshot):
        holders.setdefault((c.node, c.resource, c.device), {}).setdefault(c.group, c.source)
    per_slot: dict[Slot, set[str]] = {}
    for (node, resource, device), groups in sorted(holders.items()):
        if len(groups) > 1 or any(shares.get(g, {}).get(resource) for g in groups):
            found += _sharing_breaches(node_bodies.get(node), resource, device, groups, shares,
                                       tiles.get((node, resource, device), {}))
        offered = capacity.get(node, {}).get(resource)
        # A node that vanished is not a breach for claims of pods still shown on it; an unknown ID is.
        if node in capacity and (offered is None or device not in offered):
            holders_text = sorted(groups.values())
            found.append(f"{node} {resource} device {device!r} is not offered by the node ({holders_text})")
        per_slot.setdefault((node, resource), set()).add(device)
    for (node, resource), ids in sorted(per_slot.items()):
        cap = len(capacity.get(node, {}).get(resource, ()))
        if node in capacity and len(ids) > cap:
            found.append(f"{node} {resource}: {len(ids)} devices allocated, capacity {cap}")
    return found


def half_bound(snapshot: Snapshot) -> list[str]:
    """Running members whose node or devices disagree with their group's status (only meaningful when quiet)."""
    groups = {
        (str(g["metadata"]["namespace"]), str(g["metadata"]["name"])): g.get("status") or {} for g in snapshot.groups
    }
    found: list[str] = []
    for p in snapshot.pods:
        key = pod_group(p)
        if key is None or not is_running_member(p):
            continue
        where = f"pod {p['metadata']['namespace']}/{p['metadata']['name']}"
        st = groups.get(key)
        devices = pod_devices(p)
        if st is None:
            found.append(f"{where} runs for group {key[1]}, which does not exist")
        elif not devices:
            found.append(f"{where} is bound without {names.POD_SELECTED_DEVICES_ANNOTATION}")
        elif st.get("nodeName") != p["spec"]["nodeName"] or {
            r: list(ids) for r, ids in (st.get("allocatedDevices") or {}).items()
        } != devices:
            found.append(
                f"{where} on {p['spec']['nodeName']} with {devices}, but its group says "
                f"{st.get('nodeName')} with {st.get('allocatedDevices')}"
            )
    return found


def from_sandbox(cluster: Any) -> Snapshot:
    """One consistent read of the sandbox store (the same objects the HTTP API serves)."""
    return Snapshot(cluster.list("nodes"), cluster.list(names.PLURAL), cluster.list("pods"))


async def from_api(kube: Any) -> Snapshot:
    """Read through the HTTP API, as kubectl would."""
    nodes = await kube._json(kube.core.list_node(_preload_content=False))
    return Snapshot(list(nodes["items"]), await kube.groups(), await kube.pods())


def assert_no_double_allocation(snapshot: Snapshot) -> None:
    found = violations(snapshot)
    assert not found, "double allocation:\n" + "\n".join(found)


def held_devices(snapshot: Snapshot) -> Iterable[tuple[str, str, str]]:
    """(node, resource, id) of every group-status claim."""
    return sorted({(c.node, c.resource, c.device) for c in claims(snapshot) if c.source.startswith("status")})
