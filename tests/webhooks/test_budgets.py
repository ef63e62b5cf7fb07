"""The group budget decision, without HTTP: which group writes are checked, and what a refusal says."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.core import budget
from deviceshare.webhooks import admission, budgets

GPU = "nvidia.com/gpu"


@dataclasses.dataclass
class View:
    groups: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    limits: list[budget.Quota] = dataclasses.field(default_factory=list)
    budget_synced: bool = True

    def quotas(self, namespace: str) -> list[budget.Quota]:
        return self.limits

    def group_resources(self, namespace: str) -> dict[str, dict[str, int]]:
        return self.groups


def review(gpus: int, *, operation: str = "CREATE", old_gpus: int | None = None, **request: Any) -> dict[str, Any]:
    def group(n: int) -> dict[str, Any]:
        return {"metadata": {"name": "g", "namespace": "ml"}, "spec": {"resources": {GPU: n}}}

    body: dict[str, Any] = {"uid": "u", "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
                            "operation": operation, "namespace": "ml", "name": "g", "object": group(gpus),
                            "oldObject": None if old_gpus is None else group(old_gpus), **request}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


QUOTA = [budget.Quota("gpu-budget", {GPU: 4})]


def test_a_group_within_the_budget_is_allowed_and_its_old_self_is_not_counted() -> None:
    view = View({"g": {GPU: 4}, "h": {GPU: 1}}, QUOTA)
    assert budgets.decide(review(3), view).allowed
    assert not budgets.decide(review(4), view).allowed


def test_a_refusal_is_403_and_names_the_quota() -> None:
    decision = budgets.decide(review(3), View({"h": {GPU: 2}}, QUOTA))
    assert (decision.allowed, decision.code) == (False, 403)
    assert "ResourceQuota 'gpu-budget' in namespace 'ml'" in decision.message
    answer = admission.respond(review(3), decision)
    assert answer["response"]["status"]["reason"] == "Forbidden"


def test_an_update_that_takes_no_more_needs_no_cache() -> None:
    assert budgets.decide(review(1, operation="UPDATE", old_gpus=2), View(limits=QUOTA, budget_synced=False)).allowed


def test_a_cold_cache_asks_for_a_retry() -> None:
    decision = budgets.decide(review(1), View(limits=QUOTA, budget_synced=False))
    assert (decision.allowed, decision.code, decision.outcome) == (False, 503, "warming")


@pytest.mark.parametrize("request_fields", [
    {"kind": {"group": "", "version": "v1", "kind": "Pod"}},
    {"subResource": "status"},
    {"operation": "DELETE"},
], ids=["other-kind", "status", "delete"])
def test_other_writes_are_not_checked(request_fields: dict[str, Any]) -> None:
    body = review(100)
    body["request"].update(request_fields)
    assert budgets.decide(body, View(limits=QUOTA)).outcome == "skipped"


def test_not_a_review_is_malformed() -> None:
    with pytest.raises(admission.MalformedReview):
        budgets.decide({"kind": "Pod"}, View())
