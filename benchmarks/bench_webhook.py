"""Admission webhook throughput and latency over HTTPS, with the load generated in another process.

The server is the production path: ``start_webhook`` with TLS, the watch-backed group cache (fed
by the tests' fake API server, idle during the run), the pure engine and the metrics. The load
generator (this module run with ``--loadgen``) is a separate Python process with an aiohttp client
holding 32 keep-alive connections. The paced run issues requests on a fixed 200 req/s schedule and
measures each latency from its *scheduled* send time, so a server that falls behind is charged for
the queueing too (no coordinated omission). The unthrottled run sends as fast as 32 workers can.

    python -m benchmarks.run --only webhook
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from tests.webhooks import fakeapi

from deviceshare.kube import loops as event_loops
from deviceshare.webhooks import certs, server

ROOT = Path(__file__).resolve().parent.parent

HEADER = (
    "| run | concurrency | offered req/s | requests | achieved req/s | p50 ms | p90 ms | p99 ms "
    "| p99 from send ms | max ms | server CPU ms/req | errors |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)
CONCURRENCY = 32
RATE = 200
TARGET_P99_MS = 10.0


def pod_review(uid: str) -> dict[str, Any]:
    """A typical opted-in pod: two containers, some env, labels and resources."""
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.01-py3",
        "command": ["python", "train.py"],
        "env": [{"name": "OMP_NUM_THREADS", "value": "8"}, {"name": "RANK", "value": "0"}],
        "resources": {"limits": {"cpu": "8", "memory": "32Gi"}, "requests": {"cpu": "4", "memory": "16Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    sidecar = {"name": "exporter", "image": "dcgm-exporter:3", "ports": [{"containerPort": 9400}]}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": "trainer-",
                    "namespace": "ml",
                    "labels": {"app": "trainer", "job-name": "trainer"},
                    "annotations": {"deviceshare.io/device-group": "trainer"},
                },
                "spec": {
                    "schedulerName": "default-scheduler",
                    "restartPolicy": "Never",
                    "containers": [container, sidecar],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
            "dryRun": False,
        },
    }


# -- load generator (separate process) ------------------------------------------------------------


async def _load(url: str, ca_file: str, rate: float, duration_s: float, concurrency: int) -> dict[str, Any]:
    import aiohttp

    context = ssl.create_default_context(cafile=ca_file)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    latencies: list[float] = []
    service: list[float] = []  # from the actual send, for comparison
    errors = 0
    total = int(rate * duration_s) if rate else 0
    next_index = 0
    template = json.dumps(pod_review("@UID@")).encode()
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm the connections and the server before the clock starts.
        await asyncio.gather(*(session.post(url, json=pod_review("warm")) for _ in range(concurrency)))
        start = time.perf_counter()
        deadline = start + duration_s

        async def worker() -> None:
            nonlocal next_index, errors
            while True:
                if rate:
                    if next_index >= total:
                        return
                    scheduled = start + next_index / rate
                    next_index += 1
                    delay = scheduled - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                else:
                    scheduled = time.perf_counter()
                    if scheduled >= deadline:
                        return
                body = template.replace(b"@UID@", uuid.uuid4().hex.encode())
                sent = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as resp:
                    answer = await resp.json()
                done = time.perf_counter()
                latencies.append(done - scheduled)
                service.append(done - sent)
                if resp.status != 200 or not answer["response"].get("patch"):
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    service.sort()

    def pct(p: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return {
        "requests": len(latencies),
        "errors": errors,
        "elapsed_s": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": 1000 * latencies[-1],
        "mean_ms": 1000 * statistics.fmean(latencies),
        "p99_from_send_ms": 1000 * service[min(len(service) - 1, int(0.99 * len(service)))],
    }


# -- server side ----------------------------------------------------------------------------------


async def _measure(tmp: Path, loop: str, label: str, rate: float, duration: float) -> dict[str, Any]:
    ca_file, cert, key = certs.generate(["127.0.0.1"]).write(tmp)
    api = fakeapi.FakeApi()
    await api.start()
    api.put(fakeapi.GROUPS, fakeapi.group("ml", "trainer", {"nvidia.com/gpu": 2}))
    async with client.ApiClient(configuration=client.Configuration(host=api.url)) as api_client:
        running = await server.start_webhook(tls_cert=cert, tls_key=key, api_client=api_client)
        try:
            await running.webhook.lookup.wait_synced(10.0)
            server.freeze_startup_heap()  # as `deviceshare webhook` does
            cpu_before = time.process_time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.bench_webhook", "--loadgen",
                "--url", running.mutate_url, "--ca", str(ca_file), "--rate", str(rate),
                "--duration", str(duration), "--concurrency", str(CONCURRENCY), "--loop", loop,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
                cwd=ROOT,
            )  # fmt: skip
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"load generator failed ({proc.returncode})")
            result = json.loads(out)
            result["label"] = f"{label}, {loop}"
            result["rate"] = rate
            result["server_cpu_ms_per_req"] = 1000 * (time.process_time() - cpu_before) / result["requests"]
            return result
        finally:
            await running.stop()
            await api.stop()


def run(quick: bool) -> str:
    load_before = os.getloadavg()[0]
    loops = {"uvloop": event_loops.event_loop_factory(), "asyncio": None}
    if loops["uvloop"] is None:
        del loops["uvloop"]
    paced_s, flat_s = (3.0, 2.0) if quick else (15.0, 10.0)
    runs: list[dict[str, Any]] = []
    # Interleaved, so that a burst of load from elsewhere does not land on one loop only.
    for label, rate, duration in (("paced", RATE, paced_s), ("unthrottled", 0, flat_s)):
        for loop, factory in loops.items():
            with (
                tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp,
                asyncio.Runner(loop_factory=factory) as runner,
            ):
                runs.append(runner.run(_measure(Path(tmp), loop, label, rate, duration)))
    paced = runs[0]
    met = paced["p99_ms"] < TARGET_P99_MS and paced["errors"] == 0 and paced["rps"] >= 0.95 * RATE
    rows = "\n".join(
        f"| {r['label']} | {CONCURRENCY} | {r['rate'] or 'max'} | {r['requests']} | {r['rps']:.0f} | "
        f"{r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | {r['p99_from_send_ms']:.2f} | "
        f"{r['max_ms']:.1f} | "
        f"{r['server_cpu_ms_per_req']:.2f} | {r['errors']} |"
        for r in runs
    )
    return f"""## Admission webhook

AdmissionReview requests (a two-container pod that joins a group; the answer is a JSONPatch) sent over
HTTPS to `start_webhook` — TLS, the watch-backed group cache, the pure engine and the metrics, one
Python process — from a load generator in a separate process (aiohttp, {CONCURRENCY} keep-alive
connections). The paced run sends on a fixed {RATE} req/s schedule and measures each latency from its
scheduled send time, so queueing behind a slow server counts; the unthrottled run sends as fast as
{CONCURRENCY} workers can; "p99 from send" leaves out the load generator's own scheduling delay. Server
CPU is the webhook process's CPU time per request. Each pair of runs is made with both processes on
uvloop (what `deviceshare webhook` uses when installed) and then on asyncio's default loop, side by
side. The processes share the machine's cores with whatever else runs (1-minute load average
{load_before:.1f} at the start); on this shared machine the p99 moves with that load.
{"Quick mode: short runs." if quick else ""}

{HEADER}
{rows}

Target: p99 under {TARGET_P99_MS:.0f} ms at {RATE} req/s — **{"met" if met else "not met"}**
(first paced run, {paced["label"].split(", ")[1]}: p99 {paced["p99_ms"]:.2f} ms). For scale, Kyverno
publishes a 42 ms average at 100 virtual users; that is a different policy engine on different
hardware, not a side-by-side measurement.
"""


def _main() -> int:
    parser = argparse.ArgumentParser(description="webhook load generator (used by the benchmark)")
    parser.add_argument("--loadgen", action="store_true", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="requests per second; 0 = unthrottled")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    factory = event_loops.event_loop_factory() if args.loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(_load(args.url, args.ca, args.rate, args.duration, args.concurrency))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
