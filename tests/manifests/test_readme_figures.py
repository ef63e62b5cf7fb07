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
        **_limits(text),
    }


def _limits(text: str) -> dict[str, str]:
    """Issue 24's figures: writes per one-pod group and operator CPU per bound pod, each beside today's from the
    same run (bench_operator_writes, bench_operator), and the table at Kubernetes' envelope (bench_scale)."""
    writes = re.search(r"One-pod groups: ([\d.]+) writes per group today, ([\d.]+) now\.", text)
    assert writes, "docs/benchmarks.md: no 'One-pod groups: ... writes per group today, ... now.' line"
    cpu = re.search(r"Operator CPU per bound pod, medians: today ([\d.]+) ms, now ([\d.]+) ms", text)
    assert cpu, "docs/benchmarks.md: no 'Operator CPU per bound pod, medians: ...' line"

    def first(starts: str) -> str:
        return _row(text, starts)[1].split()[0]

    return {
        "writes today": f"{float(writes.group(1)):g}", "writes now": f"{float(writes.group(2)):g}",
        "cpu today ms": cpu.group(1), "cpu now ms": cpu.group(2),
        "scale rebuild s": first("operator: ledger rebuild"),
        "scale operator RSS MiB": first("operator RSS once settled"),
        "scale webhook RSS MiB": first("webhook RSS once ready"),
        "scale placement p99 ms": _row(text, "placement decision on that ledger")[1].split("/")[1].split()[0],
        "scale relist stall s": first("meanwhile: longest create"),
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
        f"{m['writes now']} API writes per one-pod group ({m['writes today']} before",
        f"{m['cpu now ms']} ms of operator CPU per bound pod ({m['cpu today ms']} ms before",
        f"ledger rebuilt in {m['scale rebuild s']} s, operator RSS {m['scale operator RSS MiB']} MiB",
        f"webhook RSS {m['scale webhook RSS MiB']} MiB",
        f"placement p99 {m['scale placement p99 ms']} ms",
        f"new pods wait {m['scale relist stall s']} s at most",
        *held_out(BENCHMARKS.read_text()),
    ]
    missing = [e for e in expected if e not in section]
    assert not missing, f"README's figures disagree with docs/benchmarks.md; it should say: {missing}"
