"""A DRA group's ResourceClaim (CONTRACT §13): made as soon as the group is seen, never adopted when it is someone
else's, and deleted at release only once the API shows nothing holds it; observed through the API only."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.operator import draclaims
from deviceshare.sandbox import Sandbox
from tests.operator.kube import Kube
from tests.sandbox.dra_objects import allocation, consumer
from tests.sandbox.dra_objects import claim as foreign_claim

pytestmark = pytest.mark.usefixtures("operator")

NS = "ml"
H100 = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 2, "dra": True, "dra_shared": True}


async def create_dra_group(kube: Kube, name: str, **spec: Any) -> dict[str, Any]:
    await kube.ensure_namespace(NS)
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": NS},
            "spec": {"claim": {"deviceClassName": "gpu.nvidia.com", "count": 2}, **spec}}
    created: dict[str, Any] = await kube._json(kube.custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, NS, names.PLURAL, body, _preload_content=False))
    return created


async def claim_of(kube: Kube, cluster: Sandbox, group: str) -> dict[str, Any]:
    found: dict[str, Any] = await kube.wait_for(
        lambda: cluster.get("resourceclaims", f"{group}-devices", NS), f"the claim of {group}")
    return found


def problem(group: dict[str, Any] | None) -> dict[str, Any] | None:
    conditions = ((group or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "ClaimProblem"), None)


async def test_a_group_with_no_pod_gets_its_claim_owned_and_held(kube: Kube, cluster: Sandbox) -> None:
    share = {"gpu.nvidia.com": {"capacity": {"memory": "24Gi"}}}
    group = await create_dra_group(kube, "trainer", claim={"deviceClassName": "gpu.nvidia.com", "count": 2,
                                                          "selectors": [H100]}, share=share)
    claim = await claim_of(kube, cluster, "trainer")
    meta = claim["metadata"]
    assert meta["ownerReferences"] == [{"apiVersion": names.API_VERSION, "kind": names.KIND, "name": "trainer",
                                        "uid": group["metadata"]["uid"], "controller": True}]
    assert meta["finalizers"] == [names.GROUP_FINALIZER]
    assert meta["labels"] == {names.POD_GROUP_LABEL: "trainer"}
    assert claim["spec"]["devices"]["requests"] == [{"name": "devices", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": H100}}], "capacity": {"requests": {"memory": "24Gi"}}}}]
    assert "allocation" not in (claim.get("status") or {})  # the allocation's to write, not ours
    async def created_event() -> bool:  # events are posted in the background
        return "ClaimCreated" in {e["reason"] for e in await kube.events(NS, "trainer")}

    await kube.wait_for(created_event, "the ClaimCreated event")


async def test_a_group_of_extended_resources_gets_no_claim(kube: Kube, cluster: Sandbox) -> None:
    await kube.create_group(NS, "plain", {"nvidia.com/gpu": 1})
    await create_dra_group(kube, "dra")
    await claim_of(kube, cluster, "dra")  # the reconciler has run; the plain group got nothing
    assert [c["metadata"]["name"] for c in cluster.list("resourceclaims")] == ["dra-devices"]


async def test_release_deletes_the_claim_before_the_group_goes(kube: Kube, cluster: Sandbox) -> None:
    await create_dra_group(kube, "trainer")
    await claim_of(kube, cluster, "trainer")
    await kube.delete_group(NS, "trainer")
    await kube.wait_for(lambda: cluster.get("resourceclaims", "trainer-devices", NS) is None, "the claim deleted")
    await kube.wait_for(lambda: cluster.get("sdg", "trainer", NS) is None, "the group gone")


async def test_an_allocated_claim_holds_the_group_until_the_allocation_is_cleared(
    kube: Kube, cluster: Sandbox
) -> None:
    """Devices are released only when the API shows nobody holds them: a claim allocated and reserved (here by
    hand, as a scheduler writes it) is not deleted, and the group's finalizer stays, until both are cleared."""
    await create_dra_group(kube, "trainer")
    await claim_of(kube, cluster, "trainer")
    cluster.patch("resourceclaims", "trainer-devices", {"status": {
        "allocation": allocation("gpu-node-0", "gpu-0", "gpu-1"), "reservedFor": [consumer("trainer-0")]}},
        NS, subresource="status")
    looks = cluster.inject_fault("GET", r"/namespaces/ml/resourceclaims/trainer-devices$", times=None)  # counts
    await kube.delete_group(NS, "trainer")
    await kube.wait_for(lambda: looks.seen >= 3, "three looks at the claim by the release")
    fresh = cluster.get("resourceclaims", "trainer-devices", NS)
    assert fresh is not None and not fresh["metadata"].get("deletionTimestamp")
    assert names.GROUP_FINALIZER in cluster.get("sdg", "trainer", NS)["metadata"]["finalizers"]
    cluster.patch("resourceclaims", "trainer-devices", {"status": {"reservedFor": None}}, NS, subresource="status")
    cluster.patch("resourceclaims", "trainer-devices", {"status": {"allocation": None}}, NS, subresource="status")
    await kube.wait_for(lambda: cluster.get("resourceclaims", "trainer-devices", NS) is None, "the claim deleted")
    await kube.wait_for(lambda: cluster.get("sdg", "trainer", NS) is None, "the group gone")


async def test_a_claim_of_that_name_made_by_someone_else_is_never_adopted(kube: Kube, cluster: Sandbox) -> None:
    await kube.ensure_namespace(NS)
    theirs = foreign_claim("trainer-devices", count=1)
    theirs["metadata"]["namespace"] = NS
    cluster.create(theirs)
    await create_dra_group(kube, "trainer")
    group = await kube.wait_group(NS, "trainer", lambda g: problem(g) is not None, "ClaimProblem")
    condition = problem(group)
    assert condition is not None and condition["reason"] == "ClaimNotOwned" and condition["status"] == "True"
    assert "ResourceClaim ml/trainer-devices exists and is not this group's" in condition["message"]
    kept = cluster.get("resourceclaims", "trainer-devices", NS)
    assert kept is not None and "ownerReferences" not in kept["metadata"] and "finalizers" not in kept["metadata"]
    assert kept["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1  # untouched
    # Its owner deletes it: the group's own claim is made and the condition goes.
    cluster.delete("resourceclaims", "trainer-devices", NS)
    await kube.wait_group(NS, "trainer", lambda g: problem(g) is None, "ClaimProblem cleared")
    ours = await claim_of(kube, cluster, "trainer")
    assert ours["metadata"]["ownerReferences"][0]["name"] == "trainer"


async def test_a_create_whose_answer_is_lost_is_read_back_not_made_twice(kube: Kube, cluster: Sandbox) -> None:
    fault = cluster.inject_fault("POST", rf"/namespaces/{NS}/resourceclaims$", status=504, applied=True)
    group = await create_dra_group(kube, "trainer")
    claim = await claim_of(kube, cluster, "trainer")
    await kube.wait_for(lambda: fault.fired == 1, "the lost answer")
    assert claim["metadata"]["ownerReferences"][0]["uid"] == group["metadata"]["uid"]
    assert [c["metadata"]["name"] for c in cluster.list("resourceclaims")] == ["trainer-devices"]
    await create_dra_group(kube, "other")  # the next reconciles go on: no problem reported for ours
    await claim_of(kube, cluster, "other")
    assert problem(cluster.get("sdg", "trainer", NS)) is None


async def test_a_spec_changed_while_pending_replaces_the_unallocated_claim(kube: Kube, cluster: Sandbox) -> None:
    await create_dra_group(kube, "trainer")
    first = await claim_of(kube, cluster, "trainer")
    cluster.patch("sdg", "trainer", {"spec": {"claim": {"count": 1}}}, NS)

    def replaced() -> dict[str, Any] | None:
        now = cluster.get("resourceclaims", "trainer-devices", NS)
        return now if now and now["metadata"]["uid"] != first["metadata"]["uid"] else None

    second = await kube.wait_for(replaced, "the claim replaced")
    assert second["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1


async def test_a_claim_the_api_refuses_is_reported_on_the_group(kube: Kube, cluster: Sandbox) -> None:
    """The CRD cannot compile CEL; the API server does when the claim is created, and the group says why."""
    await create_dra_group(kube, "typo", claim={"deviceClassName": "gpu.nvidia.com", "count": 1,
                                                "selectors": ["device.attributes['gpu.nvidia.com'].productName ==="]})
    group = await kube.wait_group(NS, "typo", lambda g: problem(g) is not None, "ClaimProblem")
    condition = problem(group)
    assert condition is not None and condition["reason"] == "ClaimRefused"
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in condition["message"]
    assert condition["message"].endswith("fix spec.claim")
    assert cluster.get("resourceclaims", "typo-devices", NS) is None


async def test_an_allocated_claim_someone_deletes_keeps_our_finalizer_while_it_is_held(
    kube: Kube, cluster: Sandbox
) -> None:
    """A tenant deletes the claim of a group whose member holds it: the finalizer keeps the allocation in the API
    (devices are never freed under a pod) and the group says why its claim cannot be replaced yet."""
    await create_dra_group(kube, "trainer")
    await claim_of(kube, cluster, "trainer")
    cluster.patch("resourceclaims", "trainer-devices", {"status": {
        "allocation": allocation("gpu-node-0", "gpu-0", "gpu-1"), "reservedFor": [consumer("trainer-0")]}},
        NS, subresource="status")
    cluster.delete("resourceclaims", "trainer-devices", NS)
    cluster.patch("sdg", "trainer", {"spec": {"maxMembers": 4}}, NS)  # a new generation: the claim is read again
    group = await kube.wait_group(NS, "trainer", lambda g: problem(g) is not None, "ClaimProblem")
    assert (problem(group) or {}).get("reason") == "ClaimInUse"
    held = cluster.get("resourceclaims", "trainer-devices", NS)
    assert held is not None and held["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
    assert held["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


async def test_a_refused_claim_is_asked_for_again_less_and_less_often(
    kube: Kube, cluster: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim the API server refuses (here a selector that does not compile; a full quota alike) is not POSTed
    again every second for as long as it is refused: each retry waits twice as long as the last, as a controller's
    rate-limited workqueue does. The base is shortened so the doubling shows in a second."""
    monkeypatch.setattr(draclaims, "RECHECK_S", 0.1)
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"

    def posts() -> int:
        return sum(1 for r in cluster.api if str(r.method.value) == "POST" and r.url.path == path)

    await create_dra_group(kube, "typo", claim={"deviceClassName": "gpu.nvidia.com", "count": 1,
                                                "selectors": ["device.attributes['gpu.nvidia.com'].productName ==="]})
    seen: list[float] = []
    async with asyncio.timeout(60):
        while len(seen) < 5:  # the time each refused POST is first seen (polled: each gap +- 5 ms)
            if posts() > len(seen):
                seen.append(time.monotonic())
            await asyncio.sleep(0.005)
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    # Each gap is at least its backoff however busy the machine (a stall only lengthens one), so the last one
    # alone tells a backoff (0.8 s) from a fixed recheck (0.1 s); comparing it with the first would not: a stall
    # there lengthens the first.
    assert gaps[-1] >= 0.7, f"retries {gaps} did not back off (0.1, 0.2, 0.4, 0.8 s expected)"
