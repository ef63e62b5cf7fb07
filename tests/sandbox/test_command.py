"""``deviceshare sandbox``: flags, the kubeconfig it writes and announces, and a clean Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from deviceshare.cli import build_parser
from deviceshare.sandbox import Sandbox, cluster
from tests import waiting


def test_flags_and_defaults() -> None:
    args = build_parser().parse_args(["sandbox", "--nodes", "2", "--gpus", "4", "--port", "0"])
    assert (args.nodes, args.gpus, args.port) == (2, 4, 0)
    assert args.kubeconfig == Path(".sandbox/kubeconfig")


def test_the_crds_are_found_from_the_package(repo_root: Path) -> None:
    assert cluster.default_crds() == repo_root / "crds"


async def test_kubeconfig_points_at_the_server(sandbox: Sandbox) -> None:
    written = yaml.safe_load(sandbox.kubeconfig.read_text())
    assert written["current-context"] == "deviceshare-sandbox"
    assert written["clusters"][0]["cluster"]["server"] == sandbox.url
    assert sandbox.url.startswith("http://127.0.0.1:")


def test_command_prints_the_kubeconfig_and_stops_on_ctrl_c(tmp_path: Path, repo_root: Path) -> None:
    kubeconfig = tmp_path / "kc"
    env = dict(os.environ, PYTHONPATH=str(repo_root / "src"))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deviceshare",
            "sandbox",
            "--nodes",
            "2",
            "--gpus",
            "4",
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert "2 nodes x 4 nvidia.com/gpu" in lines[0]
        assert lines[1].strip() == f"kubeconfig: {kubeconfig}"
        assert lines[2].strip() == f"export KUBECONFIG={kubeconfig}"
        assert kubeconfig.exists()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=waiting.HANG_GUARD) == 0


async def test_only_crds_are_taken_from_the_crds_folder(tmp_path: Path, repo_root: Path) -> None:
    folder = tmp_path / "crds"
    folder.mkdir()
    (folder / "shareddevicegroups.yaml").write_text(
        (repo_root / "crds" / "shareddevicegroups.yaml").read_text()
    )
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources: [shareddevicegroups.yaml]\n"
    )
    async with Sandbox(nodes=0, crds=folder, kubelet_delay=None) as sandbox:
        assert sandbox.store.catalog.lookup("sdg").kind == "SharedDeviceGroup"
