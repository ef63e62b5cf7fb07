"""`deviceshare inspect`: which group holds which device on which node (like ``kubectl inspect gpushare``).

The operator keeps its ledger in memory, so the truth a user can see lives in the API: each group's
``status.nodeName`` / ``status.allocatedDevices`` / ``status.members``, and each node's inventory as
:func:`deviceshare.core.inventory.node_from_object` reads it (the same parser the operator uses, so
device IDs match). :func:`device_map` rebuilds the per-device holdings from those; ``explain`` reuses
it for its "free devices per node" hint. Two groups claiming one device are shown as CONFLICT.

A device shared by groups (CONTRACT §7) lists each holder with its share (from the group's spec,
immutable once Bound; tiles from ``status.allocatedTiles``) and what is left of the device; the
capacity arithmetic is the core's (:mod:`deviceshare.core.capacity`), so an over-committed device
or one used two ways at once is a CONFLICT here exactly when the operator would report it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from deviceshare.api import names, quantities
from deviceshare.cli import claimview, handoverview, linkview, shareview, waitingview
from deviceshare.core import capacity, inventory
from deviceshare.core import topology as topologies

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

FREE = "-"
CONFLICT = "CONFLICT"
NOT_IN_INVENTORY = "NOT-IN-INVENTORY"
UNHEALTHY = "UNHEALTHY"


@dataclasses.dataclass(frozen=True)
class Holder:
    """One group that names a device in its status."""

    namespace: str
    name: str
    phase: str
    members: tuple[str, ...]
    share: capacity.Share | None = None  # of this device's resource; None: the whole device
    tiles: tuple[int, ...] = ()  # tile indices of this device, for a tile holder

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def describe_share(self) -> str:
        if self.share is None:
            return "whole"
        text = self.share.describe()
        return f"{text}:{','.join(map(str, self.tiles))}" if self.tiles else text


@dataclasses.dataclass(frozen=True)
class Device:
    id: str
    holders: tuple[Holder, ...]
    in_inventory: bool = True
    memory_cap: int | None = None  # bytes the node declares per device of this resource
    tiles_cap: int = 0
    unhealthy: bool = False  # the node reports it so (deviceshare.io/device-health): no new group gets it

    def use(self) -> capacity.DeviceUse | None:
        """The parts sharing holders took, summed by the core's arithmetic; None when nobody shares."""
        use: capacity.DeviceUse | None = None
        for h in self.holders:
            if h.share is not None:
                use = capacity.with_part(use, capacity.Part((h.namespace, h.name), h.share, h.tiles))
        return use

    @property
    def problem(self) -> str | None:
        """What is wrong with the holders together (as the operator's rebuild would report it), or None."""
        whole = sum(1 for h in self.holders if h.share is None)
        if whole > 1:
            return "held by several groups"
        use = self.use()
        if use is None:
            return None
        return capacity.overcommit(use, self.memory_cap, self.tiles_cap, whole=bool(whole))

    @property
    def conflict(self) -> bool:
        return self.problem is not None

    def left(self) -> dict[str, Any]:
        """What sharers of the device's kind may still take (``{"compute": "540m", "memory": "56Gi"}``,
        ``{"tiles": 1}``); empty for a device held whole or free."""
        use = self.use()
        if use is None or use.kind is None:
            return {}
        if use.kind is capacity.Kind.TILES:
            return {"tiles": max(0, self.tiles_cap - len(set(use.tiles)))}
        left: dict[str, Any] = {
            "compute": quantities.format_milli(max(0, capacity.COMPUTE_FULL - use.compute_milli))}
        if self.memory_cap is not None:
            left["memory"] = quantities.format_bytes(max(0, self.memory_cap - use.memory_bytes))
        return left


@dataclasses.dataclass(frozen=True)
class NodeDevices:
    """One node's devices of every resource, in inventory order (unknown IDs groups claim last)."""

    name: str
    shared: bool
    ready: bool
    exists: bool
    resources: Mapping[str, tuple[Device, ...]]
    problems: tuple[str, ...] = ()
    topology: Mapping[str, topologies.Topology] = dataclasses.field(default_factory=dict)

    def total(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory)

    def allocated(self, resource: str) -> int:
        return sum(1 for d in self.resources.get(resource, ()) if d.in_inventory and d.holders)

    def free(self, resource: str) -> list[str]:
        """Devices a new group could get: in the inventory, held by nobody, not unhealthy."""
        return [d.id for d in self.resources.get(resource, ()) if d.in_inventory and not d.holders and not d.unhealthy]

    def links(self, resource: str) -> dict[str, list[str]]:
        """Group ref -> its devices of ``resource`` on this node, for the links they have."""
        return linkview.holders(self.resources.get(resource, ()))


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
    claims: dict[str, dict[str, dict[str, list[Holder]]]] = {}  # node -> resource -> id -> holders
    for group in sorted(groups, key=lambda g: (_holder(g).namespace, _holder(g).name)):
        status = group.get("status") or {}
        node = status.get("nodeName")
        if not node:
            continue
        holder, shares = _holder(group), shareview.shares(group)
        for resource, ids in (status.get("allocatedDevices") or {}).items():
            tiles = shareview.tiles(status, resource)
            for device_id in ids or []:
                held = dataclasses.replace(holder, share=shares.get(resource), tiles=tiles.get(str(device_id), ()))
                claims.setdefault(str(node), {}).setdefault(resource, {}).setdefault(str(device_id), []).append(held)

    infos = {info.name: info for info in (inventory.node_from_object(n) for n in nodes)}
    out: list[NodeDevices] = []
    for name in sorted({n for n, i in infos.items() if i.shared} | set(claims)):
        info = infos.get(name)
        offered = dict(info.devices) if info is not None else {}
        claimed = claims.get(name, {})
        resources: dict[str, tuple[Device, ...]] = {}
        for resource in sorted(set(offered) | set(claimed)):
            ids = offered.get(resource, ())
            by_id = claimed.get(resource, {})
            caps = {"memory_cap": info.device_memory.get(resource) if info else None,
                    "tiles_cap": info.device_tiles.get(resource, 0) if info else 0}
            sick = info.unhealthy.get(resource, frozenset()) if info else frozenset()
            devices = [Device(i, tuple(by_id.get(i, ())), unhealthy=i in sick, **caps)  # type: ignore[arg-type]
                       for i in ids]
            devices += [Device(i, tuple(h), False, **caps)  # type: ignore[arg-type]
                        for i, h in sorted(by_id.items()) if i not in ids]
            resources[resource] = tuple(devices)
        out.append(NodeDevices(
            name=name,
            shared=bool(info and info.shared),
            ready=bool(info and info.ready),
            exists=info is not None,
            resources=resources,
            problems=tuple(info.problems) if info is not None else ("node not found",),
            topology=dict(info.topology) if info is not None else {},
        ))
    return out


# -- reading -----------------------------------------------------------------------------------


async def get_json(api: k8s.ApiClient, path: str) -> Any:
    from deviceshare.kube import rest  # the client library loads on use: `--help` stays fast

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
                                **({"unhealthy": True} if d.unhealthy else {}),
                                **({"problem": d.problem} if d.problem else {}),
                                **({"left": d.left()} if d.left() else {}),
                                "groups": [
                                    {"namespace": h.namespace, "name": h.name, "phase": h.phase,
                                     "members": list(h.members), **shareview.share_json(h.share, h.tiles)}
                                    for h in d.holders
                                ],
                            }
                            for d in devices
                        ],
                        **({"links": {ref: {"devices": ids, **linkview.links(n.topology.get(resource), ids)}
                                      for ref, ids in n.links(resource).items()}}
                           if resource in n.topology else {}),
                    }
                    for resource, devices in n.resources.items()
                },
            }
            for n in nodes
        ],
        "conflicts": [
            {"node": n.name, "resource": r, "device": d.id, "groups": [h.ref for h in d.holders]}
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
    rows: list[tuple[str, ...]] = [("NODE", "RESOURCE", "DEVICE", "GROUP", "SHARE", "MEMBERS", "LEFT", "NOTE")]
    for n in nodes:
        for resource, devices in n.resources.items():
            for d in devices:
                notes = [CONFLICT] if d.conflict else []
                if not d.in_inventory:
                    notes.append(NOT_IN_INVENTORY)
                if d.unhealthy:
                    notes.append(UNHEALTHY)
                left = ",".join(f"{k}={v}" for k, v in d.left().items()) or FREE
                if not d.holders:
                    rows.append((n.name, resource, d.id, FREE, FREE, FREE, left, " ".join(notes)))
                # One row per holder: a shared device lists each group with its share.
                for h in d.holders:
                    rows.append((n.name, resource, d.id, h.ref, h.describe_share(), ",".join(h.members) or "(none)",
                                 left, " ".join(notes)))
    print_table(rows, out)
    out.write("\n")
    for n in nodes:
        summary = ", ".join(f"{r} {n.allocated(r)}/{n.total(r)} allocated" for r in n.resources) or "no devices"
        flags = [f for f, on in (("not ready", n.exists and not n.ready),
                                 ("not in shared mode", n.exists and not n.shared),
                                 ("node not found", not n.exists)) if on]
        flags += [p for p in n.problems if p != "node not found"]
        out.write(f"{n.name}: {summary}" + (f" ({'; '.join(flags)})" if flags else "") + "\n")
        for resource in n.resources:
            for ref, ids in n.links(resource).items():
                text = linkview.line(ref, resource, ids, n.topology.get(resource))
                if text:
                    out.write(f"  {text}\n")


# -- command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")
    parser.add_argument("--node", action="append", metavar="NODE", help="only this node (repeatable; default: all)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")


async def inspect(
    kubeconfig: str | None, *, context: str | None = None, only: Sequence[str] | None = None
) -> tuple[list[NodeDevices], list[waitingview.Waiting]]:
    """The device map (of ``only`` these nodes), and the groups that wait (all of them, with why)."""
    nodes, waiting, _, _ = await _inspect(kubeconfig, context=context, only=only, members=False)
    return nodes, waiting


async def _inspect(
    kubeconfig: str | None, *, context: str | None, only: Sequence[str] | None, members: bool
) -> tuple[list[NodeDevices], list[waitingview.Waiting], list[handoverview.PodHandover],
           list[claimview.GroupClaim]]:
    """:func:`inspect`, and with ``members`` each bound member pod's hand-over (CONTRACT §12) and the DRA groups'
    claims (CONTRACT §13)."""
    from deviceshare.kube import connecting

    async with await connecting.api_client(kubeconfig, context=context) as api:
        snap = await read_snapshot(api, pods=False)
        pods = (await get_json(api, handoverview.MEMBER_PODS_PATH)).get("items") or [] if members else []
        claims = await claimview.read_claims(api) if members else []
    nodes = device_map(snap.nodes, snap.groups)
    return ([n for n in nodes if not only or n.name in only], waitingview.waiting(snap.groups),
            handoverview.bound_members(pods, only), [c for c in claims if not only or c.node in only])


def run(args: argparse.Namespace) -> int:
    from deviceshare.kube import rest

    try:
        nodes, waiting, members, claims = asyncio.run(
            _inspect(args.kubeconfig, context=args.context, only=args.node, members=True))
    except rest.ApiError as e:
        print(f"deviceshare inspect: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the API server did not answer (a missing kubeconfig is the CLI's ConfigError)
        print(f"deviceshare inspect: cannot reach the API server: {e}", file=sys.stderr)
        return 1
    if args.node and not nodes:
        print(f"deviceshare inspect: no such shared node: {', '.join(args.node)}", file=sys.stderr)
        return 1
    if args.output == "json":
        json.dump({**to_json(nodes), "waiting": waitingview.to_json(waiting),
                   "handovers": handoverview.to_json(members), "claims": claimview.to_json(claims)},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_table(nodes, sys.stdout)
        handoverview.render(members, sys.stdout)
        claimview.render(claims, sys.stdout)
        waitingview.render(waiting, sys.stdout)
    return 0
