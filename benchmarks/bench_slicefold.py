"""A restart's fold of every ResourceSlice into the inventory (CONTRACT §13), this tree beside an earlier commit's.

The work the rebuild does (``operator/runtime.py``) with DRA objects, on what ``draintake.list_all`` hands it: the
DeviceClass, then 5,000 nodes' slices of 8 NVIDIA-shaped GPUs each (``sandbox/dradriver.py``'s attributes: the
same model everywhere, each GPU its own uuid; 1% of the nodes with a tainted GPU), then the claims (5% of the
nodes with two GPUs kube-scheduler allocated) folded by ``draintake.fill``; each node's view into the ledger
(``dra.node``), and every view again (``draintake.refresh_all``), with the cyclic collector paused as the rebuild
pauses it. Also one slice's and one claim's update on the watch (``DraFeed.apply``: the object re-read, its node's
view upserted).

The listing is written once as JSON and each side reads it in its own process (``json.load``: fresh strings for
every occurrence, as the API client's decoding makes them), so the two sides fold the same bytes; the older side
runs from ``git archive`` of its ``src`` (``baseline.source``). Reported per side: CPU seconds
(``time.process_time``) of the fold, the memory the inventory and ledger hold afterwards (tracemalloc, in a second
pass, the listing's bodies dropped), the process's RSS growth over the fold, and the CPU of one slice update and of
one claim update on the watch.

    python -m benchmarks.bench_slicefold --against eae091e    # 5,000 nodes
    python -m benchmarks.bench_slicefold --quick               # 500 nodes, this tree only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import baseline

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
BEFORE = "eae091e"  # main before the fold was made cheap


def listing(nodes: int, seed: int = 7) -> dict[str, Any]:
    """The DRA lists and the nodes' names, as plain JSON (bench_dra's cluster)."""
    import random

    from benchmarks import bench_dra
    from deviceshare.sandbox import dradriver

    rng = random.Random(seed)
    slices, claims = [], []
    for i in range(nodes):
        name = f"node-{i:05d}"
        roll = rng.random()
        slices.append(bench_dra._slice(name, GPUS, rng.randrange(GPUS) if roll < 0.01 else None))
        if 0.01 <= roll < 0.06:
            claims.append(bench_dra._foreign(name, rng.sample(range(GPUS), 2)))
    return {"nodes": [f"node-{i:05d}" for i in range(nodes)],
            "bodies": {"deviceclasses": [dradriver.device_class()], "resourceslices": slices,
                       "resourceclaims": claims}}


def child(path: str, traced: bool) -> dict[str, float]:
    """One side's fold of the listing at ``path`` (run with that side's ``src`` first on sys.path)."""
    import tracemalloc

    from deviceshare.core import deviceselectors, inventory
    from deviceshare.core import ledger as ledgers
    from deviceshare.operator import draintake, drainventory

    deviceselectors.compile_selectors(["device.driver == ''"])  # cel-python's one-time load: not the fold's
    with open(path) as f:
        data = json.load(f)
    bases = [inventory.NodeInfo(name=n, labels={"deviceshare.io/mode": "shared"}, shared=True, ready=True,
                                unschedulable=False, taints=(), devices={}, cpu_milli=128_000,
                                memory_bytes=1 << 40) for n in data["nodes"]]
    listed = draintake.Listed(data["bodies"], {k: "1" for k in data["bodies"]})
    gc.collect()
    gc.disable()  # as the rebuild folds (runtime._collector_paused)
    if traced:
        tracemalloc.start()
    rss = _rss_mib()
    started = time.process_time()
    ledger = ledgers.DeviceLedger()
    dra = drainventory.DraInventory(lambda g: None)
    draintake.fill(dra, listed)
    for base in bases:
        ledger.upsert_node(dra.node(base))
    draintake.refresh_all(dra, ledger)
    fold_s = time.process_time() - started
    gc.enable()
    result = {"fold_s": fold_s, "rss_mib": _rss_mib() - rss}
    if traced:
        del listed, data
        gc.collect()
        result["held_mib"] = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        return result
    # The watch: one slice changed (its resourceVersion bumped), folded and its node upserted, many times over.
    feed = draintake.DraFeed("resourceslices", lambda: dra, lambda: ledger, lambda: None)
    updates = data["bodies"]["resourceslices"][:200]
    started = time.process_time()
    for n, body in enumerate(updates * 5):
        body["metadata"]["resourceVersion"] = str(n + 2)
        feed.apply("MODIFIED", body)
    result["update_ms"] = (time.process_time() - started) / (len(updates) * 5) * 1e3
    # A claim's allocation changing (kube-scheduler's claims here), folded and its node upserted.
    claims = draintake.DraFeed("resourceclaims", lambda: dra, lambda: ledger, lambda: None)
    bodies = data["bodies"]["resourceclaims"]
    started = time.process_time()
    for body in bodies * 4:
        claims.apply("MODIFIED", body)
    result["claim_ms"] = (time.process_time() - started) / (len(bodies) * 4) * 1e3
    return result


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def side(path: Path, src: Path, traced: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(src), str(ROOT)))}
    script = (f"import json, sys; from benchmarks import bench_slicefold as b; "
              f"print(json.dumps(b.child({str(path)!r}, {traced!r})))")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(nodes: int, against: str | None, rounds: int) -> dict[str, dict[str, float]]:
    """Per side (``now``, and ``against`` when given): the best fold of ``rounds`` (alternating sides), the
    memory held, the median slice update."""
    sides = {"now": ROOT / "src"}
    older = baseline.source(against) if against is not None else None
    if against is not None and older is not None:  # (no git, or not that commit: this tree alone)
        sides = {against: older, **sides}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "listing.json"
        path.write_text(json.dumps(listing(nodes)))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, src in sides.items():
                runs[name].append(side(path, src, traced=False))
        held = {name: side(path, src, traced=True)["held_mib"] for name, src in sides.items()}
    return {name: {"fold_s": min(r["fold_s"] for r in rs), "rss_mib": min(r["rss_mib"] for r in rs),
                   "update_ms": sorted(r["update_ms"] for r in rs)[len(rs) // 2],
                   "claim_ms": sorted(r["claim_ms"] for r in rs)[len(rs) // 2], "held_mib": held[name]}
            for name, rs in runs.items()}


def section(nodes: int, against: str | None, rounds: int) -> str:
    load = os.getloadavg()
    results = measure(nodes, against, rounds)
    rows = "\n".join(f"| {name} | {r['fold_s']:.2f} | {r['fold_s'] / (nodes * GPUS) * 1e6:.0f} | {r['held_mib']:.0f} "
                     f"| {r['rss_mib']:.0f} | {r['update_ms']:.2f} | {r['claim_ms']:.2f} |"
                     for name, r in results.items())
    ratio = ""
    if against is not None and against in results:
        old, new = results[against], results["now"]
        ratio = (f"\n\nFold {old['fold_s'] / new['fold_s']:.1f}x less CPU, memory held "
                 f"{old['held_mib'] / new['held_mib']:.1f}x less, a slice update "
                 f"{old['update_ms'] / new['update_ms']:.1f}x and a claim update "
                 f"{old['claim_ms'] / new['claim_ms']:.1f}x less CPU.")
    return f"""## Operator: a restart's fold of {nodes:,} nodes' ResourceSlices ({nodes * GPUS:,} devices)

`benchmarks/bench_slicefold.py`: the rebuild's DRA work on the listed classes, slices and claims (`draintake.fill`,
each node's view into the ledger, `refresh_all`), each side in its own process on the same JSON; best CPU time of
{rounds} alternating runs; memory held by the inventory and ledger after the fold (tracemalloc, listing dropped) and
the process's RSS growth over the fold (least of the runs; the listing's bodies loaded before it); a slice update
and a claim update on the watch (re-read, its node upserted; CPU), median of the runs' means. Load average at the
start {load[0]:.1f} (2-core machine shared with other engineers' test runs).

| side | fold CPU (s) | per device (µs) | held (MiB) | RSS growth (MiB) | slice update (ms) | claim update (ms) |
|---|---:|---:|---:|---:|---:|---:|
{rows}{ratio}
"""


def run(quick: bool) -> str:
    return section(500 if quick else 5000, None if quick else BEFORE, 1 if quick else 3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="500 nodes")
    parser.add_argument("--against", metavar="REV", help="that commit's src beside this tree's")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(section(500 if args.quick else 5000, args.against, args.rounds))
