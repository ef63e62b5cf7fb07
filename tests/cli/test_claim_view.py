"""`inspect` and `explain` show a DRA group's ResourceClaim (CONTRACT §13): its name, and its state as the API shows
it — pending, then allocated on a node with its devices and reserved for its pods."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from deviceshare import cli
from deviceshare.api import names
from deviceshare.cli import claimview
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube
from tests.sandbox.dra_objects import allocation, consumer

NS = "ml"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 2, "dra": True}


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, list(argv))
    return rc, capsys.readouterr().out


async def dra_group_with_a_member(kube: Kube, cluster: Sandbox) -> dict[str, Any]:
    await kube.ensure_namespace(NS)
    cluster.create({"apiVersion": names.API_VERSION, "kind": names.KIND,
                    "metadata": {"name": "trainer", "namespace": NS},
                    # 3 GPUs where the one node has 2: the operator makes the claim but never allocates it, so the
                    # test sees it pending for as long as it likes, then allocates it by hand.
                    "spec": {"claim": {"deviceClassName": "gpu.nvidia.com", "count": 3}}})
    await kube.create_pod(NS, "trainer-0", "trainer")
    claim: dict[str, Any] = await kube.wait_for(
        lambda: cluster.get("resourceclaims", "trainer-devices", NS), "the operator's claim")
    return claim


async def test_a_pending_then_allocated_claim_in_explain_and_inspect(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await dra_group_with_a_member(kube, cluster)
    kubeconfig = str(cluster.kubeconfig)
    rc, out = await run(capsys, "explain", "--kubeconfig", kubeconfig, "trainer-0", "-n", NS)
    assert rc == 0
    assert "ResourceClaim ml/trainer-devices: pending (no devices allocated yet)." in out.splitlines()
    # What the allocation writes (by hand here): the claim allocated on gpu-node-0 and reserved for the member.
    pod = cluster.get("pods", "trainer-0", NS)
    assert pod is not None
    cluster.patch("resourceclaims", "trainer-devices", {"status": {
        "allocation": allocation("gpu-node-0", "gpu-0", "gpu-1"),
        "reservedFor": [consumer("trainer-0", pod["metadata"]["uid"])]}}, NS, subresource="status")
    rc, out = await run(capsys, "explain", "--kubeconfig", kubeconfig, "trainer-0", "-n", NS)
    assert ("ResourceClaim ml/trainer-devices: allocated,reserved on node gpu-node-0, devices "
            "gpu-node-0/gpu-0,gpu-node-0/gpu-1; reserved for trainer-0.") in out.splitlines()
    rc, out = await run(capsys, "inspect", "--kubeconfig", kubeconfig)
    assert rc == 0
    table = out[out.index("DRA groups' claims:"):].splitlines()
    assert table[1].split() == ["GROUP", "CLAIM", "STATE", "NODE", "DEVICES", "RESERVED", "FOR"]
    assert table[2].split() == ["ml/trainer", "trainer-devices", "allocated,reserved", "gpu-node-0",
                                "gpu-node-0/gpu-0,gpu-node-0/gpu-1", "trainer-0"]
    rc, out = await run(capsys, "inspect", "--kubeconfig", kubeconfig, "-o", "json")
    (shown,) = json.loads(out)["claims"]
    assert (shown["group"], shown["state"], shown["reserved_for"]) == ("trainer", "allocated,reserved", ["trainer-0"])


def test_a_claim_not_made_yet_says_to_look_at_the_operator() -> None:
    assert claimview.describe(None, NS, "trainer").startswith("ResourceClaim ml/trainer-devices: not created yet")


def test_the_states_read_as_kubectls() -> None:
    assert claimview.state_of({}) == "pending"
    deleting = {"metadata": {"deletionTimestamp": "2026-11-27T20:00:00Z"}, "status": {"allocation": {"x": 1}}}
    assert claimview.state_of(deleting) == "deleted,allocated"
    assert claimview.state_of({"metadata": deleting["metadata"]}) == "deleted"
