"""The SharedDeviceGroup path through Kopf against our own group reflector: an openb replay, side by side.

Three processes, as in ``placing.py``: the sandbox API server with the 1,213 GPU nodes of the openb trace
(``openb_node_list_gpu_node.csv``: GPU count, model, CPU and memory of each), the operator (``deviceshare
operator``) and this one, which creates the first 1,500 GPU pods of ``openb_pod_list_default.csv`` as one-pod
groups (whole GPUs as ``resources``, a fraction of one as a compute ``share``; the pod's own CPU and memory as its
requests), each group carrying the finalizer as the webhook sets it at CREATE, with 32 concurrent creators, and
watches the pods. The runs alternate *main* (the operator of :data:`BEFORE`, run from its own source: groups, nodes
and pods through its own reflectors), *tree* (this tree as it runs by default, the same) and *kopf* (this tree with
``--groups-through-kopf``: groups through Kopf's ``on.event``), so all three are measured side by side on the same
machine state. Throughput is bound pods over first create → last binding;
operator CPU per bound pod is the operator process's CPU (every thread) from the first create until every
``Scheduled`` event has landed, over the bound pods.

    python -m benchmarks.bench_kopf_groups              # 3 rounds of the three, prints the section
    python -m benchmarks.bench_kopf_groups --rounds 1 --groups 300 --spy DIR   # py-spy on each operator
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import multiprocessing.synchronize
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import baseline, placing, profiles
from benchmarks.sandboxes import NAMESPACE, Child, cpu_seconds, server_of
from deviceshare.api import names
from deviceshare.core import traces
from deviceshare.kube import loops

BEFORE = "9c948ae"  # main as issue 36 found it: groups, nodes and pods through its own reflectors
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "openb"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"
GPU = "nvidia.com/gpu"
GROUPS = 1500
CREATORS = 32
LIMIT = 0.10  # the Kopf path may cost at most 10% of throughput or of CPU per bound pod


@dataclasses.dataclass
class Run(placing.PerPod):
    mode: str  # one of MODES
    pods: int
    bound: int
    bind_wall: float
    operator_cpu: float
    sandbox_cpu: float
    load: float
    kopf_share: float | None = None  # of the operator's sampled CPU, the part under Kopf's frames (--spy)


def _sandbox_main(kubeconfig: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event,
                  results: Any) -> None:
    from deviceshare.sandbox import command

    command.tune_collector()  # as `deviceshare sandbox` does
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(_serve(Path(kubeconfig), ready, stop))


async def _serve(kubeconfig: Path, ready: multiprocessing.synchronize.Event,
                 stop: multiprocessing.synchronize.Event) -> None:
    from deviceshare.sandbox import Sandbox

    sandbox = Sandbox(nodes=0, kubelet_delay=0.5, kubeconfig_path=kubeconfig)
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for node in traces.parse_nodes(NODES.open(), str(NODES)):
        sandbox.add_node(node.name, gpus=node.gpus, cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi",
                         labels={"nvidia.com/gpu.product": node.model})
    async with sandbox:
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)


def workload(count: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(group, pod) bodies: the trace's first ``count`` pods that ask for a GPU or a share of one."""
    import csv

    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with PODS.open() as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if gpus < 1:
                continue
            name = f"g{len(out)}"
            spec: dict[str, Any] = {"resources": {GPU: gpus}}
            if 0 < milli < 1000:
                spec["share"] = {GPU: {"compute": f"{milli}m"}}
            group = {"apiVersion": names.API_VERSION, "kind": names.KIND, "spec": spec, "metadata": {
                "name": name, "namespace": NAMESPACE, "finalizers": [names.GROUP_FINALIZER]}}
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-p0", "namespace": NAMESPACE,
                             "annotations": {names.POD_GROUP_ANNOTATION: name},
                             "labels": {names.POD_GROUP_LABEL: name}},
                "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{
                    "name": "main", "image": "busybox",
                    "resources": {"requests": {"cpu": f"{row['cpu_milli']}m", "memory": f"{row['memory_mib']}Mi"}},
                }]},
            }
            out.append((group, pod))
            if len(out) == count:
                break
    return out


async def _create_all(session: aiohttp.ClientSession, url: str, bodies: list[tuple[dict[str, Any], dict[str, Any]]],
                      created_at: dict[str, float]) -> None:
    queue = list(reversed(bodies))

    async def post(path: str, body: dict[str, Any]) -> None:
        await placing.create(session, url + path, body)

    async def creator() -> None:
        while queue:
            group, pod = queue.pop()
            await post(f"/apis/{names.API_VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}", group)
            await post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
            created_at[pod["metadata"]["name"]] = time.perf_counter()

    await asyncio.gather(*(creator() for _ in range(CREATORS)))


async def replay(mode: str, count: int, spy: Path | None = None) -> Run:
    bodies = workload(count)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-kopf-groups-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        sandbox = Child(_sandbox_main, str(kubeconfig))
        sandbox_proc = sandbox.start(300)
        operator = baseline.OperatorProcess(kubeconfig, src=baseline.source(BEFORE) if mode == "main" else None,
                                            args=("--groups-through-kopf",) if mode == "kopf" else ())
        try:
            operator_proc = await asyncio.to_thread(operator.start)
            await asyncio.sleep(1.0)  # its watches settle on the idle cluster
            url, headers = server_of(kubeconfig)
            listed = await placing._get_json(url, headers, f"/api/v1/namespaces/{NAMESPACE}/pods")
            created_at: dict[str, float] = {}
            bound_at: dict[str, float] = {}
            done = asyncio.Event()
            recorder = profiles.Spy(operator_proc.pid, spy / f"operator-{mode}.txt") if spy is not None else None
            cpu0 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc))
            connector = aiohttp.TCPConnector(limit=CREATORS + 4)
            async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
                watcher = asyncio.get_running_loop().create_task(placing._watch_bound(
                    session, url, listed["metadata"]["resourceVersion"], bound_at, len(bodies), done))
                await asyncio.sleep(0.2)
                t0 = time.perf_counter()
                await _create_all(session, url, bodies, created_at)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 300)
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await watcher
            last = max(bound_at.values(), default=t0)
            await placing._events_landed(url, headers, len(bound_at))
            cpu1 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc))
            profile = recorder.stop() if recorder is not None else None
        finally:
            await asyncio.to_thread(operator.stop)
            sandbox.stop()
    return Run(mode, len(bodies), len(bound_at), last - t0, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], load,
               _kopf_share(profile) if profile is not None else None)


def _kopf_share(profile: Path) -> float:
    """Of the samples where the operator ran Python (not the loop waiting), those under a Kopf frame."""
    _, shares = profiles.summary(profile, {"kopf": ("/kopf/",)}, leaf_first=False)
    return shares.get("kopf", 0.0)


MODES = ("main", "tree", "kopf")


def section(runs: list[Run], command: str) -> str:
    med = statistics.median
    rate = {m: med(r.rate for r in runs if r.mode == m) for m in MODES}
    cpu = {m: med(r.cpu_per_pod_ms for r in runs if r.mode == m) for m in MODES}
    complete = all(r.bound == r.pods for r in runs)

    def verdict(mode: str) -> str:
        rate_ok = complete and rate[mode] >= (1 - LIMIT) * rate["main"]
        cpu_ok = complete and cpu[mode] <= (1 + LIMIT) * cpu["main"]
        return (f"throughput {rate[mode]:.0f} pods/s ({rate[mode] / rate['main']:.2f}x, "
                f"{'within' if rate_ok else '**not within**'} {100 * LIMIT:.0f}%), operator CPU per bound pod "
                f"{cpu[mode]:.2f} ms ({cpu[mode] / cpu['main']:.2f}x, {'within' if cpu_ok else '**not within**'} "
                f"{100 * LIMIT:.0f}%)")

    rows = "\n".join(
        f"| {r.mode} | {r.bound}/{r.pods} | {r.bind_wall:.2f} | {r.rate:.0f} | **{r.cpu_per_pod_ms:.2f}** "
        f"| {r.operator_cpu:.2f} | {r.sandbox_cpu:.2f} | {r.load:.1f} |" for r in runs
    )
    return f"""{HEADING}

`benchmarks/bench_kopf_groups.py` (`{command}`). The sandbox serves the 1,213 GPU nodes of the openb trace; the
load generator creates the trace's first {runs[0].pods:,} GPU pods as one-pod groups, each group carrying our
finalizer (as the webhook sets it at CREATE), with {CREATORS} concurrent creators. *main*: the operator of
commit `{BEFORE}` (groups, nodes and pods through its own reflectors), run from its own source; *tree*: this tree as
it runs by default (the same); *kopf*: this tree with `--groups-through-kopf` (groups through Kopf's `on.event`,
nodes and pods through the reflectors). Runs alternate on the same machine ({os.cpu_count()} CPUs, **shared with
other engineers' jobs during this run**: 1-minute load average at each run's start in the last column), so only
the ratios within this table mean something.

| mode | bound | create→all bound s | pods bound/s | **operator CPU ms per bound pod** | operator CPU s \
| sandbox CPU s | load avg |
|---|---|---|---|---|---|---|---|
{rows}

Medians, against *main*'s {rate["main"]:.0f} pods/s and {cpu["main"]:.2f} ms: *tree* {verdict("tree")}; *kopf*
{verdict("kopf")}.
"""


async def _main(rounds: int, count: int, spy: Path | None) -> list[Run]:
    runs: list[Run] = []
    for _ in range(rounds):
        for mode in MODES:
            run = await replay(mode, count, spy)
            share = "" if run.kopf_share is None else f", Kopf {100 * run.kopf_share:.0f}% of its sampled CPU"
            print(f"{mode}: {run.bound}/{run.pods} bound, {run.rate:.0f}/s, {run.cpu_per_pod_ms:.2f} ms/pod "
                  f"(load {run.load:.1f}){share}", file=sys.stderr, flush=True)
            runs.append(run)
    return runs


HEADING = "## Groups through Kopf: openb replay, side by side (issue 36)"


def run(quick: bool) -> str:
    """The section for ``benchmarks.run`` (``make bench``)."""
    if not NODES.exists() or not PODS.exists():
        return f"{HEADING}\n\nSkipped: the openb trace is not at `{DATA}` (expected `../shared/data/openb`).\n"
    if baseline.source(BEFORE) is None:
        return f"{HEADING}\n\nSkipped: commit `{BEFORE}` is not in this clone.\n"
    rounds, count = (1, 200) if quick else (3, GROUPS)
    return section(asyncio.run(_main(rounds, count, None)), "python -m benchmarks.run --only kopf_groups"
                   + (" --quick" if quick else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--groups", type=int, default=GROUPS)
    parser.add_argument("--spy", type=Path, help="py-spy each operator into this folder; print Kopf's share")
    args = parser.parse_args(argv)
    if not NODES.exists() or not PODS.exists():
        print(f"skipped: the openb trace is not at {DATA}", file=sys.stderr)
        return 0
    if baseline.source(BEFORE) is None:
        print(f"skipped: commit {BEFORE} is not in this clone", file=sys.stderr)
        return 0
    if args.spy is not None:
        args.spy.mkdir(parents=True, exist_ok=True)
    runs = asyncio.run(_main(args.rounds, args.groups, args.spy))
    command = "python -m benchmarks.bench_kopf_groups" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    print(section(runs, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
