"""Fixtures for the reliability suite: the operator tests' sandbox and client, an abrupt kill, and a watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest

from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.process import run_operator
from tests import waiting
from tests.operator.conftest import cluster, kube, sandbox_options
from tests.reliability import invariants

__all__ = ["cluster", "kube", "sandbox_options"]

class Replica:
    """One operator in a thread with its own event loop: as separate as a process, and as killable.

    Kopf, when its task is cancelled, cancels every task created in the loop after it started (see
    ``kopf._core.reactor.running.run_tasks``), so two operators in one loop cannot die one at a time.
    """

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.memo = kopf.Memo()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._dead = False
        self._thread = threading.Thread(target=self._main, name=f"operator-{config.identity}", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as e:
            self._error = e
        finally:
            self._dead = True
            self._ready.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                self.loop.run_until_complete(self._close_sockets())
            self.loop.close()

    async def _serve(self) -> None:
        self._stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            run_operator(self.config, stop_flag=self._stop, ready_flag=ready, memo=self.memo)
        )
        waiter = asyncio.get_running_loop().create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        self._ready.set()
        waiter.cancel()
        await task

    async def _close_sockets(self) -> None:
        # What the OS does for a dead process.
        runtime = getattr(self.memo, "runtime", None)
        if runtime is not None:
            await runtime.ctx.api.close()

    async def start(self) -> Replica:
        self._thread.start()
        await waiting.until(self._ready.is_set, "the operator ready (or dead)", interval=0.01)
        if not self._thread.is_alive() or self._error is not None:
            raise RuntimeError(f"operator exited during start-up: {self._error!r}")
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def runtime(self) -> Any:
        return getattr(self.memo, "runtime", None)

    async def _join(self) -> None:
        await waiting.until(lambda: not self._thread.is_alive(), "the operator thread to end", interval=0.01)

    async def kill(self) -> None:
        """Die like a killed process: its connections cut and every task cancelled in the same tick.

        A request already sent is on the wire and still lands (the sandbox serves it to the end); nothing
        the dying code tries later (a roll-back in an ``except``, a clean-up handler) reaches the API.
        """
        if not self.alive:
            return

        def cancel_everything() -> None:
            self._cut_connections()
            # Again and again: whatever the dying code spawns or shields is cut too, as by SIGKILL.
            tasks = asyncio.all_tasks(self.loop)
            for t in tasks:
                t.cancel()
            if tasks and not self._dead:
                self.loop.call_later(0.02, cancel_everything)

        with contextlib.suppress(RuntimeError):  # the loop already closed
            self.loop.call_soon_threadsafe(cancel_everything)
        await self._join()

    def _cut_connections(self) -> None:
        """Close the operator's API connections now, from its own loop: what the OS does at a kill."""
        runtime = self.runtime
        if runtime is None:
            return
        session = runtime.ctx.api._client.rest_client.pool_manager  # kubernetes_asyncio's aiohttp session
        # The synchronous part of TCPConnector.close(): every transport closed now, and any later request
        # fails to connect ("Connector is closed"), without giving the dying loop a turn first.
        session.connector._close()

    async def stop(self) -> None:
        """The graceful stop (SIGTERM): Kopf runs the cleanup handlers."""
        if self.alive and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        await self._join()


async def launch(config: OperatorConfig) -> Replica:
    return await Replica(config).start()


async def kill(replica: Replica) -> None:
    await replica.kill()


class Watchdog:
    """Checks the invariant against the sandbox store on every tick while a scenario runs."""

    def __init__(
        self, cluster: Any, interval: float = 0.02,
        judge: Callable[[Any], list[str]] = lambda cluster: invariants.violations(invariants.from_sandbox(cluster)),
    ) -> None:
        self.cluster, self.interval, self.judge = cluster, interval, judge
        self.checks = 0
        self.found: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.interval)  # the watchdog's sampling period

    def check(self) -> None:
        self.checks += 1
        for line in self.judge(self.cluster):
            if line not in self.found:
                self.found.append(line)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.check()


@pytest.fixture
async def watchdog(cluster: Any) -> AsyncIterator[Watchdog]:
    dog = Watchdog(cluster)
    dog.start()
    yield dog
    await dog.stop()
    assert not dog.found, "double allocation seen during the scenario:\n" + "\n".join(dog.found)
