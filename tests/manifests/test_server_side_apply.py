"""The install applied server-side with kubectl, as GitOps controllers apply it, on a fresh sandbox.

``kubectl apply --server-side`` of ``crds/`` and of the kustomize base; a conflict with another manager,
``--force-conflicts``, a field removed once the configuration stops naming it; and the loop Flux's
kustomize-controller runs (a server-side dry run, then an apply as ``kustomize-controller`` that takes
back what a second manager changed and leaves what it added).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
NS = "deviceshare-system"
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@pytest.fixture
async def fresh(tmp_path: Path) -> AsyncIterator[Sandbox]:
    (tmp_path / "no-crds").mkdir()
    async with Sandbox(nodes=1, crds=tmp_path / "no-crds", kubeconfig_path=tmp_path / "kubeconfig",
                       kubelet_delay=None) as cluster:
        yield cluster


async def kubectl(cluster: Sandbox, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return await asyncio.to_thread(subprocess.run, [KUBECTL, "--kubeconfig", str(cluster.kubeconfig), *args],
                                   cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def managers(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["manager"], e["operation"]) for e in obj["metadata"].get("managedFields", [])}


async def test_crds_and_the_base_apply_server_side_on_a_fresh_cluster(fresh: Sandbox) -> None:
    crds = await kubectl(fresh, "apply", "--server-side", "-f", "crds/")
    assert crds.returncode == 0, crds.stderr
    assert crds.stdout.strip() == \
        "customresourcedefinition.apiextensions.k8s.io/shareddevicegroups.deviceshare.io serverside-applied"
    base = await kubectl(fresh, "apply", "--server-side", "-k", "manifests/base")
    assert base.returncode == 0, base.stderr
    operator = fresh.get("deployments", "deviceshare-operator", NS)
    assert operator is not None and managers(operator) == {("kubectl", "Apply")}
    again = await kubectl(fresh, "apply", "--server-side", "-k", "manifests/base")
    assert again.returncode == 0, again.stderr
    assert fresh.get("deployments", "deviceshare-operator", NS) == operator  # nothing changed, not even versions


async def test_conflicts_force_and_a_dropped_field(fresh: Sandbox, tmp_path: Path) -> None:
    def write(name: str, data: dict[str, str]) -> str:
        path = tmp_path / name
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "settings", "namespace": "default"}, "data": data}))
        return str(path)

    first = await kubectl(fresh, "apply", "--server-side", "-f", write("a.yaml", {"mode": "fast", "level": "1"}))
    assert first.returncode == 0, first.stderr
    other = write("b.yaml", {"mode": "safe"})
    refused = await kubectl(fresh, "apply", "--server-side", "--field-manager", "platform", "-f", other)
    assert refused.returncode == 1
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .data.mode' in refused.stderr
    assert fresh.get("configmaps", "settings", "default")["data"] == {"mode": "fast", "level": "1"}
    forced = await kubectl(fresh, "apply", "--server-side", "--field-manager", "platform", "--force-conflicts",
                           "-f", other)
    assert forced.returncode == 0, forced.stderr
    assert fresh.get("configmaps", "settings", "default")["data"] == {"mode": "safe", "level": "1"}
    dropped = await kubectl(fresh, "apply", "--server-side", "-f", write("c.yaml", {"mode": "fast"}))
    assert dropped.returncode == 1  # kubectl no longer owns mode, and may not take it back unforced
    dropped = await kubectl(fresh, "apply", "--server-side", "-f", write("c.yaml", {"mode": "safe"}))
    assert dropped.returncode == 0, dropped.stderr
    assert fresh.get("configmaps", "settings", "default")["data"] == {"mode": "safe"}  # level: only kubectl's


async def test_a_flux_style_loop_dry_runs_applies_and_corrects_drift(fresh: Sandbox, tmp_path: Path) -> None:
    flux = ("--server-side", "--field-manager", "kustomize-controller")
    # Flux applies in stages: cluster definitions (CRDs, Namespaces) first, so that the dry run of the
    # rest has a namespace to run in (a dry run creates nothing, as on kube-apiserver).
    for definitions in ("crds/", "manifests/base/namespace.yaml"):
        staged = await kubectl(fresh, "apply", *flux, "-f", definitions)
        assert staged.returncode == 0, staged.stderr
    planned = await kubectl(fresh, "apply", *flux, "--dry-run=server", "-k", "manifests/base")
    assert planned.returncode == 0, planned.stderr
    assert "deployment.apps/deviceshare-webhook serverside-applied (server dry run)" in planned.stdout
    assert fresh.get("deployments", "deviceshare-webhook", NS) is None

    applied = await kubectl(fresh, "apply", *flux, "-k", "manifests/base")
    assert applied.returncode == 0, applied.stderr
    assert managers(fresh.get("deployments", "deviceshare-webhook", NS)) == {("kustomize-controller", "Apply")}

    # A second manager: someone scales the webhook by hand and labels it.
    scaled = await kubectl(fresh, "-n", NS, "scale", "deployment/deviceshare-webhook", "--replicas=5")
    assert scaled.returncode == 0, scaled.stderr
    labelled = await kubectl(fresh, "-n", NS, "label", "deployment/deviceshare-webhook", "team=ml")
    assert labelled.returncode == 0, labelled.stderr

    drift = await kubectl(fresh, "apply", *flux, "--dry-run=server", "-k", "manifests/base")
    assert drift.returncode == 1 and "conflict with \"kubectl\" with subresource \"scale\"" in drift.stderr
    assert fresh.get("deployments", "deviceshare-webhook", NS)["spec"]["replicas"] == 5
    corrected = await kubectl(fresh, "apply", *flux, "--force-conflicts", "-k", "manifests/base")
    assert corrected.returncode == 0, corrected.stderr
    webhook = fresh.get("deployments", "deviceshare-webhook", NS)
    assert webhook["spec"]["replicas"] == 2  # taken back from the hand edit
    assert webhook["metadata"]["labels"]["team"] == "ml"  # what the configuration never named stays
    assert managers(webhook) == {("kustomize-controller", "Apply"), ("kubectl-label", "Update")}

    # The source drops a field: the next reconciliation removes it from the cluster.
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "manifests", copy / "manifests")
    shutil.copytree(ROOT / "crds", copy / "crds")
    operator = copy / "manifests" / "base" / "operator.yaml"
    operator.write_text(operator.read_text().replace("  revisionHistoryLimit: 3\n", "", 1))
    pruned = await kubectl(fresh, "apply", *flux, "-k", "manifests/base", cwd=copy)
    assert pruned.returncode == 0, pruned.stderr
    assert "revisionHistoryLimit" not in fresh.get("deployments", "deviceshare-operator", NS)["spec"]
    assert fresh.get("deployments", "deviceshare-webhook", NS)["spec"]["revisionHistoryLimit"] == 3
