"""Sandbox speed: start-up, request throughput, watch latency, CEL validation cost.

The test suite and ``make demo`` start many sandboxes and push every operator write through
them, so these are the numbers that decide whether the suite stays fast.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def _sdg(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
    }


def _import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import deviceshare.sandbox; print(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src")},
    )
    return float(out.stdout.strip())


async def _startup(rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        async with Sandbox():
            times.append(time.perf_counter() - started)
    return times


async def _throughput(count: int, concurrency: int) -> dict[str, float]:
    results: dict[str, float] = {}
    async with Sandbox(kubelet_delay=None) as sandbox, aiohttp.ClientSession() as session:
        base = f"{sandbox.url}/api/v1/namespaces/default/pods"
        gate = asyncio.Semaphore(concurrency)

        async def call(method: str, url: str, body: Any, content_type: str = "application/json") -> None:
            async with (
                gate,
                session.request(
                    method, url, data=json.dumps(body), headers={"Content-Type": content_type}
                ) as response,
            ):
                await response.read()
                assert response.status < 300, response.status

        started = time.perf_counter()
        await asyncio.gather(*(call("POST", base, _pod(f"p{i}")) for i in range(count)))
        results[f"create {count} pods"] = count / (time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(
            *(
                call(
                    "PATCH",
                    f"{base}/p{i}",
                    {"metadata": {"labels": {"x": "y"}}},
                    "application/merge-patch+json",
                )
                for i in range(count)
            )
        )
        results[f"merge-patch {count} pods"] = count / (time.perf_counter() - started)
        started = time.perf_counter()
        lists = max(5, count // 100)
        for _ in range(lists):
            async with session.get(base) as response:
                await response.read()
        results[f"list {count} pods (whole list per request)"] = lists / (time.perf_counter() - started)
        sdg_base = f"{sandbox.url}/apis/deviceshare.io/v1alpha1/namespaces/default/shareddevicegroups"
        started = time.perf_counter()
        await call("POST", sdg_base, _sdg("first"))
        results["first SharedDeviceGroup create (CEL compile), ms"] = (time.perf_counter() - started) * 1000
        groups = count // 4
        started = time.perf_counter()
        await asyncio.gather(*(call("POST", sdg_base, _sdg(f"g{i}")) for i in range(groups)))
        results[f"create {groups} SharedDeviceGroups (schema + CEL)"] = groups / (
            time.perf_counter() - started
        )
    return results


async def _watch_latency(events: int, watchers: int) -> list[float]:
    latencies: list[float] = []
    async with Sandbox(kubelet_delay=None) as sandbox, aiohttp.ClientSession() as session:
        url = f"{sandbox.url}/api/v1/namespaces/default/configmaps"
        sent: dict[str, float] = {}
        ready = asyncio.Barrier(watchers + 1)

        async def watcher() -> None:
            params = {
                "watch": "true",
                "resourceVersion": sandbox.store.resource_version,
                "timeoutSeconds": "30",
            }
            async with session.get(url, params=params) as response:
                await ready.wait()
                seen = 0
                async for line in response.content:
                    name = json.loads(line)["object"]["metadata"]["name"]
                    latencies.append(time.perf_counter() - sent[name])
                    seen += 1
                    if seen == events:
                        return

        tasks = [asyncio.create_task(watcher()) for _ in range(watchers)]
        await ready.wait()
        for i in range(events):
            sent[f"c{i}"] = time.perf_counter()
            sandbox.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"c{i}", "namespace": "default"},
                }
            )
            await asyncio.sleep(0.002)
        await asyncio.gather(*tasks)
    return latencies


def run(quick: bool) -> str:
    rounds, count, events, watchers = (5, 200, 50, 4) if quick else (20, 2000, 300, 10)
    imported = _import_seconds()
    starts = asyncio.run(_startup(rounds))
    rates = asyncio.run(_throughput(count, concurrency=8))
    latencies = sorted(asyncio.run(_watch_latency(events, watchers)))
    start_median = statistics.median(starts)
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    rows = [
        (
            "start + stop a Sandbox (4 nodes, CRDs), median",
            f"{start_median * 1000:.0f} ms",
            "< 1 s",
            "met" if start_median < 1 else "NOT met",
        ),
        ("`import deviceshare.sandbox` (cold process)", f"{imported * 1000:.0f} ms", "-", "-"),
    ]
    rows += [
        (name, f"{rate:,.0f} ms" if name.endswith("ms") else f"{rate:,.0f} /s", "-", "-")
        for name, rate in rates.items()
    ]
    rows += [
        (
            f"watch delivery, {watchers} watchers x {events} events, p50 / p99",
            f"{p50:.1f} / {p99:.1f} ms",
            "-",
            "-",
        )
    ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    return f"""## Sandbox (embedded Kubernetes API)

What: the in-process API server the tests and `make demo` run on. Start-up is `Sandbox()` plus
`async with` (server listening, kubeconfig written) and exit; throughput is requests/s of a local
aiohttp client with 8 requests in flight; watch delivery is the time from a store write to the
line arriving at each watching HTTP client. {"Quick sizes." if quick else "Full sizes."}

| measure | result | target | met? |
|---|---|---|---|
{table}
"""


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
