"""The no-double-allocation invariant, judged from API state only (never from the operator's memory).

Who holds a device is what the API says: a SharedDeviceGroup's ``status.allocatedDevices`` on
``status.nodeName``, and every bound, not-yet-terminated pod's ``deviceshare.io/selected-devices``
annotation (attributed to the group it names). A node offers the IDs of its ``deviceshare.io/devices``
annotation when that parses, none when it is present but malformed (CONTRACT §2), else ``"0".."N-1"``
from ``status.allocatable``. The checker is written independently of ``deviceshare.core`` so a bug
there cannot hide itself here.

For each node and resource:
- no device ID is claimed by two different groups, unless every one of them is a sharing group
  (``spec.share`` for that resource, CONTRACT §7) of one kind: then compute/memory sharers sum to
  at most 1 and to at most the device memory the node declares, and tile holders hold distinct
  tiles within the node's tiles per device (``status.allocatedTiles``);
- every claimed ID exists on the node, so the count claimed never exceeds capacity.
``half_bound`` is the quiescent-state check used after crashes: a bound member's devices and node
agree with its group's status.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from deviceshare.api import models, names, quantities

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


def group_shares(snapshot: Snapshot) -> dict[GroupKey, dict[str, models.DeviceShare]]:
    """resource -> share of every group whose spec parses (a group with an invalid spec holds whole)."""
    out: dict[GroupKey, dict[str, models.DeviceShare]] = {}
    for g in snapshot.groups:
        meta = g.get("metadata") or {}
        try:
            spec = models.GroupSpec.model_validate(g.get("spec") or {})
        except ValueError:
            continue
        out[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = dict(spec.share)
    return out


def group_tiles(snapshot: Snapshot) -> dict[tuple[GroupKey, str], list[str]]:
    """(group, resource) -> the "<device>.<tile>" its status holds."""
    out: dict[tuple[GroupKey, str], list[str]] = {}
    for g in snapshot.groups:
        meta, st = g.get("metadata") or {}, g.get("status") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        for resource, ids in (st.get("allocatedTiles") or {}).items():
            out[(key, str(resource))] = [str(i) for i in ids or []]
    return out


def per_device(node: Mapping[str, Any], resource: str) -> tuple[int | None, int]:
    """(memory bytes, tiles) per device the node declares for ``resource`` (annotation over label)."""
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    memory: int | None = None
    tiles = 0
    if resource == "nvidia.com/gpu" and str(labels.get("nvidia.com/gpu.memory", "")).isdigit():
        memory = int(labels["nvidia.com/gpu.memory"]) * quantities.MIB
    try:
        declared = json.loads(annotations.get("deviceshare.io/device-memory") or "{}")
        if resource in declared:
            memory = quantities.parse_bytes(declared[resource])
        tiles = int(json.loads(annotations.get("deviceshare.io/device-tiles") or "{}").get(resource, 0))
    except (ValueError, AttributeError, TypeError):
        pass
    return memory, tiles


def shared_breach(
    groups: Mapping[GroupKey, str], resource: str, device: str, shares: Mapping[GroupKey, Mapping[str, Any]],
    tiles: Mapping[tuple[GroupKey, str], list[str]], memory: int | None, tile_count: int,
) -> str | None:
    """Why several groups on one device break CONTRACT §7; None when they may share it."""
    entries = [shares.get(g, {}).get(resource) for g in groups]
    if any(e is None for e in entries):
        return "a whole-device group among them"
    kinds = {e.tiles is not None for e in entries}
    if len(kinds) > 1:
        return "compute/memory sharers and tile holders mixed"
    if kinds == {True}:
        held = [t for g in groups for t in tiles.get((g, resource), []) if t.rpartition(".")[0] == device]
        if len(set(held)) != len(held):
            return f"a tile held twice: {sorted(held)}"
        if any(int(t.rpartition(".")[2]) >= tile_count for t in held):
            return f"a tile beyond the device's {tile_count}: {sorted(held)}"
        return None
    compute = sum(e.compute_milli for e in entries)
    used = sum(e.memory_bytes for e in entries)
    if compute > 1000:
        return f"compute {compute}m > 1"
    if used and (memory is None or used > memory):
        return f"memory {used} bytes > the device's {memory}"
    return None


def violations(snapshot: Snapshot) -> list[str]:
    """Every breach of the invariant, as readable lines; empty means none."""
    capacity = {str((n.get("metadata") or {}).get("name")): node_capacity(n) for n in snapshot.nodes}
    raw_nodes = {str((n.get("metadata") or {}).get("name")): n for n in snapshot.nodes}
    shares, tiles = group_shares(snapshot), group_tiles(snapshot)
    holders: dict[tuple[str, str, str], dict[GroupKey, str]] = {}
    found: list[str] = []
    for c in claims(snapshot):
        holders.setdefault((c.node, c.resource, c.device), {}).setdefault(c.group, c.source)
    per_slot: dict[Slot, set[str]] = {}
    for (node, resource, device), groups in sorted(holders.items()):
        if len(groups) > 1:
            memory, tile_count = per_device(raw_nodes.get(node, {}), resource)
            breach = shared_breach(groups, resource, device, shares, tiles, memory, tile_count)
            if breach is not None:
                found.append(f"{node} {resource} device {device} held by {len(groups)} groups "
                             f"({breach}): {sorted(groups.values())}")
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
