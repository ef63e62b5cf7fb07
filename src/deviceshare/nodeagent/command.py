"""`deviceshare node-agent`: publish what this node's devices are (CONTRACT §9), for a DaemonSet.

Only the flags and the wiring live here: sources (NVML through ``nvidia-ml-py``, and/or a device file),
the XID watch, the API client, the /metrics server, and the loop of :mod:`agent`. Missing pieces end the
process at once with one line saying what to fix (a :class:`~deviceshare.errors.ConfigError`: no node
name, NVML or its bindings missing, no device file given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceshare.api import names
from deviceshare.errors import ConfigError

NODE_NAME_ENV = "NODE_NAME"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", default=None,
                        help=f"this node's name (default: ${NODE_NAME_ENV}, set from spec.nodeName in the DaemonSet)")
    parser.add_argument("--source", action="append", choices=("nvml", "file"), default=None,
                        help="where devices are read: nvml (NVIDIA GPUs through nvidia-ml-py) and/or file "
                        "(--device-file); repeatable (default: nvml)")
    parser.add_argument("--device-file", type=Path, metavar="FILE",
                        help="JSON device file for --source file (Intel and other vendors, MIG devices)")
    parser.add_argument("--resource", default=names.NVIDIA_GPU_RESOURCE,
                        help="extended resource the NVML GPUs are published under")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                        help="between reads of the devices (an XID error is published at once)")
    parser.add_argument("--resync", type=float, default=300.0, metavar="SECONDS",
                        help="between reads of the Node's own annotations (to repair someone else's edit)")
    parser.add_argument("--mps-pipe-directory", type=Path, metavar="DIR",
                        help=f"publish {names.NODE_MPS_ANNOTATION}: {names.NODE_MPS_READY} while an MPS control "
                        "daemon listens in DIR (the MPS overlay's pipe directory)")
    parser.add_argument("--ignore-xids", default="", metavar="LIST",
                        help="XID codes that do not make a GPU unhealthy, besides the application errors "
                        "13,31,43,45,68,109 (comma-separated)")
    parser.add_argument("--metrics-port", type=int, default=8081, help="port for /metrics and /healthz (0: any)")
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server listens on")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


@dataclass
class AgentSettings:
    node_name: str
    sources: tuple[str, ...] = ("nvml",)
    device_file: Path | None = None
    resource: str = names.NVIDIA_GPU_RESOURCE
    interval: float = 30.0
    resync: float = 300.0
    mps_pipe_directory: Path | None = None
    ignore_xids: tuple[int, ...] = ()
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8081
    kubeconfig: str | None = None
    context: str | None = None


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> AgentSettings:
    env = os.environ if environ is None else environ
    node = args.node_name or env.get(NODE_NAME_ENV)
    if not node:
        raise ConfigError(f"no node name: pass --node-name or set ${NODE_NAME_ENV} "
                          "(the DaemonSet sets it from spec.nodeName)")
    sources = tuple(dict.fromkeys(args.source or ["nvml"]))
    if "file" in sources and args.device_file is None:
        raise ConfigError("--source file needs --device-file FILE")
    try:
        xids = tuple(int(x) for x in args.ignore_xids.split(",") if x.strip())
    except ValueError as e:
        raise ConfigError(f"--ignore-xids must be comma-separated numbers, got {args.ignore_xids!r}") from e
    if args.interval <= 0 or args.resync <= 0:
        raise ConfigError("--interval and --resync must be positive")
    return AgentSettings(
        node_name=node, sources=sources, device_file=args.device_file, resource=args.resource,
        interval=args.interval, resync=args.resync, mps_pipe_directory=args.mps_pipe_directory,
        ignore_xids=xids, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
        kubeconfig=args.kubeconfig, context=args.context,
    )


async def serve(settings: AgentSettings, stop: asyncio.Event, *, nvml: Any = None) -> None:
    """Run the agent until ``stop``. ``nvml``: the NVML bindings (default: ``import pynvml``, on use)."""
    from prometheus_client import CollectorRegistry

    from deviceshare.kube import connecting
    from deviceshare.nodeagent import agent, filesource, metrics, nvmlsource, publishing, xids

    sources: list[agent.Source] = []
    started: list[Any] = []
    registry = CollectorRegistry()
    writes = publishing.writes_counter(registry)
    try:
        if "nvml" in settings.sources:
            binding = nvml if nvml is not None else nvmlsource.load()
            gpus = nvmlsource.NvmlSource(binding, settings.resource)
            gpus.start()
            started.append(gpus)
            sources.append(gpus)
        if "file" in settings.sources:
            assert settings.device_file is not None
            sources.append(filesource.FileSource(settings.device_file))
        async with await connecting.api_client(settings.kubeconfig, context=settings.context) as api:
            node_api = publishing.NodeApi(api, settings.node_name, writes)
            loop = agent.NodeAgent(node_api, sources, agent.AgentConfig(
                settings.interval, settings.resync, settings.mps_pipe_directory))
            if "nvml" in settings.sources:
                watch = xids.XidWatch(sources[0].nvml, loop.mark_unhealthy, settings.ignore_xids)  # type: ignore[attr-defined]
                watch.start()
                started.insert(0, watch)
            server = metrics.MetricsServer(registry)
            if settings.metrics_port is not None:
                await server.start(settings.metrics_host, settings.metrics_port)
            try:
                await loop.run(stop)
            finally:
                await server.stop()
    finally:
        for thing in started:
            thing.stop()


def run(args: argparse.Namespace) -> int:
    from deviceshare.kube import loops

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(main())
    return 0
