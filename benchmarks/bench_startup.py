"""Start-up and fail-fast times: what the test suite used to assert as "under N seconds" (issue 21).

The tests check the behaviour (no retry on a fatal setting, nothing heavy imported by ``--help``, an
operator that heals once its API server comes up); how many seconds it takes depends on the machine,
so it is measured here, beside its target.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from deviceshare.api import names
from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import OperatorThread
from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent
API_LATE_S = 5.0  # the API server comes up this long after the operator


def _env(home: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**clean, "HOME": str(home), "PYTHONPATH": str(ROOT / "src")}


def _cli_seconds(env: dict[str, str], *argv: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "deviceshare", *argv], env=env, capture_output=True, check=False)
    return time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(url: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "late",
        "clusters": [{"name": "late", "cluster": {"server": url}}],
        "users": [{"name": "late", "user": {"token": "t"}}],
        "contexts": [{"name": "late", "context": {"cluster": "late", "user": "late"}}],
    }))
    return path


async def _healing_seconds(work: Path) -> float:
    """From the API server coming up (API_LATE_S after the operator) to a pod bound, production backoff."""
    port = _free_port()
    config = OperatorConfig(kubeconfig=str(_kubeconfig(f"http://127.0.0.1:{port}", work / "kubeconfig")),
                            metrics_port=None, status_debounce=0.01, worker_idle_timeout=0.2)
    operator = OperatorThread(config)
    starting = asyncio.get_running_loop().create_task(operator.start(timeout=120))
    try:
        await asyncio.sleep(API_LATE_S)  # the scenario itself: the API server is down this long
        async with Sandbox(port=port, kubeconfig_path=work / "sandbox-kubeconfig", kubelet_delay=0.01) as cluster:
            up = time.perf_counter()
            cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}})
            cluster.create({"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
                            "metadata": {"name": "g", "namespace": "late"},
                            "spec": {"resources": {"nvidia.com/gpu": 1}}})
            cluster.create({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": "p", "namespace": "late",
                                         "annotations": {names.POD_GROUP_ANNOTATION: "g"}},
                            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                                     "containers": [{"name": "main", "image": "busybox"}]}})
            while not (cluster.get("pods", "p", "late") or {}).get("spec", {}).get("nodeName"):
                await asyncio.sleep(0.01)
            bound = time.perf_counter() - up
            await starting
            await operator.stop()
            return bound
    finally:
        if not starting.done():
            starting.cancel()
        await operator.stop()


def run(quick: bool) -> str:
    rounds = 2 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = _env(work)
        help_s = min(_cli_seconds(env, "--help") for _ in range(rounds))
        missing_s = statistics.median(
            _cli_seconds(env, "operator", "--kubeconfig", "/nope/config") for _ in range(rounds)
        )
        healing = [asyncio.run(_healing_seconds(work)) for _ in range(1 if quick else 3)]
    rows = [
        (f"`deviceshare --help`, best of {rounds}", f"{help_s * 1000:.0f} ms", "< 0.5 s", help_s < 0.5),
        ("`deviceshare operator --kubeconfig /nope/config` exits (code 2), median",
         f"{missing_s:.2f} s", "< 10 s", missing_s < 10),
        (f"operator started {API_LATE_S:.0f} s before its API server: API up -> pod bound, production backoff, "
         f"max of {len(healing)}", f"{max(healing):.1f} s", "< 15 s", max(healing) < 15),
    ]
    table = "\n".join(f"| {what} | {result} | {target} | {'met' if ok else 'NOT met'} |"
                      for what, result, target, ok in rows)
    return (
        "## Start-up and fail-fast times\n\n"
        "What: the command line's own latency, and an operator healing once its API server comes up. The tests\n"
        "check the behaviour (tests/cli/test_errors.py, tests/operator/test_startup.py); the seconds are here.\n\n"
        "| measure | result | target | met? |\n|---|---|---|---|\n" + table + "\n"
    )
