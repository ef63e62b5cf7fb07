"""`deviceshare inspect`: which group holds which device on which node (like ``kubectl inspect gpushare``).

The operator keeps its ledger in memory, so the truth a user can see lives in the API: each group's
``status.nodeName`` / ``status.allocatedDevices`` / ``status.members``, and each node's inventory as
:func:`deviceshare.core.inventory.node_from_object` reads it (the same parser the operator uses, so
device IDs match). :func:`~deviceshare.cli.devicemap.device_map` rebuilds the per-device holdings from
those; ``explain`` reuses it for its "free devices per node" hint. Two groups claiming one device are shown as CONFLICT.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from deviceshare.api import names
from deviceshare.cli import claimview, draview, handoverview, linkview, shareview, waitingview
from deviceshare.cli.devicemap import (
    CONFLICT,
    FREE,
    NOT_IN_INVENTORY,
    TAINTED,
    UNHEALTHY,
    Device,
    Holder,
    NodeDevices,
    device_map,
)

# The device map lives in devicemap.py; inspect's importers (explain, demo, tests) keep reading it from here.
__all__ = ["CONFLICT", "FREE", "NOT_IN_INVENTORY", "TAINTED", "UNHEALTHY", "Device", "Holder", "NodeDevices",
           "Snapshot", "add_arguments", "device_map", "get_json", "inspect", "print_table", "read_snapshot",
           "render_table", "run", "to_json"]

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What inspect and explain read, once: raw nodes, groups and pods, and the DRA objects (CONTRACT §13)."""

    nodes: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    dra: draview.DraObjects = dataclasses.field(default_factory=draview.DraObjects)

    def device_map(self) -> list[NodeDevices]:
        return device_map(self.nodes, self.groups, self.dra)


async def get_json(api: k8s.ApiClient, path: str) -> Any:
    from deviceshare.kube import rest  # the client library loads on use: `--help` stays fast

    return await rest.call(api, "GET", path)


async def read_snapshot(api: k8s.ApiClient, *, pods: bool = True) -> Snapshot:
    node_list, group_list, dra = await asyncio.gather(
        get_json(api, "/api/v1/nodes"), get_json(api, f"/apis/{names.API_VERSION}/{names.PLURAL}"), draview.read(api)
    )
    pod_list = await get_json(api, "/api/v1/pods") if pods else {"items": []}
    return Snapshot(list(node_list.get("items") or []), list(group_list.get("items") or []),
                    list(pod_list.get("items") or []), dra)


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
                                **({"tainted": True} if d.tainted else {}),
                                **({"claims": list(d.claims)} if d.claims else {}),
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
                if d.tainted:
                    notes.append(TAINTED)
                left = ",".join(f"{k}={v}" for k, v in d.left().items()) or FREE
                # A claim not deviceshare's holds the device (kube-scheduler's, a tenant's): one row per claim.
                for claim in d.claims:
                    rows.append((n.name, resource, d.id, f"claim:{claim}", "whole", FREE, left, " ".join(notes)))
                if not d.holders and not d.claims:
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
    nodes, waiting, _, _, _ = await _inspect(kubeconfig, context=context, only=only, members=False)
    return nodes, waiting


async def _inspect(
    kubeconfig: str | None, *, context: str | None, only: Sequence[str] | None, members: bool
) -> tuple[list[NodeDevices], list[waitingview.Waiting], list[handoverview.PodHandover],
           list[claimview.GroupClaim], draview.DraObjects]:
    """:func:`inspect`, and with ``members`` each bound member pod's hand-over (CONTRACT §12) and the DRA groups'
    claims (CONTRACT §13)."""
    from deviceshare.kube import connecting

    async with await connecting.api_client(kubeconfig, context=context) as api:
        snap = await read_snapshot(api, pods=False)
        pods = (await get_json(api, handoverview.MEMBER_PODS_PATH)).get("items") or [] if members else []
        claims = await claimview.read_claims(api) if members else []
    nodes = snap.device_map()
    return ([n for n in nodes if not only or n.name in only], waitingview.waiting(snap.groups),
            handoverview.bound_members(pods, only), [c for c in claims if not only or c.node in only], snap.dra)


def run(args: argparse.Namespace) -> int:
    from deviceshare.kube import rest

    try:
        nodes, waiting, members, claims, dra = asyncio.run(
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
    note = dra.note()
    if note:  # a kind the user may not read: said once, the rest shown
        print(f"deviceshare inspect: {note}", file=sys.stderr)
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
