"""The attacks of issue 12 that the admission policy (manifests/base/admission-policy.yaml) stops.

Each test acts as a tenant through the API of a sandbox that runs the policy as shipped, the real
webhook and the real operator, and asserts the refusal (the status and the rule it names) and that
the API state an attacker aimed at is unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox, errors, identity
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.attacks import ENV_VISIBLE, annotate, refused

pytestmark = pytest.mark.usefixtures("webhook", "operator")
NS, OTHER = attacks.TENANT_NAMESPACES


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


async def test_a_member_cannot_unjoin_or_forge_its_devices(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a")
    before = _annotations(await attacks.member(tenant, NS, "a", "a-0"))
    assert before[ENV_VISIBLE]  # the operator wrote it (it acts as its service account)

    # kubectl annotate pod a-0 deviceshare.io/device-group- deviceshare.io/env.NVIDIA_VISIBLE_DEVICES=all
    both = await refused(annotate(tenant, NS, "a-0", {names.POD_GROUP_ANNOTATION: None, ENV_VISIBLE: "all"}))
    assert both.status == 403
    assert "rule group-annotation-immutable" in both.message

    forged = await refused(annotate(tenant, NS, "a-0", {ENV_VISIBLE: "all"}))
    assert forged.status == 403
    assert "rule device-annotations-operator-only" in forged.message
    assert "tenant-alice may not set, change or remove them" in forged.message

    removed = await refused(annotate(tenant, NS, "a-0", {names.POD_SELECTED_DEVICES_ANNOTATION: None}))
    assert "rule device-annotations-operator-only" in removed.message
    assert _annotations(await tenant.pod(NS, "a-0")) == before


async def test_a_member_cannot_be_pointed_at_another_group(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a1")
    await attacks.group(tenant, NS, "a2")
    await attacks.member(tenant, NS, "a1", "a1-0")
    await attacks.member(tenant, NS, "a2", "a2-0")

    repoint = await refused(annotate(tenant, NS, "a1-0", {names.POD_GROUP_ANNOTATION: "a2"}))
    assert repoint.status == 403
    assert "rule group-annotation-immutable" in repoint.message
    assert "pod a1-0" in repoint.message
    assert _annotations(await tenant.pod(NS, "a1-0"))[names.POD_GROUP_ANNOTATION] == "a1"


async def test_late_join_with_our_scheduler_name_is_refused(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a")
    late = attacks.pod(NS, "late", scheduler=names.DEFAULT_SCHEDULER_NAME, limits={attacks.GPU: "4"},
                       env={"NVIDIA_VISIBLE_DEVICES": "all"})
    refusal = await refused(attacks.create_pod(tenant, late))
    assert refusal.status == 403
    assert "rule scheduler-name-needs-group" in refusal.message
    assert await tenant.pod(NS, "late") is None

    # The other road to a late join: a plain pod, annotated afterwards.
    await attacks.create_pod(tenant, attacks.pod(NS, "plain"))
    joined = await refused(annotate(tenant, NS, "plain", {names.POD_GROUP_ANNOTATION: "a"}))
    assert "rule group-annotation-immutable" in joined.message


async def test_forged_device_claims_are_refused_at_creation(tenant: Kube, sandbox: Sandbox) -> None:
    forged = attacks.pod(NS, "fake-claim", node_name="gpu-node-0", tolerations=[],
                         annotations={names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0,1"}'})
    refusal = await refused(attacks.create_pod(tenant, forged))
    assert refusal.status == 403
    assert "rule device-annotations-operator-only" in refusal.message
    assert sandbox.get("pods", "fake-claim", NS) is None

    # Nor may they be added to a pod that already runs (any pod, not only members).
    await attacks.create_pod(tenant, attacks.pod(NS, "web"))
    forged_later = {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}'}
    later = await refused(annotate(tenant, NS, "web", forged_later))
    assert "rule device-annotations-operator-only" in later.message


async def test_only_the_operator_may_bind_with_device_annotations(
    tenant: Kube, as_operator: Kube, sandbox: Sandbox
) -> None:
    # A pod for another scheduler, so the operator leaves it alone while the test binds it by hand.
    await attacks.create_pod(tenant, attacks.pod(NS, "p", tolerations=[{"key": "example.com/x", "operator": "Exists"}]))
    claim = {ENV_VISIBLE: "0,1,2,3", names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0,1,2,3"}'}

    by_tenant = await refused(attacks.bind(tenant, NS, "p", "gpu-node-1", claim))
    assert by_tenant.status == 403
    assert "rule device-annotations-operator-only" in by_tenant.message
    assert "pods/binding p" in by_tenant.message
    legacy = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "annotations": claim},
              "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"}}
    by_legacy = await refused(tenant._json(tenant.core.create_namespaced_binding(NS, legacy, _preload_content=False)))
    assert "rule device-annotations-operator-only" in by_legacy.message
    assert "bindings p" in by_legacy.message
    assert sandbox.get("pods", "p", NS)["spec"].get("nodeName") is None  # type: ignore[index]

    await attacks.bind(as_operator, NS, "p", "gpu-node-1", claim)  # the policy lets the operator's through
    bound = sandbox.get("pods", "p", NS)
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-node-1"
    assert claim.items() <= _annotations(bound).items()


async def test_no_ephemeral_containers_on_pods_that_hold_devices(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a")
    await attacks.member(tenant, NS, "a", "a-0")
    refusal = await refused(attacks.add_ephemeral_container(tenant, NS, "a-0"))
    assert refusal.status == 403
    assert "rule no-ephemeral-containers-on-group-pods" in refusal.message
    assert "ephemeralContainers" not in (await tenant.pod(NS, "a-0"))["spec"]  # type: ignore[index]

    await attacks.create_pod(tenant, attacks.pod(NS, "web"))
    debugged = await attacks.add_ephemeral_container(tenant, NS, "web")  # other pods may still be debugged
    assert debugged["spec"]["ephemeralContainers"][0]["name"] == "debugger"


@pytest.mark.parametrize("toleration", [
    {"key": names.SHARED_NODE_TAINT, "operator": "Exists"},
    {"key": names.SHARED_NODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoExecute"},
    {"operator": "Exists"},  # tolerates every taint, ours included
], ids=["our-key", "our-key-equal", "tolerate-everything"])
async def test_a_non_member_may_not_tolerate_the_shared_node_taint(
    tenant: Kube, admin: Kube, toleration: dict[str, str]
) -> None:
    body = attacks.pod(NS, "squatter", tolerations=[toleration])
    refusal = await refused(attacks.create_pod(tenant, body))
    assert refusal.status == 403
    assert "rule shared-node-toleration" in refusal.message

    # Added later (tolerations may be appended to a running pod): refused the same way.
    await attacks.create_pod(tenant, attacks.pod(NS, "later", tolerations=[]))
    patch = {"spec": {"tolerations": [toleration]}}
    later = await refused(admin._json(tenant.core.patch_namespaced_pod(
        "later", NS, patch, _content_type="application/merge-patch+json", _preload_content=False)))
    assert "rule shared-node-toleration" in later.message

    # The device plugin's namespace is exempt by its label.
    daemon = attacks.pod(attacks.EXEMPT_NAMESPACE, "device-plugin", tolerations=[toleration])
    assert await attacks.create_pod(admin, daemon)


async def test_members_get_the_toleration_and_land_on_tainted_nodes(tenant: Kube, sandbox: Sandbox) -> None:
    node = sandbox.get("nodes", "gpu-node-0")
    assert node is not None and node["spec"]["taints"] == [
        {"key": names.SHARED_NODE_TAINT, "value": "true", "effect": "NoExecute"}]
    await attacks.group(tenant, NS, "a")
    bound = await attacks.member(tenant, NS, "a", "a-0")
    assert {"key": names.SHARED_NODE_TAINT, "operator": "Exists"} in bound["spec"]["tolerations"]
    running = await tenant.wait_for(
        lambda: (sandbox.get("pods", "a-0", NS) or {}).get("status", {}).get("phase") == "Running", "a-0 runs")
    assert running


async def test_a_pod_pinned_to_a_shared_node_is_rejected_by_the_kubelet(tenant: Kube, sandbox: Sandbox) -> None:
    # spec.nodeName skips every scheduler; the NoExecute taint is what the kubelet still checks.
    await attacks.create_pod(tenant, attacks.pod(NS, "pinned", node_name="gpu-node-0",
                                                 env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    pinned = await tenant.wait_for(
        lambda: (sandbox.get("pods", "pinned", NS) or {}).get("status", {}).get("phase") == "Failed",
        "the kubelet to reject the pinned pod")
    assert pinned
    status = sandbox.get("pods", "pinned", NS)["status"]  # type: ignore[index]
    assert status["reason"] == "UntoleratedTaint"
    assert names.SHARED_NODE_TAINT in status["message"]


async def test_the_operator_is_not_hindered(tenant: Kube) -> None:
    """The policy refuses tenants, not the operator: a whole group binds, annotations and all."""
    await attacks.group(tenant, OTHER, "b", gpus=2)
    for i in range(3):
        await attacks.create_pod(tenant, attacks.pod(OTHER, f"b-{i}", group="b"))
    devices = {_annotations(await tenant.wait_bound(OTHER, f"b-{i}"))[ENV_VISIBLE] for i in range(3)}
    assert len(devices) == 1 and len(devices.pop().split(",")) == 2


async def test_the_operators_token_changes_nothing_on_a_pod_but_its_annotations(
    tenant: Kube, as_operator: Kube, sandbox: Sandbox
) -> None:
    """Its RBAC lets the operator patch any pod (to put back device annotations), and RBAC cannot say which
    fields: a stolen operator token could swap an image, in kube-system too. The policy lets it change only
    deviceshare.io/ annotations and the CDI annotations of CONTRACT §12 (issue 32)."""
    await attacks.create_pod(tenant, attacks.pod(NS, "p", tolerations=[{"key": "example.com/x", "operator": "Exists"}]))
    image = sandbox.get("pods", "p", NS)["spec"]["containers"][0]["image"]  # type: ignore[index]

    swap = {"spec": {"containers": [{"name": "main", "image": "evil.example/miner:latest"}]}}
    changed = await refused(as_operator._json(as_operator.core.patch_namespaced_pod(
        "p", NS, swap, _preload_content=False)))
    assert changed.status == 403 and "rule operator-pod-writes" in changed.message
    assert sandbox.get("pods", "p", NS)["spec"]["containers"][0]["image"] == image  # type: ignore[index]
    labelled = await refused(as_operator._json(as_operator.core.patch_namespaced_pod(
        "p", NS, {"metadata": {"labels": {"app": "hijacked"}}}, _preload_content=False)))
    assert "rule operator-pod-writes" in labelled.message
    # kube-apiserver's pod status strategy keeps a pods/status write's labels and finalizers (it resets only spec
    # and ownerReferences); the sandbox's drops all metadata there, so the policy is asked directly with the object
    # kube-apiserver would hand it.
    pod = sandbox.get("pods", "p", NS)
    assert pod is not None
    hijacked = copy.deepcopy(pod)
    hijacked["metadata"]["labels"] = {"app": "hijacked"}
    hijacked["metadata"]["finalizers"] = ["example.com/hold"]
    with pytest.raises(errors.ApiError) as by_status:
        sandbox.admission.policies.check(sandbox.store.catalog.lookup("pods"), NS, "UPDATE", "status", hijacked,
                                         pod, identity.OPERATOR)
    assert "rule operator-pod-writes" in str(by_status.value) and "pods/status p" in str(by_status.value)
    foreign = await refused(annotate(as_operator, NS, "p", {"example.com/owner": "operator"}))
    assert "rule operator-pod-writes" in foreign.message
    bound_foreign = await refused(attacks.bind(as_operator, NS, "p", "gpu-node-1", {"example.com/x": "1"}))
    assert "rule operator-pod-writes" in bound_foreign.message and "pods/binding p" in bound_foreign.message

    ours = {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}',
            "nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0"}
    await annotate(as_operator, NS, "p", ours)  # what it is for: allowed
    assert ours.items() <= _annotations(sandbox.get("pods", "p", NS)).items()
