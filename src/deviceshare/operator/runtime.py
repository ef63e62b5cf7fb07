"""The running operator's lifecycle: start and stop, election, the rebuild, and each term's tasks.

Watch events enter through the :class:`~.intake.Intake` (synchronous, cheap: it only records and enqueues).
Decisions happen in worker tasks taking pods off the :class:`~.queueing.SchedulingQueue` (``deciding.py``, which
routes each outcome: bound, parked, retried, reported). Group status work runs in the
:class:`~.reconciler.GroupReconciler`'s own loop, fed by the :class:`~.queueing.ReconcileQueue`. Before any of
that starts, :meth:`Runtime.rebuild` reconstructs the ledger from the API, so a restarted (or newly elected)
operator never hands out a device the API shows as taken. With an election, workers run only while this replica
holds the Lease (``leadership.py``).

Each term (a start, or an election) begins with one list of nodes, groups and pods: the rebuild's. The watches of
that term resume from those lists' resourceVersions; with ``--groups-through-kopf`` the groups, which Kopf watches
for the whole process, are held from the rebuild's start and replayed from its list on (``groupfeed.py``). So an
event that happens during the rebuild is delivered to the state the rebuild made, never to the one it replaces,
and nothing is listed twice. A deposed replica stops its watches with its workers and closes the groups' gate: a
standby acts on nothing. Writes pass a fence (``storage.Fence``): the Lease's (``Leadership.remaining``) or, for a
single replica, one that is open while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator

from deviceshare.core import fgdplacement, inventory
from deviceshare.core import ledger as ledgers

from . import context, draintake, drainventory, storage
from . import leadership as leadership_
from . import rebuild as rebuild_
from . import state as state_
from .context import Context
from .deciding import Deciding, queue_order
from .intake import Intake
from .queueing import ReconcileQueue, SchedulingQueue
from .reconciler import GroupReconciler
from .scheduler import PodScheduler

logger = logging.getLogger(__name__)


class Runtime:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.scheduler = PodScheduler(ctx)
        self.queue: SchedulingQueue[state_.PodKey] = SchedulingQueue(
            backoff_initial=ctx.config.backoff_initial, backoff_max=ctx.config.backoff_max, order=queue_order(ctx)
        )
        self.reconciles = ReconcileQueue(
            debounce=ctx.config.status_debounce, allocations=lambda: ctx.ledger.allocations()
        )
        self.deciding = Deciding(ctx, self.scheduler, self.queue, self.reconciles)
        self.intake = Intake(ctx, self.queue, self.reconciles, is_ours=self.scheduler.is_ours)
        self.reconciler = GroupReconciler(ctx, self.reconciles, pods=self.intake)
        self._workers: list[asyncio.Task[None]] = []  # the term's watches and workers, while we schedule
        self._listed: dict[str, str | None] = {}  # the rebuild's lists' resourceVersions: the watches go on from there
        self.started = False
        self.leadership: leadership_.Leadership | None = None
        self._election: asyncio.Task[None] | None = None
        self._fence = storage.OpenFence(ctx.api.request_timeout)
        ctx.metrics.bind_leader(lambda: self.scheduling)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, *, identity: str | None = None) -> None:
        """Single replica: rebuild and schedule now. Electing: stand by until we hold the Lease (leadership.py)."""
        config = self.ctx.config
        self.ctx.api.watch_idle_s = config.watch_idle_timeout
        if config.lease_name is None:
            self.ctx.api.fence = self._fence
            await self.rebuild()
            self._start_scheduling()
        else:
            # Each Lease request within a third of the renew deadline (client-go's leader election client: half):
            # one hung request (a dead connection), the retry period, and a try on a new connection all fit in it.
            self.ctx.api.lease_timeout = max(1.0, config.renew_deadline / 3)
            elector = leadership_.LeaseElector(
                self.ctx.api, namespace=config.namespace, name=config.lease_name,
                identity=identity or "", lease_duration=config.lease_duration,
            )
            self.leadership = leadership_.Leadership(
                elector, renew_deadline=config.renew_deadline, retry_period=config.retry_period,
                on_elected=self._elected, on_deposed=self._deposed,
            )
            self.ctx.api.fence = self.leadership
            self._election = asyncio.get_running_loop().create_task(self.leadership.run(), name="election")
        self.started = True

    async def _elected(self) -> None:
        await asyncio.sleep(self.ctx.config.election_settle)
        try:
            await self.rebuild()
        except Exception:
            self.intake.groups.close()  # a failed take-over starts no term (leadership.py): keep no event meanwhile
            raise
        self._start_scheduling()

    async def _deposed(self) -> None:
        await self._stop_scheduling()

    def _start_scheduling(self) -> None:
        loop = asyncio.get_running_loop()
        self._workers = self.intake.watch(self.scheduler.quotas, resume_from=self._listed)
        self._workers += [loop.create_task(self.deciding.worker()) for _ in range(self.ctx.config.workers)]
        self._workers.append(loop.create_task(self.reconciler.run(released=self.queue.move_parked)))
        self._workers.append(loop.create_task(self.deciding.flush_loop()))
        self._workers.append(loop.create_task(self.intake.audit_loop()))

    async def _stop_scheduling(self) -> None:
        """Cancel decisions in flight (the fence is closed already: none of them writes any more) and the
        term's watches; group events are neither applied nor kept from here on."""
        self.intake.groups.close()
        workers, self._workers = self._workers, []
        await _cancel(workers)
        self.queue.clear()
        self.reconciles.clear()

    @property
    def scheduling(self) -> bool:
        return bool(self._workers)

    async def stop(self) -> None:
        self.started = False
        self._fence.open = False  # first: from here on nothing of ours is sent
        if self._election is not None:  # so that it cannot elect us again while we stop (closes its fence)
            await _cancel([self._election])
        await self._stop_scheduling()
        if self.leadership is not None:  # a successor may start at once, once our last writes have settled
            await self.leadership.release(after=self.ctx.api.settle)
        await self.ctx.drain()

    async def rebuild(self) -> ledgers.RebuildReport:
        """Replace all in-memory state with what the API shows now."""
        started = time.perf_counter()
        ctx = self.ctx
        self.intake.groups.hold()  # until the term opens it: what groups do meanwhile is replayed onto our state
        # What follows makes ~10^5 objects that live on: the cyclic collector would walk the growing heap
        # over and over (a tenth of the rebuild); the one collection at the end, before freezing, suffices.
        with _collector_paused():
            # Page by page, each page made into records as it arrives (storage/listing.py): the bodies of 150,000
            # pods never sit in memory together.
            node_list, group_list, pod_list, dra_listed = await asyncio.gather(
                ctx.api.list_nodes(inventory.node_from_object), ctx.api.list_groups(state_.group_record),
                ctx.api.list_pods(state_.pod_record), draintake.list_all(ctx.api),
            )
            self._listed = {"nodes": node_list.resource_version, "groups": group_list.resource_version,
                            "pods": pod_list.resource_version, **(dra_listed.versions or {})}
            nodes, groups, records = node_list.items, group_list.items, pod_list.items
            del node_list, group_list, pod_list
            counts = (len(nodes), len(groups), len(records))
            ledger = ledgers.DeviceLedger()
            dra = drainventory.DraInventory(context.held_by(lambda: ledger))
            draintake.fill(dra, dra_listed)
            for node in nodes:
                ledger.upsert_node(dra.node(node))
            state = state_.ClusterState()
            for record in groups:
                state.upsert_group(record)
            del nodes, groups
            # Only claims a record of ours agrees with count (see rebuild.py); membership comes from those records.
            sorted_claims = rebuild_.sort_claims(state.groups.values(), records, ctx.config.scheduler_name)
            for key, (uid, group) in sorted_claims.members.items():
                state.record_binding(key, uid, group)
            for pod in records:
                state.upsert_pod(pod)
            ledger.account_pods(
                (pod.key, pod.node_name, pod.demand.cpu_milli, pod.demand.memory_bytes)
                for pod in records if pod.on_devices and pod.node_name
            )
            # Our groups' own ResourceClaims are records of ours too (draintake.our_claims); a status wins.
            report = ledger.rebuild(sorted_claims.claims + draintake.our_claims(dra, state.groups))
            draintake.refresh_all(dra, ledger)  # which claims are ours depends on what the ledger now holds
            ctx.adopt(ledger, state, conflicts=rebuild_.contested(report), fgd=fgdplacement.FGDPlacement(
                fgdplacement.seed_histogram((g.spec, [p.demand for p in state.members(g.key)])
                                            for g in state.groups.values() if g.spec is not None)
            ), dra=dra, dra_served=dra_listed.versions is not None)
            rebuild_.announce(ctx, report, sorted_claims.untrusted)
            for pod in state.pods.values():
                if self.scheduler.is_ours(pod):
                    self.queue.add(pod.key)
            for gkey in state.groups:
                self.reconciles.request(gkey)
            del records  # the pods' records before they joined their groups
            if gc.get_freeze_count():  # a previous term's state, frozen: any cycle among it is garbage now
                gc.unfreeze()
                gc.collect()  # (at the first rebuild there is no old state to collect: 1-2 s spared at 150k pods)
            gc.freeze()  # the rebuilt state lives on: later collections need not scan it again
        elapsed = time.perf_counter() - started
        ctx.metrics.rebuilt(elapsed, *counts, untrusted=len(sorted_claims.untrusted))
        logger.info(
            "ledger rebuilt in %.3fs: %d nodes, %d groups, %d pods, %d allocations, %d conflicts",
            elapsed, *counts, report.allocations, len(report.conflicts),
        )
        return report


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection inside (unless it was off already)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
