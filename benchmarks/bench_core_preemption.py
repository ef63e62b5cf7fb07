"""The failed cycle on a full cluster (the filter that explains, then preemption's decide), two ways side by side.

5,000 nodes x 8 GPUs, every GPU held: three nodes in four by whole-GPU groups (1, 2 or 4 GPUs), one in
four by sharers (four 250m groups per GPU, 32 a node), priorities mixed, every group's pods requesting
CPU. Preemptors of higher priority arrive (whole 1-8 GPUs or a 250m/500m share, 1-3 pending pods),
while one group on a random node is replaced by another between two of them. Each goes through the
cycle the old way (every node asked why it does not fit, every node bounded) and the new one (reasons
counted per class of alike nodes, :mod:`filterclasses`; nodes walked in the order of a
:class:`victimindex.VictimIndex`), in turn, on the same ledger; both must decide the same. The placement
p99 beside it is ``bench_core``'s churn (70% full, the indexed walk), measured in the same process.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import statistics
import time

from benchmarks import bench_core
from deviceshare.core import capacity, inventory, ledger, placement, preemption, victimindex, victims

GPU = "nvidia.com/gpu"
GI = 1 << 30
PRIORITIES = (0, 0, 10, 10, 100, 100, 500, 1000)
P99_TARGET_MS = 20.0  # the whole failed cycle (filter + decide), issue 34


def build(nodes: int, gpus: int, rng: random.Random) -> tuple[ledger.DeviceLedger, dict[str, list[victims.BoundGroup]]]:
    """Every device of every node held; the groups bound on each node, as preemption is given them."""
    book = ledger.DeviceLedger()
    bound: dict[str, list[victims.BoundGroup]] = {}
    pods: list[tuple[inventory.PodKey, str, int, int]] = []
    n = 0
    for i in range(nodes):
        name = f"node-{i:05d}"
        book.upsert_node(inventory.NodeInfo(
            name=name, labels={"deviceshare.io/mode": "shared"}, shared=True, ready=True, unschedulable=False,
            taints=(), devices={GPU: tuple(str(d) for d in range(gpus))}, cpu_milli=128_000,
            memory_bytes=1 << 40, device_memory={GPU: 80 * GI},
        ))
        holders: list[tuple[tuple[str, ...], capacity.Share | None]] = []
        if rng.random() < 0.25:
            holders = [((str(d),), capacity.Share(250)) for d in range(gpus) for _ in range(4)]
        else:
            d = 0
            while d < gpus:
                size = min(rng.choice((1, 1, 2, 4)), gpus - d)
                holders.append((tuple(str(x) for x in range(d, d + size)), None))
                d += size
        groups = bound.setdefault(name, [])
        for devices, share in holders:
            key = ("batch", f"g{n}")
            n += 1
            allocation = book.reserve(key, name, {GPU: devices}, {GPU: share} if share else None)
            members, cpu = rng.choice((1, 1, 2)), rng.choice((500, 1000, 2000))
            pods += [(("batch", f"g{n}-{p}"), name, cpu, 4 * GI) for p in range(members)]
            groups.append(victims.BoundGroup(
                book.commit(key) or allocation, rng.choice(PRIORITIES), members, cpu * members, 4 * GI * members
            ))
    book.account_pods(pods)
    return book, bound


def preemptor(step: int, rng: random.Random) -> tuple[placement.GroupRequest, list[inventory.PodDemand], int]:
    key = ("ml", f"p{step}")
    if rng.random() < 0.3:
        request = placement.GroupRequest(key, {GPU: 1}, {}, share={GPU: capacity.Share(rng.choice((250, 500)))})
    else:
        request = placement.GroupRequest(key, {GPU: rng.choice((1, 1, 2, 4, 8))}, {})
    pending = [inventory.PodDemand(rng.choice((1000, 4000)), 8 * GI) for _ in range(rng.choice((1, 2, 3)))]
    return request, pending, rng.choice((50, 200, 600, 2000))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _regroup(
    book: ledger.DeviceLedger, bound: dict[str, list[victims.BoundGroup]], rng: random.Random, step: int
) -> str:
    """One group leaves a random node and another of another priority takes its devices (the cluster stays
    full; the ledger and that node's groups change between two decisions, as they do in a live cluster)."""
    node = rng.choice(sorted(bound))
    old = bound[node].pop(rng.randrange(len(bound[node])))
    book.release(old.key)
    key = ("batch", f"r{step}")
    allocation = old.allocation
    book.reserve(key, node, allocation.devices, allocation.share or None)
    committed = book.commit(key)
    bound[node].append(dataclasses.replace(old, allocation=committed, priority=rng.choice(PRIORITIES)))
    return node


class _Path:
    """One way through the failed cycle: the filter that explains, then preemption's decide."""

    def __init__(self, indexed: bool, bound: dict[str, list[victims.BoundGroup]]) -> None:
        self.indexed = indexed
        groups = {node: victims.NodeGroups.of(gs) for node, gs in bound.items()}  # the operator keeps these
        self.by_node: dict[str, victims.NodeGroups] | victimindex.VictimIndex = (
            victimindex.VictimIndex(groups) if indexed else groups)
        self.cycle_ms: list[float] = []
        self.filter_ms: list[float] = []
        self.decide_ms: list[float] = []
        self.cycle_cpu_ms: list[float] = []

    def refile(self, node: str, groups: list[victims.BoundGroup]) -> None:
        filed = victims.NodeGroups.of(groups)
        if isinstance(self.by_node, victimindex.VictimIndex):
            self.by_node.file(node, filed)
        else:
            self.by_node[node] = filed

    def cycle(
        self, book: ledger.DeviceLedger, request: placement.GroupRequest, pending: list[inventory.PodDemand],
        priority: int, changed: tuple[str, list[victims.BoundGroup]] | None,
    ) -> preemption.Preemption | preemption.NoPreemption:
        t0, c0 = time.perf_counter(), time.process_time()
        if changed is not None:
            self.refile(*changed)  # what the operator's groups_by_node does for the nodes the ledger changed
        snapshot = book.snapshot()
        if not self.indexed:  # the scan: every node asked why it does not fit
            snapshot = dataclasses.replace(snapshot, filter_classes=None)
        failed = placement.place_on(snapshot, request, preemption.gang.demand(pending))  # the filter first
        t1 = time.perf_counter()
        decision = preemption.decide(snapshot, request, pending, priority, self.by_node)
        t2, c2 = time.perf_counter(), time.process_time()
        assert isinstance(failed, placement.Unschedulable), "the cluster is full: nothing fits without eviction"
        self.filter_ms.append((t1 - t0) * 1e3)
        self.decide_ms.append((t2 - t1) * 1e3)
        self.cycle_ms.append((t2 - t0) * 1e3)
        self.cycle_cpu_ms.append((c2 - c0) * 1e3)
        return decision


def measure(nodes: int, gpus: int, decisions: int, seed: int = 11) -> dict[str, float]:
    rng = random.Random(seed)
    book, bound = build(nodes, gpus, rng)
    searched = [0]
    best = victims.NodeSearch.best

    def counting(self: victims.NodeSearch) -> victims.Choice | None:
        searched[0] += 1
        return best(self)

    scan, index = _Path(False, bound), _Path(True, bound)
    # The index's first order of each kind of request, and the filter classes' first catch-up, are built once
    # per ledger (the operator's first preemption after a start): timed here, apart from the decisions.
    warm = placement.GroupRequest(("ml", "warm"), {GPU: 1}, {})
    t0 = time.perf_counter()
    placement.explain(book.snapshot(), warm, inventory.PodDemand())
    classes_ms = (time.perf_counter() - t0) * 1e3
    assert isinstance(index.by_node, victimindex.VictimIndex)
    t0 = time.perf_counter()
    for how in (victimindex.WHOLE, "compute"):
        index.by_node.order(book.snapshot(), GPU, how, 1)
    index_ms = (time.perf_counter() - t0) * 1e3 / 2
    victims.NodeSearch.best = counting  # type: ignore[method-assign]
    outcomes: list[int] = []
    gc.collect()
    gc.freeze()  # as the operator does after a rebuild: the cluster's records live on, collections skip them
    try:
        for step in range(decisions):
            request, pending, priority = preemptor(step, rng)
            node = _regroup(book, bound, rng, step)
            changed = (node, bound[node])
            first, second = (scan, index) if step % 2 else (index, scan)  # alternate: neither always runs warm
            before = searched[0]
            a = first.cycle(book, request, pending, priority, changed)
            b = second.cycle(book, request, pending, priority, changed)
            searched.append(searched[0] - before)
            assert a == b, (step, a, b)  # the same victims, the same node, the same reasons
            outcomes.append(len(a.victims) if isinstance(a, preemption.Preemption) else -1)
    finally:
        victims.NodeSearch.best = best  # type: ignore[method-assign]
        gc.unfreeze()
    load = os.getloadavg()[0]
    placed, _, _ = bench_core._churn(nodes, gpus, max(200, decisions), seed, naive=False)
    out: dict[str, float] = {
        "load": load, "classes_ms": classes_ms, "index_ms": index_ms,
        "place_p50": _percentile(placed, 0.5) * 1e3,
        "place_p99": _percentile(placed, 0.99) * 1e3,
        "searched_mean": statistics.fmean(searched[1:]) / 2,
        "preempted": sum(1 for o in outcomes if o >= 0),
        "victims_mean": statistics.fmean([o for o in outcomes if o >= 0] or [0]),
        "groups": sum(len(g) for g in bound.values()),
        "decisions": decisions,
    }
    for label, path in (("scan", scan), ("index", index)):
        for what in ("cycle_ms", "filter_ms", "decide_ms", "cycle_cpu_ms"):
            values: list[float] = getattr(path, what)
            out[f"{label}_{what[:-3]}_p50"] = _percentile(values, 0.5)
            out[f"{label}_{what[:-3]}_p99"] = _percentile(values, 0.99)
    return out


def run(quick: bool) -> str:
    nodes, gpus, decisions = (500, 8, 60) if quick else (5000, 8, 300)
    r = measure(nodes, gpus, decisions)
    ok = r["index_cycle_p99"] < P99_TARGET_MS
    rows = "\n".join(
        f"| {what} | {r[f'scan_{key}_p50']:.2f} | {r[f'scan_{key}_p99']:.2f} | {r[f'index_{key}_p50']:.2f} "
        f"| {r[f'index_{key}_p99']:.2f} | {r[f'scan_{key}_p99'] / r[f'index_{key}_p99']:.1f}x |"
        for what, key in (
            ("failed filter + `decide` (the whole cycle)", "cycle"),
            ("the same cycles, CPU time", "cycle_cpu"),
            ("the failed filter (`place_on`, reasons counted)", "filter"),
            ("`preemption.decide` (post-filter)", "decide"),
        )
    )
    return f"""## Allocation core: a preemption decision on a full cluster ({nodes:,} nodes x {gpus} GPUs)

`benchmarks/bench_core_preemption.py`. Every GPU held by one of {int(r["groups"]):,} groups: three nodes in
four by whole-GPU groups (1, 2 or 4 GPUs), one in four by sharers (four 250m groups per GPU), priorities
0/10/100/500/1000, every group's 1-2 pods requesting CPU and memory. {decisions} preemptors arrive one by
one (70% whole 1/1/2/4/8 GPUs, 30% a 250m or 500m share; 1-3 pending pods; priority 50/200/600/2000); before
each, one group on a random node leaves and another of a random priority takes its devices (the cluster stays
full, the ledger and that node's groups change). Each preemptor goes through the failed cycle twice, the two
ways in turn (which goes first alternates), on the same ledger: the placement filter fails first and counts
every node's reason, then `preemption.decide`.

- *scan* (before): the filter asks every node why it does not fit; `decide` bounds every node's rank from
  the groups bound there (a dict of `victims.NodeGroups`), then searches nodes exactly in that order;
- *index* (now): the filter counts per class of alike nodes (`core/filterclasses.py`, kept by the ledger,
  following its snapshots); `decide` walks a `victimindex.VictimIndex` (nodes ordered per resource, mode and
  count by a lower bound of their cheapest victim set, refiled when a node's groups or state change) and
  bounds and searches only the nodes whose key could still win. The changed node's groups are refiled
  inside the timed cycle, in both ways, as the operator does when it decides.

Both ways must return the same decision (node, victims and, where nothing is found, every reason counted):
asserted for every preemptor. Wall-clock per cycle, CPython, GC on (the cluster's records frozen out of
collections, as the operator does after a rebuild). The machine (2 cores) was shared with other engineers'
work while it ran: load average {r["load"]:.1f} at the end of the timed decisions; the CPU time of the same
cycles is beside the wall clock.

| | scan p50 (ms) | scan p99 (ms) | index p50 (ms) | index p99 (ms) | p99 scan / index |
|---|---:|---:|---:|---:|---:|
{rows}
| normal placement `place_group` (bench_core's churn, same run) | | | {r["place_p50"]:.3f} | {r["place_p99"]:.3f} | |

Built once per ledger, before the first failed cycle (the operator's first preemption after a start): the
filter classes' first catch-up {r["classes_ms"]:.0f} ms, the index's order for one kind of request
{r["index_ms"]:.0f} ms. Preemptions found: {int(r["preempted"])} of {decisions} (mean {r["victims_mean"]:.1f} victim
groups); nodes searched exactly per decision: {r["searched_mean"]:.1f} on average (of {nodes:,}). The choice equals
a brute-force search over every victim subset on every node (tests/core/test_preemption_properties.py: 200
random clusters scanned and indexed, 60 larger ones with the index kept as they change).

Target: the whole failed cycle's p99 below {P99_TARGET_MS:g} ms — **{"met" if ok else "NOT met"}**
({r["index_cycle_p99"]:.2f} ms; by the scan {r["scan_cycle_p99"]:.2f} ms).
"""
