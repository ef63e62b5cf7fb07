"""Runs every benchmark and writes ``docs/benchmarks.md``.

Each ``benchmarks/bench_*.py`` exposes ``run(quick: bool) -> str`` returning a Markdown section
(heading, what was measured, a table). Ratios against a baseline are measured side by side in the
same run, because these machines are noisy.

    python -m benchmarks.run                 # all, full size
    python -m benchmarks.run --only core     # bench_core*.py only
    python -m benchmarks.run --quick         # small sizes (smoke test)
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="run bench_<NAME>*.py only (repeatable)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"), help="where to write the report")
    args = parser.parse_args(argv)

    modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if any(m.startswith(f"bench_{o}") for o in args.only)]
    sections = []
    for name in modules:
        started = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        module = importlib.import_module(f"benchmarks.{name}")
        sections.append(module.run(quick=args.quick))
        print(f"   {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)

    command = "make bench" if not (args.only or args.quick) else "python -m benchmarks.run " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    header = (
        "# Benchmarks\n\n"
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{_cpu_count()} cores. Numbers are from one run on a noisy shared machine; "
        "comparisons are ratios measured side by side in the same run.\n\n"
    )
    text = header + "\n\n".join(s.strip() for s in sections) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
