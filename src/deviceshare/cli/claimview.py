"""What `inspect` and `explain` say of a DRA group's ResourceClaim (CONTRACT §13): its name and state as the API shows
it — pending, allocated (node and ``<pool>/<device>`` results), reserved for which pods, being deleted.

The state words are kubectl's for ``kubectl get resourceclaims`` (``pending``, ``allocated``, ``reserved``,
``deleted``, joined by commas), so the two read alike. The claims are those the operator labels with the group's
name (``deviceshare.io/group``); a cluster that does not serve ``resource.k8s.io/v1`` simply has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from deviceshare.api import names

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

CLAIMS_PATH = f"/apis/{names.DRA_API_VERSION}/resourceclaims?labelSelector={quote(names.POD_GROUP_LABEL, safe='')}"


@dataclasses.dataclass(frozen=True)
class GroupClaim:
    namespace: str
    group: str
    name: str
    state: str
    node: str  # "" while not allocated
    devices: tuple[str, ...]  # <pool>/<device>, as the group's status keys them
    reserved_for: tuple[str, ...]


def state_of(claim: Mapping[str, Any]) -> str:
    """kubectl's STATE column for a ResourceClaim (pkg/printers/internalversion ``resourceClaimState``): deleted;
    pending (not when deleted); allocated, and reserved."""
    status, meta = claim.get("status") or {}, claim.get("metadata") or {}
    words = ["deleted"] if meta.get("deletionTimestamp") else []
    if not status.get("allocation"):
        return ",".join(words or ["pending"])
    return ",".join([*words, "allocated", *(["reserved"] if status.get("reservedFor") else [])])


def allocated_node(allocation: Mapping[str, Any]) -> str:
    """The node a claim is allocated on, from its ``nodeSelector`` (a ``matchFields`` term on ``metadata.name``)."""
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and field.get("values"):
                return str(field["values"][0])
    return ""


def of_claim(claim: Mapping[str, Any]) -> GroupClaim:
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    allocation = status.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return GroupClaim(
        namespace=str(meta.get("namespace", "")),
        group=str((meta.get("labels") or {}).get(names.POD_GROUP_LABEL, "")),
        name=str(meta.get("name", "")),
        state=state_of(claim),
        node=allocated_node(allocation),
        devices=tuple(f"{r.get('pool')}/{r.get('device')}" for r in results),
        reserved_for=tuple(str(c.get("name", "")) for c in status.get("reservedFor") or ()),
    )


def describe(claim: Mapping[str, Any] | None, namespace: str, group: str) -> str:
    """One line for `explain`: the claim of a DRA group, or that it is not there yet."""
    name = names.claim_name(group)
    if claim is None:
        return (f"ResourceClaim {namespace}/{name}: not created yet (the operator makes it as soon as it sees the "
                "group: is it running?).")
    shown = of_claim(claim)
    text = f"ResourceClaim {namespace}/{name}: {shown.state}"
    if shown.node:
        text += f" on node {shown.node}, devices {','.join(shown.devices)}"
    if shown.reserved_for:
        text += f"; reserved for {', '.join(shown.reserved_for)}"
    elif shown.state == "pending":
        text += " (no devices allocated yet)"
    return text + "."


def render(claims: Sequence[GroupClaim], out: TextIO) -> None:
    if not claims:
        return
    from deviceshare.cli import inspect as inspect_

    out.write("\nDRA groups' claims:\n")
    rows: list[tuple[str, ...]] = [("GROUP", "CLAIM", "STATE", "NODE", "DEVICES", "RESERVED FOR")]
    rows += [(f"{c.namespace}/{c.group}", c.name, c.state, c.node or "-", ",".join(c.devices) or "-",
              ",".join(c.reserved_for) or "-") for c in claims]
    inspect_.print_table(rows, out)


def to_json(claims: Sequence[GroupClaim]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(c) for c in claims]


async def read_claims(api: k8s.ApiClient) -> list[GroupClaim]:
    """Every claim the operator made for a group, sorted; none where the API does not serve resource.k8s.io/v1."""
    from deviceshare.cli import inspect as inspect_
    from deviceshare.kube import rest

    try:
        items = (await inspect_.get_json(api, CLAIMS_PATH)).get("items") or []
    except rest.ApiError as e:
        if e.status in (403, 404):  # no DRA API on this cluster, or no right to read claims: nothing to show
            return []
        raise
    return sorted((of_claim(c) for c in items), key=lambda c: (c.namespace, c.group))


async def read_claim(api: k8s.ApiClient, namespace: str, group: str) -> dict[str, Any] | None:
    from deviceshare.cli import inspect as inspect_
    from deviceshare.kube import rest

    path = f"/apis/{names.DRA_API_VERSION}/namespaces/{quote(namespace, safe='')}/resourceclaims/" + quote(
        names.claim_name(group), safe="")
    try:
        found: dict[str, Any] = await inspect_.get_json(api, path)
    except rest.ApiError as e:
        if e.status in (403, 404):
            return None
        raise
    return found
