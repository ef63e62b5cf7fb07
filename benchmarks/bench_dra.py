"""Placement of DRA groups (CONTRACT §13) at 5,000 nodes x 8 GPUs published in ResourceSlices.

The nodes' inventory is built the operator's way: Node bodies and the sandbox driver's ResourceSlices
(``sandbox/dradriver.py``: NVIDIA's ``gpu.nvidia.com`` attributes) and DeviceClass folded by
``operator/drainventory.py`` (class selectors evaluated with cel-python, once per slice), with 5% of the nodes
holding two GPUs another claim allocated (kube-scheduler's) and 1% a tainted GPU. Then the churn of
``bench_core``: filled to ~70%, then each step decides where a new group goes (timed), reserves it and lets an
older one go. Three kinds of group, side by side in one run over the same seeded sequence:

- **extended resource**: the same cluster as device-plugin nodes (``nvidia.com/gpu``), the baseline;
- **DRA**: the group's resource is the DeviceClass, its IDs ``<pool>/<device>``;
- **DRA + selectors**: a claim selector on every group, one every GPU matches (``productName``) and one about
  an eighth of the GPUs match (a ``uuid`` prefix), the devices narrowed by ``core/eligibility.restrict`` on each
  decision (the time includes that narrowing; the selector's evaluation is cached per (class, selectors) and
  not in the loop).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from deviceshare.core import eligibility, inventory, ledger, placement
from deviceshare.operator import drainventory
from deviceshare.sandbox import dradriver

GPU = "nvidia.com/gpu"
CLASS = dradriver.DEVICE_CLASS
SIZES = (1, 1, 1, 1, 2, 2, 4, 8)
# A selector every GPU of the cluster matches, and one a tenth of the nodes' GPUs match.
SELECTORS = {
    "selectors": f"device.attributes['{dradriver.DRIVER}'].productName.startsWith('NVIDIA H')",
    "narrow": f"device.attributes['{dradriver.DRIVER}'].uuid.startsWith('GPU-0') || "
              f"device.attributes['{dradriver.DRIVER}'].uuid.startsWith('GPU-1')",
}


def _node(i: int, gpus: int) -> inventory.NodeInfo:
    return inventory.NodeInfo(
        name=f"node-{i:05d}", labels={"deviceshare.io/mode": "shared"}, shared=True, ready=True,
        unschedulable=False, taints=(), devices={GPU: tuple(str(d) for d in range(gpus))},
        cpu_milli=128_000, memory_bytes=1 << 40,
    )


def _slice(name: str, gpus: int, tainted: int | None) -> dict[str, Any]:
    devices = [dradriver.gpu_device(name, d, 81920, shared=False) for d in range(gpus)]
    if tainted is not None:
        devices[tainted]["taints"] = [{"key": "example.com/xid", "effect": "NoSchedule"}]
    return {"metadata": {"name": f"{name}-slice", "resourceVersion": "1"},
            "spec": {"driver": dradriver.DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def _foreign(name: str, devices: Sequence[int]) -> dict[str, Any]:
    return {"metadata": {"namespace": "other", "name": f"{name}-theirs", "uid": f"u-{name}"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": dradriver.DRIVER, "pool": name, "device": f"gpu-{d}"} for d in devices]}}}}


def build(
    nodes: int, gpus: int, seed: int, dra: bool
) -> tuple[ledger.DeviceLedger, drainventory.DraInventory, float]:
    """The ledger, the inventory its views came from, and (DRA) the CPU seconds the views took to build: the slices
    and claims folded and each node's view upserted, the objects made beforehand (the operator gets them from its
    lists) and the cyclic collector paused, as the rebuild folds them (``operator/runtime.py``)."""
    rng = random.Random(seed)
    book = ledger.DeviceLedger()
    inv = drainventory.DraInventory(lambda g: None)
    inv.on_class("ADDED", dradriver.device_class())
    cluster: list[tuple[inventory.NodeInfo, dict[str, Any] | None, dict[str, Any] | None]] = []
    for i in range(nodes):
        base = _node(i, gpus)
        roll = rng.random()
        if dra:
            body = _slice(base.name, gpus, rng.randrange(gpus) if roll < 0.01 else None)
            claim = _foreign(base.name, rng.sample(range(gpus), 2)) if 0.01 <= roll < 0.06 else None
            cluster.append((base, body, claim))
        else:
            cluster.append((base, None, None))
    gc.collect()
    gc.disable()
    t0 = time.process_time()
    try:
        for node, published, theirs in cluster:
            if published is not None:
                inv.on_slice("ADDED", published)
                if theirs is not None:
                    inv.on_claim("ADDED", theirs)
                book.upsert_node(inv.node(node))
            else:
                book.upsert_node(node)
        return book, inv, time.process_time() - t0
    finally:
        gc.enable()


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def churn(nodes: int, gpus: int, decisions: int, kind: str, seed: int = 7) -> dict[str, float]:
    book, inv, built = build(nodes, gpus, seed, dra=kind != "extended")
    resource = GPU if kind == "extended" else CLASS
    narrow: Callable[[Any], Any] = lambda snapshot: snapshot  # noqa: E731
    if kind in SELECTORS:
        selector = SELECTORS[kind]
        t0 = time.perf_counter()
        left_out, memo = inv.excluded(CLASS, [selector]), inv.narrowed(CLASS, [selector])
        narrow = lambda snapshot: eligibility.restrict(snapshot, CLASS, left_out, memo)  # noqa: E731
        built = time.perf_counter() - t0  # the selector's evaluation over every device, once
    rng = random.Random(seed + 1)
    live: list[tuple[str, str]] = []
    pod = inventory.PodDemand(cpu_milli=1000, memory_bytes=8 << 30)
    target = int(nodes * gpus * 0.7)
    step = used = 0
    while used < target and step < 4 * target:  # fill, not timed
        key = ("fill", f"f{step}")
        step += 1
        d = placement.place_group(book, placement.GroupRequest(key, {resource: rng.choice(SIZES)}, {}), pod)
        if isinstance(d, placement.Placement):
            book.reserve(key, d.node, d.devices)
            live.append(key)
            used += len(d.devices[resource])
    timings: list[float] = []
    failures = 0
    gc.collect()
    for n in range(decisions):
        request = placement.GroupRequest(("bench", f"g{n}"), {resource: rng.choice(SIZES)}, {},
                                         "spread" if rng.random() < 0.25 else "binpack")
        t0 = time.perf_counter()
        decision = placement.place_on(narrow(book.snapshot()), request, pod)
        timings.append(time.perf_counter() - t0)
        if isinstance(decision, placement.Placement):
            book.reserve(request.key, decision.node, decision.devices)
            live.append(request.key)
        else:
            failures += 1
        book.release(live.pop(rng.randrange(len(live))))
    return {"p50": _percentile(timings, 0.5) * 1e3, "p99": _percentile(timings, 0.99) * 1e3,
            "mean": statistics.fmean(timings) * 1e3, "failures": failures, "built_s": built}


def run(quick: bool) -> str:
    nodes, gpus, decisions = (500, 8, 200) if quick else (5000, 8, 1500)
    rows = {kind: churn(nodes, gpus, decisions, kind) for kind in ("extended", "dra", "selectors", "narrow")}
    base = rows["extended"]["p99"]
    lines = "\n".join(
        f"| {label} | {r['p50']:.3f} | {r['p99']:.3f} | {r['mean']:.3f} | {r['p99'] / base:.1f}x "
        f"| {int(r['failures'])} |"
        for label, r in (("extended resource (device plugin)", rows["extended"]), ("DRA", rows["dra"]),
                         ("DRA + a claim selector all GPUs match", rows["selectors"]),
                         ("DRA + a claim selector ~1/8 of GPUs match (uuid prefix)", rows["narrow"])))
    return f"""## DRA groups: placement with ResourceSlices ({nodes:,} nodes x {gpus} GPUs)

`benchmarks/bench_dra.py`: {decisions:,} decisions of the churn, each kind over the same seeded sequence in one
run; 5% of nodes with two GPUs another claim allocated, 1% with a tainted GPU (DRA rows). Inventory views built
from the slices in {rows["dra"]["built_s"]:.1f} s of CPU (the class's selectors with cel-python, once per slice); the
claim selectors evaluated over every device in {rows["selectors"]["built_s"]:.1f} s and
{rows["narrow"]["built_s"]:.1f} s (once per class and selectors, until a slice or class changes).

| group kind | p50 (ms) | p99 (ms) | mean (ms) | p99 vs extended | unschedulable |
|---|---:|---:|---:|---:|---:|
{lines}
"""


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv))

