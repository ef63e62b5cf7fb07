"""The admission decision for a SharedDeviceGroup: does it fit its namespace's device budget?

Pure, like :mod:`admission`: an AdmissionReview of a group CREATE or UPDATE in, a decision out,
with the namespace's quotas and other groups answered from memory by a :class:`BudgetView`. The
arithmetic is :func:`deviceshare.core.budget.over_budget`, which the operator can run again when it
places a group. A refusal names the quota (``ResourceQuota 'gpus' in namespace 'ml': ...``). A DRA group
(``spec.claim``) counts as kube-apiserver will count the ResourceClaim the operator makes for it:
``count`` devices of ``<deviceClassName>.deviceclass.resource.k8s.io/devices`` (:mod:`deviceshare.core.budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from deviceshare.api import names
from deviceshare.core import budget
from deviceshare.webhooks import admission, reviews


@runtime_checkable
class BudgetView(Protocol):
    @property
    def budget_synced(self) -> bool:
        """Groups and quotas have their first list."""

    def quotas(self, namespace: str) -> list[budget.Quota]:
        """The namespace's ResourceQuotas with device limits."""

    def group_resources(self, namespace: str) -> dict[str, dict[str, int]]:
        """Group name -> what it asks (``GroupSpec.requested``: ``spec.resources``, or ``{deviceClassName: count}``
        for a DRA group), for every group in the namespace."""


def decide(body: Mapping[str, Any], view: BudgetView) -> admission.Decision:
    """Allow or refuse a group write (raises :class:`admission.MalformedReview`)."""
    request = reviews.request_of(body)
    if not reviews.is_group_write(request, ("CREATE", "UPDATE")):
        return admission.Decision(allowed=True, outcome="skipped")
    group = request.get("object")
    if group is None:
        raise admission.MalformedReview(f"request.object is missing: a {names.KIND} {request['operation']} "
                                        "carries the group")
    reviews.check_group(group, ("request", "object"))
    old = request.get("oldObject")
    if old is not None:
        reviews.check_group(old, ("request", "oldObject"))
    meta = group.get("metadata") or {}
    namespace = str(request.get("namespace") or meta.get("namespace") or "")
    name = str(request.get("name") or meta.get("name") or "")
    resources = _resources(group)
    previous = None if old is None else _resources(old)
    if previous is not None and all(n <= previous.get(r, 0) for r, n in resources.items()):
        return admission.Decision(allowed=True, outcome="unchanged")  # takes no more: never refused
    if not view.budget_synced:
        return admission.deny(
            "deviceshare webhook is still loading quotas and groups; retry", code=503, outcome="warming"
        )
    others = [r for other, r in view.group_resources(namespace).items() if other != name]
    # Its own claim is counted by the quota's status.used only once made: not yet at CREATE, the old one at UPDATE.
    found = budget.over_budget(namespace, name, resources, others, view.quotas(namespace), previous, previous)
    if found is None:
        return admission.Decision(allowed=True, outcome="unchanged")
    return admission.deny(found.message)


def _resources(group: Mapping[str, Any]) -> dict[str, int]:
    """``spec.resources`` as counts, or a DRA group's ``{deviceClassName: count}`` (count defaults to 1, as the
    CRD's; :func:`reviews.check_group` has checked their types)."""
    spec = group.get("spec") or {}
    claim = spec.get("claim")
    if claim:
        return {claim["deviceClassName"]: claim.get("count", 1)}
    return dict(spec.get("resources") or {})
