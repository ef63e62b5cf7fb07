"""``kubectl apply -f crds/`` (what the install docs invite) and ``kubectl apply -k crds/`` both work.

crds/ is a kustomize folder too (the base includes it); its kustomization is named ``Kustomization``
so that ``-f``, which reads every ``.yaml`` file, does not try to apply it as an object.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
async def test_apply_f_and_apply_k_of_crds(tmp_path: Path) -> None:
    empty = tmp_path / "no-crds"
    empty.mkdir()
    async with Sandbox(nodes=1, crds=empty, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=None) as cluster:
        def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
            assert KUBECTL is not None
            return subprocess.run([KUBECTL, "--kubeconfig", str(cluster.kubeconfig), *args], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60, check=False)

        assert cluster.get("customresourcedefinitions", "shareddevicegroups.deviceshare.io") is None
        applied = await asyncio.to_thread(kubectl, "apply", "-f", "crds/")
        assert applied.returncode == 0, applied.stderr
        crd = "customresourcedefinition.apiextensions.k8s.io/shareddevicegroups.deviceshare.io"
        assert applied.stdout.strip() == f"{crd} created"
        again = await asyncio.to_thread(kubectl, "apply", "-k", "crds/")
        assert again.returncode == 0, again.stderr
        assert "shareddevicegroups.deviceshare.io" in again.stdout
