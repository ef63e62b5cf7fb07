"""The scheduling workers: pods taken off the :class:`~.queueing.SchedulingQueue`, decided, and each outcome routed.

An outcome goes back to the queue (bound: forgotten; unschedulable: parked; refused or a conflict: retried after a
backoff), to the group's status reconcile (``ReconcileQueue``), and, for a pod that waits, to the pod itself
(``PodScheduled=False`` and a ``FailedScheduling`` event, as kube-scheduler writes them). The runtime starts
:meth:`Deciding.worker` tasks for each term (``runtime.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from deviceshare.core import priority as priority_

from . import state as state_
from . import storage
from .context import Context
from .queueing import ReconcileQueue, SchedulingQueue
from .scheduler import PodScheduler, Result

logger = logging.getLogger(__name__)


def queue_order(ctx: Context) -> Callable[[state_.PodKey], tuple[int, str, state_.PodKey]]:
    """Queue sort (kube-scheduler's PrioritySort): the pod's group priority, then its age."""

    def key(pod_key: state_.PodKey) -> tuple[int, str, state_.PodKey]:
        pod = ctx.state.pods.get(pod_key)
        if pod is None:
            return priority_.queue_key(0, "", pod_key)
        gkey = pod.group_key
        return priority_.queue_key(ctx.state.priority(gkey) if gkey else 0, pod.created, pod_key)

    return key


class Deciding:
    def __init__(
        self, ctx: Context, scheduler: PodScheduler, queue: SchedulingQueue[state_.PodKey], reconciles: ReconcileQueue
    ) -> None:
        self.ctx, self.scheduler, self.queue, self.reconciles = ctx, scheduler, queue, reconciles

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.schedule_one(key)
            except Exception:
                logger.exception("scheduling pod %s/%s failed", *key)
                self.queue.retry_later(key, 1.0)
            finally:
                self.queue.done(key)
                self.ctx.metrics.queue_pending.set(len(self.queue))
                self.ctx.metrics.queue_parked.set(self.queue.parked)

    async def schedule_one(self, key: state_.PodKey) -> None:
        outcome = await self.scheduler.schedule(key)
        self.ctx.metrics.placements.labels(outcome.result.value).inc()
        pod = self.ctx.state.pods.get(key)
        for other in outcome.also_bound:  # a gang's other members, bound in the same cycle
            self.queue.forget(other)
        if outcome.result is Result.BOUND:
            self.queue.forget(key)
            if pod is not None and pod.group_key is not None:
                self.reconciles.request(pod.group_key)
        elif outcome.result is Result.SKIPPED:
            self.queue.forget(key)
        elif outcome.result is Result.RETRY:
            self.queue.retry_later(key, outcome.retry_after)
        elif outcome.result is Result.UNSCHEDULABLE:
            self.queue.park(key)
            if pod is not None:
                await self.report_unschedulable(pod, outcome.message)
        elif outcome.result is Result.REFUSED:
            # Never a silent Pending: the API's own words on the pod, and another try after a backoff.
            self.ctx.metrics.api_retries.inc()
            self.queue.back_off(key)
            if pod is not None:
                await self.report_unschedulable(pod, outcome.message, reason="SchedulerError")

    async def report_unschedulable(
        self, pod: state_.PodRecord, message: str, *, reason: str = "Unschedulable"
    ) -> None:
        """PodScheduled=False (written only when it changes) and a FailedScheduling event.

        ``reason`` is kube-scheduler's: ``Unschedulable`` when nothing fits, ``SchedulerError`` when the
        API server refused what the scheduler wrote."""
        self.ctx.event(pod, "FailedScheduling", message, warning=True)
        if pod.group_key is not None:
            self.reconciles.request(pod.group_key)
        if pod.scheduled_condition == ("False", reason, message):
            return
        try:
            await self.ctx.api.set_pod_scheduled_condition(pod.key, status="False", reason=reason, message=message)
        except (storage.Gone, storage.Conflict, storage.Fenced):
            pass
        except storage.RetryLater as e:  # written again the next time the pod is found unschedulable
            logger.info("could not set PodScheduled on pod %s/%s: %s", *pod.key, e)
        except storage.Invalid as e:  # the event above still says why
            logger.warning("could not set PodScheduled on pod %s/%s: %s", *pod.key, e)

    async def flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.config.unschedulable_flush)
            self.queue.flush()
