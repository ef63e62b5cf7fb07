"""What one Prometheus scrape of the operator costs at 5,000 nodes, and what keeping the fleet gauges costs.

The cluster of ``bench_core_shares`` (5,000 nodes x 8 GPUs, half whole-device and half sharing groups,
filled to ~70%), its groups recorded in a ClusterState as Bound, a few hundred unschedulable, and a
learned workload mix; then :meth:`Metrics.exposition` is timed (the whole /metrics body, every
collector), and apart: the fleet collector (leader, phases, reasons, fragmentation), the per-node
device gauges, the fragmentation gauge right after the workload mix changed (every live node state
priced again), and the subscription's work per ledger change during churn (what a placement pays
for the gauge to stay current).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from benchmarks import bench_core_shares, filling
from deviceshare.api import models
from deviceshare.core import fgdplacement, placement
from deviceshare.core import ledger as ledgers
from deviceshare.operator import fleetmetrics, metrics, nodemetrics, tallies
from deviceshare.operator import state as state_

UNSCHEDULABLE = 300
MESSAGE = "0/5000 nodes are available: 4900 insufficient nvidia.com/gpu, 100 not in shared mode."


class NaiveNodeCollector(Collector):
    """The per-node gauges as they were built before (commit 1fb9481): every node from the ledger, formatted
    by prometheus-client, at every scrape. The baseline, timed beside the kept-as-text gauges."""

    def __init__(self, book: ledgers.DeviceLedger) -> None:
        self.book = book

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [GaugeMetricFamily(name, doc, labels=["node", "resource"]) for name, doc in nodemetrics.FAMILIES]
        for node in self.book.nodes():
            for resource, ids in node.devices.items():
                key = [node.name, resource]
                n_free = len(self.book.free_devices(node.name, resource))
                milli, mem, n_tiles = nodemetrics.given_out(self.book, node, resource, ids)
                families[nodemetrics.FREE].add_metric(key, n_free)
                families[nodemetrics.ALLOCATED].add_metric(key, len(ids) - n_free)
                families[nodemetrics.COMPUTE].add_metric(key, milli / 1000)
                per_device = node.device_memory.get(resource)
                if per_device is not None:
                    families[nodemetrics.MEMORY].add_metric(key, mem)
                    families[nodemetrics.MEMORY_CAP].add_metric(key, per_device * len(ids))
                if node.device_tiles.get(resource):
                    families[nodemetrics.TILES].add_metric(key, n_tiles)
        yield from families


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip


@dataclass
class Source:
    """What the fleet collector reads, as a running operator's Context holds it."""

    state: state_.ClusterState
    fgd: fgdplacement.FGDPlacement
    unschedulable: tallies.Tally[state_.GroupKey, str] = field(init=False)
    conflicts: dict[state_.GroupKey, set[state_.GroupKey]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.unschedulable = tallies.Tally(
            lambda key, message: fleetmetrics.waiting_class(message, self.state.groups.get(key))
        )


def _group(key: tuple[str, str], request: placement.GroupRequest, phase: str) -> state_.GroupRecord:
    spec = models.GroupSpec.model_validate({"resources": dict(request.resources)})
    return state_.GroupRecord(key, f"uid-{key[1]}", 1, "1", spec, None, models.GroupStatus(phase=phase), False, ())  # type: ignore[arg-type]


def _timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(nodes: int, gpus: int, churn: int, repeat: int) -> dict[str, float]:
    rng = random.Random(7)
    book = bench_core_shares.build_cluster(nodes, gpus, rng)
    requests: dict[tuple[str, str], placement.GroupRequest] = {}
    fgd = fgdplacement.FGDPlacement()

    def make(key: tuple[str, str]) -> tuple[placement.GroupRequest, object]:
        request, pod = bench_core_shares._request(key, rng)
        requests[key] = request
        return request, pod

    place = filling.scheduling(book)

    def place_and_learn(request: placement.GroupRequest, pod: object) -> object:
        got = place(request, pod)  # type: ignore[arg-type]
        if got is not None:
            fgd.observe(request, pod.cpu_milli)  # type: ignore[attr-defined]
        return got

    live = filling.fill(nodes, gpus, make, place_and_learn)  # type: ignore[arg-type]
    cluster = state_.ClusterState()
    for key in live:
        cluster.groups[key] = _group(key, requests[key], "Bound")
    source = Source(cluster, fgd)
    for i in range(UNSCHEDULABLE):
        key = ("waiting", f"w{i}")
        cluster.groups[key] = _group(key, placement.GroupRequest(key, {filling.GPU: 16}, {}), "Pending")
        source.unschedulable[key] = MESSAGE

    m = metrics.Metrics()
    t0 = time.perf_counter()
    m.bind_ledger(book)  # the subscription: every node's state priced into the gauge's counts once
    subscribe_ms = (time.perf_counter() - t0) * 1000
    m.bind_context(source)
    m.bind_leader(lambda: True)
    t0 = time.perf_counter()
    m.exposition()  # the first scrape renders every node and counts every node state once
    first_scrape_ms = (time.perf_counter() - t0) * 1000

    # Churn: what each ledger change costs the subscription (timed inside the callback).
    spent = [0.0, 0]
    tracker = m.fleet._fragmentation
    subscribers = list(book._subscribers)

    def timed_on_node(name: str, node_state: ledgers.NodeState | None) -> None:
        t = time.perf_counter()
        for on_node in subscribers:
            on_node(name, node_state)
        spent[0] += time.perf_counter() - t
        spent[1] += 1

    book._subscribers[:] = [timed_on_node]
    t0 = time.perf_counter()
    for step in range(churn):
        key = ("churn", f"c{step}")
        request, pod = make(key)
        place_and_learn(request, pod)
        book.release(live.pop(rng.randrange(len(live))))
        live.append(key)
    churn_s = time.perf_counter() - t0
    gc.collect()
    pending = len(tracker._changed)
    t0 = time.perf_counter()
    m.exposition()
    first_ms = (time.perf_counter() - t0) * 1000
    body = m.exposition()
    scrape = _timed(m.exposition, repeat)
    fleet = _timed(lambda: list(m.fleet.collect()), repeat)
    per_node = _timed(m.nodes.text, repeat)
    naive = CollectorRegistry()
    naive.register(NaiveNodeCollector(book))
    before = _timed(lambda: generate_latest(naive), max(3, repeat // 3))
    if _samples(generate_latest(naive).decode()) != _samples(m.nodes.text()):
        raise AssertionError("the per-node gauges kept as text differ from the ones built afresh")
    workload = fgd.histogram.workload()
    reprice = _timed(lambda: tracker._reprice(workload), max(3, repeat // 4))
    return {
        "nodes": nodes, "groups": len(live),
        "series": sum(1 for line in body.splitlines() if not line.startswith(b"#")),
        "bytes": len(body), "scrape_p50": statistics.median(scrape), "scrape_max": max(scrape),
        "fleet_p50": statistics.median(fleet), "per_node_p50": statistics.median(per_node),
        "reprice_p50": statistics.median(reprice), "states": sum(len(c) for c in tracker._counts.values()),
        "subscribe_ms": subscribe_ms, "changes": spent[1], "per_change_us": spent[0] / max(spent[1], 1) * 1e6,
        "churn_share": spent[0] / churn_s * 100, "first_ms": first_ms, "pending": pending,
        "first_scrape_ms": first_scrape_ms, "before_p50": statistics.median(before),
    }


def run(quick: bool) -> str:
    nodes, gpus, churn, repeat = (500, 8, 300, 10) if quick else (5000, 8, 2000, 30)
    r = measure(nodes, gpus, churn, repeat)
    return f"""## Operator: one /metrics scrape at {nodes:,} nodes

`benchmarks/bench_scrape.py`. The cluster of the shares section ({nodes:,} nodes x {gpus} GPUs, half
whole-device and half sharing groups, ~70% allocated: {int(r["groups"]):,} groups recorded as Bound, plus
{UNSCHEDULABLE} unschedulable ones), the workload mix learned from the groups placed, then {churn:,}
placements each followed by a release. Then `Metrics.exposition()` (the whole body Prometheus reads:
{int(r["series"]):,} samples, {r["bytes"] / 1024:,.0f} KiB) is timed {repeat} times, and its parts apart.
Wall clock, one process, GC on.

| what | ms (p50) |
|---|---:|
| whole scrape (`Metrics.exposition`) | {r["scrape_p50"]:.1f} (max {r["scrape_max"]:.1f}) |
| fleet gauges (leader, phases, reasons, fragmentation; counts, no walk) | {r["fleet_p50"]:.3f} |
| per-node device gauges (free, allocated, compute, memory, tiles; text kept per node) | {r["per_node_p50"]:.1f} |
| whole scrape, the first after the churn ({int(r["pending"]):,} nodes changed) | {r["first_ms"]:.1f} |
| the first scrape after a rebuild (every node rendered, every node state counted) | {r["first_scrape_ms"]:.1f} |
| fragmentation after the mix changed ({int(r["states"]):,} node states priced again) | {r["reprice_p50"]:.1f} |
| subscribing a rebuilt ledger (every node once) | {r["subscribe_ms"]:.1f} |

The fleet gauges cost the number of phases, reason kinds and resources, whatever the number of groups or
nodes, plus the nodes changed since the last scrape (at most every node once). The per-node gauges are
one series per node and resource, kept as text per node and re-rendered for the nodes that changed
since the last scrape: a scrape is O(nodes x resources) string joins, plus O(devices) per changed node.
A ledger change costs the two subscriptions {r["per_change_us"]:.2f} µs on the scheduling path (they note
the node; {int(r["changes"]):,} changes during the churn, {r["churn_share"]:.2f}% of its time). Before, the
per-node gauges were built from the ledger and formatted by prometheus-client at every scrape (commit
1fb9481): timed beside, on the same ledger, with the same samples (checked), {r["before_p50"]:.1f} ms p50,
{r["before_p50"] / r["per_node_p50"]:.0f}x the kept text.
"""
