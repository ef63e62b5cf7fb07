"""``deviceshare sandbox``: run the local cluster until Ctrl-C and tell the user how to reach it.

Its Deployments make pods (a small controller, see ``deployments.py``), so the quickstart's
``kubectl apply`` and ``kubectl scale`` behave as on a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes")
    parser.add_argument("--gpus", type=int, default=8, help="devices per node")
    parser.add_argument("--resource", default="nvidia.com/gpu", help="extended resource the nodes offer")
    parser.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (default: any free port)")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(".sandbox/kubeconfig"),
        help="where to write the kubeconfig",
    )
    parser.add_argument(
        "--crds", type=Path, default=None, help="folder of CRD YAML to serve (default: crds/)"
    )
    parser.add_argument(
        "--kubelet-delay",
        type=float,
        default=0.5,
        help="seconds from binding to Running (0 disables the kubelet simulation)",
    )


async def serve(args: argparse.Namespace, ready: asyncio.Event | None = None) -> None:
    from deviceshare.sandbox import cluster

    sandbox = cluster.Sandbox(
        nodes=args.nodes,
        gpus=args.gpus,
        resource=args.resource,
        port=args.port,
        kubeconfig_path=args.kubeconfig.resolve(),
        crds=args.crds,
        kubelet_delay=args.kubelet_delay,
        deployments=True,  # `kubectl apply` of a Deployment makes pods, and `kubectl scale` works
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with sandbox:
        print(
            f"sandbox API at {sandbox.url} with {args.nodes} nodes x {args.gpus} {args.resource}", flush=True
        )
        print(f"kubeconfig: {sandbox.kubeconfig}", flush=True)
        print(f"export KUBECONFIG={sandbox.kubeconfig}", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()


def run(args: argparse.Namespace) -> int:
    from deviceshare import sandbox
    from deviceshare.kube import loops

    sandbox.require()
    tune_collector()
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(serve(args))
    return 0


# Allocations between collections of the youngest generation, and collections of each generation between two of
# the next: 100,000 / 50 / 100 against Python's 700 / 10 / 10.
COLLECTOR_THRESHOLDS = (100_000, 50, 100)


def tune_collector() -> None:
    """For a process that serves the sandbox: what it holds is JSON trees (every object, and a copy per watch
    event in the history), which have no reference cycles, yet Python's cyclic collector walks all of them each
    time an older generation is collected, and every write allocates thousands of objects. Measured on the
    500-node placement bench: 31% of the sandbox's CPU (6.2 s -> 4.3 s for the same 2,000 pods) went to that walk,
    counted in the copies that allocate (docs/benchmarks.md). Collections still run, only less often; the
    cycles aiohttp leaves per request are collected with the young generation as before."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
