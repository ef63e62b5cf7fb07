"""README's "Where it stands" figures are the ones docs/benchmarks.md measured (``make bench`` writes that
file; a new run that moves a figure fails here until README says the same)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def _row(text: str, starts: str) -> list[str]:
    """The cells of the first table row whose first cell starts with ``starts``."""
    for line in text.splitlines():
        cells = [re.sub(r"[*`]", "", c).strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(starts):
            return cells
    raise AssertionError(f"docs/benchmarks.md has no table row starting {starts!r}")


def _rows(text: str, first: str) -> list[list[str]]:
    """The cells of every table row whose first cell is ``first``."""
    rows = []
    for line in text.splitlines():
        cells = [re.sub(r"[*`]", "", c).strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            rows.append(cells)
    return rows


def held_out(text: str) -> list[str]:
    """README's phrases for the held-out margins of the operator's FGD variant over FGD: ``LIST +a / +b``
    (at 100% / 130% load), from the held-out table ``make bench`` writes."""
    best = re.search(r"`([\w-]+)` \(the operator's `fgd`\) over FGD, held out", text)
    assert best, "docs/benchmarks.md: no held-out summary line"
    rows = [r for r in _rows(text, "held out") if r[2] == best.group(1)]
    assert len(rows) == 4, f"docs/benchmarks.md: expected the held-out rows of 4 lists, got {len(rows)}"
    return [f"{r[1]} {r[4]} / {r[7]}" for r in rows]


def measured() -> dict[str, str]:
    """The figures README quotes, read from docs/benchmarks.md."""
    text = BENCHMARKS.read_text()
    medians = re.search(r"Medians: (\d+) pods bound/s, p99 ([\d.]+) s", text)
    assert medians, "docs/benchmarks.md: no 'Medians: N pods bound/s, p99 X s' line"
    rss = re.search(r"\| operator RSS MiB \| peak RSS MiB \|.*\n\|[-| ]+\|\n\| (\d+) \|", text)
    assert rss, "docs/benchmarks.md: no operator RSS table"
    return {
        "placement p99 ms": _row(text, "indexed")[2],
        "speedup (mean)": _row(text, "speedup")[3],
        "webhook p99 ms": _row(text, "paced, uvloop")[7],
        "rebuild s": _row(text, "Runtime.rebuild() total")[1],
        "operator RSS MiB": rss.group(1),
        "pods/s": medians.group(1),
        "e2e p99 s": medians.group(2),
        "fgd p99 ms": _rows(text, "fgd")[0][3],  # the operator's fgd at 5,000 nodes (bench_core_fgd)
    }


def test_readme_quotes_the_measured_figures() -> None:
    if not BENCHMARKS.exists():
        pytest.skip("docs/benchmarks.md not generated in this checkout (make bench)")
    m = measured()
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Where it stands", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())
    expected = [
        f"p99 {m['placement p99 ms']} ms, {m['speedup (mean)']} faster (mean)",
        f"p99 {m['webhook p99 ms']} ms",
        f"ledger rebuilt in {m['rebuild s']} s, RSS {m['operator RSS MiB']} MiB",
        f"median {m['pods/s']} pods/s",
        f"p99 create->bound {m['e2e p99 s']} s",
        f"`fgd` strategy decides in p99 {m['fgd p99 ms']} ms",
        *held_out(BENCHMARKS.read_text()),
    ]
    missing = [e for e in expected if e not in section]
    assert not missing, f"README's figures disagree with docs/benchmarks.md; it should say: {missing}"
