"""`deviceshare inspect`: which group holds which device on which node (like ``kubectl inspect gpushare``).

The operator keeps its ledger in memory, so the truth a user can see lives in the API: each group's
``status.nodeName`` / ``status.allocatedDevices`` / ``status.members``, and each node's inventory as
:func:`deviceshare.core.inventory.node_from_object` reads it (the same parser the operator uses, so
device IDs match). :func:`device_map` rebuilds the per-device holdings from those; ``explain`` reuses
it for its "free devices per node" hint. Sharing groups (``spec.share``) are shown with their share
and what the device has left; a device held against the rules of CONTRACT §7 (two whole holders,
whole and shared at once, shares over its capacity) is shown as CONFLICT, judged by the same rules
as the operator's ledger (:mod:`deviceshare.core.capacity`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from kubernetes_asyncio import client as k8s

from deviceshare.api import models, names, quantities
from deviceshare.core import capacity, claims, inventory
from deviceshare.kube import connecting, rest

FREE = "-"
CONFLICT = "CONFLICT"
NOT_IN_INVENTORY = "NOT-IN-INVENTORY"


@dataclasses.dataclass(frozen=True)
class Holder:
    """One group that names a device in its status."""

    namespace: str
    name: str
    phase: str
    members: tuple[str, ...]
    share: str = ""  # "compute=250m,memory=20Gi" or "tiles=0.1" for a sharing group; "" holds it whole

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def shown(self) -> str:
        return f"{self.ref}({self.share})" if self.share else self.ref


@dataclasses.dataclass(frozen=True)
class Device:
    id: str
    holders: tuple[Holder, ...]
    in_inventory: bool = True
    problem: str = ""  # why the holding breaks the rules; "" when it does not
    left: str = ""  # what a device in partial use still offers, e.g. "compute 500m, memory 40Gi"

    @property
    def conflict(self) -> bool:
        return bool(self.problem)


@dataclasses.dataclass(frozen=True)
class NodeDevices:
    """One node's devices of every resource, in inventory order (unknown IDs groups claim last)."""

    name: str
    shared: bool
    ready: bool
    exists: bool
    resources: Mapping[str, tuple[Device, ...]]
    problems: tuple[str, ...] = ()

    def total(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory)

    def allocated(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory and d.holders)

    def free(self, resource: str) -> list[str]:
        return [d.id for d in self.resources.get(resource, ()) if d.in_inventory and not d.holders]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What inspect and explain read, once: raw nodes, groups and pods."""

    nodes: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def _holder(group: Mapping[str, Any]) -> Holder:
    meta, status = group.get("metadata") or {}, group.get("status") or {}
    return Holder(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        phase=str(status.get("phase") or names.PHASE_PENDING),
        members=tuple(str(m) for m in status.get("members") or []),
    )


def device_map(nodes: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> list[NodeDevices]:
    """Per node: every device and the groups whose status holds it.

    Shown: nodes in shared mode, plus any node a group's status points at (even a missing one,
    so a group stranded on a deleted node is visible). Sorted by node name.
    """
    held: dict[str, dict[str, dict[str, list[_Claimed]]]] = {}  # node -> resource -> id -> holders
    for group in sorted(groups, key=lambda g: (_holder(g).namespace, _holder(g).name)):
        status = group.get("status") or {}
        node = status.get("nodeName")
        if not node:
            continue
        holder = _holder(group)
        shares = _shares(group)
        tiles = status.get("allocatedTiles") or {}
        for resource, ids in (status.get("allocatedDevices") or {}).items():
            share = shares.get(resource)
            try:
                by_device = capacity.parse_tile_ids([str(t) for t in tiles.get(resource) or []])
            except ValueError:
                by_device = {}
            for device_id in ids or []:
                mine = by_device.get(str(device_id), ())
                shown = dataclasses.replace(holder, share=_describe(share, str(device_id), mine))
                held.setdefault(str(node), {}).setdefault(resource, {}).setdefault(str(device_id), []).append(
                    _Claimed(shown, share, mine)
                )

    infos = {info.name: info for info in (inventory.node_from_object(n) for n in nodes)}
    out: list[NodeDevices] = []
    for name in sorted({n for n, i in infos.items() if i.shared} | set(held)):
        info = infos.get(name)
        offered = dict(info.devices) if info is not None else {}
        claimed = held.get(name, {})
        resources: dict[str, tuple[Device, ...]] = {}
        for resource in sorted(set(offered) | set(claimed)):
            ids = offered.get(resource, ())
            by_id = claimed.get(resource, {})
            memory = info.device_memory.get(resource) if info is not None else None
            tile_count = info.device_tiles.get(resource, 0) if info is not None else 0
            devices = [_device(i, by_id.get(i, []), True, memory, tile_count) for i in ids]
            devices += [_device(i, h, False, memory, tile_count) for i, h in sorted(by_id.items()) if i not in ids]
            resources[resource] = tuple(devices)
        out.append(NodeDevices(
            name=name,
            shared=bool(info and info.shared),
            ready=bool(info and info.ready),
            exists=info is not None,
            resources=resources,
            problems=tuple(info.problems) if info is not None else ("node not found",),
        ))
    return out


@dataclasses.dataclass(frozen=True)
class _Claimed:
    holder: Holder
    share: capacity.Share | None
    tiles: tuple[int, ...]


def _shares(group: Mapping[str, Any]) -> dict[str, capacity.Share]:
    try:
        spec = models.GroupSpec.model_validate(group.get("spec") or {})
    except ValueError:
        return {}  # an invalid spec: the operator places nothing for it; shown as whole
    return capacity.shares_from_spec(spec.share)


def _describe(share: capacity.Share | None, device: str, tiles: tuple[int, ...]) -> str:
    if share is None:
        return ""
    if share.tiles:
        return "tiles=" + ",".join(capacity.tile_ids(device, tiles))
    return share.describe()


def _device(
    device: str, holders: Sequence[_Claimed], in_inventory: bool, memory: int | None, tiles: int
) -> Device:
    """One device, judged as the ledger judges it: who holds it, whether that is allowed, what is left."""
    whole = [c for c in holders if c.share is None]
    use: capacity.DeviceUse | None = None
    for c in holders:
        if c.share is not None:
            use = capacity.with_part(use, capacity.Part((c.holder.namespace, c.holder.name), c.share, c.tiles))
    problem, left = "", ""
    if use is None:
        problem = claims.HELD_TWICE if len(whole) > 1 else ""
    else:
        problem = capacity.overcommit(use, memory, tiles, bool(whole)) or ""
        rest = None if problem else capacity.left_of(device, use, memory, tiles)
        if rest is not None and rest.kind is capacity.Kind.TILES:
            left = f"tiles {','.join(map(str, rest.free_tiles)) or 'none'}"
        elif rest is not None:
            left = f"compute {quantities.format_milli(rest.compute_milli)}" + (
                "" if rest.memory_bytes is None else f", memory {quantities.format_bytes(rest.memory_bytes)}"
            )
    return Device(device, tuple(c.holder for c in holders), in_inventory, problem, left)


# -- reading -----------------------------------------------------------------------------------


async def get_json(api: k8s.ApiClient, path: str) -> Any:
    return await rest.call(api, "GET", path)


async def read_snapshot(api: k8s.ApiClient, *, pods: bool = True) -> Snapshot:
    node_list, group_list = await asyncio.gather(
        get_json(api, "/api/v1/nodes"), get_json(api, f"/apis/{names.API_VERSION}/{names.PLURAL}")
    )
    pod_list = await get_json(api, "/api/v1/pods") if pods else {"items": []}
    return Snapshot(list(node_list.get("items") or []), list(group_list.get("items") or []),
                    list(pod_list.get("items") or []))


# -- rendering ---------------------------------------------------------------------------------


def to_json(nodes: Sequence[NodeDevices]) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": n.name,
                "shared": n.shared,
                "ready": n.ready,
                "exists": n.exists,
                "problems": list(n.problems),
                "resources": {
                    resource: {
                        "total": n.total(resource),
                        "allocated": n.allocated(resource),
                        "free": n.free(resource),
                        "devices": [
                            {
                                "id": d.id,
                                "inInventory": d.in_inventory,
                                "conflict": d.conflict,
                                **({"conflictReason": d.problem} if d.problem else {}),
                                **({"left": d.left} if d.left else {}),
                                "groups": [
                                    {"namespace": h.namespace, "name": h.name, "phase": h.phase,
                                     "members": list(h.members), **({"share": h.share} if h.share else {})}
                                    for h in d.holders
                                ],
                            }
                            for d in devices
                        ],
                    }
                    for resource, devices in n.resources.items()
                },
            }
            for n in nodes
        ],
        "conflicts": [
            {"node": n.name, "resource": r, "device": d.id, "groups": [h.ref for h in d.holders],
             "reason": d.problem}
            for n in nodes for r, devices in n.resources.items() for d in devices if d.conflict
        ],
    }


def print_table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Left-aligned columns, kubectl style (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def render_table(nodes: Sequence[NodeDevices], out: TextIO) -> None:
    if not nodes:
        out.write("No shared-mode nodes (label nodes deviceshare.io/mode=shared) and no group holds devices.\n")
        return
    rows: list[tuple[str, ...]] = [("NODE", "RESOURCE", "DEVICE", "GROUP", "MEMBERS", "NOTE")]
    for n in nodes:
        for resource, devices in n.resources.items():
            for d in devices:
                notes = []
                if d.conflict:  # the reason only where it is news: two whole holders is what CONFLICT says
                    notes.append(CONFLICT if d.problem == claims.HELD_TWICE else f"{CONFLICT} ({d.problem})")
                if not d.in_inventory:
                    notes.append(NOT_IN_INVENTORY)
                if d.left:
                    notes.append(f"left: {d.left}")
                group = ",".join(h.shown for h in d.holders) or FREE
                members = ";".join(",".join(h.members) or "(none)" for h in d.holders) or FREE
                rows.append((n.name, resource, d.id, group, members, " ".join(notes)))
    print_table(rows, out)
    out.write("\n")
    for n in nodes:
        summary = ", ".join(f"{r} {n.allocated(r)}/{n.total(r)} allocated" for r in n.resources) or "no devices"
        flags = [f for f, on in (("not ready", n.exists and not n.ready),
                                 ("not in shared mode", n.exists and not n.shared),
                                 ("node not found", not n.exists)) if on]
        flags += [p for p in n.problems if p != "node not found"]
        out.write(f"{n.name}: {summary}" + (f" ({'; '.join(flags)})" if flags else "") + "\n")


# -- command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="kubeconfig context to use")
    parser.add_argument("--node", action="append", metavar="NODE", help="only this node (repeatable)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


async def inspect(
    kubeconfig: str | None, *, context: str | None = None, only: Sequence[str] | None = None
) -> list[NodeDevices]:
    async with await connecting.api_client(kubeconfig, context=context) as api:
        snap = await read_snapshot(api, pods=False)
    nodes = device_map(snap.nodes, snap.groups)
    return [n for n in nodes if not only or n.name in only]


def run(args: argparse.Namespace) -> int:
    try:
        nodes = asyncio.run(inspect(args.kubeconfig, context=args.context, only=args.node))
    except (connecting.ClusterNotFound, rest.ApiError, OSError) as e:
        print(f"deviceshare inspect: {e}", file=sys.stderr)
        return 1
    if args.node and not nodes:
        print(f"deviceshare inspect: no such shared node: {', '.join(args.node)}", file=sys.stderr)
        return 1
    if args.output == "json":
        json.dump(to_json(nodes), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_table(nodes, sys.stdout)
    return 0
