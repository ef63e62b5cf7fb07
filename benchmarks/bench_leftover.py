"""Where the capacity goes that no policy allocates: the idle GPU at the end of the FGD experiment.

The FGD replay (``bench_fgd``) ends with 2-9% of the openb cluster's GPU capacity idle. This
splits it, per list and policy, into whole idle GPUs (stranded by CPU or memory, or by a GPU
count no pending pod matches) and *crumbs* (the free share of partly used GPUs), and names the
commonest crumb. It is the evidence for how much room any placement policy has left over FGD:
a crumb that only pods smaller than it could fill stays idle unless such pods come.
"""

from __future__ import annotations

from pathlib import Path

from deviceshare.cli import simulate
from deviceshare.core import experiment, fragmentation, nodeclasses, traces

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "openb"
LISTS = ("default", "gpushare60", "gpuspec33", "multigpu50")
POLICIES = ("bestfit", "packing", "fgd", "fgd-fill-share")


def run(quick: bool) -> str:
    node_file = DATA / "openb_node_list_gpu_node.csv"
    if not node_file.exists():
        return f"## Idle capacity at the end of the FGD experiment\n\nSkipped: the openb trace is not at `{DATA}`."
    nodes = traces.parse_nodes(node_file.open(), str(node_file))
    capacity = sum(n.gpus for n in nodes) * fragmentation.MILLI
    seeds = 1 if quick else 5
    rows, notes = [], []
    for name in LISTS[:1] if quick else LISTS:
        pods = traces.parse_pods((DATA / f"openb_pod_list_{name}.csv").open(), name)
        results = simulate.simulate(nodes, pods, POLICIES, seeds, 1.3)
        for policy in POLICIES:
            left = experiment.idle(results[policy])
            at = experiment.spread(results[policy], 130).median
            rows.append(
                f"| `{name}` | {policy} | {at:.2f} | {left.whole:.2f} | {left.crumbs:.2f} | "
                f"{left.commonest / 1000:.2f} GPU: {left.commonest_share:.2f} | "
                f"{left.stranded:.2f} | {left.unfit:.2f} |"
            )
        fgd, ours = (experiment.idle(results[p]) for p in ("fgd", "fgd-fill-share"))
        idle_fgd = 100 - experiment.spread(results["fgd"], 130).median
        fill = _fillable(pods, fgd.commonest, capacity)
        room = idle_fgd - (fgd.commonest_share - fill)
        notes.append(
            f"`{name}`: FGD leaves {idle_fgd:.2f} pt idle; {fgd.commonest_share:.2f} pt are "
            f"{fgd.commonest / 1000:.2f}-GPU crumbs, which only pods of at most that share can fill, and those "
            f"bring at most {fill:.2f} pt at 130% load (they are {_share_of_pods(pods, fgd.commonest):.1f}% of the "
            f"list): a policy that wasted nothing else would gain at most {room:.2f} pt. Stranded by CPU or memory: "
            f"FGD {fgd.stranded:.2f} pt, fgd-fill-share {ours.stranded:.2f} pt; whole GPUs idle: FGD {fgd.whole:.2f} "
            f"pt, fgd-fill-share {ours.whole:.2f} pt."
        )
    command = "python -m benchmarks.run --only leftover" + (" --quick" if quick else "")
    return f"""## Idle capacity at the end of the FGD experiment

`benchmarks/bench_leftover.py`: the replay of `bench_fgd` (same code path), {seeds} seeds (42..{41 + seeds}),
loads to 130%; what stays idle once every pod has arrived, in percent of the cluster's GPU capacity
(medians over the seeds): whole idle GPUs, *crumbs* (free share of partly used GPUs), the commonest
crumb size with its share (median), and, cutting across both, idle GPU *stranded* (a one-GPU pod of the
list fits it by share and model, but not its node's free CPU or memory) and idle GPU that *fits no pod*
of the list at all. `deviceshare simulate` prints the same columns.

| list | policy | at 130% | idle whole GPUs | crumbs | commonest crumb | stranded by CPU/memory | fits no pod |
|---|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(rows)}

{chr(10).join("- " + n for n in notes)}

Command: `{command}`."""


def _small(pods: list[nodeclasses.Pod], crumb: int) -> list[nodeclasses.Pod]:
    return [p for p in pods if p.shape.is_share and p.shape.gpu_milli <= crumb]


def _fillable(pods: list[nodeclasses.Pod], crumb: int, capacity: int) -> float:
    """The GPU share the list's pods that fit a crumb bring at 130% load, in percent of capacity.

    Arrivals sample the list uniformly until 130% of capacity is requested, so each pod's
    expected copies are 1.3 x capacity / the list's total request.
    """
    total = sum(p.shape.total_gpu_milli for p in pods)
    small = sum(p.shape.gpu_milli for p in _small(pods, crumb))
    return 100.0 * small * 1.3 / total if total else 0.0


def _share_of_pods(pods: list[nodeclasses.Pod], crumb: int) -> float:
    return 100.0 * len(_small(pods, crumb)) / len(pods) if pods else 0.0
