"""What the quickstart does with kubectl against the sandbox: Deployments that make pods, ``kubectl scale``,
``kubectl get deploy`` columns, and server-side dry run (``kubectl apply --dry-run=server``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.helpers import sdg
from tests.sandbox.test_clients import KUBECTL, kubectl

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "inference", "namespace": "default"},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "inference"}},
        "template": {
            "metadata": {"labels": {"app": "inference"}},
            "spec": {"containers": [{"name": "server", "image": "busybox"}]},
        },
    },
}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=1, gpus=8, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=None,
                       deployments=True) as sandbox:
        yield sandbox


async def run(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(kubectl, sandbox.kubeconfig, *args)


def pod_names(sandbox: Sandbox) -> list[str]:
    return sorted(p["metadata"]["name"] for p in sandbox.list("pods", "default"))


async def eventually(check: Callable[[], Any], what: str) -> Any:
    return await waiting.until(check, what)


async def test_kubectl_scale_makes_and_removes_pods(cluster: Sandbox, tmp_path: Path) -> None:
    manifest = tmp_path / "deployment.json"
    manifest.write_text(json.dumps(DEPLOYMENT))
    assert (await run(cluster, "apply", "-f", str(manifest))).returncode == 0
    await eventually(lambda: pod_names(cluster) == ["inference-0", "inference-1", "inference-2"], "3 pods")

    scaled = await run(cluster, "scale", "deployment", "inference", "--replicas=5")
    assert scaled.returncode == 0, scaled.stderr
    assert "deployment.apps/inference scaled" in scaled.stdout
    await eventually(lambda: len(pod_names(cluster)) == 5, "5 pods")
    assert cluster.get("deployments", "inference", "default")["spec"]["replicas"] == 5

    table = await run(cluster, "get", "deploy", "inference")
    assert table.stdout.split("\n")[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert table.stdout.split("\n")[1].split()[1:4] == ["0/5", "5", "0"]  # no kubelet here: none ready

    assert (await run(cluster, "scale", "deployment", "inference", "--replicas=2")).returncode == 0
    await eventually(lambda: pod_names(cluster) == ["inference-0", "inference-1"], "the newest pods removed")
    assert (await run(cluster, "delete", "deployment", "inference")).returncode == 0
    await eventually(lambda: pod_names(cluster) == [], "pods collected with their Deployment")


async def test_server_side_dry_run_validates_but_stores_nothing(cluster: Sandbox, tmp_path: Path) -> None:
    group = tmp_path / "group.json"
    group.write_text(json.dumps(sdg("trainer", gpus=2)))
    version = cluster.store.resource_version

    created = await run(cluster, "apply", "--dry-run=server", "-f", str(group))
    assert created.returncode == 0, created.stderr
    assert "created (server dry run)" in created.stdout
    assert cluster.get("sdg", "trainer", "default") is None
    assert cluster.store.resource_version == version  # no write, no watch event

    assert (await run(cluster, "apply", "-f", str(group))).returncode == 0
    changed = sdg("trainer", gpus=4)
    group.write_text(json.dumps(changed))
    patched = await run(cluster, "apply", "--dry-run=server", "-f", str(group))
    assert patched.returncode == 0 and "configured (server dry run)" in patched.stdout, patched.stderr
    assert cluster.get("sdg", "trainer", "default")["spec"]["resources"] == {"nvidia.com/gpu": 2}

    deleted = await run(cluster, "delete", "--dry-run=server", "sdg", "trainer")
    assert deleted.returncode == 0 and "(server dry run)" in deleted.stdout, deleted.stderr
    assert cluster.get("sdg", "trainer", "default") is not None

    # Validated like a real write: the CRD schema still refuses a bad spec.
    group.write_text(json.dumps(sdg("bad", gpus=0)))
    refused = await run(cluster, "apply", "--dry-run=server", "-f", str(group))
    assert refused.returncode != 0 and "resources" in refused.stderr
    assert cluster.get("sdg", "bad", "default") is None
