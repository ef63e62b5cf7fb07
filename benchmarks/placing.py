"""One placement run of ``bench_operator``: a burst of groups and pods against a sandbox, the operator binding them.

Three processes, so each side's CPU is its own: the sandbox API server (``sandboxes.sandbox_child``), the
operator (``deviceshare operator``: today's or this tree's, see ``baseline.py``) and this one, which creates the
groups and pods over HTTP with 32 concurrent creators and watches the pods. A pod's latency runs from the return of
its create call to the moment this process's pod watch first shows it with ``spec.nodeName`` (client-side clocks;
the API's ``creationTimestamp`` has 1 s resolution). Throughput is bound pods over first create → last binding.
The operator's CPU is counted from the first create until its last event has landed (everything the burst cost
it), per bound pod.

Groups and pods are created as the webhook leaves them (``bench_webhook`` measures the webhook itself): pods
with the scheduler name, label and env; groups, for the current operator, with the finalizer that the chart's
MutatingWebhookConfiguration has the webhook add in the CREATE (``bench_operator_writes`` runs that path for
real). For today's operator, groups come without it, as today's install created them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil  # type: ignore[import-untyped]

from benchmarks import baseline, profiles
from benchmarks.sandboxes import NAMESPACE, Sizes, cpu_seconds, pod_body, sandbox_child, server_of
from deviceshare.api import names

CREATORS = 32


def sizes(quick: bool) -> Sizes:
    return Sizes(50, 8, 100, 2, 2) if quick else Sizes(500, 8, 1000, 2, 2)


class PerPod:
    """Throughput and the operator's CPU per bound pod, of a run that records these fields."""

    bound: int
    bind_wall: float
    operator_cpu: float

    @property
    def rate(self) -> float:
        return self.bound / self.bind_wall if self.bind_wall else 0.0

    @property
    def cpu_per_pod_ms(self) -> float:
        return 1000 * self.operator_cpu / max(1, self.bound)


@dataclasses.dataclass
class PlacementResult(PerPod):
    mode: str  # "today" (baseline.BASELINE's operator) or "now"
    sizes: Sizes
    pods: int
    bound: int
    create_wall: float
    bind_wall: float
    latencies: list[float]
    operator_cpu: float  # first create -> last event landed
    sandbox_cpu: float  # the same window
    loadgen_cpu: float
    operator_rss: tuple[float, float]
    events: dict[str, int]
    events_done: float  # when the last event landed, seconds after the last binding
    wall: float  # first create -> last event landed
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after the run
    profile: Path | None = None  # py-spy's folded stacks of the operator, when asked for



async def create(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    """POST ``body`` to the collection at ``url``; any answer but a 2xx fails the run, naming it."""
    async with session.post(url, json=body) as resp:
        if resp.status >= 300:
            raise RuntimeError(f"create {url}: {resp.status} {await resp.text()}")
        await resp.read()


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
    session: aiohttp.ClientSession, url: str, sizes: Sizes, created_at: dict[str, float], finalizer: bool
) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for g in range(sizes.groups):
        queue.put_nowait(g)

    async def post(path: str, body: dict[str, Any]) -> None:
        await create(session, url + path, body)

    async def creator() -> None:
        while not queue.empty():
            g = queue.get_nowait()
            name = f"g{g}"
            meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
            if finalizer:
                meta["finalizers"] = [names.GROUP_FINALIZER]
            await post(f"/apis/{names.API_VERSION}/namespaces/{NAMESPACE}/{names.PLURAL}", {
                "apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": meta,
                "spec": {"resources": {GPU: sizes.gpus_per_group}},
            })
            for i in range(sizes.pods_per_group):
                pod = f"{name}-p{i}"
                await post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(pod, name))
                created_at[pod] = time.perf_counter()

    await asyncio.gather(*(creator() for _ in range(CREATORS)))


GPU = "nvidia.com/gpu"


async def _get_json(url: str, headers: dict[str, str], path: str) -> Any:
    async with aiohttp.ClientSession(url, headers=headers) as session, session.get(path) as resp:
        return await resp.json()


async def placement(
    quick: bool, mode: str = "now", spy: Path | None = None, against: str | None = None
) -> PlacementResult:
    """One run; ``spy``: record the operator with py-spy (folded stacks) into that file during the burst, and the
    sandbox into the same name with the suffix ``.sandbox``. ``against`` (with mode "today"): the operator of that
    commit instead of :data:`baseline.BASELINE`, on this tree's workload and CRDs (groups with the finalizer), so
    a change is measured alone."""
    s = sizes(quick)
    want = s.groups * s.pods_per_group
    load_before = os.getloadavg()[0]
    today = mode == "today" and against is None  # today's operator on today's workload and CRDs
    src = baseline.source(against or baseline.BASELINE) if mode == "today" else None
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        # Today's operator on today's CRD (a newer schema defaults fields its models refuse).
        sandbox = sandbox_child(s, False, kubeconfig, crds=baseline.crds() if today else None)
        sandbox_proc = sandbox.start(120)
        operator = baseline.OperatorProcess(kubeconfig, src=src)
        try:
            operator_proc = await asyncio.to_thread(operator.start)
            await asyncio.sleep(1.0)  # let the operator's watches settle on the idle cluster
            url, headers = server_of(kubeconfig)
            rv = (await _get_json(url, headers, f"/api/v1/namespaces/{NAMESPACE}/pods"))["metadata"]["resourceVersion"]
            created_at: dict[str, float] = {}
            bound_at: dict[str, float] = {}
            done = asyncio.Event()
            me = psutil.Process()
            recorder = profiles.Spy(operator_proc.pid, spy) if spy is not None else None
            # The sandbox's too, beside it (``FILE.sandbox``), to see what the API emulator spends its time on.
            sandbox_recorder = (
                profiles.Spy(sandbox_proc.pid, spy.with_suffix(".sandbox")) if spy is not None else None
            )
            cpu0 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc), cpu_seconds(me))
            async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=CREATORS + 4)) as c:
                watcher = asyncio.get_running_loop().create_task(_watch_bound(c, url, rv, bound_at, want, done))
                await asyncio.sleep(0.2)
                t0 = time.perf_counter()
                await _create_all(c, url, s, created_at, finalizer=not today)
                create_wall = time.perf_counter() - t0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 60 if quick else 300)
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await watcher
            last = max(bound_at.values(), default=t0)
            events = await _events_landed(url, headers, want)
            t_end = time.perf_counter()
            cpu1 = (cpu_seconds(operator_proc), cpu_seconds(sandbox_proc), cpu_seconds(me))
            profile = recorder.stop() if recorder is not None else None
            if sandbox_recorder is not None:
                sandbox_recorder.stop()
            rss = operator.rss_mib()
        finally:
            await asyncio.to_thread(operator.stop)
            sandbox.stop()
    latencies = sorted(max(0.0, bound_at[p] - created_at[p]) for p in bound_at if p in created_at)
    return PlacementResult(
        mode, s, want, len(bound_at), create_wall, last - t0, latencies,
        cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2], rss, events, t_end - last, t_end - t0,
        (load_before, os.getloadavg()[0]), profile,
    )


async def _events_landed(url: str, headers: dict[str, str], bound: int) -> dict[str, int]:
    """The events, once every bound pod's Scheduled event has landed (they trail the bindings: a few background
    posters, so a burst spends itself on placements first)."""
    events: collections.Counter[str] = collections.Counter()
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        items = (await _get_json(url, headers, f"/api/v1/namespaces/{NAMESPACE}/events"))["items"]
        events = collections.Counter(e.get("reason", "") for e in items)
        if events["Scheduled"] >= bound:
            break
        await asyncio.sleep(0.25)
    return dict(events)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]
