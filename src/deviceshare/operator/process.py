"""The operator as a process: Kopf with our handlers, the metrics server, and the thread the demo and tests use.

Separate from ``command.py`` (the CLI flags) so that ``deviceshare --help`` does not import Kopf. Kopf itself
is started, and named, only in ``handlers.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import socket
import threading

from . import handlers, startup
from .config import OperatorConfig
from .metrics import Metrics, MetricsServer


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    memo: handlers.Memo | None = None,
) -> None:
    """Run until ``stop_flag`` is set (or forever): the in-process entry used by the CLI, demo and tests.

    ``memo`` receives the runtime objects (``metrics``, ``metrics_server``, and ``runtime`` once started).
    Raises :class:`~deviceshare.errors.ConfigError` at once for a missing kubeconfig/context or a taken
    metrics port; an API server that does not answer yet is waited out (see ``startup.py``).
    """
    config.check()
    if config.identity is None:
        config = dataclasses.replace(
            config, identity=f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        )
    await startup.preflight(config)  # a missing kubeconfig or context ends here, before anything starts
    memo = memo if memo is not None else handlers.Memo()
    memo.metrics = Metrics()
    server: MetricsServer | None = None
    if config.metrics_port is not None:
        # Started once for the whole process (never per start-up try), so /healthz answers while the
        # operator waits for the API, and a taken port ends the process at once.
        server = MetricsServer(memo.metrics, ready=lambda: startup.ready(getattr(memo, "runtime", None)))
        await server.start(config.metrics_host, config.metrics_port)
        memo.metrics_server = server
    try:
        await handlers.run(config, stop_flag=stop_flag, ready_flag=ready_flag, memo=memo)
    finally:
        if server is not None:
            await server.stop()


class OperatorThread:
    """The operator on its own event loop in a thread: how the demo and the tests embed it.

    Separate loops keep it honest (it only reaches the cluster over HTTP, like in production) and
    keep Kopf's shutdown, which waits for every task started after it, away from the caller's tasks.
    """

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.memo = handlers.Memo()
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
