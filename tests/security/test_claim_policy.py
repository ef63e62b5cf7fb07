"""A DRA group's ResourceClaim (CONTRACT §13): the policy ``deviceshare-group-claims`` of manifests/base keeps its
``status.allocation`` and ``status.reservedFor`` the operator's, and the marks that say it is a group's
(docs/security.md, "DRA groups: who may write a claim").

The attack it stops: a tenant, who may usually write ResourceClaims (and, with a broad role, their status) in their
own namespace, adds a pod of their own to ``reservedFor`` of their group's claim (the kubelet then hands that pod the
group's devices), clears the allocation so the devices look free to every allocator, or unlabels the claim to slip
out of the policy. kube-scheduler, for a non-member pod that names the claim, would do the same. The resourceclaim
controller of kube-controller-manager only ever removes pods that are gone from ``reservedFor``: that passes.

Everything goes through the API of a sandbox with the real YAML of manifests/base loaded and evaluated by its CEL
evaluator, each client authenticated as the user it plays.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.sandbox import Sandbox, identity
from tests.operator import dra
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.attacks import refused

NS = attacks.TENANT_NAMESPACES[0]
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"  # k8s.io/api/resource/v1 Finalizer
# What kube-controller-manager's resourceclaim controller (--use-service-account-credentials) and kube-scheduler
# authenticate as; the policy's defaults name the first (charts/deviceshare/values.yaml).
CONTROLLER = identity.service_account("kube-system", "resource-claim-controller")
SCHEDULER = identity.User("system:kube-scheduler", ("system:authenticated",))
CONTROLLER_TOKEN, SCHEDULER_TOKEN = "resource-claim-controller-token", "kube-scheduler-token"


@pytest.fixture
def sandbox_overrides() -> dict[str, object]:
    """The security suite's sandbox with DRA (the simulated driver's slices), untainted (the members here are made
    without the webhook's toleration), and two more users."""
    return {"dra": True, "shared_taint": False, "users": {CONTROLLER_TOKEN: CONTROLLER, SCHEDULER_TOKEN: SCHEDULER}}


@pytest.fixture
async def controller(sandbox: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(sandbox.kubeconfig_as(CONTROLLER_TOKEN))) as kube:
        yield kube


@pytest.fixture
async def scheduler(sandbox: Sandbox) -> AsyncIterator[Kube]:
    async with Kube.connect(str(sandbox.kubeconfig_as(SCHEDULER_TOKEN))) as kube:
        yield kube


# -- writes as the clients send them -----------------------------------------------------------------------------


async def patch_claim(kube: Kube, name: str, body: Mapping[str, Any], *, status: bool = False) -> dict[str, Any]:
    """``kubectl patch resourceclaim NAME [--subresource=status] --type=merge -p BODY``."""
    api = kube.custom.patch_namespaced_custom_object_status if status else kube.custom.patch_namespaced_custom_object
    patched: dict[str, Any] = await kube._json(api(dra.GROUP, dra.VERSION, NS, "resourceclaims", name, dict(body),
                                                   _content_type="application/merge-patch+json",
                                                   _preload_content=False))
    return patched


async def replace_status(kube: Kube, claim: Mapping[str, Any]) -> dict[str, Any]:
    """An ``UpdateStatus`` of the whole claim, as kube-scheduler and the resourceclaim controller write one."""
    replaced: dict[str, Any] = await kube._json(kube.custom.replace_namespaced_custom_object_status(
        dra.GROUP, dra.VERSION, NS, "resourceclaims", claim["metadata"]["name"], dict(claim), _preload_content=False))
    return replaced


async def create_claim(kube: Kube, name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    body = {"apiVersion": f"{dra.GROUP}/{dra.VERSION}", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS, "labels": dict(labels or {})},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": dra.CLASS}}]}}}
    created: dict[str, Any] = await kube._json(kube.custom.create_namespaced_custom_object(
        dra.GROUP, dra.VERSION, NS, "resourceclaims", body, _preload_content=False))
    return created


def consumer(pod: str) -> dict[str, str]:
    return {"resource": "pods", "name": pod, "uid": f"uid-{pod}"}


def allocation(node: str, devices: Sequence[str], request: str = names.CLAIM_REQUEST_NAME) -> dict[str, Any]:
    """A ``status.allocation`` as kube-scheduler (and the operator) write one."""
    return {"devices": {"results": [{"request": request, "driver": dra.DRIVER, "pool": node, "device": d}
                                    for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def group_claim(sandbox: Sandbox, group: str, reserved: Sequence[str]) -> dict[str, Any]:
    """A group's claim as the operator makes and allocates it (written in-process: no request, no admission)."""
    name = names.claim_name(group)
    sandbox.create({
        "apiVersion": f"{dra.GROUP}/{dra.VERSION}", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "labels": {names.POD_GROUP_LABEL: group},
                     "finalizers": [names.GROUP_FINALIZER],
                     "ownerReferences": [{"apiVersion": names.API_VERSION, "kind": names.KIND, "name": group,
                                          "uid": f"uid-{group}", "controller": True}]},
        "spec": {"devices": {"requests": [{"name": names.CLAIM_REQUEST_NAME,
                                           "exactly": {"deviceClassName": dra.CLASS, "count": 2}}]}},
    })
    return sandbox.patch("resourceclaims", name, {"status": {
        "allocation": allocation("gpu-node-0", ["gpu-0", "gpu-1"]),
        "reservedFor": [consumer(p) for p in reserved]}}, NS, subresource="status")


def held(claim: Mapping[str, Any] | None) -> tuple[Any, list[Any]]:
    status = (claim or {}).get("status") or {}
    return status.get("allocation"), list(status.get("reservedFor") or [])


# -- the attacks ---------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("operator")
async def test_a_tenant_cannot_write_a_group_claims_status_or_marks_and_the_operator_still_can(
    tenant: Kube, scheduler: Kube, sandbox: Sandbox
) -> None:
    await dra.create_dra_group(tenant, NS, "trainer", 2)
    await dra.create_member(tenant, NS, "trainer-0", "trainer")
    await tenant.wait_bound(NS, "trainer-0")
    claim = await dra.claim(tenant, NS, "trainer-devices")
    assert claim is not None and dra.reserved(claim) == ["trainer-0"]
    before = held(claim)

    # kubectl patch resourceclaim trainer-devices --subresource=status: a pod of the tenant's own reserved.
    intruder = await refused(patch_claim(tenant, "trainer-devices", {"status": {"reservedFor": [
        *claim["status"]["reservedFor"], consumer("intruder")]}}, status=True))
    assert intruder.status == 403
    assert "rule group-claim-reserved-for-operator-only" in intruder.message
    assert "tenant-alice may not change it" in intruder.message
    # ... the allocation cleared (the devices would look free to kube-scheduler and to a restarted operator).
    cleared = await refused(patch_claim(tenant, "trainer-devices",
                                        {"status": {"allocation": None, "reservedFor": None}}, status=True))
    assert "rule group-claim-allocation-operator-only" in cleared.message
    # kube-scheduler reserving the claim for a non-member pod that names it (its bindClaim, an UpdateStatus).
    shown = await dra.claim(tenant, NS, "trainer-devices")
    assert shown is not None
    shown["status"]["reservedFor"].append(consumer("plain-pod"))
    by_scheduler = await refused(replace_status(scheduler, shown))
    assert "rule group-claim-reserved-for-operator-only" in by_scheduler.message
    assert "system:kube-scheduler may not change it" in by_scheduler.message

    # The marks: unlabelled (to slip out of the policy), kube-scheduler's finalizer added, a look-alike made.
    unlabelled = await refused(patch_claim(tenant, "trainer-devices",
                                           {"metadata": {"labels": {names.POD_GROUP_LABEL: None}}}))
    assert "rule group-claim-marks-fixed" in unlabelled.message
    protected = await refused(patch_claim(tenant, "trainer-devices", {"metadata": {
        "finalizers": [names.GROUP_FINALIZER, DELETE_PROTECTION]}}))
    assert "rule group-claim-no-delete-protection" in protected.message
    forged = await refused(create_claim(tenant, "lookalike", {names.POD_GROUP_LABEL: "trainer"}))
    assert "rule group-claim-operator-made" in forged.message
    assert held(await dra.claim(tenant, NS, "trainer-devices")) == before

    # What the policy is not about goes through: another label, the tenant's own finalizer.
    await patch_claim(tenant, "trainer-devices", {"metadata": {"labels": {"team": "vision"}}})

    # The operator's own writes pass: a second member reserved, a gone one pruned, the release cleared and deleted.
    await dra.create_member(tenant, NS, "trainer-1", "trainer")
    await tenant.wait_bound(NS, "trainer-1")
    assert dra.reserved(await dra.claim(tenant, NS, "trainer-devices")) == ["trainer-0", "trainer-1"]
    await tenant.delete_pod(NS, "trainer-1")

    async def pruned() -> bool:
        return dra.reserved(await dra.claim(tenant, NS, "trainer-devices")) == ["trainer-0"]

    await tenant.wait_for(pruned, "trainer-1 gone from reservedFor")
    await tenant.delete_group(NS, "trainer")
    await tenant.delete_pod(NS, "trainer-0")
    await tenant.wait_for(lambda: sandbox.get(names.PLURAL, "trainer", NS) is None,
                          "the group released, its claim cleared and deleted by the operator")
    assert sandbox.get("resourceclaims", "trainer-devices", NS) is None


async def test_the_resourceclaim_controller_may_only_remove_pods_from_reserved_for(
    controller: Kube, sandbox: Sandbox
) -> None:
    claim = group_claim(sandbox, "trainer", ["trainer-0", "trainer-1"])
    allocated = claim["status"]["allocation"]

    added = await refused(patch_claim(controller, "trainer-devices", {"status": {"reservedFor": [
        *claim["status"]["reservedFor"], consumer("other")]}}, status=True))
    assert "rule group-claim-reserved-for-operator-only" in added.message
    assert "system:serviceaccount:kube-system:resource-claim-controller may not change it" in added.message

    # syncClaim for a pod that is gone: an UpdateStatus without it.
    claim["status"]["reservedFor"] = [consumer("trainer-0")]
    written = await replace_status(controller, claim)
    assert held(written) == (allocated, [consumer("trainer-0")])

    # The last pod gone: it would clear the allocation in the same write if the claim held delete-protection.
    written["status"] = {"allocation": None, "reservedFor": None}
    deallocated = await refused(replace_status(controller, written))
    assert "rule group-claim-allocation-operator-only" in deallocated.message
    assert held(sandbox.get("resourceclaims", "trainer-devices", NS)) == (allocated, [consumer("trainer-0")])


async def test_a_tenants_own_claim_is_none_of_the_policys_business(
    tenant: Kube, scheduler: Kube, controller: Kube
) -> None:
    claim = await create_claim(tenant, "mine")
    # kube-scheduler allocates and reserves it for the tenant's pod; the controller releases it; the tenant writes it.
    claim["status"] = {"allocation": allocation("gpu-node-1", ["gpu-3"], "gpus"), "reservedFor": [consumer("p")]}
    claim = await replace_status(scheduler, claim)
    assert held(claim)[1] == [consumer("p")]
    claim["status"] = {}
    claim = await replace_status(controller, claim)
    assert held(claim) == (None, [])
    await patch_claim(tenant, "mine", {"status": {"allocation": allocation("gpu-node-1", ["gpu-2"], "gpus")}},
                      status=True)
    await patch_claim(tenant, "mine", {"metadata": {"finalizers": [DELETE_PROTECTION]}})
    # ... but the tenant cannot make it look like a group's claim.
    labelled = await refused(patch_claim(tenant, "mine", {"metadata": {"labels": {names.POD_GROUP_LABEL: "x"}}}))
    assert "rule group-claim-marks-fixed" in labelled.message
    owned = await refused(patch_claim(tenant, "mine", {"metadata": {"ownerReferences": [
        {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": "x", "uid": "uid-x", "controller": True}]}}))
    assert "rule group-claim-marks-fixed" in owned.message


async def test_random_status_writes_never_give_a_group_claims_devices_to_anyone_else(
    sandbox: Sandbox, tenant: Kube, scheduler: Kube, controller: Kube, as_operator: Kube
) -> None:
    """Whoever writes what: only the operator sets or clears the allocation or adds to reservedFor; the controller's
    removals and anyone's write that changes neither go through."""
    claim = group_claim(sandbox, "g", ["a", "b"])
    allocated = claim["status"]["allocation"]
    writers = {"operator": as_operator, "controller": controller, "scheduler": scheduler, "tenant": tenant}
    rng = random.Random(29)
    outcomes: dict[tuple[str, bool], int] = {}
    for _ in range(60):
        who = rng.choice(sorted(writers))
        old_allocation, old_reserved = held(sandbox.get("resourceclaims", "g-devices", NS))
        pool = [consumer(p) for p in "abcd"]
        reserved = rng.sample(pool, rng.randint(0, 3)) if rng.random() < 0.7 else list(old_reserved)
        new_allocation = old_allocation if rng.random() < 0.8 else (None if old_allocation else allocated)
        if new_allocation is None:
            reserved = []  # kube-apiserver refuses reservedFor without an allocation
        try:
            await patch_claim(writers[who], "g-devices", {"status": {"allocation": new_allocation,
                                                                     "reservedFor": reserved or None}}, status=True)
            accepted = True
        except k8s.ApiException as e:
            assert e.status == 403 and "rule group-claim-" in str(e.reason), e.reason
            accepted = False
        now_allocation, now_reserved = held(sandbox.get("resourceclaims", "g-devices", NS))
        outcomes[(who, accepted)] = outcomes.get((who, accepted), 0) + 1
        if who == "operator":
            assert accepted
            continue
        assert now_allocation == old_allocation, f"{who} changed the allocation"
        assert all(r in old_reserved for r in now_reserved), f"{who} added to reservedFor: {now_reserved}"
        unchanged = new_allocation == old_allocation and reserved == old_reserved
        removes_only = new_allocation == old_allocation and all(r in old_reserved for r in reserved)
        assert accepted == (unchanged or (who == "controller" and removes_only)), (who, reserved, old_reserved)
    for who in ("controller", "scheduler", "tenant"):  # the walk tried both outcomes
        assert outcomes.get((who, False)), (who, outcomes)
    assert outcomes.get(("controller", True)), outcomes


async def test_only_the_operator_removes_a_group_claims_finalizer(tenant: Kube, sandbox: Sandbox) -> None:
    """Without its finalizer a tenant deletes the claim while a member still runs on its devices (the kubelet keeps
    a running pod whose claim is gone): kube-scheduler, which counts only existing claims' allocations, then hands
    those GPUs to another tenant's claim, and that tenant's pod shares them with the group."""
    group_claim(sandbox, "trainer", ["trainer-0"])
    dropped = await refused(patch_claim(tenant, "trainer-devices", {"metadata": {"finalizers": None}}))
    assert dropped.status == 403
    assert "rule group-claim-finalizer-operator-only" in dropped.message
    assert "tenant-alice may not remove them" in dropped.message
    shown = sandbox.get("resourceclaims", "trainer-devices", NS)
    assert shown is not None and shown["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
    # The tenant's own finalizer beside it comes and goes.
    await patch_claim(tenant, "trainer-devices", {"metadata": {"finalizers": [names.GROUP_FINALIZER, "team.io/x"]}})
    await patch_claim(tenant, "trainer-devices", {"metadata": {"finalizers": [names.GROUP_FINALIZER]}})


async def test_an_owner_reference_rewritten_in_place_passes_and_a_new_group_owner_does_not(
    tenant: Kube, sandbox: Sandbox
) -> None:
    """The garbage collector rewrites the group's owner reference in place (``blockOwnerDeletion: false`` when it
    unblocks a foreground deletion): the same owner (uid, name) passes; another SharedDeviceGroup owner does not."""
    claim = group_claim(sandbox, "trainer", ["trainer-0"])
    owner = dict(claim["metadata"]["ownerReferences"][0])
    rewritten = await patch_claim(tenant, "trainer-devices", {"metadata": {"ownerReferences": [
        {**owner, "blockOwnerDeletion": False}]}})
    assert rewritten["metadata"]["ownerReferences"] == [{**owner, "blockOwnerDeletion": False}]
    swapped = await refused(patch_claim(tenant, "trainer-devices", {"metadata": {"ownerReferences": [
        {**owner, "uid": "uid-someone-else"}]}}))
    assert "rule group-claim-marks-fixed" in swapped.message
