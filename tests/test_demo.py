"""`deviceshare demo`, the README's first command, runs the whole system and every example pod binds."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deviceshare import cli
from deviceshare.cli import demo
from tests import waiting

# What a wheel of the package is built from (pyproject.toml and the folders its package data links to).
BUILT_FROM = ("pyproject.toml", "README.md", "src", "crds", "examples", "manifests")


async def test_demo_binds_every_example_pod_with_wired_devices(
    tmp_path: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        nodes=4, gpus=8, examples=repo_root / "examples", kubeconfig=tmp_path / "kubeconfig",
        timeout=waiting.HANG_GUARD, keep_running=False,  # a hang guard: the demo waits for every pod
    )
    assert await demo.demo(args) == 0
    out = capsys.readouterr().out
    total = re.search(r"(\d+)/(\d+) pods bound", out)
    assert total and total.group(1) == total.group(2) and int(total.group(1)) >= 5
    pod_rows = [line for line in out.splitlines() if " Running " in line]
    assert pod_rows and all("NVIDIA_VISIBLE_DEVICES=" in line or "ZE_AFFINITY_MASK=" in line for line in pod_rows)
    # The trainer and its evaluator see the same two GPUs.
    trainer = {line.split()[-1] for line in pod_rows if line.split()[2] == "trainer"}
    assert len(trainer) == 1 and len(trainer.pop().split("=")[1].split(",")) == 2
    # Sharing groups are bound too, their pods seeing their limits; the tile groups see one tile each.
    env = {line.split()[1]: dict(e.split("=", 1) for e in line.split()[6:]) for line in pod_rows}
    # Each bound pod's hand-over (CONTRACT §12): by CDI on the node labelled so, by env var elsewhere.
    handover = {line.split()[1]: (line.split()[3], line.split()[5]) for line in pod_rows}
    assert {way for node, way in handover.values() if node == "gpu-node-0"} == {"cdi"}
    assert {way for node, way in handover.values() if node != "gpu-node-0"} == {"env"}
    assert env["llm-0"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24576M"
    assert env["nb-alice"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert sorted(env[p]["ZE_AFFINITY_MASK"] for p in ("encode-0", "decode-0")) == ["0.0", "0.1"]
    # The groups table's SHARE column: a tile group's share, then the tile it holds.
    assert {re.search(r"tiles=1@0\.[01]", line) is not None for line in out.splitlines()
            if " encode " in line and " Bound " in line} == {True}
    # schedulingStrategy fgd (examples/fgd-mixed.yaml): the two half-GPU groups close one GPU, not two.
    assert env["embed-0"]["NVIDIA_VISIBLE_DEVICES"] == env["rerank-0"]["NVIDIA_VISIBLE_DEVICES"]


async def test_demo_with_dra_shows_the_groups_claim_and_what_the_driver_handed_over(
    tmp_path: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`deviceshare demo --dra`: the DRA group's ResourceClaim as the operator made it, and per member container
    the CDI devices the kubelet got from the (simulated) NVIDIA driver once the claim is allocated and reserved."""
    examples = tmp_path / "examples"
    (examples / "dra").mkdir(parents=True)
    shutil.copy(repo_root / "examples" / "trainer-evaluator.yaml", examples)
    shutil.copy(repo_root / "examples" / "dra" / "training-on-dra.yaml", examples / "dra")
    args = argparse.Namespace(
        nodes=2, gpus=4, examples=examples, kubeconfig=tmp_path / "kubeconfig", dra=True,
        timeout=15.0, keep_running=False,
    )
    rc = await demo.demo(args)
    out = capsys.readouterr().out
    assert "gpu-node-1: deviceshare.io/pool=dra" in out
    (row,) = [line.split() for line in out.splitlines() if line.split()[:3] == ["ml-dra", "llm-train",
                                                                                 "llm-train-devices"]]
    cdi = {line.split()[1]: line.split()[3:] for line in out.splitlines() if line.startswith("ml-dra ")
           and line.split()[2] == "train"}
    assert sorted(cdi) == ["worker-0", "worker-1"]
    # The operator allocated the claim on the DRA node and reserved it for both workers, which run there with the
    # claim's two GPUs, handed over by CDI.
    assert rc == 0 and row[3:5] == ["allocated,reserved", "gpu-node-1"]
    assert sorted(row[-1].split(",")) == ["worker-0", "worker-1"]
    assert {len(devices) for devices in cdi.values()} == {2}
    assert all(d.startswith("k8s.gpu.nvidia.com/claim=") for devices in cdi.values() for d in devices)
    # The pods table: the workers take no env var; their hand-over is the driver's, by the claim.
    workers = {line.split()[1]: line.split()[5] for line in out.splitlines()
               if line.startswith("ml-dra ") and line.split()[2] == "llm-train"}
    assert workers == {"worker-0": "dra", "worker-1": "dra"}
    groups = [line.split() for line in out.splitlines() if line.split()[:2] == ["ml-dra", "llm-train"]]
    assert ["Bound", "gpu-node-1"] in [g[2:4] for g in groups], groups  # the groups table's row


def test_the_demo_runs_a_dra_group_unless_told_not_to(tmp_path: Path) -> None:
    """`make demo` (plain `deviceshare demo`) shows a DRA group: on with the packaged examples' dra folder, off with
    --no-dra or with examples that have none."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert parser.parse_args([]).dra is None and (demo.EXAMPLES / "dra").is_dir()
    assert parser.parse_args(["--no-dra"]).dra is False and parser.parse_args(["--dra"]).dra is True


@pytest.fixture(scope="module")
def pip_installed(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Path:
    """A virtualenv outside the checkout with deviceshare pip-installed from a wheel of it, as a user gets it.

    The wheel is built from a copy of the checkout (the build writes nothing into it); the dependencies
    are this venv's, reached through a .pth line (which, unlike a site dir, runs none of its .pth files:
    the editable install of the checkout stays out of sight).
    """
    tmp = tmp_path_factory.mktemp("pip-user")
    source = tmp / "source"
    for name in BUILT_FROM:
        origin = repo_root / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(origin, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp / "wheels"), str(source)], check=True, timeout=300,
                   capture_output=True)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "deviceshare-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = (tmp / "wheels").glob("deviceshare-*.whl")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300, capture_output=True)
    return venv


def test_a_pip_installed_demo_run_from_another_folder_binds_every_example_pod(
    pip_installed: Path, tmp_path: Path
) -> None:
    """The examples and admission policies ship in the package: nothing is read from the checkout."""
    python = str(pip_installed / "bin" / "python")
    where = subprocess.run([python, "-c", "import deviceshare; print(deviceshare.__file__)"],
                           check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    assert where.startswith(str(pip_installed))
    ran = subprocess.run([str(pip_installed / "bin" / "deviceshare"), "demo", "--timeout", str(waiting.HANG_GUARD)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=150)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "admission policies: " in ran.stdout
    total = re.search(r"(\d+)/(\d+) pods bound", ran.stdout)
    assert total and total.group(1) == total.group(2) and int(total.group(1)) >= 20, ran.stdout
    assert ran.stderr == ""


def test_a_demo_with_no_pods_to_bind_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text("apiVersion: v1\nkind: Node\nmetadata: {name: gpu-node-1}\n")
    assert cli.main(["demo", "--examples", str(tmp_path)]) == cli.EXIT_CONFIG
    assert "no Pod or Deployment" in capsys.readouterr().err
    assert cli.main(["demo", "--examples", str(tmp_path / "absent")]) == cli.EXIT_CONFIG
    assert "no such folder" in capsys.readouterr().err


IMPOSSIBLE = """\
apiVersion: deviceshare.io/v1alpha1
kind: SharedDeviceGroup
metadata: {name: too-big, namespace: default}
spec: {resources: {nvidia.com/gpu: 64}}
---
apiVersion: v1
kind: Pod
metadata: {name: too-big-0, namespace: default, annotations: {deviceshare.io/device-group: too-big}}
spec: {containers: [{name: main, image: busybox}]}
"""


async def test_a_demo_that_binds_nothing_fails_naming_the_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "too-big.yaml").write_text(IMPOSSIBLE)  # 64 GPUs on a node of 8
    args = argparse.Namespace(nodes=2, gpus=8, examples=tmp_path / "examples", kubeconfig=tmp_path / "kubeconfig",
                              timeout=1.0, keep_running=False)
    assert await demo.demo(args) == 1
    captured = capsys.readouterr()
    assert "0/1 pods bound" in captured.out
    assert "not bound within --timeout 1s: default/too-big-0" in captured.err
