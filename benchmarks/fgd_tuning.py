"""Screen candidate FGD variants on the tuning split only: margins over the paper's FGD beside ``fgd-scarce``.

The held-out margins (``bench_fgd_heldout``) are worth something only while no choice looks at them, so
this screen refuses any seed outside :data:`fgd.TUNING_SEEDS`. A candidate is ``fgd-scarce`` with one
thing changed; it is worth a held-out run only if it beats ``fgd-scarce`` here on every list.

    python -m benchmarks.fgd_tuning gpushare60 --seeds 4 --candidates coverage-all,gpu-weighted
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from deviceshare.cli import simulate
from deviceshare.core import experiment, fgd, nodeclasses, policies, replay, traces
from deviceshare.core import fragmentation as frag

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "openb"
Workload = tuple[frag.WeightedShape, ...]


def _by_gpu_demand(workload: Workload) -> Workload:
    """The shapes weighted by popularity x GPU milli, not popularity (CPU-only shapes as 1 milli)."""
    weights = [(w.shape, w.weight * max(w.shape.total_gpu_milli, 1)) for w in workload]
    total = sum(v for _, v in weights)
    return tuple(frag.WeightedShape(s, v / total) for s, v in weights)


def _candidate(coverage: float = 0.95, reweigh: Callable[[Workload], Workload] | None = None) -> experiment.Build:
    def build(nodes: Sequence[nodeclasses.Node], pods: Sequence[nodeclasses.Pod]) -> policies.Policy:
        workload = frag.target_workload((p.shape for p in pods), coverage)
        types = fgd.node_types((n.model, n.gpus, n.cpu_milli) for n in nodes)
        measure = fgd.Measure(fgd.VARIANTS[fgd.BEST], reweigh(workload) if reweigh else workload, types)
        return policies.FGDPolicy(measure, name="candidate")

    return build


CANDIDATES: dict[str, experiment.Build] = {
    "coverage-all": _candidate(coverage=1.0),  # the target workload is every shape, not the 95% most popular
    "gpu-weighted": _candidate(reweigh=_by_gpu_demand),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("list", help="openb pod list: default, gpushare60, gpuspec33, multigpu50")
    parser.add_argument("--seeds", type=int, default=len(fgd.TUNING_SEEDS))
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if not 0 < args.seeds <= len(fgd.TUNING_SEEDS):
        parser.error(f"--seeds: at most the {len(fgd.TUNING_SEEDS)} tuning seeds (held-out seeds are not screened on)")
    names = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in names if c not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown} (known: {', '.join(CANDIDATES)})")
    experiment.POLICIES.update(CANDIDATES)  # type: ignore[attr-defined]  # the worker processes fork with it
    node_file = DATA / "openb_node_list_gpu_node.csv"
    nodes = traces.parse_nodes(node_file.open(), str(node_file))
    pods = traces.parse_pods((DATA / f"openb_pod_list_{args.list}.csv").open(), args.list)
    first = fgd.TUNING_SEEDS[0]
    runs = simulate.simulate(nodes, pods, ["fgd", fgd.BEST, *names], args.seeds, 1.3, jobs=args.jobs, first=first)
    for policy in [fgd.BEST, *names]:
        cells = []
        for load in (100, 130):
            ours = [replay.allocated_at(r.curve, load) for r in runs[policy]]
            paper = [replay.allocated_at(r.curve, load) for r in runs["fgd"]]
            margin, worst = statistics.median(ours) - statistics.median(paper), min(
                o - p for o, p in zip(ours, paper, strict=True))
            cells.append(f"{load}%: {margin:+.2f} (worst seed {worst:+.2f})")
        print(f"{args.list} seeds {first}..{first + args.seeds - 1} {policy}: {' | '.join(cells)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
