"""Wiring a member pod to its DRA group's ResourceClaim (CONTRACT §13), and what a member may not claim itself.

A member of a claim group gets at CREATE ``spec.resourceClaims: [{name: deviceshare, resourceClaimName:
<group>-devices}]`` and, in every container and init container, ``resources.claims: [{name: deviceshare}]``, so
the kubelet asks the DRA driver to prepare the group's devices for it (CDI) once the operator has allocated the
claim and reserved it for the pod. No env var is injected: the driver, not the pod, says which devices it gets.

Tenants are not trusted, so the pod's own claims are refused, never overwritten or kept:

- an entry named ``deviceshare`` that points anywhere but the group's claim (another group's claim, a claim
  template, a claim the tenant made): overwriting it would hide from the tenant that their spec was wrong, and
  keeping it would hand the pod devices deviceshare never allocated for the group;
- any other pod claim: deviceshare schedules members and allocates only the group's claim, so a pod with another
  claim could never start (the kubelet prepares only claims allocated on its node and reserved for it), and a
  claim allocated elsewhere (kube-scheduler's, for another workload) would take devices outside the group's
  accounting. The same holds for a group of extended resources, whose members claim nothing.

An entry that is exactly ours (a reinvocation, or a pod the user wired by hand) is kept, and nothing is added
twice. Every field read here has been type-checked by :func:`deviceshare.webhooks.reviews.check_pod`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from deviceshare.api import models, names

Pointer = Callable[..., str]


def pod_claim(group_name: str) -> dict[str, str]:
    """The ``spec.resourceClaims`` entry of a member of ``group_name``."""
    return {"name": names.POD_CLAIM_NAME, "resourceClaimName": names.claim_name(group_name)}


CONTAINER_CLAIM: Mapping[str, str] = {"name": names.POD_CLAIM_NAME}


def problem(spec: Mapping[str, Any], group_name: str, group: models.GroupSpec) -> str | None:
    """Why a member pod's own ``spec.resourceClaims`` cannot stand, or None."""
    ours = pod_claim(group_name)
    for i, entry in enumerate(spec.get("resourceClaims") or ()):
        name = entry.get("name")
        where = f"spec.resourceClaims[{i}] ({name!r})"
        if not group.is_dra:
            return (
                f"{where}: a member of SharedDeviceGroup {group_name!r} takes its devices from the group's "
                f"spec.resources, and deviceshare allocates no ResourceClaim for it, so the pod could never "
                f"start; remove spec.resourceClaims"
            )
        if name == names.POD_CLAIM_NAME and dict(entry) != ours:
            return (
                f"{where} points to {_target(entry)}, but the claim named {names.POD_CLAIM_NAME!r} is the "
                f"group's ResourceClaim {ours['resourceClaimName']!r}, which deviceshare adds; remove the entry"
            )
        if name != names.POD_CLAIM_NAME:
            return (
                f"{where}: a member of DRA group {group_name!r} takes devices through the group's claim "
                f"{ours['resourceClaimName']!r} only; deviceshare schedules the pod and allocates no other "
                f"claim, so it could never start; remove the entry"
            )
    return None


def _target(entry: Mapping[str, Any]) -> str:
    if entry.get("resourceClaimTemplateName"):
        return f"the ResourceClaimTemplate {entry['resourceClaimTemplateName']!r}"
    if entry.get("resourceClaimName"):
        return f"the ResourceClaim {entry['resourceClaimName']!r}"
    return "no claim"


def patch(spec: Mapping[str, Any], group_name: str, pointer: Pointer) -> Iterator[dict[str, Any]]:
    """The JSONPatch operations that wire the pod to the group's claim, adding only what is missing (the pod's
    own claims have passed :func:`problem`, so an entry named ``deviceshare`` is ours)."""
    present = [e for e in spec.get("resourceClaims") or () if e.get("name") == names.POD_CLAIM_NAME]
    if not spec.get("resourceClaims"):
        yield {"op": "add", "path": pointer("spec", "resourceClaims"), "value": [pod_claim(group_name)]}
    elif not present:
        yield {"op": "add", "path": pointer("spec", "resourceClaims", "-"), "value": pod_claim(group_name)}
    for list_name in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(list_name) or ()):
            resources = container.get("resources") or {}
            claims = resources.get("claims") or []
            if any(c.get("name") == names.POD_CLAIM_NAME for c in claims):
                continue
            at: tuple[str | int, ...] = ("spec", list_name, index, "resources")
            if not container.get("resources"):
                yield {"op": "add", "path": pointer(*at), "value": {"claims": [dict(CONTAINER_CLAIM)]}}
            elif not claims:
                yield {"op": "add", "path": pointer(*at, "claims"), "value": [dict(CONTAINER_CLAIM)]}
            else:
                yield {"op": "add", "path": pointer(*at, "claims", "-"), "value": dict(CONTAINER_CLAIM)}
