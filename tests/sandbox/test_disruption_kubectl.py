"""kubectl against the sandbox's budgets, classes and evictions: what an admin types (protobuf bodies included)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import pod
from tests.sandbox.test_clients import KUBECTL, kubectl
from tests.sandbox.test_eviction import processed, until

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")


async def run(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(kubectl, sandbox.kubeconfig, *args)


async def test_kubectl_creates_and_lists_budgets(sandbox: Sandbox) -> None:
    for name in ("a", "b"):
        sandbox.create(pod(name, metadata={"labels": {"app": "web"}}))
        sandbox.bind("default", name, "gpu-node-0")
    done = await run(sandbox, "create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=1")
    assert done.returncode == 0, done.stderr
    await processed(sandbox, "web", currentHealthy=2, disruptionsAllowed=1)
    listed = await run(sandbox, "get", "pdb")
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert row.split()[:4] == ["web", "1", "N/A", "1"]
    percent = await run(sandbox, "create", "pdb", "half", "--selector=app=web", "--max-unavailable=50%")
    assert percent.returncode == 0, percent.stderr
    assert sandbox.get("pdb", "half", "default")["spec"]["maxUnavailable"] == "50%"  # type: ignore[index]


async def test_kubectl_creates_and_lists_priority_classes(sandbox: Sandbox) -> None:
    done = await run(sandbox, "create", "priorityclass", "inference", "--value=1000", "--preemption-policy=Never",
                     "--description=serving first")
    assert done.returncode == 0, done.stderr
    listed = await run(sandbox, "get", "priorityclass", "inference")
    assert listed.stdout.splitlines()[1].split()[:3] == ["inference", "1000", "false"]
    assert listed.stdout.splitlines()[1].split()[-1] == "Never"
    refused = await run(sandbox, "create", "priorityclass", "huge", "--value=2000000000")
    assert refused.returncode != 0 and "maximum allowed value of a user defined priority" in refused.stderr


async def test_kubectl_drain_evicts_what_its_budgets_allow(sandbox: Sandbox) -> None:
    sandbox.create(pod("guarded", metadata={"labels": {"app": "web"}}))
    sandbox.create(pod("free"))
    for name in ("guarded", "free"):
        sandbox.bind("default", name, "gpu-node-0")
    sandbox.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    await processed(sandbox, "web", currentHealthy=1, disruptionsAllowed=0)
    drained = await run(sandbox, "drain", "gpu-node-0", "--force", "--timeout=1s")
    assert drained.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget." in drained.stderr
    await until(sandbox, lambda: sandbox.get("pods", "free", "default") is None, "free evicted and removed")
    assert sandbox.get("pods", "guarded", "default") is not None
    assert sandbox.get("nodes", "gpu-node-0")["spec"]["unschedulable"] is True  # type: ignore[index]
