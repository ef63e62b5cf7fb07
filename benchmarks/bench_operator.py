"""Operator placement throughput, its CPU per bound pod beside today's, and restart (ledger rebuild) cost.

* Placement (``placing.py``): 1,000 groups x 2 pods (2 GPUs per group) created at once by 32 concurrent
  creators over HTTP on a 500-node x 8-GPU sandbox in its own process; the operator in another. Runs alternate
  today's operator (``baseline.BASELINE``, from its own source) and this tree's, so the CPU per bound pod of
  both is measured side by side on the same machine state.
* Restart: the sandbox is pre-populated (directly in its store) with 2,000 Bound groups and 10,000 bound,
  Running pods carrying ``selected-devices``; ``Runtime.rebuild()`` is timed here, split into the three list
  calls and the in-memory rebuild; then a whole operator is started in its own process and its RSS is read
  once it has settled.

    python -m benchmarks.run --only operator            # full size (a few minutes)
    python -m benchmarks.bench_operator --quick         # small sizes, prints the section
    python -m benchmarks.bench_operator --placement --spy DIR   # placements only, py-spy on both operators
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import baseline, placing, profiles
from benchmarks.placing import PlacementResult, pct
from benchmarks.sandboxes import Sizes, sandbox_child
from deviceshare.kube import connecting, watching
from deviceshare.operator import context, runtime, storage
from deviceshare.operator.config import OperatorConfig

TARGET_RATE = 500.0  # pods/s, end to end on the sandbox
TARGET_P99 = 5.0  # s
TARGET_CPU_MS = 1.0  # operator CPU per bound pod
TARGET_REBUILD = 2.0  # s
TARGET_RSS_MIB = 200.0
PLACEMENT_PAIRS = 3

# Where the operator's time goes, by the code it runs (py-spy's samples, leaf up; see profiles.summary).
CODE = {
    "JSON (orjson, json)": ("orjson", "json/"),
    "pydantic models": ("pydantic",),
    "aiohttp, yarl, multidict, kubernetes_asyncio (HTTP, watches)": ("aiohttp/", "yarl/", "multidict/",
                                                                     "kubernetes_asyncio/"),
    "kube/http1 (our HTTP/1.1 client for writes)": ("kube/http1.py",),
    "Prometheus metrics": ("prometheus_client/",),
    "placement decision (core/)": ("deviceshare/core/",),
    "watch events into records (kube/watching, intake, state, records)": (
        "kube/watching.py", "operator/intake.py", "operator/state.py", "operator/records.py"),
    "status bodies and annotations (statuses, api/)": (
        "operator/statuses.py", "operator/conditions.py", "operator/memberannotations.py", "deviceshare/api/"),
    "writes: fence, count, read-back (storage/, kube/rest)": ("operator/storage/", "kube/rest.py"),
    "scheduler, reconciler, events, queues": ("deviceshare/operator/",),
    "asyncio (tasks, locks, queues)": ("asyncio/",),
}
# ... and by what it is for (root down).
PURPOSE = {
    "scheduling cycles (decide, status write, binding)": ("Deciding.worker",),
    "group reconciles": ("ReconcileLoop", "GroupReconciler"),
    "events": ("_post_events", "EventRecorder"),
    "watches (nodes, groups, pods)": ("Reflector.run",),
    "sending request bodies (aiohttp's writer task)": ("write_bytes",),
    "reading answers (aiohttp's protocol)": ("data_received",),
}


# ---- restart -----------------------------------------------------------------------------------


def rebuild_sizes(quick: bool) -> Sizes:
    return Sizes(50, 8, 200, 5, 2) if quick else Sizes(500, 8, 2000, 5, 2)


@dataclasses.dataclass
class RebuildResult:
    sizes: Sizes
    list_nodes: float
    list_groups: float
    list_pods: float
    list_gathered: float
    in_memory: float
    rebuild_total: float
    allocations: int
    conflicts: int
    operator_start: float
    operator_rebuild: float
    rss: tuple[float, float]
    sandbox_rss: float


class CachedLists:
    """Stands in for ClusterApi in Runtime.rebuild so only the in-memory part is timed."""

    request_timeout = 30.0

    def __init__(self, nodes: watching.Listing, groups: watching.Listing, pods: watching.Listing) -> None:
        self.nodes, self.groups, self.pods = nodes, groups, pods

    async def list_nodes(self, transform: Any = None) -> watching.Listing:
        return _through(self.nodes, transform)

    async def list_groups(self, transform: Any = None) -> watching.Listing:
        return _through(self.groups, transform)

    async def list_pods(self, transform: Any = None) -> watching.Listing:
        return _through(self.pods, transform)


def _through(listing: watching.Listing, transform: Any) -> watching.Listing:
    return watching.Listing([transform(b) for b in listing.items] if transform else listing.items,
                            listing.resource_version)


async def _timed(coro: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    value = await coro
    return time.perf_counter() - t, value


def metric(text: str, name: str) -> float:
    """The first sample of ``name`` in a Prometheus exposition."""
    line = next(line for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


async def restart(quick: bool) -> RebuildResult:
    sizes = rebuild_sizes(quick)
    repeats = 3
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        sandbox = sandbox_child(sizes, True, kubeconfig)
        sandbox_proc = sandbox.start(600)
        try:
            config = OperatorConfig(kubeconfig=str(kubeconfig), metrics_port=None)
            api = storage.ClusterApi(await connecting.api_client(str(kubeconfig)))
            try:
                ln, lg, lp, gathered, mem, total = [], [], [], [], [], []
                report: Any = None
                for _ in range(repeats):
                    ln.append((await _timed(api.list_nodes()))[0])
                    lg.append((await _timed(api.list_groups()))[0])
                    lp.append((await _timed(api.list_pods()))[0])
                    t, (nodes, groups, pods) = await _timed(
                        asyncio.gather(api.list_nodes(), api.list_groups(), api.list_pods())
                    )
                    gathered.append(t)
                    cached = context.Context(config, api=CachedLists(nodes, groups, pods))  # type: ignore[arg-type]
                    mem.append((await _timed(runtime.Runtime(cached).rebuild()))[0])
                    t, report = await _timed(runtime.Runtime(context.Context(config, api=api)).rebuild())
                    total.append(t)
                assert len(pods.items) == sizes.groups * sizes.pods_per_group, len(pods.items)
            finally:
                await api.close()
            operator = baseline.OperatorProcess(kubeconfig)
            try:
                started = time.perf_counter()
                await asyncio.to_thread(operator.start)
                start_s = time.perf_counter() - started
                await asyncio.sleep(3.0 if quick else 8.0)  # its watches and first reconciles settle
                rebuild_s = metric(await asyncio.to_thread(operator.metrics), "deviceshare_ledger_rebuild_seconds")
                rss = operator.rss_mib()
                sandbox_rss = sandbox_proc.memory_info().rss / 2**20
            finally:
                await asyncio.to_thread(operator.stop)
        finally:
            sandbox.stop()
    med = statistics.median
    return RebuildResult(
        sizes, med(ln), med(lg), med(lp), med(gathered), med(mem), med(total),
        report.allocations, len(report.conflicts), start_s, rebuild_s, rss, sandbox_rss,
    )


# ---- report ------------------------------------------------------------------------------------


def _ok(met: bool) -> str:
    return "met" if met else "**not met**"


def _placement_row(p: PlacementResult) -> str:
    p50, p90, p99 = (pct(p.latencies, q) for q in (0.5, 0.9, 0.99))
    busy = p.wall or 1.0
    return (
        f"| {p.mode} | {p.bound}/{p.pods} | {p.create_wall:.2f} | {p.bind_wall:.2f} | {p.rate:.0f} "
        f"| {p50:.2f} | {p90:.2f} | {p99:.2f} "
        f"| **{p.cpu_per_pod_ms:.2f}** | {p.operator_cpu:.2f} ({100 * p.operator_cpu / busy:.0f}%) "
        f"| {p.sandbox_cpu:.2f} ({100 * p.sandbox_cpu / busy:.0f}%) | {p.loadgen_cpu:.1f} "
        f"| {p.operator_rss[1]:.0f} | {p.events_done:.1f} | {p.load[0]:.1f} |"
    )


def section_placement(runs: list[PlacementResult], profile: str = "") -> str:
    s = runs[0].sizes
    now = [r for r in runs if r.mode == "now"] or runs
    today = [r for r in runs if r.mode == "today"]
    rate = statistics.median(r.rate for r in now)
    p99 = statistics.median(pct(r.latencies, 0.99) for r in now)
    cpu_now = statistics.median(r.cpu_per_pod_ms for r in now)
    cpu_today = statistics.median(r.cpu_per_pod_ms for r in today) if today else float("nan")
    complete = all(r.bound == r.pods for r in runs)
    events = {mode: collections.Counter[str]() for mode in ("today", "now")}
    for r in runs:
        events[r.mode].update(r.events)
    sandbox_share = statistics.median(r.sandbox_cpu / (r.sandbox_cpu + r.operator_cpu + r.loadgen_cpu) for r in now)
    rows = "\n".join(_placement_row(r) for r in runs)
    said = "; ".join(f"{m}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) for m, c in events.items() if c)
    return f"""## Operator: placement throughput, CPU per bound pod (today's beside ours), restart

`benchmarks/bench_operator.py` (`placing.py`). Three processes on the same machine: the sandbox API server
(`Sandbox`, {s.nodes} nodes x {s.gpus} GPUs, kubelet simulation on), the operator (`deviceshare operator`,
default settings: 32 workers, 50 ms status debounce) and the load generator, which creates {s.groups} groups x
{s.pods_per_group} pods ({s.gpus_per_group} GPUs per group) at once with {placing.CREATORS} concurrent HTTP
creators and watches pods. The runs alternate *today* (the operator of commit `{baseline.BASELINE}`, run from
its own source; groups created without the finalizer, as today's install creates them) and *now* (this code;
groups created with the finalizer the webhook now sets at CREATE). Latency runs from the return of a pod's create
call to the moment the load generator's watch first shows it bound; throughput is bound pods over first create →
last binding. CPU seconds are each process's own (every thread), from the first create until the operator's last
event landed; **operator CPU per bound pod** is the operator's over the bound pods. The three share
{os.cpu_count()} CPUs with the other jobs on the machine (load average at each run's start in the last column).

| mode | bound | create wall s | create→all bound s | pods bound/s | p50 s | p90 s | p99 s \
| **operator CPU ms per bound pod** | operator CPU s (% of wall) | sandbox CPU s (% of wall) \
| load generator CPU s | operator peak RSS MiB | events trail s | load avg |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Operator CPU per bound pod, medians: today {cpu_today:.2f} ms, now {cpu_now:.2f} ms
({cpu_today / cpu_now if cpu_now else float("nan"):.1f}x less). Target: at most {TARGET_CPU_MS:.1f} ms —
{_ok(complete and cpu_now <= TARGET_CPU_MS)}.
Medians: {rate:.0f} pods bound/s, p99 {p99:.2f} s (now).
Targets: at least {TARGET_RATE:.0f} pods bound/s end to end — {_ok(complete and rate >= TARGET_RATE)};
p99 create→bound under {TARGET_P99:.0f} s — {_ok(complete and p99 < TARGET_P99)}. Of the three processes' CPU in
the *now* runs, the sandbox's own is {100 * sandbox_share:.0f}% (median).
Events posted, by reason: {said}.

What today's CPU went to, and what was cut (issue 24; the py-spy table below shows both): two API writes per
group that are gone (the finalizer, now set by the webhook in the group's CREATE, and the group's `Bound` event,
now told by its status); every request through kubernetes_asyncio's `call_api` and aiohttp's general-purpose
client (a body walked by its model serializer, a task per request body, cookies, tracing), now a request written
as one buffer on kept-alive HTTP/1.1 connections of our own (`kube/http1.py`); JSON by the standard library, now
orjson; watch events parsed again although the operator held that version already (our own write's answer), now
skipped; a group's spec validated by pydantic at every event, now once per distinct spec; a pod's demand and
member facts read at every event, now once per distinct shape; a member's annotations and env names resolved at
every binding and reconcile, now once per allocation; a reconcile at every Pending→Running. What remains is the
scheduling cycle itself, the watches, and the writes' own fencing, counting and HTTP.
{profile}"""


def section_profile(paths: dict[str, Path]) -> str:
    """Where each operator's time goes, side by side (py-spy's samples of one run of each)."""
    if not paths:
        return ""
    modes = list(paths)
    lines = []
    for title, places, leaf in (("by the code it runs", CODE, True), ("by what it is for", PURPOSE, False)):
        summaries = {m: profiles.summary(paths[m], places, leaf_first=leaf) for m in modes}
        totals = " | ".join(f"{summaries[m][0]} samples" for m in modes)
        lines.append(f"| **{title}** | {totals} |")
        for name in [*places, "other"]:
            shares = " | ".join(f"{100 * summaries[m][1].get(name, 0.0):.0f}%" for m in modes)
            lines.append(f"| {name} | {shares} |")
    table = "\n".join(lines)
    header = " | ".join(modes)
    rule = "|".join("---:" for _ in modes)
    return f"""
Where each operator's time goes, in one run of each (py-spy sampling it at 200 Hz during the burst; the event
loop's own waiting left out; shares of each one's busy samples):

| where | {header} |
|---|{rule}|
{table}
"""


def section_restart(r: RebuildResult) -> str:
    rs = r.sizes
    return f"""Restart: the sandbox holds {rs.groups} Bound groups and {rs.groups * rs.pods_per_group} bound
Running pods with `selected-devices` on {rs.nodes} nodes. `Runtime.rebuild()` is timed in the load generator's process
(median of 3): the list calls alone, then the in-memory part fed the same lists, then the whole.
The operator is then started in its own process; its RSS is read after its watches settled.

| step | seconds |
|---|---|
| list nodes ({rs.nodes}) | {r.list_nodes:.3f} |
| list groups ({rs.groups}) | {r.list_groups:.3f} |
| list pods ({rs.groups * rs.pods_per_group}) | {r.list_pods:.3f} |
| the three lists, concurrently (as rebuild does) | {r.list_gathered:.3f} |
| in-memory rebuild (records, ledger, claims) | {r.in_memory:.3f} |
| **`Runtime.rebuild()` total** ({r.allocations} allocations, {r.conflicts} conflicts) | **{r.rebuild_total:.3f}** |
| operator process: rebuild as it reports it (`deviceshare_ledger_rebuild_seconds`) | {r.operator_rebuild:.3f} |
| operator process: launch → ready (imports, Kopf start-up, rebuild, first lists) | {r.operator_start:.3f} |

| operator RSS MiB | peak RSS MiB | sandbox RSS MiB |
|---|---|---|
| {r.rss[0]:.0f} | {r.rss[1]:.0f} | {r.sandbox_rss:.0f} |

Targets: rebuild under {TARGET_REBUILD:.0f} s — {_ok(r.rebuild_total < TARGET_REBUILD)};
operator RSS under {TARGET_RSS_MIB:.0f} MiB — {_ok(r.rss[0] < TARGET_RSS_MIB)} (peak {_ok(r.rss[1] < TARGET_RSS_MIB)}).
"""


def placements(
    quick: bool, pairs: int, spy: Path | None = None, against: str | None = None
) -> list[PlacementResult]:
    """Today's and this operator alternately, ``pairs`` times each; py-spy on the last run of each (``spy``: a
    folder for the folded stacks, ``today.folded`` and ``now.folded``). ``against``: "today" is that commit's
    operator on this tree's workload (see :func:`placing.placement`)."""
    runs = []
    for i in range(pairs):
        for mode in ("today", "now") if baseline.source(against or baseline.BASELINE) is not None else ("now",):
            last = i == pairs - 1 and spy is not None
            spied = spy / f"{mode}.folded" if last and spy else None
            runs.append(asyncio.run(placing.placement(quick, mode, spied, against)))
    return runs


def section_against(runs: list[PlacementResult], rev: str) -> str:
    """The placement rows of ``rev``'s operator (before) and this tree's (after) on the same workload."""
    before, after = ([r for r in runs if r.mode == mode] for mode in ("today", "now"))
    rows = "\n".join(_placement_row(r) for r in runs)
    rows = rows.replace("| today |", f"| {rev} |").replace("| now |", "| this tree |")
    cpu = [statistics.median(r.cpu_per_pod_ms for r in rs) if rs else float("nan") for rs in (before, after)]
    rate = [statistics.median(r.rate for r in rs) if rs else float("nan") for rs in (before, after)]
    return f"""| operator | bound | create wall s | create→all bound s | pods bound/s | p50 s | p90 s | p99 s \
| **operator CPU ms per bound pod** | operator CPU s (% of wall) | sandbox CPU s (% of wall) \
| load generator CPU s | operator peak RSS MiB | events trail s | load avg |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Medians: operator CPU per bound pod {cpu[0]:.2f} ms ({rev}) and {cpu[1]:.2f} ms (this tree); \
{rate[0]:.0f} and {rate[1]:.0f} pods bound/s.
"""


def profiled(runs: list[PlacementResult]) -> dict[str, Path]:
    return {r.mode: r.profile for r in runs if r.profile is not None}


def run(quick: bool, spy: Path | None = None) -> str:
    spy = spy or Path(tempfile.mkdtemp(prefix="bench-operator-spy-"))
    runs = placements(quick, 1 if quick else PLACEMENT_PAIRS, spy)
    r = asyncio.run(restart(quick))
    return section_placement(runs, section_profile(profiled(runs))) + "\n" + section_restart(r)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--placement", action="store_true", help="placements only (today's and ours)")
    parser.add_argument("--pairs", type=int, default=1, help="with --placement: runs of each")
    parser.add_argument("--spy", metavar="DIR", type=Path, help="where py-spy's folded stacks of the last runs go")
    parser.add_argument("--against", metavar="REV", help="with --placement: that commit's operator beside this "
                        "tree's, on this tree's workload (a change measured alone)")
    args = parser.parse_args(argv)
    if args.placement and args.against:
        print(section_against(placements(args.quick, args.pairs, args.spy, args.against), args.against))
        return 0
    if args.placement:
        runs = placements(args.quick, args.pairs, args.spy)
        print(section_placement(runs, section_profile(profiled(runs))))
        return 0
    print(run(args.quick, args.spy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
