"""``bench_scale --restart``: the operator restarted into Kubernetes' envelope, one new group waiting (issue 34).

5,000 nodes x 8 GPUs, 35,000 Bound groups of four Running members (140,000 pods, seven one-GPU groups a node, one
GPU free on each), built as ``scalestate.py`` builds its state. Then, for each way the sandbox answers a list (in
pages of 2,000, as kube-apiserver pages with ``limit``; whole, ``limit`` ignored, as its watch cache answered
resourceVersion=0):

1. the sandbox's own read of the cluster: nodes, groups and pods listed concurrently, as the rebuild lists them,
   by a client that only reads the bytes (the time the server takes to serve one read of the cluster);
2. one new one-GPU group and its pod created; the operator (its own process) launched: launch → the pod bound
   (first placement), launch → ready, its RSS once settled and its peak, the LIST requests the sandbox served
   it by resource, and every write it made (``deviceshare_api_writes_total``): one placement's, none to the
   140,000 pods and 35,000 groups it found in place.

    python -m benchmarks.bench_scale --restart --quick    # 500 nodes, 14,000 pods
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import baseline, scalestate
from benchmarks.sandboxes import Child, server_of
from deviceshare.api import names

GPU = scalestate.GPU
PAGE = 2000  # as the rebuild pages (operator/storage/listing.py)
TARGET_SLACK_S = 15.0  # first placement within one read of the cluster + this (issue 34)
TARGET_RSS_MIB = 1024.0
COLLECTIONS = ("/api/v1/nodes", f"/apis/{names.API_VERSION}/{names.PLURAL}", "/api/v1/pods")
READ = ("nodes", names.PLURAL, "pods")


def sizes(quick: bool) -> scalestate.ScaleSizes:
    return scalestate.ScaleSizes(500 if quick else 5000, 3500 if quick else 35000, 4, groups_per_node=7)


@dataclasses.dataclass
class Restart:
    mode: str  # "paged" or "whole"
    read_s: float  # the sandbox's own read of nodes, groups and pods
    read_mib: float
    placed_s: float  # operator launch → the waiting pod bound
    ready_s: float  # operator launch → /readyz 200
    placed_cpu_s: float  # the operator's CPU seconds (all threads) from launch to the pod bound
    rss: tuple[float, float]  # settled, peak
    lists: dict[str, int]  # LIST requests begun, by plural
    writes: dict[str, int]  # the operator's writes by "verb resource result"


@dataclasses.dataclass
class RestartResult:
    sizes: scalestate.ScaleSizes
    fill_s: float
    runs: list[Restart]
    decoding: dict[str, tuple[float, float, float]]  # how -> (body MiB, seconds, peak RSS MiB of its process)


def _decode_child(how: str, size: scalestate.ScaleSizes, out: Any) -> None:
    """In a fresh process: every pod of the envelope in one list body, made into the operator's pod records,
    decoded whole (``orjson.loads``, as before issue 34) or item by item (``listbodies``); its peak RSS while it
    does (the body's bytes included, the building of the body not)."""
    import orjson

    from deviceshare.kube import listbodies
    from deviceshare.operator import state

    pods = []
    for g in range(size.groups):
        node, _ = scalestate.placed(size, g)
        for i in range(size.pods_per_group):
            pod = scalestate.member(size, g, i)
            pod["status"] = scalestate.running_status(node)
            pods.append(orjson.dumps(pod))
    body = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[' + b",".join(pods) + b"]}"
    del pods
    gc.collect()
    with contextlib.suppress(OSError):  # the peak from here on: not the building of the body (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    started = time.perf_counter()
    if how == "whole":
        records = [state.pod_record(p) for p in orjson.loads(body)["items"]]
    else:
        records = [state.pod_record(p) for p in listbodies.ListBody(body).items()]
    seconds = time.perf_counter() - started
    peak = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    out.put((len(body) / 2**20, seconds, peak / 1024, len(records)))


def _decoding(size: scalestate.ScaleSizes) -> dict[str, tuple[float, float, float]]:
    found = {}
    ctx = multiprocessing.get_context("spawn")
    for how in ("whole", "item by item"):
        out = ctx.Queue()
        child = ctx.Process(target=_decode_child, args=(how, size, out))
        child.start()
        mib, seconds, peak, _ = out.get(timeout=1800)
        child.join()
        found[how] = (mib, seconds, peak)
    return found


async def _read(url: str, headers: dict[str, str]) -> tuple[float, int]:
    """Nodes, groups and pods, concurrently, page by page (a server answering whole sends one page each)."""
    async with aiohttp.ClientSession(url, headers=headers) as session:
        async def one(path: str) -> int:
            size, token = 0, ""
            while True:
                query = f"?limit={PAGE}" + (f"&continue={token}" if token else "")
                async with session.get(path + query) as resp:
                    body = await resp.read()
                size += len(body)
                found = re.search(rb'"continue":"([^"]*)"', body[:4096]) or re.search(rb'"continue":"([^"]*)"',
                                                                                       body[-4096:])
                token = found[1].decode() if found else ""
                if not token:
                    return size

        started = time.perf_counter()
        sizes_ = await asyncio.gather(*(one(p) for p in COLLECTIONS))
        return time.perf_counter() - started, sum(sizes_)


async def _waiting(url: str, headers: dict[str, str], name: str) -> None:
    """A one-GPU group and its one pod, as the bench's probes make them (``bench_scale._probe``)."""
    ns = "waiting"
    async with aiohttp.ClientSession(url, headers=headers) as session:
        async with session.post("/api/v1/namespaces", json={"metadata": {"name": ns}}) as resp:
            await resp.read()
        async with session.post(f"/apis/{names.API_VERSION}/namespaces/{ns}/{names.PLURAL}", json={
            "apiVersion": names.API_VERSION, "kind": names.KIND,
            "metadata": {"name": name, "namespace": ns, "finalizers": [names.GROUP_FINALIZER]},
            "spec": {"resources": {GPU: 1}}}) as resp:
            assert resp.status == 201, await resp.text()
        pod = scalestate.member(scalestate.ScaleSizes(1, 1, 1), 0, 0)
        pod["metadata"].update(name=name, namespace=ns, labels={names.POD_GROUP_LABEL: name},
                               annotations={names.POD_GROUP_ANNOTATION: name})
        del pod["spec"]["nodeName"]
        async with session.post(f"/api/v1/namespaces/{ns}/pods", json=pod) as resp:
            assert resp.status == 201, await resp.text()


async def _bound_after(url: str, headers: dict[str, str], name: str, started: float, timeout: float) -> float:
    """Seconds from ``started`` until the waiting pod has a node (read every 50 ms: one small GET)."""
    async with aiohttp.ClientSession(url, headers=headers) as session:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            async with session.get(f"/api/v1/namespaces/waiting/pods/{name}") as resp:
                pod = await resp.json()
            if (pod.get("spec") or {}).get("nodeName"):
                return time.perf_counter() - started
            await asyncio.sleep(0.05)
    raise RuntimeError(f"pod waiting/{name} was not bound in {timeout}s")


def _writes(metrics: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for m in re.finditer(r'^deviceshare_api_writes_total\{([^}]*)\} ([\d.e+]+)$', metrics, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
        if float(m[2]):
            found[f"{labels.get('verb')} {labels.get('resource')} {labels.get('result')}"] = int(float(m[2]))
    return found


def _restart(kubeconfig: Path, commands: Any, results: Any, mode: str) -> Restart:
    url, headers = server_of(kubeconfig)
    commands.put(mode)
    read_s, read_bytes = asyncio.run(_read(url, headers))
    name = f"new-{mode}"
    asyncio.run(_waiting(url, headers, name))
    commands.put("lists")
    before = results.get(timeout=60)
    operator = baseline.OperatorProcess(kubeconfig)
    try:
        started = time.perf_counter()
        # The pod is polled from another thread while this one waits for the operator's readiness.
        with_bound: dict[str, float] = {}

        def poll() -> None:
            with_bound["s"] = asyncio.run(_bound_after(url, headers, name, started, 900))
            with_bound["cpu"] = operator.cpu_seconds()

        poller = threading.Thread(target=poll)
        poller.start()
        operator.start(900)
        ready_s = time.perf_counter() - started
        poller.join()
        time.sleep(5.0)  # its first reconciles and the garbage of the lists settle
        rss = operator.rss_mib()
        writes = _writes(operator.metrics())
    finally:
        operator.stop()
    commands.put("lists")
    after = results.get(timeout=60)
    lists = {p: after.get(p, 0) - before.get(p, 0) for p in READ}
    return Restart(mode, read_s, read_bytes / 2**20, with_bound["s"], ready_s, with_bound["cpu"], rss, lists,
                   writes)


def measure(quick: bool) -> RestartResult:
    size = sizes(quick)
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        commands: Any = multiprocessing.get_context("spawn").Queue()
        sandbox = Child(scalestate.sandbox_main, size, str(kubeconfig), extra=(commands,))
        sandbox.start(1800)
        try:
            fill_s = sandbox.results.get(timeout=10)["fill_s"]
            runs = [_restart(kubeconfig, commands, sandbox.results, mode) for mode in ("paged", "whole")]
        finally:
            sandbox.stop()
    return RestartResult(size, fill_s, runs, _decoding(size))


def _ok(met: bool) -> str:
    return "met" if met else "**not met**"


def section(r: RestartResult) -> str:
    s = r.sizes
    rows = []
    for run in r.runs:
        target = run.read_s + TARGET_SLACK_S
        rss, peak = run.rss
        lists = ", ".join(f"{p} {run.lists[p]}" for p in READ)
        writes = ", ".join(f"{k} {v}" for k, v in sorted(run.writes.items())) or "none"
        rows += [
            (f"{run.mode}: the sandbox's own read of nodes, groups and pods ({run.read_mib:,.0f} MiB)",
             f"{run.read_s:.2f} s", "", ""),
            (f"{run.mode}: operator launch → the waiting pod bound (first placement)", f"**{run.placed_s:.2f} s**",
             f"≤ read + {TARGET_SLACK_S:.0f} s ({target:.1f} s)", _ok(run.placed_s <= target)),
            (f"{run.mode}: operator CPU from launch to that placement (imports, start-up, rebuild; all threads)",
             f"{run.placed_cpu_s:.1f} s", "", ""),
            (f"{run.mode}: operator launch → ready", f"{run.ready_s:.2f} s", "", ""),
            (f"{run.mode}: operator RSS once settled (peak)", f"**{rss:,.0f} MiB** ({peak:,.0f})", "< 1 GiB",
             f"{_ok(rss < TARGET_RSS_MIB)} (peak {_ok(peak < TARGET_RSS_MIB)})"),
            (f"{run.mode}: LIST requests the operator began, by resource", lists, "1 each",
             _ok(all(run.lists[p] == 1 for p in READ))),
            (f"{run.mode}: the operator's writes (verb, resource, result)", writes, "one placement's", ""),
        ]
    for how, (mib, seconds, peak) in r.decoding.items():
        rows.append((f"one list body of every pod ({mib:,.0f} MiB) made into pod records, decoded {how}: "
                     "its process's peak RSS meanwhile, the body included (seconds)",
                     f"**{peak:,.0f} MiB** ({seconds:.2f} s)", "", ""))
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    return f"""## Restart at Kubernetes' envelope: {s.pods:,} pods in {s.groups:,} groups on {s.nodes:,} nodes, one read

`benchmarks/scalerestart.py` (`python -m benchmarks.bench_scale --restart`). {s.groups:,} Bound groups of
{s.pods_per_group} Running members ({s.groups_per_node} one-GPU groups per {s.gpus}-GPU node), filled straight into
the sandbox's store ({r.fill_s:.0f} s); then, with the sandbox paging its lists ({PAGE:,} a page) and then answering
each list whole (`limit` ignored), its own read of the cluster beside the operator restarted into it with one new
one-GPU group waiting.

| measure | result | target | |
|---|---|---|---|
{table}
"""


def run(quick: bool) -> str:
    return section(measure(quick))
