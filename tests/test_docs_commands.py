"""The shell blocks of README.md and docs/quickstart.md, run as a reader would run them, with the real kubectl.

Each ```` ```sh ```` block runs in order in one "terminal" (bash; exports carry over from block to block),
in a scratch folder that looks like the repository (``Makefile``, ``examples/``, ``crds/``, ``.venv``), and
must exit 0: a command that fails, or a ``kubectl wait`` for a state the docs show that never comes, fails
the test. A block that cannot run as such is marked just above its fence with an HTML comment that says
why, in parentheses:

- ``<!-- doc-test: skip (why) -->``: not run (e.g. ``make test``, which runs this very test);
- ``<!-- doc-test: background until="REGEX" (why) -->``: a command that runs until Ctrl-C (the sandbox,
  the operator): started in the background; the next block runs once its output matches ``REGEX``;
- ``<!-- doc-test: stop-background (why) -->`` (anywhere in the text): Ctrl-C for everything started so far.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KUBECTL = shutil.which("kubectl")
TOKEN = re.compile(
    r"(?:<!-- doc-test: (?P<marker>[^>]*?) -->\n)?```sh\n(?P<body>.*?)```"
    r"|<!-- doc-test: (?P<stop>stop-background[^>]*?) -->",
    re.S,
)


@dataclass(frozen=True)
class Step:
    kind: str  # run | skip | background | stop
    body: str
    until: str = ""


def steps(doc: Path) -> Iterator[Step]:
    for m in TOKEN.finditer(doc.read_text()):
        marker = m.group("marker") or m.group("stop") or ""
        if marker:
            assert re.search(r"\(.+\)", marker), f"{doc.name}: the marker {marker!r} must say why, in parentheses"
        if m.group("stop"):
            yield Step("stop", "")
        elif not marker:
            yield Step("run", m.group("body"))
        elif marker.startswith("skip"):
            yield Step("skip", m.group("body"))
        elif marker.startswith("background"):
            until = re.search(r'until="([^"]+)"', marker)
            assert until, f"{doc.name}: a background block needs until=\"REGEX\": {marker!r}"
            yield Step("background", m.group("body"), until.group(1))
        else:
            raise AssertionError(f"{doc.name}: unknown doc-test marker {marker!r}")


class Terminal:
    """One reader's shell session: exports persist between blocks; background commands get Ctrl-C."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.state = workdir / ".doc-test-env"
        self.state.write_text("")
        self.background: list[tuple[subprocess.Popen[str], list[str]]] = []

    def _script(self, body: str, *, keep: bool) -> str:
        saved = f"\nexport -p > {self.state}\n" if keep else "\n"
        return f"set -eo pipefail\nsource {self.state}\n{body}{saved}"

    def run(self, body: str) -> None:
        done = subprocess.run(["bash", "-c", self._script(body, keep=True)], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, (
            f"this block failed (exit {done.returncode}):\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )

    def start(self, body: str, until: str, timeout: float = 120) -> None:
        proc = subprocess.Popen(["bash", "-c", self._script(body, keep=False)], cwd=self.workdir, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        self.background.append((proc, lines))
        deadline = time.monotonic() + timeout
        while not re.search(until, "".join(lines)):
            assert proc.poll() is None, f"this background block exited ({proc.returncode}):\n{body}\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"no {until!r} within {timeout} s from:\n{body}\n{''.join(lines)}"
            time.sleep(0.1)  # the poll of a background block's output (deadline above)

    def stop(self) -> None:
        for proc, _ in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        for proc, lines in self.background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"Ctrl-C did not stop it:\n{''.join(lines)}") from None
        self.background.clear()


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    if KUBECTL is None or shutil.which("make") is None:
        pytest.skip("the docs' commands need kubectl and make")
    if not (ROOT / ".venv" / "bin" / "deviceshare").exists():
        pytest.skip("the docs' commands use .venv/bin/deviceshare (make venv)")
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md", "examples", "crds", "manifests", ".venv"):
        (work / name).symlink_to(ROOT / name)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1")
    session = Terminal(work, env)
    try:
        yield session
    finally:
        session.stop()


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md"])
def test_every_shell_block_runs(doc: str, terminal: Terminal) -> None:
    ran = 0
    for step in steps(ROOT / doc):
        if step.kind == "run":
            terminal.run(step.body)
            ran += 1
        elif step.kind == "background":
            terminal.start(step.body, step.until)
            ran += 1
        elif step.kind == "stop":
            terminal.stop()
    assert ran or doc == "README.md", f"{doc}: no block ran"
