"""Operator placement throughput/latency and restart (ledger rebuild) cost, against the sandbox API.

Three processes, so each side's CPU and memory are its own: the sandbox API server (a
``multiprocessing`` child running :class:`deviceshare.sandbox.Sandbox`), the real operator
(``run_operator``, Kopf and all, in a second child) and this process, which generates the load and
watches pods.

* Placement: 1,000 groups x 2 pods (2 GPUs per group) created at once by 32 concurrent creators over
  HTTP on a 500-node x 8-GPU sandbox. A pod's latency runs from the return of its create call to the
  moment this process's pod watch first shows it with ``spec.nodeName`` (client-side clocks; the API's
  ``creationTimestamp`` has 1 s resolution). Throughput is bound pods over the time from the first
  create to the last binding.
* Restart: the sandbox is pre-populated (directly in its store) with 2,000 Bound groups and 10,000
  bound, Running pods carrying ``selected-devices``; ``Runtime.rebuild()`` is timed here, split into the
  three list calls and the in-memory rebuild; then a whole operator is started in its own process and
  its RSS is read once it has settled.

    python -m benchmarks.run --only operator            # full size (a few minutes)
    python -m benchmarks.bench_operator --quick         # small sizes, prints the section
    python -m benchmarks.bench_operator --profile out.prof   # placement run with cProfile in the operator
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import dataclasses
import io
import json
import multiprocessing
import multiprocessing.synchronize
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil  # type: ignore[import-untyped]
import yaml

from deviceshare.api import names
from deviceshare.kube import connecting, loops
from deviceshare.operator import context, runtime, storage
from deviceshare.operator.config import OperatorConfig

GPU = "nvidia.com/gpu"
NAMESPACE = "bench"
CREATORS = 32
TARGET_RATE = 100.0  # pods/s
TARGET_P99 = 5.0  # s
TARGET_REBUILD = 2.0  # s
TARGET_RSS_MIB = 200.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    nodes: int
    gpus: int
    groups: int
    pods_per_group: int
    gpus_per_group: int


def placement_sizes(quick: bool) -> Sizes:
    return Sizes(50, 8, 100, 2, 2) if quick else Sizes(500, 8, 1000, 2, 2)


def rebuild_sizes(quick: bool) -> Sizes:
    return Sizes(50, 8, 200, 5, 2) if quick else Sizes(500, 8, 2000, 5, 2)


# ---- child processes ---------------------------------------------------------------------------


def _sandbox_main(
    sizes: Sizes, prepopulate: bool, kubeconfig: str, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event, results: Any, profile_path: str | None = None,
) -> None:
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:  # as `deviceshare sandbox`
            runner.run(_serve_sandbox(sizes, prepopulate, Path(kubeconfig), ready, stop))
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


async def _serve_sandbox(
    sizes: Sizes, prepopulate: bool, kubeconfig: Path, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
) -> None:
    from deviceshare.sandbox import Sandbox

    sandbox = Sandbox(nodes=sizes.nodes, gpus=sizes.gpus, kubelet_delay=0.5, kubeconfig_path=kubeconfig)
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    if prepopulate:
        populate_bound(sandbox, sizes)
    async with sandbox:
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)


def populate_bound(sandbox: Any, sizes: Sizes) -> None:
    """Bound groups packed onto nodes, each with bound Running members that carry their devices."""
    per_node = sizes.gpus // sizes.gpus_per_group
    for g in range(sizes.groups):
        node = f"gpu-node-{(g // per_node) % sizes.nodes}"
        first = (g % per_node) * sizes.gpus_per_group
        ids = [str(i) for i in range(first, first + sizes.gpus_per_group)]
        name = f"g{g}"
        sandbox.create({
            "apiVersion": names.API_VERSION, "kind": names.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE, "finalizers": [names.GROUP_FINALIZER]},
            "spec": {"resources": {GPU: sizes.gpus_per_group}},
        })
        members = [f"{name}-p{i}" for i in range(sizes.pods_per_group)]
        sandbox.patch(names.PLURAL, name, {"status": {
            "phase": names.PHASE_BOUND, "nodeName": node, "allocatedDevices": {GPU: ids},
            "members": members, "memberCount": len(members),
        }}, NAMESPACE, subresource="status")
        for pod_name in members:
            body = pod_body(pod_name, name)
            body["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] = json.dumps({GPU: ",".join(ids)})
            body["metadata"]["annotations"][names.POD_ENV_ANNOTATION_PREFIX + "NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            body["spec"]["nodeName"] = node
            sandbox.create(body)
            sandbox.patch("pods", pod_name, {"status": {"phase": "Running"}}, NAMESPACE, subresource="status")


def pod_body(name: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "annotations": {names.POD_GROUP_ANNOTATION: group}, "labels": {names.POD_GROUP_LABEL: group},
        },
        "spec": {
            "schedulerName": names.DEFAULT_SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
    }


def _operator_main(
    kubeconfig: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event,
    results: Any, profile_path: str | None,
) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    # Kopf's watch generators are closed noisily when the loop shuts down; nothing to act on here.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:  # as `deviceshare operator`
            runner.run(_run_operator(kubeconfig, ready, stop, results))
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


async def _run_operator(
    kubeconfig: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event,
    results: Any,
) -> None:
    import kopf

    from deviceshare.operator.process import run_operator

    config = OperatorConfig(kubeconfig=kubeconfig, metrics_port=None)
    stop_flag, memo = asyncio.Event(), kopf.Memo()
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    task = loop.create_task(run_operator(config, stop_flag=stop_flag, memo=memo))
    while not (getattr(memo, "runtime", None) is not None and memo.runtime.started):
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    gauge = memo.runtime.ctx.metrics.rebuild_seconds
    rebuild = next(iter(gauge.collect())).samples[0].value
    results.put({"start_s": time.perf_counter() - started, "rebuild_s": rebuild})
    ready.set()
    await loop.run_in_executor(None, stop.wait)
    stop_flag.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)


class Child:
    """A spawned process with a stop event; stopping waits for it, then kills it if it hangs."""

    def __init__(self, target: Any, *args: Any, extra: tuple[Any, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop_event = ctx.Event(), ctx.Event()
        self.results: Any = ctx.Queue()
        self.process = ctx.Process(
            target=target, args=(*args, self.ready, self.stop_event, self.results, *extra), daemon=True
        )

    def start(self, timeout: float) -> psutil.Process:
        self.process.start()
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if not self.process.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.process.name} exited or was not ready in {timeout}s")
        return psutil.Process(self.process.pid)

    def stop(self) -> None:
        self.stop_event.set()
        self.process.join(30)
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(5)


def sandbox_child(sizes: Sizes, prepopulate: bool, kubeconfig: Path, profile_path: str | None = None) -> Child:
    return Child(_sandbox_main, sizes, prepopulate, str(kubeconfig), extra=(profile_path,))


def operator_child(kubeconfig: Path, profile_path: str | None = None) -> Child:
    return Child(_operator_main, str(kubeconfig), extra=(profile_path,))


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def rss_mib(proc: psutil.Process) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB."""
    current = proc.memory_info().rss / 2**20
    peak = current
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return current, peak


def server_of(kubeconfig: Path) -> tuple[str, dict[str, str]]:
    cfg = yaml.safe_load(kubeconfig.read_text())
    token = cfg["users"][0]["user"]["token"]
    return cfg["clusters"][0]["cluster"]["server"], {"Authorization": f"Bearer {token}"}


# ---- placement ---------------------------------------------------------------------------------


@dataclasses.dataclass
class PlacementResult:
    sizes: Sizes
    pods: int
    bound: int
    create_wall: float
    bind_wall: float
    latencies: list[float]
    timeline: list[tuple[float, float]]  # (created, bound) relative to the first create
    operator_cpu: float
    sandbox_cpu: float
    loadgen_cpu: float
    operator_rss: tuple[float, float]
    events: dict[str, int]
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after the run
    # Events are posted after placements, by a few background posters: when the last one landed
    # (seconds after the last binding).
    events_done: float = float("nan")

    @property
    def rate(self) -> float:
        return self.bound / self.bind_wall if self.bind_wall else 0.0


async def _watch_bound(
    session: aiohttp.ClientSession, url: str, rv: str, bound_at: dict[str, float], want: int, done: asyncio.Event
) -> None:
    path = f"{url}/api/v1/namespaces/{NAMESPACE}/pods?watch=true&resourceVersion={rv}&timeoutSeconds=600"
    while len(bound_at) < want:
        async with session.get(path, timeout=aiohttp.ClientTimeout(total=None)) as resp:
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    rv = meta["resourceVersion"]
                if (obj.get("spec") or {}).get("nodeName") and meta.get("name") not in bound_at:
                    bound_at[meta["name"]] = time.perf_counter()
                    if len(bound_at) >= want:
                        done.set()
                        return
        path = f"{url}/api/v1/namespaces/{NAMESPACE}/pods?watch=true&resourceVersion={rv}&timeoutSeconds=600"


async def _create_all(
    session: aiohttp.ClientSession, url: str, sizes: Sizes, created_at: dict[str, float]
) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for g in range(sizes.groups):
        queue.put_nowait(g)

    async def post(path: str, body: dict[str, Any]) -> None:
        async with session.post(url + path, json=body) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"create {path}: {resp.status} {await resp.text()}")
            await resp.read()

    async def creator() -> None:
        while not queue.empty():
            g = queue.get_nowait()
            name = f"g{g}"
            await post(f"/apis/{names.API_VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}", {
                "apiVersion": names.API_VERSION, "kind": names.KIND,
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"resources": {GPU: sizes.gpus_per_group}},
            })
            for i in range(sizes.pods_per_group):
                pod = f"{name}-p{i}"
                await post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(pod, name))
                created_at[pod] = time.perf_counter()

    await asyncio.gather(*(creator() for _ in range(CREATORS)))


async def _get_json(url: str, headers: dict[str, str], path: str) -> Any:
    async with aiohttp.ClientSession(url, headers=headers) as session, session.get(path) as resp:
        return await resp.json()


async def placement(quick: bool, profile_path: str | None = None) -> PlacementResult:
    sizes = placement_sizes(quick)
    want = sizes.groups * sizes.pods_per_group
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        sandbox = sandbox_child(sizes, False, kubeconfig, profile_path and profile_path + ".sandbox")
        sandbox_proc = sandbox.start(120)
        operator = operator_child(kubeconfig, profile_path)
        try:
            operator_proc = operator.start(60)
            await asyncio.sleep(1.0)  # let the operator's watches settle on the idle cluster
            url, headers = server_of(kubeconfig)
            rv = (await _get_json(url, headers, f"/api/v1/namespaces/{NAMESPACE}/pods"))["metadata"]["resourceVersion"]
            created_at: dict[str, float] = {}
            bound_at: dict[str, float] = {}
            done = asyncio.Event()
            me = psutil.Process()
            cpu0 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc), cpu_seconds(me))
            async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=CREATORS + 4)) as s:
                watcher = asyncio.get_running_loop().create_task(_watch_bound(s, url, rv, bound_at, want, done))
                await asyncio.sleep(0.2)
                t0 = time.perf_counter()
                await _create_all(s, url, sizes, created_at)
                create_wall = time.perf_counter() - t0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 60 if quick else 300)
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await watcher
            cpu1 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc), cpu_seconds(me))
            rss = rss_mib(operator_proc)
            # The Scheduled and Bound events trail the bindings: wait for them, and count their cost too.
            expected = want + sizes.groups
            events: collections.Counter[str] = collections.Counter()
            deadline = time.perf_counter() + 120
            while time.perf_counter() < deadline:
                items = (await _get_json(url, headers, f"/api/v1/namespaces/{NAMESPACE}/events"))["items"]
                events = collections.Counter(e.get("reason", "") for e in items)
                if events["Scheduled"] + events["Bound"] >= expected:
                    break
                await asyncio.sleep(0.25)
            events_done = time.perf_counter() - max(bound_at.values(), default=t0)
        finally:
            operator.stop()
            sandbox.stop()
    last = max(bound_at.values(), default=t0)
    latencies = sorted(max(0.0, bound_at[p] - created_at[p]) for p in bound_at if p in created_at)
    timeline = sorted((created_at[p] - t0, bound_at.get(p, float("nan")) - t0) for p in created_at)
    return PlacementResult(
        sizes, want, len(bound_at), create_wall, last - t0, latencies, timeline,
        cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2], rss, dict(events),
        (load_before, os.getloadavg()[0]), events_done,
    )


# ---- restart -----------------------------------------------------------------------------------


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


class _CachedLists:
    """Stands in for ClusterApi in Runtime.rebuild so only the in-memory part is timed."""

    def __init__(self, nodes: list[dict[str, Any]], groups: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.groups, self.pods = nodes, groups, pods

    async def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    async def list_groups(self) -> list[dict[str, Any]]:
        return self.groups

    async def list_pods(self) -> list[dict[str, Any]]:
        return self.pods


async def _timed(coro: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    value = await coro
    return time.perf_counter() - t, value


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
                    cached = context.Context(config, api=_CachedLists(nodes, groups, pods))  # type: ignore[arg-type]
                    mem.append((await _timed(runtime.Runtime(cached).rebuild()))[0])
                    t, report = await _timed(runtime.Runtime(context.Context(config, api=api)).rebuild())
                    total.append(t)
                assert len(pods) == sizes.groups * sizes.pods_per_group, len(pods)
            finally:
                await api.close()
            operator = operator_child(kubeconfig)
            try:
                operator_proc = operator.start(120)
                started = operator.results.get(timeout=10)
                await asyncio.sleep(3.0 if quick else 8.0)  # Kopf's initial listings and per-object workers
                rss = rss_mib(operator_proc)
                sandbox_rss = sandbox_proc.memory_info().rss / 2**20
            finally:
                operator.stop()
        finally:
            sandbox.stop()
    med = statistics.median
    return RebuildResult(
        sizes, med(ln), med(lg), med(lp), med(gathered), med(mem), med(total),
        report.allocations, len(report.conflicts), started["start_s"], started["rebuild_s"], rss, sandbox_rss,
    )


# ---- report ------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def _ok(met: bool) -> str:
    return "met" if met else "**not met**"


def _placement_row(p: PlacementResult) -> str:
    p50, p90, p99 = (_pct(p.latencies, q) for q in (0.5, 0.9, 0.99))
    worst = max(p.latencies, default=float("nan"))
    busy = p.bind_wall or 1.0
    return (
        f"| {p.pods} | {p.bound} | {p.create_wall:.2f} | {p.bind_wall:.2f} | {p.rate:.0f} "
        f"| {p50:.2f} | {p90:.2f} | {p99:.2f} | {worst:.2f} "
        f"| {p.operator_cpu:.1f} ({100 * p.operator_cpu / busy:.0f}%) "
        f"| {p.sandbox_cpu:.1f} ({100 * p.sandbox_cpu / busy:.0f}%) "
        f"| {p.loadgen_cpu:.1f} | {p.operator_rss[1]:.0f} | {p.events_done:.1f} |"
    )


def section_placement(runs: list[PlacementResult]) -> str:
    s = runs[0].sizes
    rate = statistics.median(r.rate for r in runs)
    p99 = statistics.median(_pct(r.latencies, 0.99) for r in runs)
    complete = all(r.bound == r.pods for r in runs)
    events = collections.Counter[str]()
    for r in runs:
        events.update(r.events)
    rows = "\n".join(_placement_row(r) for r in runs)
    return f"""## Operator: placement throughput and restart

Three processes on the same machine: the sandbox API server (`Sandbox`, {s.nodes} nodes x {s.gpus} GPUs,
kubelet simulation on), the operator (`run_operator`, Kopf, default settings: 32 workers, 50 ms status
debounce) and the load generator, which creates {s.groups} groups x {s.pods_per_group} pods
({s.gpus_per_group} GPUs per group) at once with {CREATORS} concurrent HTTP creators and watches pods.
Latency runs from the return of a pod's create call to the moment the load generator's pod watch
first shows it with `spec.nodeName`; throughput is bound pods over first create → last binding.
CPU seconds are each process's own over that window (the operator's share shows whether it or the
sandbox is the bottleneck). The three share {os.cpu_count()} CPUs; on this machine the same code measures up
to 2x apart from one run to the next (CPU seconds for the same work move with it), so the placement
runs {len(runs)} times and the targets are judged on the medians. The Scheduled and Bound events trail
the bindings (a few background posters, so a burst spends itself on placements first): the last
column is how long after the last binding the last event landed.

| pods | bound | create wall s | create→all bound s | pods bound/s | p50 s | p90 s | p99 s | max s \
| operator CPU s (% of wall) | sandbox CPU s (% of wall) | load generator CPU s | operator peak RSS MiB \
| events trail s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Medians: {rate:.0f} pods bound/s, p99 {p99:.2f} s.
Targets: at least {TARGET_RATE:.0f} pods bound/s — {_ok(complete and rate >= TARGET_RATE)};
p99 create→bound under {TARGET_P99:.0f} s — {_ok(complete and p99 < TARGET_P99)}.
Events the operator posted, by reason, over all runs: {", ".join(f"{k} {v}" for k, v in sorted(events.items()))}.
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
| operator process: launch → scheduling (Kopf start-up + rebuild) | {r.operator_start:.3f} |

| operator RSS MiB | peak RSS MiB | sandbox RSS MiB |
|---|---|---|
| {r.rss[0]:.0f} | {r.rss[1]:.0f} | {r.sandbox_rss:.0f} |

Targets: rebuild under {TARGET_REBUILD:.0f} s — {_ok(r.rebuild_total < TARGET_REBUILD)};
operator RSS under {TARGET_RSS_MIB:.0f} MiB — {_ok(r.rss[0] < TARGET_RSS_MIB)} (peak {_ok(r.rss[1] < TARGET_RSS_MIB)}).
"""


def section(runs: list[PlacementResult], r: RebuildResult) -> str:
    return section_placement(runs) + "\n" + section_restart(r)


PLACEMENT_RUNS = 3


def run(quick: bool) -> str:
    runs = [asyncio.run(placement(quick)) for _ in range(1 if quick else PLACEMENT_RUNS)]
    r = asyncio.run(restart(quick))
    return section(runs, r)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--profile", metavar="FILE",
        help="placement only, with cProfile in the operator (FILE) and the sandbox (FILE.sandbox)",
    )
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--placement", action="store_true", help="placement only, without the profiler")
    args = parser.parse_args(argv)
    if args.placement:
        print(section_placement([asyncio.run(placement(args.quick))]))
        return 0
    if args.profile:
        p = asyncio.run(placement(args.quick, os.path.abspath(args.profile)))
        print(f"{p.bound}/{p.pods} bound, {p.rate:.0f} pods/s, operator CPU {p.operator_cpu:.1f}s, "
              f"sandbox CPU {p.sandbox_cpu:.1f}s, p50 {_pct(p.latencies, 0.5):.2f}s, events {p.events}")
        created = collections.Counter(int(c) for c, _ in p.timeline)
        bound = collections.Counter(int(b) for _, b in p.timeline if b == b)
        for second in range(int(max(b for _, b in p.timeline if b == b)) + 1):
            print(f"t={second:3d}s created {created[second]:5d} bound {bound[second]:5d}")
        out = io.StringIO()
        stats = pstats.Stats(args.profile, stream=out)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
        return 0
    print(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
