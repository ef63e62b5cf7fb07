"""Kubernetes' envelope: 150,000 pods in 30,000 groups on 5,000 nodes (``scalestate.py`` builds it).

In order, against one sandbox process holding that state:

1. the operator (``deviceshare operator``, its own process) starts: launch → ready, its rebuild as it reports it,
   its RSS once settled and its peak;
2. the webhook (``deviceshare webhook``, its own process) starts and caches the 30,000 groups and their members:
   launch → ready, RSS;
3. every watch expires (the sandbox forgets its history and closes the streams: each resume gets 410 Gone and
   relists, the operator's 150,000 pods included) while a probe creates a one-pod group every 100 ms, until
   every reflector of the operator has relisted: the longest create → bound of those probes is how long the
   relist stalled scheduling;
4. in this process, in memory: the lists of the sandbox fed to ``Runtime.rebuild`` (so the in-memory part is
   timed apart from the transfer), then placement decisions on the rebuilt ledger (2,000 arrivals, a random older
   group leaving after each), timed one by one.

5. (``scalerestart.py``, its own sandbox) the operator restarted into 140,000 pods with one new group waiting, the
   sandbox paging its lists and then answering them whole: first placement beside the sandbox's own read.

    python -m benchmarks.bench_scale --quick    # 500 nodes, 15,000 pods
    python -m benchmarks.bench_scale --restart  # step 5 only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing
import random
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil  # type: ignore[import-untyped]

from benchmarks import baseline, scalerestart, scalestate
from benchmarks.bench_operator import CachedLists, metric
from benchmarks.sandboxes import Child, cpu_seconds, rss_mib, server_of
from deviceshare.api import names
from deviceshare.core import inventory, placement
from deviceshare.kube import connecting
from deviceshare.operator import context, runtime, storage
from deviceshare.operator.config import OperatorConfig
from deviceshare.webhooks import certs

TARGET_REBUILD_S = 10.0
TARGET_OPERATOR_RSS_MIB = 1024.0
TARGET_WEBHOOK_RSS_MIB = 300.0
TARGET_P99_MS = 1.0
PROBE_INTERVAL = 0.1
RELISTED = {"nodes", "pods", "shareddevicegroups", "resourcequotas"}  # the operator's reflectors, by log name
RELIST_GUARD_S = 300.0  # probing stops then even if a relist never ended (the table shows which did)
GPU = scalestate.GPU


@dataclasses.dataclass
class ScaleResult:
    sizes: scalestate.ScaleSizes
    fill_s: float
    sandbox_rss: float
    operator_ready_s: float
    operator_rebuild_s: float
    operator_rss: tuple[float, float]
    operator_cpu_start: float
    webhook_ready_s: float
    webhook_rss: tuple[float, float]
    relist_probe_max_s: float
    relist_probes: int
    relist_probe_median_s: float
    list_s: float
    in_memory_s: float
    decisions: list[float]  # seconds each
    decision_cpu: list[float]
    list_bytes: int
    relisted: dict[str, tuple[int, float]]  # after the expiry: reflector -> (objects listed, seconds)


class Webhook:
    """``deviceshare webhook`` in its own process, ready when its /readyz (caches synced) answers 200."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        _, cert, key = certs.generate(["127.0.0.1"]).write(tmp / "webhook-tls")
        self.port = baseline.free_port()
        command = [sys.executable, "-c", "import sys; from deviceshare.cli import main; sys.exit(main())",
                   "webhook", "--kubeconfig", str(kubeconfig), "--tls-cert", str(cert), "--tls-key", str(key),
                   "--host", "127.0.0.1", "--port", str(self.port), "--drain-seconds", "0"]
        self.log = (tmp / "webhook.log").open("wb")
        self.popen = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.process = psutil.Process(self.popen.pid)

    def wait_ready(self, timeout: float) -> None:
        context_ = ssl.create_default_context()
        context_.check_hostname, context_.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError("the webhook exited; see its log")
            with contextlib.suppress(OSError), urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/readyz", timeout=2, context=context_
            ) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the webhook was not ready in {timeout}s")

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
        self.log.close()


async def _probe(url: str, headers: dict[str, str], stop: asyncio.Event) -> list[float]:
    """A one-pod group every PROBE_INTERVAL until ``stop``; each pod's create → bound, seen by listing the probes'
    namespace every 20 ms (one request: polling each pod would itself load the sandbox serving the relists)."""
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    ns = "probes"
    async with aiohttp.ClientSession(url, headers=headers) as session:
        async with session.post("/api/v1/namespaces", json={"metadata": {"name": ns}}) as resp:
            await resp.read()

        async def watch() -> None:  # one list of the probes' namespace every 20 ms (a watch would be expired too)
            while True:
                async with session.get(f"/api/v1/namespaces/{ns}/pods") as resp:
                    items = (await resp.json())["items"]
                now = time.perf_counter()
                for obj in items:
                    name = obj["metadata"]["name"]
                    if obj["spec"].get("nodeName") and name not in bound:
                        bound[name] = now
                await asyncio.sleep(0.02)

        async def one(i: int) -> None:
            name = f"probe-{i}"
            async with session.post(f"/apis/{names.API_VERSION}/namespaces/{ns}/{names.PLURAL}", json={
                "apiVersion": names.API_VERSION, "kind": names.KIND,
                "metadata": {"name": name, "namespace": ns, "finalizers": [names.GROUP_FINALIZER]},
                "spec": {"resources": {GPU: 1}}}) as resp:
                await resp.read()
            pod = scalestate.member(scalestate.ScaleSizes(1, 1, 1), 0, 0)
            pod["metadata"].update(name=name, namespace=ns, labels={names.POD_GROUP_LABEL: name},
                                   annotations={names.POD_GROUP_ANNOTATION: name})
            del pod["spec"]["nodeName"]
            async with session.post(f"/api/v1/namespaces/{ns}/pods", json=pod) as resp:
                await resp.read()
            created[name] = time.perf_counter()

        watcher = asyncio.create_task(watch())
        tasks, i = [], 0
        while not stop.is_set():
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(PROBE_INTERVAL)
        await asyncio.gather(*tasks)
        deadline = time.perf_counter() + 300
        while set(created) - set(bound) and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await watcher
    # A probe never seen bound counts as waiting the whole time (it would show as the worst).
    return [bound.get(n, time.perf_counter()) - t for n, t in created.items()]


async def _in_memory(
    kubeconfig: Path, sizes: scalestate.ScaleSizes
) -> tuple[float, float, list[float], list[float], int]:
    """(list seconds, in-memory rebuild seconds, decision seconds, decision CPU seconds, pods JSON bytes)."""
    config = OperatorConfig(kubeconfig=str(kubeconfig), metrics_port=None)
    api = storage.ClusterApi(await connecting.api_client(str(kubeconfig)))
    try:
        # Collector paused, as the operator's rebuild pauses it: with it on, the 150,000 bodies kept whole made
        # this process's collector walk them over and over (the pods' pages, decoded from memory: 6.6 s with it,
        # 1.5 s without), which timed the collector, not the lists.
        gc.disable()
        try:
            started = time.perf_counter()
            nodes, groups, pods = await asyncio.gather(api.list_nodes(), api.list_groups(), api.list_pods())
            listed = time.perf_counter() - started
        finally:
            gc.enable()
        url, headers = server_of(kubeconfig)
        async with aiohttp.ClientSession(headers=headers) as session, session.get(url + "/api/v1/pods") as resp:
            size = len(await resp.read())
    finally:
        await api.close()
    ctx = context.Context(config, api=CachedLists(nodes, groups, pods))  # type: ignore[arg-type]
    started = time.perf_counter()
    await runtime.Runtime(ctx).rebuild()
    in_memory = time.perf_counter() - started
    del nodes, groups, pods
    wall, cpu = _decisions(ctx, 400 if sizes.groups < 10_000 else 2000)
    return listed, in_memory, wall, cpu, size


def _decisions(ctx: context.Context, arrivals: int) -> tuple[list[float], list[float]]:
    """Placement decisions on the rebuilt ledger: arrivals of 1, 1, 2 and 4-GPU groups, binpack or spread, each
    followed by a random older group leaving (steady occupancy), each decision timed (wall and thread CPU)."""
    rng = random.Random(24)
    ledger = ctx.ledger
    present = [g.key for g in ctx.state.groups.values()]
    demand = inventory.PodDemand(cpu_milli=500, memory_bytes=2 * 2**30)
    wall, cpu = [], []
    for i in range(arrivals):
        key = ("arrivals", f"a{i}")
        request = placement.GroupRequest(key=key, resources={GPU: rng.choice((1, 1, 2, 4))}, node_selector={},
                                         strategy=rng.choice(("binpack", "binpack", "spread")))
        t, c = time.perf_counter(), time.thread_time()
        decided = placement.schedule_group(ledger, request, demand)
        c, t = time.thread_time() - c, time.perf_counter() - t
        if not isinstance(decided, placement.Unschedulable):
            ledger.commit(key)
            wall.append(t)
            cpu.append(c)
            present.append(key)
        leaving = present.pop(rng.randrange(len(present)))
        ledger.release(leaving)
    return wall, cpu


def measure(quick: bool) -> ScaleResult:
    sizes = scalestate.sizes(quick)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp_:
        tmp = Path(tmp_)
        kubeconfig = tmp / "kubeconfig"
        commands: Any = multiprocessing.get_context("spawn").Queue()
        sandbox = Child(scalestate.sandbox_main, sizes, str(kubeconfig), extra=(commands,))
        sandbox_proc = sandbox.start(1800)
        try:
            fill_s = sandbox.results.get(timeout=10)["fill_s"]
            operator = baseline.OperatorProcess(kubeconfig)
            try:
                started = time.perf_counter()
                operator_proc = operator.start(600)
                ready_s = time.perf_counter() - started
                cpu_start = cpu_seconds(operator_proc)
                time.sleep(5.0)  # its first reconciles and the garbage of the lists settle
                rebuild_s = metric(operator.metrics(), "deviceshare_ledger_rebuild_seconds")
                operator_rss = operator.rss_mib()

                webhook = Webhook(kubeconfig, tmp)
                try:
                    started = time.perf_counter()
                    webhook.wait_ready(600)
                    webhook_ready = time.perf_counter() - started
                    time.sleep(2.0)
                    webhook_rss = rss_mib(webhook.process)
                finally:
                    webhook.stop()

                log = operator.log
                def all_relisted() -> bool:
                    return set(_relists(log.read_text())) >= RELISTED

                latencies = asyncio.run(_relist(kubeconfig, commands, all_relisted))
                relisted = _relists(operator.log.read_text())
            finally:
                operator.stop()
            listed, in_memory, wall, cpu, size = asyncio.run(_in_memory(kubeconfig, sizes))
            sandbox_rss = sandbox_proc.memory_info().rss / 2**20
        finally:
            sandbox.stop()
    return ScaleResult(
        sizes, fill_s, sandbox_rss, ready_s, rebuild_s, operator_rss, cpu_start, webhook_ready, webhook_rss,
        max(latencies, default=float("nan")), len(latencies),
        statistics.median(latencies) if latencies else float("nan"), listed, in_memory, wall, cpu, size,
        relisted,
    )


async def _relist(kubeconfig: Path, commands: Any, relisted: Callable[[], bool]) -> list[float]:
    """Expire every watch, and probe scheduling until every reflector of the operator has relisted (its log says
    so), and a second more: the probes cover the whole relist, the 150,000 pods' included."""
    url, headers = server_of(kubeconfig)
    stop = asyncio.Event()
    probing = asyncio.create_task(_probe(url, headers, stop))
    await asyncio.sleep(1.0)  # a few probes before, as a baseline
    commands.put("expire")
    deadline = time.perf_counter() + RELIST_GUARD_S
    while not relisted() and time.perf_counter() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)
    stop.set()
    return await probing


def _relists(log: str) -> dict[str, tuple[int, float]]:
    """What the operator's reflectors listed after the watches expired (their log lines), proof that they did."""
    expired = log.find("expired; relisting")
    found: dict[str, tuple[int, float]] = {}
    if expired < 0:
        return found
    for m in re.finditer(r"INFO \S+: (\S+): listed (\d+) objects in ([\d.]+)s", log[expired:]):
        found[m[1]] = (int(m[2]), float(m[3]))
    return found


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _ok(met: bool) -> str:
    return "met" if met else "**not met**"


def _rows(r: ScaleResult) -> list[tuple[str, str, str, str]]:
    s = r.sizes
    p50, p99 = 1000 * _pct(r.decisions, 0.5), 1000 * _pct(r.decisions, 0.99)
    rss, peak = r.operator_rss
    return [
        ("operator: launch → ready (imports, Kopf start-up, rebuild from one list each of nodes, groups, pods)",
         f"{r.operator_ready_s:.2f} s", "", ""),
        ("operator: ledger rebuild as it reports it (`deviceshare_ledger_rebuild_seconds`)",
         f"**{r.operator_rebuild_s:.2f} s**", f"< {TARGET_REBUILD_S:.0f} s",
         _ok(r.operator_rebuild_s < TARGET_REBUILD_S)),
        ("operator: CPU from launch to ready", f"{r.operator_cpu_start:.1f} s", "", ""),
        ("operator RSS once settled (peak)", f"**{rss:,.0f} MiB** ({peak:,.0f})", "< 1 GiB",
         f"{_ok(rss < TARGET_OPERATOR_RSS_MIB)} (peak {_ok(peak < TARGET_OPERATOR_RSS_MIB)})"),
        (f"webhook: launch → ready ({s.groups:,} groups and their {s.pods:,} members cached)",
         f"{r.webhook_ready_s:.2f} s", "", ""),
        ("webhook RSS once ready (peak)", f"**{r.webhook_rss[0]:,.0f} MiB** ({r.webhook_rss[1]:,.0f})",
         f"< {TARGET_WEBHOOK_RSS_MIB:.0f} MiB", _ok(r.webhook_rss[0] < TARGET_WEBHOOK_RSS_MIB)),
        ("every watch expired (410 Gone): the operator's relists, from its log",
         ", ".join(f"{name} {n:,} in {t:.2f} s" for name, (n, t) in sorted(r.relisted.items())) or "**none**",
         "", ""),
        (f"meanwhile: longest create → bound of a one-pod group probed every "
         f"{1000 * PROBE_INTERVAL:.0f} ms ({r.relist_probes} probes; median)",
         f"**{r.relist_probe_max_s:.3f} s** ({r.relist_probe_median_s:.3f} s)",
         f"< the rebuild ({r.operator_rebuild_s:.2f} s)", _ok(r.relist_probe_max_s < r.operator_rebuild_s)),
        ("in memory: the three lists over HTTP, concurrently (the objects as they come)", f"{r.list_s:.2f} s",
         "", ""),
        ("in memory: `Runtime.rebuild()` fed those lists (records, ledger, claims)", f"{r.in_memory_s:.2f} s",
         "", ""),
        (f"placement decision on that ledger: p50 / p99 ({len(r.decisions):,} placed)",
         f"{p50:.3f} / **{p99:.3f} ms**", f"p99 < {TARGET_P99_MS:.0f} ms", _ok(p99 < TARGET_P99_MS)),
        ("the same, thread CPU time: p99", f"{1000 * _pct(r.decision_cpu, 0.99):.3f} ms", "", ""),
    ]


def section(r: ScaleResult) -> str:
    s = r.sizes
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(r))
    per_pod, whole = r.list_bytes / s.pods / 1024, r.list_bytes / 2**20
    return f"""## Kubernetes' envelope: {s.pods:,} pods in {s.groups:,} groups on {s.nodes:,} nodes

`benchmarks/bench_scale.py` (`scalestate.py` builds the state). {s.groups:,} Bound groups of {s.pods_per_group}
Running members each ({s.groups_per_node} one-GPU groups per {s.gpus}-GPU node), each member as the webhook and the
operator leave it, with a Running status: {per_pod:.1f} KiB of JSON a pod, {whole:.0f} MiB for the list of all
pods. The state is put straight into the sandbox's store, in memory ({r.fill_s:.0f} s: over HTTP the sandbox itself
would be the bottleneck); everything after that goes over HTTP to the sandbox, which answers lists from its cache
of each object's JSON, in pages (sandbox RSS {r.sandbox_rss:,.0f} MiB). The operator and the webhook run as their
own processes (`deviceshare operator`, `deviceshare webhook`).

| measure | result | target | |
|---|---|---|---|
{table}
"""


def run(quick: bool) -> str:
    return section(measure(quick)) + "\n" + scalerestart.run(quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--restart", action="store_true",
                        help="only the restart into the envelope with one group waiting (scalerestart.py)")
    args = parser.parse_args(argv)
    print(scalerestart.run(args.quick) if args.restart else run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
