"""The running operator: feeds watch events into state, runs scheduling workers and group reconciles.

Kopf handlers (nodes) and our own reflectors (groups, pods) call the ``on_*`` methods (synchronous,
cheap: they only record and enqueue). Decisions happen in worker tasks taking pods off the
:class:`~.queue.SchedulingQueue`; group status work happens in a debounced reconcile loop. Before any of
that starts, :meth:`Runtime.rebuild` reconstructs the ledger from the API, so a restarted operator never
hands out a device the API shows as taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import claims as claims_
from deviceshare.core import fgdplacement, inventory
from deviceshare.core import ledger as ledgers
from deviceshare.kube import watching

from . import leadership as leadership_
from . import rebuild as rebuild_
from . import state as state_
from . import storage
from .context import Context
from .queueing import SchedulingQueue
from .reconciler import GroupReconciler
from .scheduler import PodScheduler, Result

logger = logging.getLogger(__name__)


class Runtime:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.scheduler = PodScheduler(ctx)
        self.reconciler = GroupReconciler(
            ctx, self._request_reconcile, request_later=self._request_reconcile_later, pod_read=self._pod_read
        )
        self.queue: SchedulingQueue[state_.PodKey] = SchedulingQueue(
            backoff_initial=ctx.config.backoff_initial, backoff_max=ctx.config.backoff_max
        )
        self._reconcile_due: set[state_.GroupKey] = set()
        self._reconcile_wakeup = asyncio.Event()
        self._reconcile_timers: dict[state_.GroupKey, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._workers: list[asyncio.Task[None]] = []
        self.started = False
        self.leadership: leadership_.Leadership | None = None
        self._election: asyncio.Task[None] | None = None
        # The pods and groups feeds, from the first election on.
        self.pod_reflector: watching.Reflector | None = None
        self.group_reflector: watching.Reflector | None = None
        ctx.metrics.bind_ledger(ctx.ledger)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, *, identity: str | None = None) -> None:
        """Single replica: rebuild and schedule now. Electing: stand by until we hold the Lease (leadership.py)."""
        config = self.ctx.config
        if config.lease_name is None:
            await self.rebuild()
            self._start_scheduling()
        else:
            elector = leadership_.LeaseElector(
                self.ctx.api, namespace=config.namespace, name=config.lease_name,
                identity=identity or "", lease_duration=config.lease_duration,
            )
            self.leadership = leadership_.Leadership(
                elector, renew_deadline=config.renew_deadline, retry_period=config.retry_period,
                on_elected=self._elected, on_deposed=self._deposed,
            )
            self._election = asyncio.get_running_loop().create_task(self.leadership.run(), name="election")
        self.started = True

    async def _elected(self) -> None:
        await asyncio.sleep(self.ctx.config.election_settle)
        await self.rebuild()
        self._start_scheduling()

    async def _deposed(self) -> None:
        await self._stop_scheduling()

    def _start_scheduling(self) -> None:
        loop = asyncio.get_running_loop()
        if self.pod_reflector is None:
            # Watched from here on: the rebuild just listed them, and a standby has no use for them (its
            # state is replaced when it is elected). Their first lists replace the rebuild's.
            groups = Feed(self, "group", lambda: self.ctx.state.groups, self.on_group, self.group_gone)
            pods = Feed(self, "pod", lambda: self.ctx.state.pods, self.on_pod, self.pod_gone)
            self.group_reflector = groups.reflector = self.ctx.api.group_reflector(groups)
            self.pod_reflector = pods.reflector = self.ctx.api.pod_reflector(pods)
            self._tasks.append(loop.create_task(self.group_reflector.run(), name="watch groups"))
            self._tasks.append(loop.create_task(self.pod_reflector.run(), name="watch pods"))
            quota_reflector = self.ctx.api.quota_reflector(self.scheduler.quotas)  # device budgets (quotas.py)
            self._tasks.append(loop.create_task(quota_reflector.run(), name="watch resourcequotas"))
        self._workers = [loop.create_task(self._worker(i)) for i in range(self.ctx.config.workers)]
        self._workers.append(loop.create_task(self._reconcile_loop()))
        self._workers.append(loop.create_task(self._flush_loop()))
        self._workers.append(loop.create_task(self._audit_loop()))

    async def _stop_scheduling(self) -> None:
        """Cancel decisions in flight: a deposed replica must not keep writing."""
        workers, self._workers = self._workers, []
        await _cancel(workers)
        self.queue = SchedulingQueue(
            backoff_initial=self.ctx.config.backoff_initial, backoff_max=self.ctx.config.backoff_max
        )
        self._reconcile_due.clear()
        for timer in self._reconcile_timers.values():
            timer.cancel()
        self._reconcile_timers.clear()

    @property
    def scheduling(self) -> bool:
        return bool(self._workers)

    async def stop(self) -> None:
        self.started = False
        if self._election is not None:  # first, so that it cannot elect us again while we stop
            await _cancel([self._election])
        await self._stop_scheduling()
        if self.leadership is not None:  # no more writes from us: a successor may start at once
            await self.leadership.release()
        tasks, self._tasks = self._tasks, []
        await _cancel(tasks)
        await self.ctx.drain()

    async def rebuild(self) -> ledgers.RebuildReport:
        """Replace all in-memory state with what the API shows now."""
        started = time.perf_counter()
        ctx = self.ctx
        nodes, groups, pods = await asyncio.gather(
            ctx.api.list_nodes(), ctx.api.list_groups(), ctx.api.list_pods()
        )
        ledger = ledgers.DeviceLedger()
        for body in nodes:
            ledger.upsert_node(inventory.node_from_object(body))
        state = state_.ClusterState()
        for body in groups:
            state.upsert_group(state_.group_record(body))
        records = [state_.pod_record(body) for body in pods]
        # Only claims a record of ours agrees with count (see rebuild.py); membership comes from those records.
        sorted_claims = rebuild_.sort_claims(state.groups.values(), records, ctx.config.scheduler_name)
        for key, (uid, group) in sorted_claims.members.items():
            state.record_binding(key, uid, group)
        for pod in records:
            state.upsert_pod(pod)
            if pod.on_devices and pod.node_name:
                ledger.account_pod(pod.key, pod.node_name, pod.demand.cpu_milli, pod.demand.memory_bytes)
        report = ledger.rebuild(sorted_claims.claims)

        ctx.ledger, ctx.state = ledger, state
        ctx.fgd = fgdplacement.FGDPlacement(fgdplacement.seed_histogram(
            (g.spec, [p.demand for p in state.members(g.key)]) for g in state.groups.values() if g.spec is not None
        ))
        ctx.metrics.bind_ledger(ledger)
        ctx.conflicts.clear()
        ctx.unschedulable.clear()
        for c in report.conflicts:
            ctx.metrics.device_conflicts.inc()
            # Over-commitment and mixed kinds are reported, as double holding is: nobody is evicted.
            logger.error("device %s=%s on node %s %s: %s", c.resource, c.device, c.node, c.reason,
                         ", ".join(f"{ns}/{n}" for ns, n in c.groups))
            for g in c.groups:
                ctx.conflicts.setdefault(g, set()).update(o for o in c.groups if o != g)
                record = state.groups.get(g)
                if record is not None and c.reason != claims_.HELD_TWICE:
                    ctx.event(record, "DeviceConflict",
                              f"{c.resource} {c.device} on node {c.node}: {c.reason} "
                              f"({', '.join(f'{ns}/{n}' for ns, n in c.groups)}); it takes no new sharer "
                              "until a holder releases", warning=True)
        for g, others in ctx.conflicts.items():
            record = state.groups.get(g)
            if record is not None:
                ctx.event(record, "DeviceConflict",
                          "devices of this group are also claimed by "
                          + ", ".join(f"{ns}/{n}" for ns, n in sorted(others))
                          + "; neither keeps them exclusively until one releases", warning=True)
            logger.error("device conflict: group %s/%s shares devices with %s", *g, sorted(others))
        for problem in report.problems:
            logger.warning("rebuild: %s", problem)
        for untrusted in sorted_claims.untrusted:
            ctx.metrics.untrusted_claims.inc()
            pod = untrusted.pod
            message = (f"annotation {names.POD_SELECTED_DEVICES_ANNOTATION}={pod.selected_devices} is ignored: "
                       f"{untrusted.why}")
            ctx.event(pod, "UntrustedDeviceClaim", message, warning=True)
            logger.warning("rebuild: pod %s/%s: %s", *pod.key, message)

        for pod in state.pods.values():
            if self.scheduler.is_ours(pod):
                self.queue.add(pod.key)
        for gkey in state.groups:
            self._request_reconcile(gkey)
        gc.collect()
        gc.freeze()  # the rebuilt state lives on: later collections need not scan it again
        elapsed = time.perf_counter() - started
        ctx.metrics.rebuild_seconds.set(elapsed)
        logger.info(
            "ledger rebuilt in %.3fs: %d nodes, %d groups, %d pods, %d allocations, %d conflicts",
            elapsed, len(nodes), len(groups), len(pods), report.allocations, len(report.conflicts),
        )
        return report

    # -- watch events (from Kopf) ---------------------------------------------------------------

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        ledger = self.ctx.ledger
        name = str((body.get("metadata") or {}).get("name", ""))
        if event_type == "DELETED":
            ledger.remove_node(name)
            self._reconcile_node_groups(name)
            return
        node = inventory.node_from_object(body)
        old = ledger.node(name)
        if old == node:
            return  # a heartbeat: nothing placement cares about changed
        ledger.upsert_node(node)
        if old is None or old.ready != node.ready:
            self._reconcile_node_groups(name)
        self.queue.move_parked()

    def on_group(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        group = state_.group_record(body)
        if event_type == "DELETED":
            self.group_gone(group.key, group.uid)
            return
        old = self.ctx.state.groups.get(group.key)
        if not self.ctx.state.upsert_group(group):
            return
        self._request_reconcile(group.key)
        if old is None or old.generation != group.generation or old.deleting != group.deleting:
            for pod in self.ctx.state.members(group.key):
                if self.scheduler.is_ours(pod):
                    self.queue.add(pod.key)

    def on_pod(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        ctx = self.ctx
        if event_type == "DELETED":
            meta = body.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            self.pod_gone(key, str(meta.get("uid", "")))
            return
        pod = state_.pod_record(body)
        old = ctx.state.upsert_pod(pod)
        pod = ctx.state.pods[pod.key]  # as stored (an assumed binding applied)
        if pod.on_devices and pod.node_name:
            ctx.ledger.account_pod(pod.key, pod.node_name, pod.demand.cpu_milli, pod.demand.memory_bytes)
        else:
            ctx.ledger.forget_pod(pod.key)
        if self.scheduler.is_ours(pod):
            self.queue.add(pod.key)
        else:
            self.queue.forget(pod.key)
        if pod.group_key is not None and (old is None or _member_changed(old, pod)):
            self._request_reconcile(pod.group_key)
        if old is not None and old.on_devices and not pod.on_devices:
            self.queue.move_parked()

    def group_gone(self, key: state_.GroupKey, uid: str) -> None:
        held = self.ctx.state.groups.get(key)
        if held is not None and uid and held.uid != uid:
            return  # an earlier group of that name: the one we hold replaced it
        self.ctx.state.groups.pop(key, None)
        self._request_reconcile(key)

    def pod_gone(self, key: state_.PodKey, uid: str) -> None:
        ctx = self.ctx
        held = ctx.state.pods.get(key)
        if held is not None and uid and held.uid != uid:
            return  # an earlier pod of that name: the one we hold replaced it
        old = ctx.state.remove_pod(key)
        ctx.ledger.forget_pod(key)
        self.queue.forget(key)
        if old is not None:
            if old.group_key is not None:
                self._request_reconcile(old.group_key)
            if old.on_devices:
                self.queue.move_parked()

    def _pod_read(self, pod: state_.PodRecord, body: Mapping[str, Any] | None) -> None:
        """``pod`` read again from the API (None: not found). News the watch may never bring: a pod
        deleted while the watch was re-listing is absent from the list and has no DELETED event."""
        meta = (body or {}).get("metadata") or {}
        if body is None or meta.get("uid") != pod.uid:
            logger.info("pod %s/%s is gone; its deletion never came on the watch", *pod.key)
            self.ctx.metrics.missed_deletions.labels("pod").inc()
            self.pod_gone(pod.key, pod.uid)
            return
        held = self.ctx.state.pods.get(pod.key)
        if held is not None and held.uid == pod.uid and state_.newer(
            str(meta.get("resourceVersion", "")), held.resource_version
        ):
            self.on_pod("MODIFIED", body)

    # -- workers -------------------------------------------------------------------------------

    async def _worker(self, index: int) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._schedule_one(key)
            except Exception:
                logger.exception("scheduling pod %s/%s failed", *key)
                self.queue.retry_later(key, 1.0)
            finally:
                self.queue.done(key)
                self.ctx.metrics.queue_pending.set(len(self.queue))
                self.ctx.metrics.queue_parked.set(self.queue.parked)

    async def _schedule_one(self, key: state_.PodKey) -> None:
        outcome = await self.scheduler.schedule(key)
        self.ctx.metrics.placements.labels(outcome.result.value).inc()
        pod = self.ctx.state.pods.get(key)
        if outcome.result is Result.BOUND:
            self.queue.forget(key)
            if pod is not None and pod.group_key is not None:
                self._request_reconcile(pod.group_key)
        elif outcome.result is Result.SKIPPED:
            self.queue.forget(key)
        elif outcome.result is Result.RETRY:
            self.queue.retry_later(key, outcome.retry_after)
        elif outcome.result is Result.UNSCHEDULABLE:
            self.queue.park(key)
            if pod is not None:
                await self._report_unschedulable(pod, outcome.message)
        elif outcome.result is Result.REFUSED:
            # Never a silent Pending: the API's own words on the pod, and another try after a backoff.
            self.ctx.metrics.api_retries.inc()
            self.queue.back_off(key)
            if pod is not None:
                await self._report_unschedulable(pod, outcome.message, reason="SchedulerError")

    async def _report_unschedulable(
        self, pod: state_.PodRecord, message: str, *, reason: str = "Unschedulable"
    ) -> None:
        """PodScheduled=False (written only when it changes) and a FailedScheduling event.

        ``reason`` is kube-scheduler's: ``Unschedulable`` when nothing fits, ``SchedulerError`` when the
        API server refused what the scheduler wrote."""
        self.ctx.event(pod, "FailedScheduling", message, warning=True)
        if pod.group_key is not None:
            self._request_reconcile(pod.group_key)
        if pod.scheduled_condition == ("False", reason, message):
            return
        try:
            await self.ctx.api.set_pod_scheduled_condition(pod.key, status="False", reason=reason, message=message)
        except (storage.Gone, storage.Conflict):
            pass
        except storage.Invalid as e:  # the event above still says why
            logger.warning("could not set PodScheduled on pod %s/%s: %s", *pod.key, e)

    # -- group reconciles -----------------------------------------------------------------------

    def _request_reconcile(self, gkey: state_.GroupKey) -> None:
        self._reconcile_due.add(gkey)
        self._reconcile_wakeup.set()

    def _request_reconcile_later(self, gkey: state_.GroupKey, delay: float) -> None:
        loop = asyncio.get_running_loop()
        timer = self._reconcile_timers.get(gkey)
        if timer is not None:
            if timer.when() <= loop.time() + delay:
                return
            timer.cancel()
        self._reconcile_timers[gkey] = loop.call_later(delay, self._reconcile_timer_fired, gkey)

    def _reconcile_timer_fired(self, gkey: state_.GroupKey) -> None:
        self._reconcile_timers.pop(gkey, None)
        if self.scheduling:
            self._request_reconcile(gkey)

    def _reconcile_node_groups(self, node: str) -> None:
        for allocation in self.ctx.ledger.allocations():
            if allocation.node == node:
                self._request_reconcile(allocation.group)

    async def _reconcile_loop(self) -> None:
        limit = asyncio.Semaphore(self.ctx.config.workers)
        running: set[asyncio.Task[None]] = set()
        while True:
            await self._reconcile_wakeup.wait()
            await asyncio.sleep(self.ctx.config.status_debounce)  # coalesce a burst of member changes
            self._reconcile_wakeup.clear()
            due, self._reconcile_due = self._reconcile_due, set()
            for gkey in due:
                await limit.acquire()
                task = asyncio.get_running_loop().create_task(self._reconcile_one(gkey, limit))
                running.add(task)
                task.add_done_callback(running.discard)

    async def _reconcile_one(self, gkey: state_.GroupKey, limit: asyncio.Semaphore) -> None:
        try:
            if await self.reconciler.reconcile(gkey):
                self.queue.move_parked()
        except storage.Conflict:
            # Our copy was stale: re-read it, then try again.
            with contextlib.suppress(Exception):
                self.ctx.state.upsert_group(state_.group_record(await self.ctx.api.get_group(gkey)))
            self._request_reconcile(gkey)
        except storage.Gone:
            self.ctx.state.groups.pop(gkey, None)
            self._request_reconcile(gkey)
        except Exception:
            logger.exception("reconciling group %s/%s failed; retrying", *gkey)
            await asyncio.sleep(1.0)
            self._request_reconcile(gkey)
        finally:
            limit.release()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.config.unschedulable_flush)
            self.queue.flush()

    async def _audit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.config.audit_interval)
            try:
                await self.audit()
            except Exception:
                logger.warning("audit of pods and groups failed; next one in %.0fs",
                               self.ctx.config.audit_interval, exc_info=True)

    async def audit(self) -> int:
        """Forget pods and groups the API no longer has although no DELETED event said so. Returns how many.

        A list alone cannot tell (what was created after it is missing from it too, and applying a list
        over newer watch events goes backwards); so a held object the list lacks is read by itself, and
        only a 404 or another uid under its name counts as deleted.
        """
        ctx = self.ctx
        pods, groups = await asyncio.gather(ctx.api.list_pods(), ctx.api.list_groups())
        listed = {str((b.get("metadata") or {}).get("uid", "")) for b in pods}
        forgotten = 0
        for pod in [p for p in ctx.state.pods.values() if p.uid not in listed]:
            body = await ctx.api.get_pod(pod.key)
            if body is None or (body.get("metadata") or {}).get("uid") != pod.uid:
                forgotten += 1
            self._pod_read(pod, body)
        listed = {str((b.get("metadata") or {}).get("uid", "")) for b in groups}
        for group in [g for g in ctx.state.groups.values() if g.uid not in listed]:
            current = await ctx.api.get_group_if_exists(group.key)
            if current is not None and (current.get("metadata") or {}).get("uid") == group.uid:
                continue
            held = ctx.state.groups.get(group.key)
            if held is not None and held.uid == group.uid:
                logger.info("group %s/%s is gone; its deletion never came on the watch", *group.key)
                ctx.metrics.missed_deletions.labels("group").inc()
                self.group_gone(group.key, group.uid)
                forgotten += 1
        return forgotten


class Feed:
    """A reflector's sink. Events go to ``apply`` (the runtime's ``on_*``); a list (the first, and each relist
    after a watch expired) is the whole truth at its resourceVersion, so an object we hold that it lacks, and
    that we last saw at or before that version, was deleted while we were not watching: ``gone``."""

    def __init__(
        self,
        runtime: Runtime,
        kind: str,
        held: Callable[[], Mapping[tuple[str, str], state_.PodRecord | state_.GroupRecord]],
        apply: Callable[[str, Mapping[str, Any]], None],
        gone: Callable[[tuple[str, str], str], None],
    ) -> None:
        self.runtime, self.kind = runtime, kind
        self._held, self._gone = held, gone
        self.apply = apply
        self.reflector: watching.Reflector | None = None  # set once the reflector feeding this exists

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        held = self._held()
        listed: set[tuple[str, str]] = set()
        for body in objects:
            meta = body.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            listed.add(key)
            have = held.get(key)
            if have is not None and have.uid == meta.get("uid") and state_.newer(
                have.resource_version, str(meta.get("resourceVersion", ""))
            ):
                continue  # we already hold this version or a newer one (a rebuild's list, our own write)
            self.apply("ADDED", body)
        version = self.reflector.resource_version if self.reflector else None
        if version is None:
            return
        for key, have in list(held.items()):
            if key not in listed and state_.newer(version, have.resource_version):
                self.runtime.ctx.metrics.missed_deletions.labels(self.kind).inc()
                self._gone(key, have.uid)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


def _member_changed(old: state_.PodRecord, new: state_.PodRecord) -> bool:
    return (
        old.node_name != new.node_name
        or old.phase != new.phase
        or old.deleting != new.deleting
        or old.group != new.group
        or old.selected_devices != new.selected_devices
        or old.env_annotations != new.env_annotations
    )
