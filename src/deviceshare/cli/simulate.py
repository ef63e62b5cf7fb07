"""`deviceshare simulate`: capacity planning by replaying a node list and a pod list through the
placement policies, the way the FGD paper's artifact runs its experiment.

    deviceshare simulate --nodes NODES.csv --pods PODS.csv --policy fgd,bestfit,random \\
        --seeds 10 --load 1.3 [--json] [--plot out.png]

Per policy it reports the share of the cluster's GPU capacity allocated (fractional GPUs counted
by their share) when arrivals reach 100% and the final load (median, min, max over the seeds),
what stays idle at the end (whole GPUs, and *crumbs*: the free share of partly used GPUs, with
the commonest crumb size; idle GPU *stranded* by its node's CPU or memory; idle GPU that *fits no
pod* of the list), and decisions per second. Seeds run in parallel processes
(``--jobs``). Bad CSVs are reported by file and line with exit code 2. The plot needs
matplotlib (``pip install 'deviceshare[plot]'``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from deviceshare.core import experiment, nodeclasses, traces

DATA = Path("..") / "shared" / "data" / "openb"  # where the openb trace sits beside a checkout
DEFAULT_NODES = DATA / "openb_node_list_gpu_node.csv"
DEFAULT_PODS = DATA / "openb_pod_list_default.csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Optional in the usage wherever it is read: the default is the openb trace when it sits beside the checkout
    # (relative to the current folder), and run() says which is missing otherwise.
    parser.add_argument(
        "--nodes", type=Path,
        help=f"node list CSV (cpu_milli, memory_mib, gpu, model); default {DEFAULT_NODES}, where it exists",
    )  # fmt: skip
    parser.add_argument(
        "--pods", type=Path,
        help=f"pod list CSV (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec); default {DEFAULT_PODS}, "
        "where it exists",
    )  # fmt: skip
    parser.add_argument(
        "--policy", default="fgd,bestfit,random",
        help=f"comma-separated policies: {', '.join(experiment.POLICIES)} (default: fgd,bestfit,random)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds, 42, 43, ... (default: 10)")
    parser.add_argument("--first-seed", type=int, default=experiment.FIRST_SEED,
                        help=f"the first seed (default: {experiment.FIRST_SEED}, the FGD artifact's; "
                             f"the held-out seeds of docs/simulate.md start at {experiment.HELD_OUT_SEEDS[0]})")
    parser.add_argument("--load", type=float, default=1.3, help="arrivals as a multiple of GPU capacity (default: 1.3)")
    parser.add_argument("--jobs", type=int, default=0, help="parallel processes (default: one per core)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--plot", type=Path, help="write a PNG of allocated share against arrived load")


def run(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the simulation, not after it
        print("deviceshare simulate: --plot needs matplotlib: pip install 'deviceshare[plot]'", file=sys.stderr)
        return 2
    for flag, default in (("nodes", DEFAULT_NODES), ("pods", DEFAULT_PODS)):
        if getattr(args, flag) is None:
            if not default.exists():
                print(f"deviceshare simulate: --{flag} is needed: no openb trace at {default} "
                      "(relative to the current folder)", file=sys.stderr)
                return 2
            setattr(args, flag, default)
    names = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [n for n in names if n not in experiment.POLICIES]
    if not names or unknown:
        print(f"deviceshare simulate: unknown policy {', '.join(unknown) or '(none)'}; "
              f"choose from {', '.join(experiment.POLICIES)}", file=sys.stderr)  # fmt: skip
        return 2
    if args.seeds < 1 or not 0 < args.load <= 10:
        print("deviceshare simulate: --seeds must be at least 1 and --load in (0, 10]", file=sys.stderr)
        return 2
    try:
        nodes = traces.parse_nodes(_lines(args.nodes), str(args.nodes))
        pods = traces.parse_pods(_lines(args.pods), str(args.pods))
    except (OSError, traces.TraceError) as error:
        print(f"deviceshare simulate: {error}", file=sys.stderr)
        return 2
    if sum(n.gpus for n in nodes) == 0:
        print(f"deviceshare simulate: {args.nodes}: no node has a GPU", file=sys.stderr)
        return 2
    results = simulate(nodes, pods, names, args.seeds, args.load, args.jobs, progress=sys.stderr,
                       first=args.first_seed)
    points = experiment.report_points(args.load)
    if args.json:
        json.dump(summary(results, points), sys.stdout, indent=2)
        print()
    else:
        print(table(results, points, len(nodes), len(pods)))
    if args.plot:
        return plot(results, args.plot)
    return 0


def _lines(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        return f.readlines()


def simulate(
    nodes: Sequence[nodeclasses.Node],
    pods: Sequence[nodeclasses.Pod],
    policies: Sequence[str],
    seeds: int,
    load: float,
    jobs: int = 0,
    progress: TextIO | None = None,
    first: int = experiment.FIRST_SEED,
) -> dict[str, list[experiment.SeedResult]]:
    """Every (policy, seed) replay, seeds ``first``, ``first + 1``, ...; in parallel processes when there are
    several cores and runs."""
    runs = [(p, first + s) for p in policies for s in range(seeds)]
    jobs = jobs or min(len(runs), _cores())
    results: dict[str, list[experiment.SeedResult]] = {p: [] for p in policies}
    bar = _Progress(len(runs), progress) if progress is not None and progress.isatty() else None
    if jobs <= 1:
        for policy, seed in runs:
            results[policy].append(experiment.run_seed(nodes, pods, policy, seed, load))
            if bar:
                bar.tick(policy)
    else:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(experiment.run_seed, nodes, pods, p, s, load) for p, s in runs]
            for future in concurrent.futures.as_completed(futures):
                got = future.result()
                results[got.policy].append(got)
                if bar:
                    bar.tick(got.policy)
    if bar:
        bar.done()
    for per_policy in results.values():
        per_policy.sort(key=lambda r: r.seed)
    return results


def summary(results: dict[str, list[experiment.SeedResult]], points: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy, runs in results.items():
        allocated = {}
        for percent in points:
            got = experiment.spread(runs, percent)
            allocated[str(percent)] = {"median": round(got.median, 2), "min": round(got.min, 2),
                                       "max": round(got.max, 2)}  # fmt: skip
        left = experiment.idle(runs)
        out[policy] = {
            "allocated": allocated,
            "idle": {
                "whole_gpus": round(left.whole, 2),
                "crumbs": round(left.crumbs, 2),
                "stranded_by_cpu_or_memory": round(left.stranded, 2),
                "fits_no_pod": round(left.unfit, 2),
                "commonest_crumb": {"free_milli": left.commonest, "share": round(left.commonest_share, 2)},
            },
            "decisions_per_second": round(experiment.decisions_per_second(runs)),
            "seeds": len(runs),
        }
    return {"policies": out}


def table(results: dict[str, list[experiment.SeedResult]], points: Sequence[int], nodes: int, pods: int) -> str:
    seeds = len(next(iter(results.values())))
    head = (f"{nodes} nodes, {pods} pods, {seeds} seed(s); GPU share allocated and idle at the end "
            "(% of capacity), median [min-max]")  # fmt: skip
    cols = [f"at {p}% load" for p in points]
    rows = [["policy", *cols, "idle: whole", "crumbs", "commonest crumb", "stranded", "fits no pod", "decisions/s"]]
    for policy, runs in results.items():
        cells = []
        for percent in points:
            got = experiment.spread(runs, percent)
            cells.append(f"{got.median:.1f} [{got.min:.1f}-{got.max:.1f}]")
        left = experiment.idle(runs)
        commonest = f"{left.commonest / 1000:.2f} GPU: {left.commonest_share:.1f}" if left.commonest else "-"
        rows.append([policy, *cells, f"{left.whole:.1f}", f"{left.crumbs:.1f}", commonest, f"{left.stranded:.1f}",
                     f"{left.unfit:.1f}", f"{experiment.decisions_per_second(runs):,.0f}"])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]  # fmt: skip
    return "\n".join([head, *lines])


def plot(results: dict[str, list[experiment.SeedResult]], path: Path) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        print("deviceshare simulate: --plot needs matplotlib: pip install 'deviceshare[plot]'", file=sys.stderr)
        return 2
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for policy, runs in results.items():
        loads = sorted(set().union(*(r.curve for r in runs)))
        medians = [statistics.median(r.curve.get(x, float("nan")) for r in runs) for x in loads]
        axes.plot(loads, medians, label=policy)
    axes.set_xlabel("arrived GPU request (% of capacity)")
    axes.set_ylabel("GPU share allocated (% of capacity)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return 0


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Progress:
    """A one-line bar on a terminal's stderr."""

    def __init__(self, total: int, out: TextIO) -> None:
        self.total, self.done_count, self.out = total, 0, out

    def tick(self, label: str) -> None:
        self.done_count += 1
        filled = 30 * self.done_count // self.total
        self.out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done_count}/{self.total} {label:<10}")
        self.out.flush()

    def done(self) -> None:
        self.out.write("\r" + " " * 60 + "\r")
        self.out.flush()
