"""`deviceshare demo`, the README's first command, runs the whole system and every example pod binds."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from deviceshare.cli import demo
from tests import waiting


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
    assert {way for node, way in handover.values() if node == "gpu-node-3"} <= {"cdi"}
    assert {way for node, way in handover.values() if node != "gpu-node-3"} == {"env"}
    assert env["llm-0"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24576M"
    assert env["nb-alice"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert sorted(env[p]["ZE_AFFINITY_MASK"] for p in ("encode-0", "decode-0")) == ["0.0", "0.1"]
    # schedulingStrategy fgd (examples/fgd-mixed.yaml): the two half-GPU groups close one GPU, not two.
    assert env["embed-0"]["NVIDIA_VISIBLE_DEVICES"] == env["rerank-0"]["NVIDIA_VISIBLE_DEVICES"]
