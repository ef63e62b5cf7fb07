"""The group reconciler's loop: due groups in debounced batches, a few at a time, failures retried with backoff.

Apart from ``reconciler.py`` (what one reconcile does) so that module stays about a group's status. A reconcile
that fails is asked for again by the :class:`~.queueing.ReconcileQueue`'s timer, after a per-group delay that
doubles with each failure in a row (capped) and starts over after a success:

- ``storage.Conflict``: our copy of the group was stale; it is read again first, so the retry writes on top of
  what the API has (a group edited in a tight loop must not make us spin on 409s);
- ``storage.Gone``: the group was deleted; we forget it, and the retry does what a gone group needs (release
  its devices once no member runs on them);
- ``storage.RetryLater`` (a throttled or lost write that could not be resolved: ``Uncertain``): retried no sooner
  than ``error_delay`` (or the server's Retry-After); what it could have claimed stays held meanwhile;
- ``storage.Fenced``: this replica is being deposed and its loop is about to be cancelled: nothing to do;
- anything else is a bug or an API outage: logged with its traceback, retried no sooner than ``error_delay``.

Nothing a reconcile raises ends the loop. Cancelling the loop (a deposed leader) cancels the reconciles in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from . import state as state_
from . import storage
from .context import Context
from .queueing import ReconcileQueue

logger = logging.getLogger(__name__)

BACKOFF_INITIAL = 0.1  # s: a first conflict is usually a write that crossed ours; retry almost at once
BACKOFF_MAX = 30.0
ERROR_DELAY = 1.0  # s: the least wait after an unexpected error


class Reconciles(Protocol):
    async def reconcile(self, gkey: state_.GroupKey) -> bool:
        """Bring one group up to date; True if devices were released."""
        ...


class ReconcileLoop:
    """Runs ``reconciler`` on what ``queue`` hands out, at most ``concurrency`` groups at once; ``released`` is
    called after a reconcile that gave devices back (pods waiting for room may now fit)."""

    def __init__(
        self,
        ctx: Context,
        reconciler: Reconciles,
        queue: ReconcileQueue,
        *,
        released: Callable[[], object],
        concurrency: int,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        error_delay: float = ERROR_DELAY,
    ) -> None:
        self.ctx, self._reconciler, self._queue, self._released = ctx, reconciler, queue, released
        self._concurrency = concurrency
        self._backoff_initial, self._backoff_max, self._error_delay = backoff_initial, backoff_max, error_delay
        self.failures: dict[state_.GroupKey, int] = {}  # failed reconciles in a row, per group

    async def run(self) -> None:
        """Until cancelled."""
        limit = asyncio.Semaphore(self._concurrency)
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                for gkey in await self._queue.batch():
                    await limit.acquire()
                    task = asyncio.get_running_loop().create_task(self._one(gkey, limit))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            for task in running:  # a deposed leader must not keep writing
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _one(self, gkey: state_.GroupKey, limit: asyncio.Semaphore) -> None:
        try:
            released = await self._reconciler.reconcile(gkey)
        except storage.Conflict:
            await self._read_again(gkey)
            self._retry(gkey, "conflict")
        except storage.Gone:
            self.ctx.state.groups.pop(gkey, None)
            self._retry(gkey, "gone")
        except storage.Fenced:
            pass
        except storage.RetryLater as e:
            delay = self._retry(gkey, "api", at_least=max(self._error_delay, e.delay))
            logger.warning("reconciling group %s/%s: %s; retrying in %.1fs", *gkey, e, delay)
        except Exception:
            delay = self._retry(gkey, "error", at_least=self._error_delay)
            logger.exception("reconciling group %s/%s failed; retrying in %.1fs", *gkey, delay)
        else:
            self.failures.pop(gkey, None)
            if released:
                self._released()
        finally:
            limit.release()

    def _retry(self, gkey: state_.GroupKey, why: str, *, at_least: float = 0.0) -> float:
        failures = self.failures[gkey] = self.failures.get(gkey, 0) + 1
        delay = max(at_least, min(self._backoff_initial * 2.0 ** (failures - 1), self._backoff_max))
        logger.debug("group %s/%s: %s (%d in a row); next reconcile in %.2fs", *gkey, why, failures, delay)
        self._queue.request_later(gkey, delay)
        return delay

    async def _read_again(self, gkey: state_.GroupKey) -> None:
        """The group as the API has it now, in place of our stale copy (gone: forgotten)."""
        try:
            record = await self.ctx.api.read_group(gkey)
        except storage.Gone:
            self.ctx.state.groups.pop(gkey, None)
        except Exception as e:  # the retry reads it again, or fails again and backs off further
            logger.debug("reading group %s/%s again failed: %s", *gkey, e)
        else:
            self.ctx.state.keep(record)
