"""Replay of the Alibaba openb GPU-cluster trace through the allocation core.

The 1,213 GPU nodes of ``openb_node_list_gpu_node.csv`` become shared-mode nodes (GPU model as
the label ``deviceshare.io/gpu-model``, cpu and memory from the trace). Every pod that asks for
whole GPUs (``gpu_milli`` 1000) becomes a one-member group, in arrival order; a ``gpu_spec``
naming one model becomes the group's nodeSelector, one naming several (``V100M16|V100M32``) the
pod's required node affinity (``In``), since a nodeSelector cannot say "or". Groups never leave:
the trace is replayed (wrapping around) until the first placement fails, which is when the
cluster counts as full; we report how much of the GPU capacity was allocated by then.
The data lives outside the repository (``../shared/data/openb``); without it this is skipped.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path

from deviceshare.core import inventory, ledger, placement

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "openb"
GPU = "nvidia.com/gpu"
MODEL = "deviceshare.io/gpu-model"
TRACES = ("openb_pod_list_default.csv", "openb_pod_list_gpuspec33.csv")


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    gpus: int
    cpu_milli: int
    memory_bytes: int
    models: tuple[str, ...]  # empty: any model


def load_nodes(path: Path) -> list[inventory.NodeInfo]:
    nodes = []
    with path.open() as f:
        for row in csv.DictReader(f):
            gpus = int(row["gpu"])
            nodes.append(
                inventory.NodeInfo(
                    name=row["sn"],
                    labels={"deviceshare.io/mode": "shared", MODEL: row["model"]},
                    shared=True,
                    ready=True,
                    unschedulable=False,
                    taints=(),
                    devices={GPU: tuple(str(i) for i in range(gpus))},
                    cpu_milli=int(row["cpu_milli"]),
                    memory_bytes=int(row["memory_mib"]) << 20,
                )
            )
    return nodes


def load_pods(path: Path) -> list[TracePod]:
    pods = []
    with path.open() as f:
        for row in csv.DictReader(f):
            if int(row["gpu_milli"] or 0) != 1000 or int(row["num_gpu"] or 0) < 1:
                continue
            spec = row.get("gpu_spec") or ""
            pods.append(
                TracePod(
                    name=row["name"],
                    gpus=int(row["num_gpu"]),
                    cpu_milli=int(row["cpu_milli"]),
                    memory_bytes=int(row["memory_mib"]) << 20,
                    models=tuple(sorted(set(filter(None, spec.split("|"))))),
                )
            )
    return pods


def group_for(
    pod: TracePod, key: tuple[str, str], strategy: str
) -> tuple[placement.GroupRequest, inventory.PodDemand]:
    selector = {MODEL: pod.models[0]} if len(pod.models) == 1 else {}
    terms: tuple[inventory.NodeSelectorTerm, ...] = ()
    if len(pod.models) > 1:
        terms = (inventory.NodeSelectorTerm((inventory.Requirement(MODEL, "In", pod.models),)),)
    request = placement.GroupRequest(key, {GPU: pod.gpus}, selector, strategy)
    return request, inventory.PodDemand(pod.cpu_milli, pod.memory_bytes, {}, (), terms)


@dataclass(frozen=True, slots=True)
class Replay:
    decisions: int
    placed: int
    seconds: float
    share_at_failure: float
    failure: str


def feasible(nodes: list[inventory.NodeInfo], pods: list[TracePod]) -> list[TracePod]:
    """The pods some node could hold when empty (the trace has a few that none can, e.g. 120 cores)."""
    book = ledger.DeviceLedger()
    for node in nodes:
        book.upsert_node(node)
    empty = book.snapshot()
    return [
        pod
        for pod in pods
        if isinstance(
            placement.place_on(empty, *group_for(pod, ("openb", pod.name), "binpack")), placement.Placement
        )
    ]


def replay(
    nodes: list[inventory.NodeInfo], pods: list[TracePod], strategy: str, max_passes: int = 10
) -> Replay:
    book = ledger.DeviceLedger()
    for node in nodes:
        book.upsert_node(node)
    capacity = sum(len(n.devices[GPU]) for n in nodes)
    allocated = decisions = 0
    failure = "no failure"
    started = time.perf_counter()
    for round_ in range(max_passes):
        for pod in pods:
            key = ("openb", f"{pod.name}-{round_}")
            request, demand = group_for(pod, key, strategy)
            decisions += 1
            got = placement.schedule_group(book, request, demand)
            if isinstance(got, placement.Unschedulable):
                failure = f"{pod.name} ({pod.gpus} GPU{'s' if pod.gpus > 1 else ''}"
                failure += f", {'|'.join(pod.models)})" if pod.models else ")"
                failure += f": {got.message()}"
                seconds = time.perf_counter() - started
                return Replay(decisions, decisions - 1, seconds, allocated / capacity, failure)
            book.commit(key)
            book.account_pod(key, got.node, pod.cpu_milli, pod.memory_bytes)
            allocated += pod.gpus
    return Replay(decisions, decisions, time.perf_counter() - started, allocated / capacity, failure)


def run(quick: bool) -> str:
    heading = "## Allocation core: openb trace replay (1,213 GPU nodes)"
    node_file = DATA / "openb_node_list_gpu_node.csv"
    if not node_file.exists():
        return (
            f"{heading}\n\nSkipped: the openb trace is not at `{DATA}` (expected `../shared/data/openb`).\n"
        )
    nodes = load_nodes(node_file)
    capacity = sum(len(n.devices[GPU]) for n in nodes)
    rows = []
    notes = []
    for trace in TRACES[:1] if quick else TRACES:
        whole = load_pods(DATA / trace)
        pods = feasible(nodes, whole)
        for strategy in ("binpack", "spread"):
            r = replay(nodes, pods, strategy)
            rows.append(
                f"| `{trace.removeprefix('openb_pod_list_').removesuffix('.csv')}` "
                f"({len(whole):,} pods, {len(whole) - len(pods)} infeasible) "
                f"| {strategy} | {r.placed:,} | {r.decisions / r.seconds:,.0f} | {r.share_at_failure:.1%} |"
            )
            notes.append(f"- `{trace}`, {strategy}: first failure {r.failure}")
    table = "\n".join(rows)
    failures = "\n".join(notes)
    return f"""{heading}

`benchmarks/bench_core_openb.py`. The Alibaba `cluster-trace-gpu-v2023` openb trace
(`../shared/data/openb`, see its SOURCE.md): {len(nodes):,} GPU nodes, {capacity:,} GPUs, GPU model
as a node label. Each pod asking for whole GPUs (`gpu_milli` 1000) becomes a one-member group,
in arrival order, leaving out the few that no node could hold even when empty (e.g. 8 G2 GPUs
and 120 cores: the trace's own pod failed too). A single-model `gpu_spec` becomes the group's
nodeSelector, a multi-model one the pod's required node affinity (`In`). Groups never leave;
the trace wraps around until the first placement fails. Each decision is `schedule_group`
(snapshot, indexed placement, reserve), then commit and cpu/memory accounting. "GPUs allocated"
is the share of all GPUs held at the first failure; decisions/s includes the final, failing
decision (a full scan for the reasons).

| trace | strategy | groups placed | decisions/s | GPUs allocated at first failure |
|---|---|---:|---:|---:|
{table}

{failures}
"""
