"""The device budget at placement (operator/quotas.py): what the quota cache holds, the GET before its first
list, and the invariant: groups placed through the check never hold more than a namespace's quota allows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.core import budget as budget_
from deviceshare.core import inventory, placement
from deviceshare.core import ledger as ledgers
from deviceshare.operator import quotas
from tests.core.builders import GPU, node


def quota(ns: str, name: str, hard: Any, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"hard": {f"requests.{GPU}": hard}, **spec}}


class ListingApi:
    """The one read the budget makes before the cache has its first list."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.reads: list[str] = []

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        self.reads.append(namespace)
        return [q for q in self.items if q["metadata"]["namespace"] == namespace]


async def test_the_cache_answers_once_listed_and_one_get_answers_before() -> None:
    cache = quotas.QuotaCache()
    api = ListingApi([quota("ml", "gpu-budget", "4"), quota("other", "q", "1")])
    before = await quotas.read(cache, api, "ml")  # type: ignore[arg-type]
    assert [(q.name, q.hard) for q in before] == [("gpu-budget", {GPU: 4})]
    assert api.reads == ["ml"]

    cache.replace([quota("ml", "gpu-budget", "4"), quota("ml", "scoped", "1", scopes=["BestEffort"])])
    cache.apply("ADDED", quota("ml", "second", "2"))
    assert sorted(q.name for q in await quotas.read(cache, api, "ml")) == ["gpu-budget", "second"]  # type: ignore[arg-type]
    cache.apply("MODIFIED", {"metadata": {"namespace": "ml", "name": "second"}, "spec": {"hard": {"pods": "3"}}})
    cache.apply("DELETED", quota("ml", "gpu-budget", "4"))
    assert await quotas.read(cache, api, "ml") == []  # type: ignore[arg-type]
    assert api.reads == ["ml"]  # no further GET once listed


def test_the_refusal_names_the_quota_and_what_the_groups_hold() -> None:
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(node("n1", gpus=4))
    ledger.reserve(("ml", "a"), "n1", {GPU: ["0", "1", "2"]})
    ledger.reserve(("other", "x"), "n1", {GPU: ["3"]})  # another namespace's: not ml's budget
    budget = [q for q in [budget_.quota_from_object(quota("ml", "gpu-budget", "4"))] if q]
    assert quotas.refusal(ledger, ("ml", "b"), {GPU: 1}, budget) is None
    assert quotas.refusal(ledger, ("ml", "b"), {GPU: 2}, budget) == (
        'SharedDeviceGroup "b" would put namespace ml over its device budget: ResourceQuota "gpu-budget" '
        f"allows requests.{GPU} 4, groups hold 3, this group needs 2"
    )
    assert quotas.refusal(ledger, ("ml", "a"), {GPU: 3}, budget) is None  # its own devices are not "others"
    assert quotas.refusal(ledger, ("ml", "b"), {GPU: 9}, []) is None  # no quota, no limit


def test_a_dra_group_is_refused_as_kube_apiserver_would_refuse_its_claim() -> None:
    """A DRA group's resource is its DeviceClass; the quota's status.used counts ResourceClaims, the placed groups'
    own claims among them (the operator made them when it saw the groups), which are not counted twice."""
    cls = "gpu.nvidia.com"
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(node("n1", gpus=0, extra={cls: ("p/gpu-0", "p/gpu-1", "p/gpu-2", "p/gpu-3")}))
    ledger.reserve(("ml", "a"), "n1", {cls: ["p/gpu-0", "p/gpu-1"]})
    claims_quota = {"metadata": {"namespace": "ml", "name": "h100s"},
                    "spec": {"hard": {f"{cls}.deviceclass.resource.k8s.io/devices": "3"}},
                    "status": {"used": {f"{cls}.deviceclass.resource.k8s.io/devices": "3"}}}  # a's 2, b's own 1
    budget = [q for q in [budget_.quota_from_object(claims_quota)] if q]
    b_claim = {cls: 1}  # b's own claim, made: status.used counts it
    assert quotas.refusal(ledger, ("ml", "b"), {cls: 1}, budget, b_claim) is None
    assert quotas.refusal(ledger, ("ml", "b"), {cls: 2}, budget, b_claim) == (
        'SharedDeviceGroup "b" would put namespace ml over its device budget: ResourceQuota "h100s" allows '
        f"{cls}.deviceclass.resource.k8s.io/devices 3, ResourceClaims take 2, this group's claim asks for 2"
    )
    assert quotas.refusal(ledger, ("ml", "b"), {GPU: 2}, budget) is None  # the class's quota, not the plugin's


def test_a_dra_group_whose_claim_is_not_made_is_charged_all_it_asks() -> None:
    """status.used counts only claims that exist: a group whose claim is not made yet, or was refused for the quota,
    has nothing in it to take off. A tenant's own claim takes 2 of 3: a group asking 2 would be refused its claim."""
    cls = "gpu.nvidia.com"
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(node("n1", gpus=0, extra={cls: ("p/gpu-0", "p/gpu-1", "p/gpu-2", "p/gpu-3")}))
    claims_quota = {"metadata": {"namespace": "ml", "name": "h100s"},
                    "spec": {"hard": {f"{cls}.deviceclass.resource.k8s.io/devices": "3"}},
                    "status": {"used": {f"{cls}.deviceclass.resource.k8s.io/devices": "2"}}}  # a tenant's claim
    budget = [q for q in [budget_.quota_from_object(claims_quota)] if q]
    assert quotas.refusal(ledger, ("ml", "b"), {cls: 2}, budget) == (
        'SharedDeviceGroup "b" would put namespace ml over its device budget: ResourceQuota "h100s" allows '
        f"{cls}.deviceclass.resource.k8s.io/devices 3, ResourceClaims take 2, this group's claim asks for 2"
    )
    assert quotas.refusal(ledger, ("ml", "b"), {cls: 1}, budget) is None


def test_the_claim_devices_quota_admission_charges() -> None:
    cls = "gpu.nvidia.com"
    claim = {"spec": {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 2}},
        {"name": "b", "exactly": {"deviceClassName": cls}},  # count defaults to 1
        {"name": "c", "exactly": {"deviceClassName": "other"}},
        {"name": "d", "firstAvailable": [{"deviceClassName": cls, "count": 3}, {"deviceClassName": cls}]},
    ]}}}
    assert budget_.claim_devices(claim, cls) == 2 + 1 + 3
    all_mode = {"spec": {"devices": {"requests": [{"exactly": {"deviceClassName": cls, "allocationMode": "All"}}]}}}
    assert budget_.claim_devices(all_mode, cls) == 32


@settings(max_examples=60, deadline=None)
@given(
    hard=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 8), max_size=2),
    groups=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 4)), max_size=12),
)
def test_groups_placed_through_the_check_never_exceed_a_quota(
    hard: dict[str, int], groups: list[tuple[str, int]]
) -> None:
    ledger = ledgers.DeviceLedger()
    for i in range(3):
        ledger.upsert_node(node(f"n{i}", gpus=8))
    budget = {ns: [q for q in [budget_.quota_from_object(quota(ns, "q", str(n)))] if q]
              for ns, n in hard.items()}
    for i, (ns, gpus) in enumerate(groups):
        key = (ns, f"g{i}")
        if quotas.refusal(ledger, key, {GPU: gpus}, budget.get(ns, [])) is not None:
            assert ns in hard
            continue
        request = placement.GroupRequest(key=key, resources={GPU: gpus}, node_selector={})
        placement.schedule_group(ledger, request, inventory.PodDemand())
    for ns, limit in hard.items():
        held = sum(len(a.devices.get(GPU, ())) for a in ledger.allocations() if a.group[0] == ns)
        assert held <= limit
