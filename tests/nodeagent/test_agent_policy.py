"""An agent is kept to its own Node by the shipped admission policy, enforced by the sandbox's policy engine
with the node name bound into the agent's service-account token (as kube-apiserver 1.30+ binds it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import connecting, rest
from deviceshare.nodeagent import publishing
from deviceshare.sandbox import Sandbox, identity
from deviceshare.sandbox.cluster import load_manifests
from tests.nodeagent.conftest import MakeAgent

ROOT = Path(__file__).resolve().parents[2]
AGENT = identity.service_account("deviceshare-node", "deviceshare-node-agent")
ON_NODE_0 = "agent-on-gpu-node-0"
UNBOUND = "agent-token-bound-to-no-node"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Sandbox]:
    users = {ON_NODE_0: identity.bound_to_node(AGENT, "gpu-node-0"), UNBOUND: AGENT}
    async with Sandbox(nodes=2, gpus=4, kubelet_delay=None, kubeconfig_path=tmp_path / "kubeconfig",
                       users=users) as sandbox:
        for doc in load_manifests(ROOT / "manifests" / "node-agent" / "node-agent.yaml"):
            if doc["kind"].startswith("ValidatingAdmissionPolicy"):
                sandbox.create(doc)
        yield sandbox


@pytest.fixture
async def as_agent(cluster: Sandbox) -> AsyncIterator[k8s.ApiClient]:
    async with await connecting.api_client(str(cluster.kubeconfig_as(ON_NODE_0))) as client:
        yield client


async def test_the_agent_publishes_on_its_own_node(cluster: Sandbox, make_agent: MakeAgent,
                                                   as_agent: k8s.ApiClient) -> None:
    probe = make_agent("gpu-node-0", client=as_agent)
    assert await probe.agent.sync() is True
    assert names.NODE_TOPOLOGY_ANNOTATION in (cluster.get("nodes", "gpu-node-0") or {})["metadata"]["annotations"]


async def test_the_agent_cannot_write_another_node(cluster: Sandbox, make_agent: MakeAgent,
                                                   as_agent: k8s.ApiClient) -> None:
    probe = make_agent("gpu-node-1", client=as_agent)
    refused = r"rule node-agent-own-node.*\(gpu-node-0\), not UPDATE node gpu-node-1"
    with pytest.raises(publishing.WriteFailed, match=refused):
        await probe.agent.sync()
    assert probe.writes("failed") == 1
    assert names.NODE_DEVICES_ANNOTATION not in ((cluster.get("nodes", "gpu-node-1") or {})["metadata"].get(
        "annotations") or {})


@pytest.mark.parametrize("change", [
    {"metadata": {"labels": {names.NODE_MODE_LABEL: "exclusive"}}},
    {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}},
    {"spec": {"unschedulable": True}},
])
async def test_the_agent_cannot_change_anything_else_of_its_own_node(
    cluster: Sandbox, as_agent: k8s.ApiClient, change: dict[str, object]
) -> None:
    with pytest.raises(rest.ApiError, match="rule node-agent-annotations-only") as refused:
        await rest.call(as_agent, "PATCH", "/api/v1/nodes/gpu-node-0", change,
                        content_type=publishing.MERGE_PATCH)
    assert refused.value.status == 403


async def test_a_token_bound_to_no_node_writes_nothing(cluster: Sandbox, make_agent: MakeAgent) -> None:
    async with await connecting.api_client(str(cluster.kubeconfig_as(UNBOUND))) as client:
        probe = make_agent("gpu-node-0", client=client)
        with pytest.raises(publishing.WriteFailed, match="a token bound to no node"):
            await probe.agent.sync()


async def test_others_are_not_affected_by_the_policy(cluster: Sandbox, make_agent: MakeAgent) -> None:
    probe = make_agent("gpu-node-1")  # the admin's kubeconfig
    assert await probe.agent.sync() is True
