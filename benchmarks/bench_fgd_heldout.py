"""What our FGD variants gain over the paper's FGD on seeds their weights were not chosen on.

Every weight of ``deviceshare.core.fgd`` was chosen on :data:`fgd.TUNING_SEEDS` of :data:`fgd.TUNING_LISTS`
(the artifact's seeds 42..51, on which ``bench_fgd`` reproduces the paper). This replays every openb list
on :data:`fgd.HELD_OUT_SEEDS`, which took no part in any choice, and prints the margins over FGD at 100%
and 130% load: the figures README and docs quote (``tests/manifests/test_readme_figures.py`` checks them).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from deviceshare.cli import simulate
from deviceshare.core import fgd, replay, traces

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "openb"
LISTS = ("default", "gpushare60", "gpuspec33", "multigpu50")
POLICIES = ("fgd", "fgd-balance", fgd.BEST)
LOADS = (100, 130)
GOAL = 0.5  # points over FGD, out of sample, on every list at both loads


def run(quick: bool) -> str:
    node_file = DATA / "openb_node_list_gpu_node.csv"
    heading = "### Held out: the margins over FGD on seeds no weight was chosen on"
    if not node_file.exists():
        return f"{heading}\n\nSkipped: the openb trace is not at `{DATA}`."
    nodes = traces.parse_nodes(node_file.open(), str(node_file))
    seeds = fgd.HELD_OUT_SEEDS[:2] if quick else fgd.HELD_OUT_SEEDS
    rows, short = [], []
    margins: dict[str, list[str]] = {}
    for name in LISTS[:1] if quick else LISTS:
        pods = traces.parse_pods((DATA / f"openb_pod_list_{name}.csv").open(), name)
        results = simulate.simulate(nodes, pods, POLICIES, len(seeds), 1.3, jobs=2, first=seeds[0])
        for policy in POLICIES:
            cells = []
            for load in LOADS:
                ours = [replay.allocated_at(r.curve, load) for r in results[policy]]
                paper = [replay.allocated_at(r.curve, load) for r in results["fgd"]]
                cells.append(f"{statistics.median(ours):.2f}")
                if policy == "fgd":
                    cells += ["", ""]
                    continue
                margin = statistics.median(ours) - statistics.median(paper)
                worst = min(o - p for o, p in zip(ours, paper, strict=True))
                cells += [f"{margin:+.2f}", f"{worst:+.2f}"]
                if policy == fgd.BEST:
                    margins.setdefault(name, []).append(f"{margin:+.2f}")
                    if margin < GOAL:
                        short.append(f"`{name}` at {load}% ({margin:+.2f})")
            rows.append(f"| held out | `{name}` | {policy} | {' | '.join(cells)} |")
    quoted = "; ".join(f"`{name}` {' / '.join(m)}" for name, m in margins.items())
    verdict = ("**met** on every list at both loads" if not short
               else f"**not met** on {', '.join(short)}")  # fmt: skip
    command = "python -m benchmarks.run --only fgd_heldout" + (" --quick" if quick else "")
    return f"""{heading}

`benchmarks/bench_fgd_heldout.py`. The tuning split (`deviceshare.core.fgd`): every weight of our variants
(fill-ahead blends, the balance weight {fgd.BALANCE:g}, the scarcity weight {fgd.SCARCITY:g}) was chosen on seeds
{fgd.TUNING_SEEDS[0]}..{fgd.TUNING_SEEDS[-1]} of the lists {", ".join(f"`{n}`" for n in fgd.TUNING_LISTS)}; these
are seeds {seeds[0]}..{seeds[-1]} of the same lists, the same experiment otherwise (`deviceshare simulate
--first-seed {seeds[0]} --seeds {len(seeds)}`), looked at only once the choice was made. GPU share allocated at
100% and 130% load, median over the seeds; margin = median − FGD's median; worst seed = the smallest
per-seed difference (same seed, same arrivals).

| split | list | policy | at 100% | margin | worst seed | at 130% | margin | worst seed |
|---|---|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

`{fgd.BEST}` (the operator's `fgd`) over FGD, held out, at 100% / 130%: {quoted}.
At least +{GOAL} pp on every list at both loads: {verdict}.

Command: `{command}`."""
