"""benchmarks/gpu/chain_check.py on a machine without a GPU: its arguments, and a dry run that names what is
missing and runs nothing (exit 2). The chain itself needs a real GPU and MPS daemon; it is not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.gpu import chain_check

from tests.gpufakes import H200_VM

ROOT = Path(__file__).resolve().parents[1]


def test_arguments_default_to_a_quarter_share_handed_over_by_cdi_within_five_minutes() -> None:
    args = chain_check.parse_args([])
    assert (args.compute, args.memory_gib, args.handover, args.timeout) == ("250m", 4, "cdi", 300.0)
    with pytest.raises(SystemExit):
        chain_check.parse_args(["--compute", "0.25"])  # a milli-quantity, as the share's compute is written


def test_a_dry_run_without_a_gpu_names_what_is_missing_and_runs_nothing(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}  # no nvidia-smi, no nvidia-cuda-mps-control
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "chain_check.py"), "--dry-run"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "missing: nvidia-smi: not on PATH" in done.stderr
    assert "missing: nvidia-cuda-mps-control: not on PATH" in done.stderr
    assert "prerequisites missing (see above); nothing was run" in done.stderr
    assert not list(tmp_path.iterdir())


def test_a_missing_site_folder_is_named(tmp_path: Path) -> None:
    missing = dict(chain_check.prerequisites(tmp_path / "nowhere"))
    assert missing[f"--site {tmp_path / 'nowhere'}"] == "no such folder"


def test_the_results_table_says_which_check_failed() -> None:
    table = chain_check.render([("MPS readiness published", "ready", "ready after 2.0 s", True),
                                ("allocation over the memory limit", "refused", "ok", False)])
    lines = table.splitlines()
    assert lines[0].split() == ["CHECK", "EXPECTED", "OBSERVED", "RESULT"]
    assert lines[1].endswith("ok") and lines[2].endswith("FAILED")


def test_a_rehearsal_with_fake_nvidia_software_runs_the_whole_chain(tmp_path: Path) -> None:
    """The script's own wiring (sandbox, webhook, the operator and agent commands, the pod's env into the probe),
    against tests.gpufakes: catches a broken chain before GPU time is spent on it. Its numbers are the fakes'."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    site.mkdir()
    for exe, module in (("nvidia-smi", "nvidia_smi"), ("nvidia-cuda-mps-control", "mps_control")):
        path = bin_dir / exe
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.gpufakes.{module} "$@"\n')
        path.chmod(0o755)
    (site / "pynvml.py").write_text("from tests.gpufakes.fakepynvml import __getattr__  # noqa: F401\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(ROOT / "src")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "chain_check.py"), "--site", str(site), "--timeout", "120",
         "--probe", str(ROOT / "tests" / "gpufakes" / "probe.py"), "--json", str(tmp_path / "results.json")],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["check"] for r in rows if not r["held"]] == []
    observed = {r["check"]: r["observed"] for r in rows}
    assert observed["devices (NVML) = nvidia-smi UUIDs"] == H200_VM.uuid(0)
    assert observed["pod env: MPS limits and pipe"].startswith("25, 0=4096M, ")
    assert observed["hand-over names the agent's device"] == f"cdi nvidia.com/gpu={H200_VM.uuid(0)}"
    assert observed["SMs with the pod's env"] == "33 of 132"
