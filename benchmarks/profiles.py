"""Where a process's CPU goes during a benchmark: py-spy sampling it from outside, summed by where it is.

``py-spy record --format raw`` writes folded stacks (``frame;frame;... count``), one line per distinct stack. A
sample whose only Python frame is the event loop's ``run`` is the loop waiting (or uvloop's own C code): it is
left out, so the shares are of the time the process ran Python. :func:`summary` sums the samples under a few
named places (the first of them found on a stack, from its leaf up, takes the sample), which is how
docs/benchmarks.md says where the operator's time goes.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

_FRAME = re.compile(r"^(?P<name>[^ ]+) \((?P<file>[^:)]+)")


class Spy:
    """``py-spy record`` of one process until :meth:`stop` (None of it happens where py-spy is missing)."""

    def __init__(self, pid: int, out: Path, rate: int = 200) -> None:
        beside = Path(sys.executable).with_name("py-spy")  # the virtualenv's, whose bin may not be on PATH
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        self.out = out
        self._proc = None if exe is None else subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(out),
             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> Path | None:
        if self._proc is None:
            return None
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return None
        return self.out if self.out.exists() else None


def stacks(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    """Each folded stack as [(function, file)] from root to leaf, with its sample count."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = []
        for frame in stack.split(";"):
            m = _FRAME.match(frame)
            if m:
                frames.append((m["name"], m["file"]))
        if frames and count.isdigit():
            out.append((frames, int(count)))
    return out


def busy(frames: list[tuple[str, str]]) -> bool:
    """Not the event loop waiting: some Python frame runs below its ``run``."""
    names = [name for name, _ in frames]
    return "Runner.run" not in names or names.index("Runner.run") < len(names) - 1


def summary(
    path: Path, places: dict[str, tuple[str, ...]], *, leaf_first: bool = True
) -> tuple[int, dict[str, float]]:
    """(busy samples, share of them per place). A place is a list of substrings of ``function (file)``; a sample
    counts for the first place one of whose substrings appears on its stack, searched from the leaf up (what code
    the time is spent in) or from the root down (what the time is spent for); samples under none are ``other``."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in stacks(path):
        if not busy(frames):
            continue
        total += n
        place = "other"
        texts = [f"{name} ({file})" for name, file in (reversed(frames) if leaf_first else frames)]
        for text in texts:
            hit = next((p for p, needles in places.items() if any(needle in text for needle in needles)), None)
            if hit is not None:
                place = hit
                break
        counts[place] += n
    return total, {k: v / max(1, total) for k, v in counts.most_common()}
