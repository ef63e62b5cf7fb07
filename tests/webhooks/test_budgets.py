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


CLASS = "gpu.nvidia.com"
CLAIMS_QUOTA = [budget.Quota("h100s", {CLASS: 4}, {CLASS: 2})]  # status.used: claims of 2 devices exist already


def dra_review(count: int, *, operation: str = "CREATE", old_count: int | None = None) -> dict[str, Any]:
    body = review(0, operation=operation, old_gpus=None if old_count is None else 0)
    for key, n in (("object", count), ("oldObject", old_count)):
        if n is not None:
            body["request"][key]["spec"] = {"claim": {"deviceClassName": CLASS, "count": n}}
    return body


def test_a_dra_group_counts_as_kube_apiserver_counts_its_resource_claim() -> None:
    view = View({"h": {CLASS: 2}}, CLAIMS_QUOTA)  # h's claim is the one status.used counts
    assert budgets.decide(dra_review(2), view).allowed
    decision = budgets.decide(dra_review(3), view)
    assert (decision.allowed, decision.code) == (False, 403)
    assert decision.message == (
        "SharedDeviceGroup 'g' asks for 3 gpu.nvidia.com, which exceeds ResourceQuota 'h100s' in namespace 'ml': "
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices is 4 and ResourceClaims take 2 (other groups' claims "
        "ask for 2)"
    )
    # Raising a Pending group's count: its old claim (among what status.used counts) is replaced, not added to.
    own = View({"g": {CLASS: 2}}, CLAIMS_QUOTA)
    assert budgets.decide(dra_review(4, operation="UPDATE", old_count=2), own).allowed
    assert not budgets.decide(dra_review(4, operation="UPDATE", old_count=2), View({"h": {CLASS: 1}}, [
        budget.Quota("h100s", {CLASS: 4}, {CLASS: 3})])).allowed
    # A device-plugin quota never limits a DRA group, nor the other way round.
    assert budgets.decide(dra_review(8), View({}, QUOTA)).allowed
    assert budgets.decide(review(4), View({}, CLAIMS_QUOTA)).allowed


def test_a_dra_group_with_a_count_of_the_wrong_type_is_malformed() -> None:
    body = dra_review(1)
    body["request"]["object"]["spec"]["claim"]["count"] = "2"
    with pytest.raises(admission.MalformedReview, match=r"spec\.claim\.count"):
        budgets.decide(body, View(limits=CLAIMS_QUOTA))
