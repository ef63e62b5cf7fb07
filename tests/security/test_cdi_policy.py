"""The CDI hand-over's annotations (CONTRACT §12) under the shipped admission policy: only the operator writes
them. A tenant who could name ``nvidia.cdi.k8s.io/container.<name>: nvidia.com/gpu=all`` would get every GPU of a
CDI node, so setting, changing or removing one is refused on CREATE, UPDATE and pods/binding; namespaces the
policy exempts (the GPU Operator's own) keep theirs. The operator here defaults to ``--handover cdi``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from deviceshare.api import handovers, names
from deviceshare.sandbox import Sandbox, identity
from tests.operator.conftest import RunningOperator, operator_config, start_operator
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.attacks import annotate, refused

pytestmark = pytest.mark.usefixtures("webhook", "operator")
NS, _ = attacks.TENANT_NAMESPACES
RULE = "rule cdi-annotations-operator-only"
ALL = "nvidia.com/gpu=all"


@pytest.fixture
async def operator(sandbox: Sandbox) -> AsyncIterator[RunningOperator]:
    kubeconfig = sandbox.kubeconfig_as(identity.OPERATOR_TOKEN)
    running = await start_operator(operator_config(sandbox, kubeconfig=str(kubeconfig),
                                                   handovers=handovers.Handovers("cdi")))
    yield running
    await running.stop()


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


@pytest.mark.parametrize("key", [
    "nvidia.cdi.k8s.io/container.main", "nvidia.cdi.k8s.io/pod", "nvidia.cdi.k8s.io", "cdi.k8s.io/gpu",
])
async def test_a_tenant_may_not_create_a_pod_that_names_cdi_devices(tenant: Kube, admin: Kube, key: str) -> None:
    refusal = await refused(attacks.create_pod(tenant, attacks.pod(NS, "grab", annotations={key: ALL})))
    assert refusal.status == 403
    assert RULE in refusal.message and "tenant-alice may not set, change or remove them" in refusal.message
    assert await tenant.pod(NS, "grab") is None
    # The GPU Operator's namespace, exempt by its label, keeps its own (management pods name devices so).
    assert await attacks.create_pod(admin, attacks.pod(attacks.EXEMPT_NAMESPACE, "validator", annotations={key: ALL}))


async def test_a_member_cannot_change_remove_or_add_cdi_annotations(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a")
    before = _annotations(await attacks.member(tenant, NS, "a", "a-0"))
    held = before["nvidia.cdi.k8s.io/container.main"]  # written by the operator, in its Binding
    assert held.startswith("nvidia.com/gpu=") and "," not in held

    for change in ({"nvidia.cdi.k8s.io/container.main": ALL}, {"nvidia.cdi.k8s.io/container.main": None},
                   {"nvidia.cdi.k8s.io/pod": ALL}):
        refusal = await refused(annotate(tenant, NS, "a-0", change))
        assert refusal.status == 403 and RULE in refusal.message, change
    assert _annotations(await tenant.pod(NS, "a-0")) == before
    # Other annotations stay the tenant's to edit: the operator's CDI annotation, unchanged, is no obstacle.
    assert _annotations(await annotate(tenant, NS, "a-0", {"team": "vision"}))["team"] == "vision"


async def test_only_the_operator_may_bind_with_cdi_annotations(
    tenant: Kube, as_operator: Kube, sandbox: Sandbox
) -> None:
    await attacks.create_pod(tenant, attacks.pod(NS, "p", tolerations=[{"key": "example.com/x", "operator": "Exists"}]))
    claim = {"nvidia.cdi.k8s.io/container.main": ALL}
    by_tenant = await refused(attacks.bind(tenant, NS, "p", "gpu-node-1", claim))
    assert by_tenant.status == 403 and RULE in by_tenant.message and "pods/binding p" in by_tenant.message
    assert sandbox.get("pods", "p", NS)["spec"].get("nodeName") is None  # type: ignore[index]

    await attacks.bind(as_operator, NS, "p", "gpu-node-1", claim)
    assert claim.items() <= _annotations(sandbox.get("pods", "p", NS)).items()


async def test_members_on_cdi_nodes_run_with_exactly_their_group_devices(tenant: Kube, sandbox: Sandbox) -> None:
    for node in ("gpu-node-0", "gpu-node-1"):  # configured as CDI nodes (the operator's default is cdi already)
        sandbox.patch("nodes", node, {"metadata": {"labels": {names.NODE_HANDOVER_LABEL: "cdi"}}})
    await attacks.group(tenant, NS, "pair", gpus=2)
    bound = _annotations(await attacks.member(tenant, NS, "pair", "pair-0"))
    ids = bound[names.env_annotation("NVIDIA_VISIBLE_DEVICES")].split(",")
    assert bound["nvidia.cdi.k8s.io/container.main"] == ",".join(f"nvidia.com/gpu={i}" for i in ids)
    # The node's kubelet runs it by CDI: its container gets exactly those devices.
    started = await tenant.wait_for(
        lambda: sandbox.kubelet.started_devices.get((NS, "pair-0")) if sandbox.kubelet else None, "pair-0 started")
    assert started == {"main": tuple(f"nvidia.com/gpu={i}" for i in ids)}
