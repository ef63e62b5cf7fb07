"""How each bound member pod was handed its devices (CONTRACT §12): what ``deviceshare inspect`` shows below the
device map, ``explain`` in one line and ``demo`` in a column. Read from the pod's own annotations, as the
operator wrote them in its Binding: ``cdi`` with the CDI devices its containers are given, or ``env``; a DRA
group's member (CONTRACT §13), wired by the webhook to the group's ResourceClaim, gets its devices from the DRA
driver (CDI) through that claim: ``dra claim <name>``, never an env var."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from deviceshare.api import handovers, names

# Member pods carry the webhook's label; only they are read.
MEMBER_PODS_PATH = f"/api/v1/pods?labelSelector={names.POD_GROUP_LABEL.replace('/', '%2F')}"


@dataclass(frozen=True)
class PodHandover:
    namespace: str
    name: str
    node: str
    handover: str  # handovers.describe

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def of_pod(pod: Mapping[str, Any]) -> str:
    for claim in (pod.get("spec") or {}).get("resourceClaims") or ():
        if claim.get("name") == names.POD_CLAIM_NAME and claim.get("resourceClaimName"):
            return f"dra claim {claim['resourceClaimName']}"
    return handovers.describe((pod.get("metadata") or {}).get("annotations"))


def bound_members(pods: Sequence[Mapping[str, Any]], only: Sequence[str] | None = None) -> list[PodHandover]:
    """Member pods bound to a node (of ``only`` these nodes), sorted by namespace and name."""
    out: list[PodHandover] = []
    for pod in pods:
        meta, node = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName")
        annotations = meta.get("annotations") or {}
        if not node or names.POD_SELECTED_DEVICES_ANNOTATION not in annotations or (only and node not in only):
            continue
        out.append(PodHandover(str(meta.get("namespace", "")), str(meta.get("name", "")), str(node), of_pod(pod)))
    return sorted(out, key=lambda p: (p.namespace, p.name))


def render(rows: Sequence[PodHandover], out: TextIO) -> None:
    if not rows:
        return
    width = max(len(r.ref) for r in rows)
    node_width = max(len(r.node) for r in rows)
    out.write("\nHand-over of bound member pods:\n")
    for r in rows:
        out.write(f"  {r.ref.ljust(width)}  {r.node.ljust(node_width)}  {r.handover}\n")


def to_json(rows: Sequence[PodHandover]) -> list[dict[str, str]]:
    return [{"namespace": r.namespace, "name": r.name, "node": r.node, "handover": r.handover} for r in rows]
