"""The namespace device budget (core/budget.py): a ResourceQuota's requests.<device> caps groups too."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deviceshare.core import budget

GPU = "nvidia.com/gpu"
AMD = "amd.com/gpu"


def quota(name: str = "gpus", **hard: int) -> budget.Quota:
    return budget.Quota(name, {GPU: hard["gpu"]} if "gpu" in hard else {})


def test_a_quota_object_becomes_its_device_limits() -> None:
    obj = {
        "metadata": {"name": "team-gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "4", "requests.cpu": "10", "pods": "20",
                          "requests.amd.com/gpu": 2, "limits.nvidia.com/gpu": "8"}},
        "status": {"used": {"requests.nvidia.com/gpu": "1"}},
    }
    assert budget.quota_from_object(obj) == budget.Quota("team-gpus", {GPU: 4, AMD: 2}, {GPU: 1})


def test_quotas_without_device_limits_or_with_scopes_limit_nothing() -> None:
    assert budget.quota_from_object({"spec": {"hard": {"requests.cpu": "10"}}}) is None
    scoped = {"spec": {"hard": {"requests.nvidia.com/gpu": "1"}, "scopes": ["BestEffort"]}}
    assert budget.quota_from_object(scoped) is None
    unreadable = {"metadata": {"name": "q"}, "spec": {"hard": {"requests.nvidia.com/gpu": "lots"}}}
    assert budget.quota_from_object(unreadable) is None


def test_a_group_that_fits_is_allowed_and_one_that_does_not_names_the_quota() -> None:
    quotas = [quota(gpu=4)]
    assert budget.over_budget("ml", "c", {GPU: 2}, [{GPU: 2}], quotas) is None
    found = budget.over_budget("ml", "c", {GPU: 3}, [{GPU: 2}], quotas)
    assert found is not None
    assert found.message == (
        "SharedDeviceGroup 'c' asks for 3 nvidia.com/gpu, which exceeds ResourceQuota 'gpus' in "
        "namespace 'ml': requests.nvidia.com/gpu is 4 and other groups hold 2"
    )


def test_pods_that_request_devices_count_against_the_same_quota() -> None:
    quotas = [budget.Quota("gpus", {GPU: 4}, {GPU: 3})]
    found = budget.over_budget("ml", "c", {GPU: 2}, [], quotas)
    assert found is not None and "pods request 3" in found.message


def test_other_resources_and_other_quotas_do_not_interfere() -> None:
    assert budget.over_budget("ml", "c", {AMD: 8}, [{GPU: 4}], [quota(gpu=4)]) is None
    tight = [quota("a-loose", gpu=10), quota("b-tight", gpu=1)]
    found = budget.over_budget("ml", "c", {GPU: 2}, [], tight)
    assert found is not None and found.quota == "b-tight"


def test_an_update_that_takes_no_more_is_never_refused() -> None:
    over = [quota(gpu=1)]  # the admin lowered the quota under what the namespace holds
    assert budget.over_budget("ml", "c", {GPU: 2}, [{GPU: 3}], over, previous={GPU: 2}) is None
    assert budget.over_budget("ml", "c", {GPU: 3}, [{GPU: 3}], over, previous={GPU: 2}) is not None


@given(
    hard=st.integers(0, 16),
    used=st.integers(0, 16),
    others=st.lists(st.integers(1, 8), max_size=6),
    wanted=st.integers(1, 8),
)
def test_refused_exactly_when_the_namespace_would_pass_its_hard_limit(
    hard: int, used: int, others: list[int], wanted: int
) -> None:
    found = budget.over_budget("ml", "g", {GPU: wanted}, [{GPU: n} for n in others],
                               [budget.Quota("q", {GPU: hard}, {GPU: used})])
    assert (found is not None) == (used + sum(others) + wanted > hard)
    if found is not None:
        assert (found.hard, found.used_by_pods, found.held_by_groups, found.requested) == (
            hard, used, sum(others), wanted)


# A DRA group (CONTRACT §13) counts as kube-apiserver counts its ResourceClaim (pkg/quota/v1/evaluator/core/
# resource_claims.go): `count` devices of <class>.deviceclass.resource.k8s.io/devices, whose status.used counts every
# ResourceClaim of the namespace, the groups' own among them.
CLASS = "gpu.nvidia.com"


def test_a_device_class_quota_becomes_a_limit_keyed_by_the_class() -> None:
    obj = {
        "metadata": {"name": "h100s"},
        "spec": {"hard": {f"{CLASS}.deviceclass.resource.k8s.io/devices": "4",
                          "count/resourceclaims.resource.k8s.io": "10",  # claims, not devices: not a budget
                          ".deviceclass.resource.k8s.io/devices": "1", "a/b.deviceclass.resource.k8s.io/devices": 1}},
        "status": {"used": {f"{CLASS}.deviceclass.resource.k8s.io/devices": "3"}},
    }
    assert budget.quota_from_object(obj) == budget.Quota("h100s", {CLASS: 4}, {CLASS: 3})
    assert budget.quota_name(CLASS) == "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert budget.quota_name(GPU) == "requests.nvidia.com/gpu"


def test_a_dra_group_is_refused_as_its_claim_would_be_and_the_message_names_the_quota() -> None:
    quotas = [budget.Quota("h100s", {CLASS: 4}, {CLASS: 3})]  # 3 devices claimed already, by anyone
    assert budget.over_budget("ml", "c", {CLASS: 1}, [], quotas) is None
    found = budget.over_budget("ml", "c", {CLASS: 2}, [{CLASS: 2}], quotas)
    assert found is not None
    assert found.message == (
        "SharedDeviceGroup 'c' asks for 2 gpu.nvidia.com, which exceeds ResourceQuota 'h100s' in namespace 'ml': "
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices is 4 and ResourceClaims take 3 (other groups' claims "
        "ask for 2)"
    )


def test_the_groups_claims_status_used_counts_already_are_not_counted_twice() -> None:
    # Two groups of 2 whose claims exist: status.used says 4, the groups ask 4: the namespace takes 4, not 8.
    full = [budget.Quota("h100s", {CLASS: 5}, {CLASS: 4})]
    assert budget.over_budget("ml", "c", {CLASS: 1}, [{CLASS: 2}, {CLASS: 2}], full) is None
    # Placing a group whose own claim is among what status.used counts: it is not counted twice either.
    assert budget.over_budget("ml", "b", {CLASS: 2}, [{CLASS: 2}], full, counted={CLASS: 2}) is None
    # A group whose claim is not made yet still counts (status.used lags the groups).
    assert budget.over_budget("ml", "c", {CLASS: 2}, [{CLASS: 2}, {CLASS: 2}], [budget.Quota("q", {CLASS: 5})])


@given(
    hard=st.integers(0, 16),
    foreign=st.integers(0, 8),
    others=st.lists(st.tuples(st.integers(1, 8), st.booleans()), max_size=6),
    wanted=st.integers(1, 8),
    own_made=st.booleans(),
)
def test_a_dra_group_is_refused_exactly_when_its_claim_would_pass_the_hard_limit(
    hard: int, foreign: int, others: list[tuple[int, bool]], wanted: int, own_made: bool
) -> None:
    """status.used counts the claims made so far (other groups' or not, and maybe the group's own); once every
    group's claim is made the namespace takes foreign + others + wanted. The check is exact when no claim
    of anyone else is about (kube-apiserver's own quota admission of each claim is the last word otherwise),
    and never refuses a group whose claim kube-apiserver would admit."""
    used = foreign + sum(n for n, made in others if made) + (wanted if own_made else 0)
    found = budget.over_budget("ml", "g", {CLASS: wanted}, [{CLASS: n} for n, _ in others],
                               [budget.Quota("q", {CLASS: hard}, {CLASS: used})],
                               counted={CLASS: wanted} if own_made else None)
    truth = foreign + sum(n for n, _ in others) + wanted > hard
    if found is not None:
        assert truth
    if not foreign:
        assert (found is not None) == truth
