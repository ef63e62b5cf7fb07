"""Groups on Dynamic Resource Allocation end to end (CONTRACT §13): the real operator allocates each group's
ResourceClaim from the sandbox driver's ResourceSlices, and the sandbox kubelet starts a member only when the
claim is allocated on its node and reserves it (``FailedPrepareDynamicResources`` otherwise).

The claim and the pods' wiring are made here as the operator and the webhook make them (``tests/operator/dra.py``),
so what is tested is the allocation: which devices, on which node, written before each Binding, released after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.core import budget
from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.operator import dra
from tests.operator.conftest import RunningOperator, operator_config, start_operator
from tests.operator.kube import Kube

NS = "ml"
CLASS = dra.CLASS


@pytest.fixture(params=[False, True], ids=["operator-alone", "policy-installed"])
def policy_installed(request: pytest.FixtureRequest) -> bool:
    """Each test also with manifests/base's policies, deviceshare-group-claims among them: the operator's own claim
    writes (create, allocate, reserve, prune, clear, delete) pass them."""
    return bool(request.param)


@pytest.fixture
def sandbox_options(request: pytest.FixtureRequest, policy_installed: bool) -> dict[str, object]:
    return {**getattr(request, "param", {"nodes": 2, "gpus": 4, "dra": True}), "admission_policies": policy_installed}


def condition(group: dict[str, Any], kind: str = "Scheduled") -> dict[str, Any]:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


async def test_two_members_bind_on_one_node_with_one_allocation_reserved_for_both(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    await dra.create_dra_group(kube, NS, "trainer", 2)
    for pod in ("trainer-0", "trainer-1"):
        await dra.create_member(kube, NS, pod, "trainer")
    bound = [await kube.wait_bound(NS, p) for p in ("trainer-0", "trainer-1")]
    node = bound[0]["spec"]["nodeName"]
    assert {p["spec"]["nodeName"] for p in bound} == {node}

    claim = await dra.claim(kube, NS, "trainer-devices")
    assert claim is not None
    devices = dra.allocated(claim)
    assert len(devices) == 2 and all(d.startswith(f"{node}/gpu-") for d in devices)
    assert dra.reserved(claim) == ["trainer-0", "trainer-1"]
    allocation = claim["status"]["allocation"]
    assert allocation["nodeSelector"] == {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    assert {r["request"] for r in allocation["devices"]["results"]} == {"devices"}
    group = await kube.wait_group(NS, "trainer", lambda g: g["status"].get("memberCount") == 2, "2 members")
    assert group["status"]["nodeName"] == node
    assert group["status"]["allocatedDevices"] == {CLASS: devices}

    # The kubelet prepared the claim once and gave both containers the same CDI devices; no env var names them.
    assert cluster.kubelet is not None
    await waiting.until(lambda: all((NS, p) in cluster.kubelet.started_cdi for p in ("trainer-0", "trainer-1")),
                        "both members started")
    cdi = [cluster.kubelet.started_cdi[(NS, p)]["main"] for p in ("trainer-0", "trainer-1")]
    assert cdi[0] == cdi[1] and len(cdi[0]) == 2
    assert all(c.startswith(f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-gpu-") for c in cdi[0])
    for p in bound:
        assert not any(k.startswith(names.POD_ENV_ANNOTATION_PREFIX) for k in p["metadata"].get("annotations", {}))

    # The same GPUs are never offered again as the extended resource the node also advertises.
    await kube.create_group(NS, "plugin", {"nvidia.com/gpu": 3})
    await kube.create_pod(NS, "plugin-0", "plugin", node_selector={"kubernetes.io/hostname": node})
    waiting_group = await kube.wait_group(NS, "plugin", lambda g: bool(condition(g).get("message")), "a reason")
    assert "insufficient nvidia.com/gpu" in condition(waiting_group)["message"]

    # A member that is gone leaves reservedFor; the other keeps the allocation.
    await kube.delete_pod(NS, "trainer-1")

    async def one_left() -> bool:
        return dra.reserved(await dra.claim(kube, NS, "trainer-devices")) == ["trainer-0"]

    await kube.wait_for(one_left, "trainer-1 gone from reservedFor")
    assert dra.allocated(await dra.claim(kube, NS, "trainer-devices")) == devices

    # Released: the group deleted while its last member runs waits; then reservedFor emptied, allocation cleared.
    await kube.delete_group(NS, "trainer")
    releasing = await kube.wait_group(NS, "trainer", lambda g: g["status"].get("phase") == "Releasing", "Releasing")
    assert releasing["status"]["allocatedDevices"] == {CLASS: devices}
    assert dra.allocated(await dra.claim(kube, NS, "trainer-devices")) == devices
    await kube.delete_pod(NS, "trainer-0")

    async def cleared() -> bool:
        body = await dra.claim(kube, NS, "trainer-devices")
        return body is None or not (body.get("status") or {}).get("allocation")

    await kube.wait_for(cleared, "the claim's allocation cleared")


async def test_a_device_another_claim_allocated_is_never_taken(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    # kube-scheduler allocated gpu-0..gpu-2 of gpu-node-0 for a claim deviceshare did not make.
    await dra.allocate_foreign(kube, "other", "theirs", "gpu-node-0", ["gpu-0", "gpu-1", "gpu-2"])
    await dra.create_dra_group(kube, NS, "a", 1)
    await dra.create_member(kube, NS, "a-0", "a")
    await kube.wait_bound(NS, "a-0")
    # binpack takes the fullest node that fits: gpu-node-0's one device left.
    assert dra.allocated(await dra.claim(kube, NS, "a-devices")) == ["gpu-node-0/gpu-3"]
    await dra.create_dra_group(kube, NS, "b", 4)
    await dra.create_member(kube, NS, "b-0", "b")
    await kube.wait_bound(NS, "b-0")
    assert dra.allocated(await dra.claim(kube, NS, "b-devices")) == [f"gpu-node-1/gpu-{i}" for i in range(4)]
    await dra.create_dra_group(kube, NS, "c", 1)
    await dra.create_member(kube, NS, "c-0", "c")
    waited = await kube.wait_group(NS, "c", lambda g: bool(condition(g).get("message")), "a reason")
    assert condition(waited)["message"] == (f"0/2 nodes are available: 1 insufficient {CLASS}, 1 node(s) had "
                                            f"{CLASS} devices tainted or allocated by another ResourceClaim.")
    every = [d for c in await dra.claims(kube) for d in dra.allocated(c)]
    assert len(every) == len(set(every)) == 8


async def test_tainted_devices_get_nothing_new(cluster: Sandbox, kube: Kube, operator: RunningOperator) -> None:
    for node in ("gpu-node-0", "gpu-node-1"):
        for device in ("gpu-0", "gpu-1", "gpu-2"):
            await dra.taint_device(kube, node, device, "NoSchedule" if node.endswith("0") else "NoExecute")
    await dra.create_dra_group(kube, NS, "two", 2)
    await dra.create_member(kube, NS, "two-0", "two")
    waited = await kube.wait_group(NS, "two", lambda g: bool(condition(g).get("message")), "a reason")
    assert condition(waited)["message"] == (f"0/2 nodes are available: 2 node(s) had {CLASS} devices tainted or "
                                            "allocated by another ResourceClaim.")
    await dra.create_dra_group(kube, NS, "one", 1)
    await dra.create_member(kube, NS, "one-0", "one")
    await kube.wait_bound(NS, "one-0")
    assert dra.allocated(await dra.claim(kube, NS, "one-devices")) in (["gpu-node-0/gpu-3"], ["gpu-node-1/gpu-3"])


async def test_claim_selectors_narrow_the_devices(cluster: Sandbox, kube: Kube, operator: RunningOperator) -> None:
    selector = await dra.uuid_selector(kube, "gpu-node-1/gpu-2")
    await dra.create_dra_group(kube, NS, "picky", 1, selectors=[selector])
    await dra.create_member(kube, NS, "picky-0", "picky")
    await kube.wait_bound(NS, "picky-0")
    assert dra.allocated(await dra.claim(kube, NS, "picky-devices")) == ["gpu-node-1/gpu-2"]


async def test_a_gang_of_dra_members_starts_in_one_cycle(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    await dra.create_dra_group(kube, NS, "gang", 2, minMembers=3)
    for pod in ("gang-0", "gang-1"):
        await dra.create_member(kube, NS, pod, "gang")
    waited = await kube.wait_group(NS, "gang", lambda g: condition(g).get("reason") == "WaitingForMembers", "waits")
    assert not (waited["status"].get("allocatedDevices"))
    assert dra.allocated(await dra.claim(kube, NS, "gang-devices")) == []
    registry = operator.memo.runtime.ctx.metrics.registry
    before = registry.get_sample_value("deviceshare_placements_total", {"result": "bound"}) or 0.0
    await dra.create_member(kube, NS, "gang-2", "gang")
    bound = [await kube.wait_bound(NS, p) for p in ("gang-0", "gang-1", "gang-2")]
    after = registry.get_sample_value("deviceshare_placements_total", {"result": "bound"}) or 0.0
    assert after - before == 1, "the gang was not bound in one scheduling cycle"
    assert len({p["spec"]["nodeName"] for p in bound}) == 1
    assert dra.reserved(await dra.claim(kube, NS, "gang-devices")) == ["gang-0", "gang-1", "gang-2"]


async def test_fgd_places_dra_groups(cluster: Sandbox, kube: Kube, operator: RunningOperator) -> None:
    await dra.create_dra_group(kube, NS, "f", 3, schedulingStrategy="fgd")
    await dra.create_member(kube, NS, "f-0", "f")
    pod = await kube.wait_bound(NS, "f-0")
    devices = dra.allocated(await dra.claim(kube, NS, "f-devices"))
    assert len(devices) == 3 and all(d.startswith(pod["spec"]["nodeName"] + "/") for d in devices)


async def test_a_lost_answer_on_the_claim_write_is_read_back(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    fault = cluster.inject_fault("PATCH", r"/resourceclaims/lost-devices/status$", status=504, applied=True)
    await dra.create_dra_group(kube, NS, "lost", 1)
    await dra.create_member(kube, NS, "lost-0", "lost")
    await kube.wait_bound(NS, "lost-0")
    assert fault.fired == 1
    claim = await dra.claim(kube, NS, "lost-devices")
    assert len(dra.allocated(claim)) == 1 and dra.reserved(claim) == ["lost-0"]
    writes = operator.memo.runtime.ctx.metrics.registry.get_sample_value(
        "deviceshare_api_writes_total", {"verb": "patch", "resource": "resourceclaims/status",
                                         "result": "uncertain_resolved"})
    assert writes == 1


async def test_a_restarted_operator_keeps_what_the_claims_show(cluster: Sandbox, kube: Kube) -> None:
    running = await start_operator(operator_config(cluster))
    try:
        await dra.create_dra_group(kube, NS, "kept", 3)
        await dra.create_member(kube, NS, "kept-0", "kept")
        await kube.wait_bound(NS, "kept-0")
    finally:
        await running.stop()
    running = await start_operator(operator_config(cluster))
    try:
        # A second group of 3 cannot go where the first holds 3 of 4: it takes the other node whole.
        await dra.create_dra_group(kube, NS, "next", 3)
        await dra.create_member(kube, NS, "next-0", "next")
        await dra.create_member(kube, NS, "kept-1", "kept")
        await kube.wait_bound(NS, "next-0")
        await kube.wait_bound(NS, "kept-1")
        every = [d for c in await dra.claims(kube) for d in dra.allocated(c)]
        assert len(every) == len(set(every)) == 6
        assert dra.reserved(await dra.claim(kube, NS, "kept-devices")) == ["kept-0", "kept-1"]
    finally:
        await running.stop()


async def test_a_higher_priority_dra_group_preempts_a_lower_one_by_eviction(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    for name, value in (("low", 10), ("high", 1000)):
        await kube.create_priority_class(name, value)
    for group, count in (("low-a", 3), ("low-b", 3)):
        await dra.create_dra_group(kube, NS, group, count)
        await dra.create_member(kube, NS, f"{group}-0", group, priority_class="low")
        await kube.wait_bound(NS, f"{group}-0")
    victims = {g: dra.allocated(await dra.claim(kube, NS, f"{g}-devices")) for g in ("low-a", "low-b")}

    await dra.create_dra_group(kube, NS, "urgent", 4)
    await dra.create_member(kube, NS, "urgent-0", "urgent", priority_class="high")
    urgent = await kube.wait_bound(NS, "urgent-0")
    node = urgent["spec"]["nodeName"]
    evicted = next(g for g, devices in victims.items() if devices[0].startswith(node + "/"))
    assert await kube.pod(NS, f"{evicted}-0") is None  # evicted through the Eviction API
    preempted = await kube.group(NS, evicted)
    assert preempted is not None and condition(preempted)["reason"] == "Preempted"
    # The victim's claim was released before the preemptor's was allocated: never a device in two allocations.
    assert dra.allocated(await dra.claim(kube, NS, f"{evicted}-devices")) == []
    assert dra.allocated(await dra.claim(kube, NS, "urgent-devices")) == [f"{node}/gpu-{i}" for i in range(4)]
    every = [d for c in await dra.claims(kube) for d in dra.allocated(c)]
    assert len(every) == len(set(every)) == 7


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 2, "dra": True}], indirect=True)
async def test_preemption_evicts_no_group_whose_devices_the_claim_selectors_do_not_match(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    for name, value in (("low", 10), ("high", 1000)):
        await kube.create_priority_class(name, value)
    for group, priority in (("low", "low"), ("peer", "high")):  # one GPU each: the node is full
        await dra.create_dra_group(kube, NS, group, 1)
        await dra.create_member(kube, NS, f"{group}-0", group, priority_class=priority)
        await kube.wait_bound(NS, f"{group}-0")
    (wanted,) = dra.allocated(await dra.claim(kube, NS, "peer-devices"))  # held at the preemptor's own priority

    await dra.create_dra_group(kube, NS, "picky", 1, selectors=[await dra.uuid_selector(kube, wanted)])
    await dra.create_member(kube, NS, "picky-0", "picky", priority_class="high")
    waited = await kube.wait_group(NS, "picky", lambda g: "preempt" in condition(g).get("message", ""),
                                   "what preemption did")
    # The low group's GPU is free for nothing: it stays, and the group says why nobody was evicted.
    assert condition(waited)["reason"] == "Unschedulable"
    assert condition(waited)["message"].endswith(
        "preemption: 0/1 nodes are available: 1 node(s) where evicting lower-priority groups frees too few "
        f"{CLASS} devices the claim's selectors match.")
    low = await kube.pod(NS, "low-0")
    assert low is not None and not low["metadata"].get("deletionTimestamp")
    registry = operator.memo.runtime.ctx.metrics.registry
    assert not registry.get_sample_value("deviceshare_preemption_victims_total")
    assert len(dra.allocated(await dra.claim(kube, NS, "low-devices"))) == 1


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 2, "dra": True}], indirect=True)
async def test_preemption_evicts_exactly_the_group_whose_device_the_claim_selectors_match(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    for name, value in (("lowest", 10), ("low", 20), ("high", 1000)):
        await kube.create_priority_class(name, value)
    for group in ("lowest", "low"):  # one GPU each: the node is full
        await dra.create_dra_group(kube, NS, group, 1)
        await dra.create_member(kube, NS, f"{group}-0", group, priority_class=group)
        await kube.wait_bound(NS, f"{group}-0")
    (wanted,) = dra.allocated(await dra.claim(kube, NS, "low-devices"))

    # Without selectors the cheapest victim would be "lowest"; the preemptor can use only "low"'s GPU.
    await dra.create_dra_group(kube, NS, "picky", 1, selectors=[await dra.uuid_selector(kube, wanted)])
    await dra.create_member(kube, NS, "picky-0", "picky", priority_class="high")
    await kube.wait_bound(NS, "picky-0")
    assert await kube.pod(NS, "low-0") is None  # evicted through the Eviction API
    lowest = await kube.pod(NS, "lowest-0")
    assert lowest is not None and not lowest["metadata"].get("deletionTimestamp")
    assert dra.allocated(await dra.claim(kube, NS, "picky-devices")) == [wanted]
    preempted = await kube.group(NS, "low")
    assert preempted is not None and condition(preempted)["reason"] == "Preempted"
    registry = operator.memo.runtime.ctx.metrics.registry
    assert registry.get_sample_value("deviceshare_preemption_victims_total") == 1


async def _quota_of_three_claimed_devices(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, seen: Callable[[budget.Quota], bool]
) -> None:
    """ResourceQuota ``h100s`` allowing 3 devices of the class in NS, once the operator's cache shows it as ``seen``
    asks (its hard limit, or its ``status.used`` counted by the quota controller)."""
    await kube.ensure_namespace(NS)
    cluster.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "h100s", "namespace": NS},
                    "spec": {"hard": {f"{CLASS}.deviceclass.resource.k8s.io/devices": "3"}}})
    scheduler = operator.memo.runtime.scheduler
    await kube.wait_for(lambda: any(seen(q) for q in scheduler.quotas.quotas(NS)), "the operator to see the quota")


async def _b_refused_for_quota(kube: Kube) -> None:
    """Group b, asking for 2 devices where ResourceClaims take 2 of quota h100s's 3, is not placed, as it says."""
    await dra.create_dra_group(kube, NS, "b", 2)
    await dra.create_member(kube, NS, "b-0", "b")
    waited = await kube.wait_group(NS, "b", lambda g: "device budget" in condition(g).get("message", ""),
                                   "the group's status names the quota")
    assert condition(waited)["message"] == (
        f'SharedDeviceGroup "b" would put namespace {NS} over its device budget: ResourceQuota "h100s" allows '
        f"{CLASS}.deviceclass.resource.k8s.io/devices 3, ResourceClaims take 2, this group's claim asks for 2")
    assert not waited["status"].get("allocatedDevices")


async def test_a_dra_group_over_its_namespace_claim_quota_is_not_placed(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    """kube-apiserver counts a ResourceClaim's devices on ``<class>.deviceclass.resource.k8s.io/devices``: the operator
    places a DRA group only if its claim fits that quota beside the other groups' claims."""
    await _quota_of_three_claimed_devices(cluster, kube, operator, lambda q: q.hard.get(CLASS) == 3)
    await dra.create_dra_group(kube, NS, "a", 2)
    await dra.create_member(kube, NS, "a-0", "a")
    await kube.wait_bound(NS, "a-0")

    await _b_refused_for_quota(kube)  # 2 + 2 > 3, on a cluster with 6 devices free
    # kube-apiserver's own quota admission refused b's claim (the sandbox's, after resource_claims.go's Usage).
    refused = await kube.wait_group(NS, "b", lambda g: bool(condition(g, "ClaimProblem")), "the claim's refusal")
    assert "exceeded quota: h100s, requested: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2, used: " \
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2" in condition(refused, "ClaimProblem")["message"]
    assert condition(refused, "ClaimProblem")["message"].endswith("; made once the quota has room")
    assert await dra.claim(kube, NS, "b-devices") is None

    # Once a is gone its claim no longer counts: b is placed.
    await kube.delete_pod(NS, "a-0")
    await kube.delete_group(NS, "a")
    await kube.wait_bound(NS, "b-0")
    assert len(dra.allocated(await dra.claim(kube, NS, "b-devices"))) == 2


async def test_a_dra_group_whose_claim_the_quota_refused_holds_no_devices(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    """A claim that is not a group's takes 2 of the quota's 3: the group asking for 2 cannot have its claim (quota
    admission refuses it), so the operator must not hold 2 devices for it either. ``status.used`` does not count a
    claim that was never made: nothing of it is to be taken off."""
    await _quota_of_three_claimed_devices(cluster, kube, operator, lambda q: q.used.get(CLASS) == 0)
    tenants_own = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "tenants-own", "namespace": NS},
                   "spec": {"devices": {"requests": [{"name": "devices", "exactly": {
                       "deviceClassName": CLASS, "allocationMode": "ExactCount", "count": 2}}]}}}
    await kube._json(kube.custom.create_namespaced_custom_object(  # through quota admission, which charges it
        "resource.k8s.io", "v1", NS, "resourceclaims", tenants_own, _preload_content=False))
    quotas = operator.memo.runtime.scheduler.quotas
    await kube.wait_for(lambda: any(q.used.get(CLASS) == 2 for q in quotas.quotas(NS)),
                        "the operator to see the tenant's claim counted")

    await _b_refused_for_quota(kube)  # 2 + 2 > 3, on a cluster with 8 devices free
    assert operator.memo.runtime.ctx.ledger.allocation((NS, "b")) is None


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 1, "dra": True, "dra_shared": True}],
                         indirect=True)
async def test_memory_shares_of_a_device_that_allows_multiple_allocations(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    share = {CLASS: {"capacity": {"memory": "40Gi"}}}
    for group in ("s1", "s2"):
        await dra.create_dra_group(kube, NS, group, 1, share=share)
        await dra.create_member(kube, NS, f"{group}-0", group)
        await kube.wait_bound(NS, f"{group}-0")
    results = []
    for group in ("s1", "s2"):
        claim = await dra.claim(kube, NS, f"{group}-devices")
        assert claim is not None
        results += claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"], r["consumedCapacity"]) for r in results] == [
        ("gpu-node-0", "gpu-0", {"memory": "40Gi"})] * 2
    assert len({r["shareID"] for r in results}) == 2
    assert cluster.kubelet is not None
    await waiting.until(lambda: all((NS, p) in cluster.kubelet.started_cdi for p in ("s1-0", "s2-0")), "started")
    # The sandbox GPU has 80Gi: a third share of 40Gi does not fit beside the two.
    await dra.create_dra_group(kube, NS, "s3", 1, share=share)
    await dra.create_member(kube, NS, "s3-0", "s3")
    waited = await kube.wait_group(NS, "s3", lambda g: bool(condition(g).get("message")), "a reason")
    assert "0/1 nodes are available" in condition(waited)["message"]
    assert dra.allocated(await dra.claim(kube, NS, "s3-devices")) == []
