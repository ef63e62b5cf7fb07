"""Fixtures for the reliability suite: the operator tests' sandbox and client, an abrupt kill, and a watchdog."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.operator.conftest import RunningOperator, cluster, kube, sandbox_options
from tests.reliability import invariants

__all__ = ["cluster", "kube", "sandbox_options"]

_OPERATOR_CODE = ("/kopf/", "/deviceshare/operator/")


def _operator_owned(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    return code is not None and any(part in code.co_filename for part in _OPERATOR_CODE)


async def kill(running: RunningOperator, *, spare: set[asyncio.Task[Any]] | None = None) -> None:
    """Die like a killed process: every task of the operator cancelled in the same tick, no cleanup awaited.

    Cancelling only Kopf's task would let Kopf run its cleanup handlers (a graceful stop), and the
    runtime's own workers are not Kopf's children, so they are cancelled too.
    """
    me = asyncio.current_task()
    keep = spare or set()
    victims = [t for t in asyncio.all_tasks() if t is not me and t not in keep and _operator_owned(t)]
    victims.append(running.task)
    for t in victims:
        t.cancel()
    await asyncio.wait(victims, timeout=5)
    # The sockets a dead process leaves behind are closed by its OS; ours by hand.
    runtime = getattr(running.memo, "runtime", None)
    if runtime is not None:
        with contextlib.suppress(Exception):
            await runtime.ctx.api.close()


class Watchdog:
    """Checks the invariant against the sandbox store on every tick while a scenario runs."""

    def __init__(self, cluster: Any, interval: float = 0.02) -> None:
        self.cluster, self.interval = cluster, interval
        self.checks = 0
        self.found: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.interval)

    def check(self) -> None:
        self.checks += 1
        for line in invariants.violations(invariants.from_sandbox(self.cluster)):
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
