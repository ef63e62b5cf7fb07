"""The admission decision for a SharedDeviceGroup: does it fit its namespace's device budget?

Pure, like :mod:`admission`: an AdmissionReview of a group CREATE or UPDATE in, a decision out,
with the namespace's quotas and other groups answered from memory by a :class:`BudgetView`. The
arithmetic is :func:`deviceshare.core.budget.over_budget`, which the operator can run again when it
places a group. A refusal names the quota (``ResourceQuota 'gpus' in namespace 'ml': ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from deviceshare.api import names
from deviceshare.core import budget
from deviceshare.webhooks import admission


@runtime_checkable
class BudgetView(Protocol):
    @property
    def budget_synced(self) -> bool:
        """Groups and quotas have their first list."""

    def quotas(self, namespace: str) -> list[budget.Quota]:
        """The namespace's ResourceQuotas with device limits."""

    def group_resources(self, namespace: str) -> dict[str, dict[str, int]]:
        """Group name -> its ``spec.resources``, for every group in the namespace."""


def decide(body: Mapping[str, Any], view: BudgetView) -> admission.Decision:
    """Allow or refuse a group write (raises :class:`admission.MalformedReview`)."""
    request = admission.request_of(body)
    kind = request.get("kind") or {}
    if (
        request.get("operation") not in ("CREATE", "UPDATE")
        or kind.get("group") != names.GROUP
        or kind.get("kind") != names.KIND
        or request.get("subResource")
    ):
        return admission.Decision(allowed=True, outcome="skipped")
    group = request.get("object")
    if not isinstance(group, Mapping):
        raise admission.MalformedReview("request.object is not a SharedDeviceGroup")
    meta = group.get("metadata") or {}
    namespace = str(request.get("namespace") or meta.get("namespace") or "")
    name = str(request.get("name") or meta.get("name") or "")
    resources = _resources(group)
    old = request.get("oldObject")
    previous = _resources(old) if isinstance(old, Mapping) else None
    if previous is not None and all(n <= previous.get(r, 0) for r, n in resources.items()):
        return admission.Decision(allowed=True, outcome="unchanged")  # takes no more: never refused
    if not view.budget_synced:
        return admission.deny(
            "deviceshare webhook is still loading quotas and groups; retry", code=503, outcome="warming"
        )
    others = [r for other, r in view.group_resources(namespace).items() if other != name]
    found = budget.over_budget(namespace, name, resources, others, view.quotas(namespace), previous)
    if found is None:
        return admission.Decision(allowed=True, outcome="unchanged")
    return admission.deny(found.message)


def _resources(group: Mapping[str, Any]) -> dict[str, int]:
    """``spec.resources`` as counts; the CRD schema has already refused anything else."""
    raw = (group.get("spec") or {}).get("resources") or {}
    if not isinstance(raw, Mapping):
        return {}
    return {str(r): n for r, n in raw.items() if isinstance(n, int) and not isinstance(n, bool)}
