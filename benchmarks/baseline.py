"""Today's operator beside ours in one run: ``deviceshare operator`` as its own process, from this tree or from the
source of an earlier commit.

This machine's speed moves up to 2x from one run to the next, so a before/after figure is only worth something
measured side by side. The benchmarks therefore start the operator of :data:`BASELINE` (``git archive`` of its
``src/`` into a temporary folder, run on the same virtualenv) and the current one alternately, against the same
sandbox settings, and report both. The process is the real command (``deviceshare operator``), ready when its
``/readyz`` answers 200; its CPU time is the process's own (every thread), read with psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
# main when issue 24 began: 5 API writes per one-pod group (binding, finalizer, status, two events) and about
# 2.5 ms of operator CPU per bound pod (docs/benchmarks.md of that commit).
BASELINE = "08293c1"
_SOURCES: dict[str, Path] = {}


def source(rev: str = BASELINE) -> Path | None:
    """The ``src`` folder of ``rev`` (extracted once per process), or None where git or the commit is missing."""
    tree = _tree(rev)
    return None if tree is None else tree / "src"


def crds(rev: str = BASELINE) -> Path | None:
    """The ``crds`` folder of ``rev``: the schema today's operator was written for (a sandbox serving today's
    operator serves it, since a newer schema defaults fields that today's models refuse)."""
    tree = _tree(rev)
    return None if tree is None else tree / "crds"


def _tree(rev: str) -> Path | None:
    """``src`` and ``crds`` of ``rev``, extracted once per process."""
    if rev in _SOURCES:
        return _SOURCES[rev]
    target = Path(tempfile.gettempdir()) / f"deviceshare-baseline-{rev}"
    if not (target / "src" / "deviceshare").is_dir() or not (target / "crds").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        try:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src", "crds"], capture_output=True,
                                     check=True, timeout=60).stdout
            subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
    _SOURCES[rev] = target
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    """``deviceshare operator --kubeconfig K`` from ``src`` (this tree's when None), logging to ``log``."""

    def __init__(self, kubeconfig: Path, *, src: Path | None = None, log: Path | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.kubeconfig, self.src, self.args = kubeconfig, src or ROOT / "src", args
        self.port = free_port()
        self.log = log or kubeconfig.with_name(f"operator-{self.port}.log")
        self.popen: subprocess.Popen[bytes] | None = None
        self.process: psutil.Process | None = None

    def start(self, timeout: float = 120.0) -> psutil.Process:
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        command = [sys.executable, "-c", "import sys; from deviceshare.cli import main; sys.exit(main())",
                   "operator", "--kubeconfig", str(self.kubeconfig), "--metrics-host", "127.0.0.1",
                   "--metrics-port", str(self.port), *self.args]
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.process = psutil.Process(self.popen.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.popen.returncode}); see {self.log}")
            url = f"http://127.0.0.1:{self.port}/readyz"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return self.process
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the operator was not ready in {timeout}s; see {self.log}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    def cpu_seconds(self) -> float:
        assert self.process is not None
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def rss_mib(self) -> tuple[float, float]:
        """(current, peak) resident memory in MiB."""
        assert self.process is not None
        current = self.process.memory_info().rss / 2**20
        peak = current
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return current, peak

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
