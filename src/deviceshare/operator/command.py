"""`deviceshare operator`: run the Kopf operator (scheduler + group reconciler)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import threading

import kopf

from deviceshare.api import envnames, names
from deviceshare.kube import loops

from . import handlers
from .config import OperatorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--env-config", help="YAML/JSON file overriding the resource -> env var mapping")
    parser.add_argument("--metrics-port", type=int, default=8080, help="port for /metrics and /healthz (0: any)")
    parser.add_argument("--metrics-host", default="0.0.0.0")
    parser.add_argument(
        "--peering", metavar="NAME", default=None,
        help=f"Kopf peering object for several replicas (only one schedules); in-cluster default: deviceshare. "
        f"Without it the operator runs standalone. The object lives in ${names.ENV_NAMESPACE}.",
    )
    parser.add_argument(
        "--priority", type=int, default=None,
        help="peering priority of this replica (default with --peering: random, so that two replicas never "
        "tie; equal priorities make every replica stand down)",
    )
    parser.add_argument("--workers", type=int, default=32, help="pods in their API-write phase at once")
    parser.add_argument("-v", "--verbose", action="store_true")


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    return OperatorConfig.from_env(
        env_names=env_names,
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (
            secrets.randbelow(1_000_000) + 1 if args.peering else 0
        ),
        workers=args.workers,
    )


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    memo: kopf.Memo | None = None,
) -> None:
    """Run until ``stop_flag`` is set (or forever): the in-process entry used by the CLI, demo and tests.

    ``memo`` receives the runtime objects (``runtime``, ``metrics_server``) once started.
    """
    if config.identity is None:
        config = dataclasses.replace(
            config, identity=f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=config.peering_name is None,
        peering_name=config.peering_name,
        priority=config.priority,
        identity=config.identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        memo=memo if memo is not None else kopf.Memo(),
    )


class OperatorThread:
    """The operator on its own event loop in a thread: how the demo and the tests embed it.

    Separate loops keep it honest (it only reaches the cluster over HTTP, like in production) and
    keep Kopf's shutdown, which waits for every task started after it, away from the caller's tasks.
    """

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.memo = kopf.Memo()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="deviceshare-operator", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready = asyncio.Event()
            watcher = asyncio.get_running_loop().create_task(self._signal_ready(ready))
            try:
                await run_operator(self.config, stop_flag=self._stop, ready_flag=ready, memo=self.memo)
            finally:
                watcher.cancel()

        try:
            asyncio.run(main())
        except BaseException as e:  # reported to the starter
            self._error = e
        finally:
            self._ready.set()

    async def _signal_ready(self, ready: asyncio.Event) -> None:
        await ready.wait()
        self._ready.set()

    async def start(self, timeout: float = 30.0) -> OperatorThread:  # noqa: ASYNC109 — a thread join, not a coroutine wait
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, timeout):
            raise TimeoutError(f"the operator did not become ready in {timeout} s")
        if self._error is not None or not self._thread.is_alive():
            raise RuntimeError("the operator exited during start-up") from self._error
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    async def stop(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 — a thread join
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, timeout)

    async def kill(self) -> None:
        """Abrupt end, like a crashed process: every task is cancelled where it stands."""
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            def cancel_all() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()
            loop.call_soon_threadsafe(cancel_all)
        await asyncio.to_thread(self._thread.join, 30)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
            runner.run(run_operator(config_from_args(args)))
    except envnames.EnvNameConfigError as e:
        logging.error("%s", e)
        return 2
    return 0
