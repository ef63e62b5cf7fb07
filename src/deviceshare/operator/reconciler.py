"""Keeps each SharedDeviceGroup's status true to the ledger and its pods, and lets go of devices safely.

Runs under the group's lock, so it never interleaves with a placement of the same group. It decides
from the ledger (the authority on devices) and the pods (the authority on who runs where):
- finalizer on every live group, so deletion waits for us;
- deleting: phase Releasing while a member still runs on the devices, then release and drop the finalizer;
- node lost (deleted or NotReady): NodeLost condition and event; once no member runs there the devices
  go back to the ledger and the group returns to Pending, to be placed again by its next pod;
- member pods whose device annotations (or group annotation) were edited get them back from the
  allocation (``memberrestore.py``): only members we bound into this group, and only on the group's node; also
  after the group itself is gone while they run (someone removed our finalizer), when they are the claim's only
  record;
- a member a release has waited on for ``member_recheck`` seconds is read again from the API: if its
  deletion never reached us (a pod watch that hangs without an error), it would otherwise hold its
  group's devices for ever.

:meth:`GroupReconciler.run` takes due groups off the :class:`~.queueing.ReconcileQueue`; a reconcile that
fails (a conflict, a group gone, an error) is retried there with backoff (``reconcileloop.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deviceshare.api import names
from deviceshare.core import ledger as ledgers
from deviceshare.core import nominations

from . import draallocation, draclaims, memberrestore, statuses, storage
from . import state as state_
from .context import Context
from .queueing import ReconcileQueue
from .reconcileloop import ReconcileLoop

logger = logging.getLogger("deviceshare.operator.reconciler")


class PodReads(Protocol):
    def pod_read(self, pod: state_.PodRecord, body: Mapping[str, Any] | None) -> None:
        """``pod`` as the API shows it now (None: it no longer exists); see ``intake.Intake.pod_read``."""
        ...


class GroupReconciler:
    """Reconciles the groups ``queue`` hands out (:meth:`run`); asks ``queue`` again for groups to look at later,
    and tells ``pods`` what it read of a member a release waits on."""

    def __init__(self, ctx: Context, queue: ReconcileQueue, *, pods: PodReads) -> None:
        self.ctx = ctx
        self._queue = queue
        self._request = queue.request  # for groups whose status this one's change affects
        self._request_later = queue.request_later
        self._pod_read = pods.pod_read  # a member re-read from the API (None: it no longer exists)
        self._waiting_since: dict[state_.GroupKey, float] = {}  # groups whose release waits on members
        self._new_groups: dict[state_.GroupKey, float] = {}  # first seen, for groups with no status yet
        self._claims = draclaims.GroupClaims(ctx, queue.request_later)  # DRA groups' ResourceClaims (CONTRACT §13)

    async def run(self, *, released: Callable[[], object]) -> None:
        """Reconcile due groups until cancelled, retrying failures with backoff (see reconcileloop.py)."""
        loop = ReconcileLoop(self.ctx, self, self._queue, released=released, concurrency=self.ctx.config.workers)
        await loop.run()

    async def reconcile(self, gkey: state_.GroupKey) -> bool:
        """Bring one group up to date. Returns True if devices were released (parked pods may now fit)."""
        async with self.ctx.locks.hold(gkey):
            before = self.ctx.state.groups.get(gkey)
            released = await self._reconcile_locked(gkey)
            after = self.ctx.state.groups.get(gkey)
        # Our own write's answer may be the first news of a deletion or a spec change (its watch event,
        # older than that answer, is then ignored): look again with what we now know.
        if after is not None and (
            before is None or after.deleting != before.deleting or after.generation != before.generation
        ):
            self._request(gkey)
        return released

    async def _reconcile_locked(self, gkey: state_.GroupKey) -> bool:
        ctx = self.ctx
        await ctx.unsettled.settle(ctx.api, ctx.ledger, ctx.state, gkey)  # a claim whose write ended uncertain
        group = ctx.state.groups.get(gkey)
        on_devices = ctx.state.members_on_devices(gkey)
        allocation = ctx.ledger.allocation(gkey)

        waiting = allocation is not None and bool(on_devices) and (
            group is None or group.deleting or self._node_lost(allocation.node) is not None
        )
        if waiting:
            on_devices = await self._confirm_members(gkey, on_devices)
        else:
            self._waiting_since.pop(gkey, None)

        if group is None or group.deleting:  # a preemption for it, or of it, ends here
            ctx.nominations = ctx.nominations.clear(gkey)
            ctx.preempted.pop(gkey, None)

        if group is None:
            self._new_groups.pop(gkey, None)
            if allocation is not None and not on_devices:  # DRA hook: the claim's allocation cleared first
                await self._release_claim(None, gkey, allocation)
            if self._claims.known(gkey):  # someone else removed its finalizer: its claim goes once nothing holds it
                await self._claims.release(gkey)
            # Gone from the API (its finalizer removed by someone else): still never free devices under a pod.
            if allocation is not None and not on_devices:
                ctx.ledger.release(gkey)
                ctx.metrics.group_on_unhealthy(gkey, False)
                self._forget_conflicts(gkey)
                return True
            if allocation is not None:
                # The members' annotations are now the only record a restarted operator can rebuild this
                # claim from (a gone group has no status): keep them true while its members run.
                await memberrestore.restore(self.ctx, gkey, allocation, on_devices)
            return False

        if group.deleting:
            if on_devices:
                await self._write_status(group, phase=names.PHASE_RELEASING)
                return False
            # DRA: the claim's reservedFor and allocation cleared (draallocation), then the claim deleted (draclaims).
            await self._release_claim(group, gkey, allocation)
            if draclaims.may_have_claim(group, self._claims) and not await self._claims.release(gkey):
                return False  # its ResourceClaim first: still allocated or reserved, looked at again shortly
            # The API stops showing the claim once our finalizer is gone; only then may the ledger
            # give the devices to someone else (status/API first, ledger second, as everywhere).
            if names.GROUP_FINALIZER in group.finalizers:
                await self._set_finalizers(group, [f for f in group.finalizers if f != names.GROUP_FINALIZER])
            released = ctx.ledger.release(gkey) is not None
            ctx.metrics.group_on_unhealthy(gkey, False)
            self._forget_conflicts(gkey)
            if released:
                ctx.event(group, "Released", "devices returned; no member pod runs on them any more")
            ctx.unschedulable.pop(gkey, None)
            return released

        if names.GROUP_FINALIZER not in group.finalizers:
            group = await self._set_finalizers(group, [*group.finalizers, names.GROUP_FINALIZER])
        group = await self._claims.ensure(group)  # a DRA group's ResourceClaim, placed or not

        victim = self._victim(gkey, allocation, bool(on_devices))
        if victim is not None and not on_devices:
            return await self._release_preempted(group, victim)

        node_lost: str | None = None
        if allocation is not None:
            node_lost = self._node_lost(allocation.node)
            if node_lost and not on_devices:
                # The release wrote the status (Pending, NodeLost saying why); writing it again from the
                # record read before would wipe that reason until the group is placed again.
                return await self._release_lost(group, node_lost)
            await memberrestore.restore(self.ctx, gkey, allocation, on_devices)
            if draallocation.is_dra(group):  # DRA hook: members that are gone leave the claim's reservedFor
                await draallocation.prune_reserved(ctx, gkey, (p.uid for p in ctx.state.live_members(gkey)))

        await self._write_status(group, node_lost=node_lost)
        return False

    async def _release_claim(
        self, group: state_.GroupRecord | None, gkey: state_.GroupKey, allocation: ledgers.Allocation | None
    ) -> None:
        """DRA hook (CONTRACT §13): before the ledger gives a DRA group's devices back, its claim's reservedFor and
        allocation are cleared (draallocation.py); a failure raises, so the devices stay held until a later try."""
        if draallocation.holds_claim(self.ctx, group, gkey):
            await draallocation.release_claim_allocation(self.ctx, gkey, allocation)

    def _node_lost(self, name: str) -> str | None:
        node = self.ctx.ledger.node(name)
        if node is None:
            return f"node {name} no longer exists"
        if not node.ready:
            return f"node {name} is not Ready"
        return None

    async def _confirm_members(
        self, gkey: state_.GroupKey, members: list[state_.PodRecord]
    ) -> list[state_.PodRecord]:
        """The members a release still waits on; re-read from the API once they kept it waiting long enough.

        Cheap by design: nothing is read while the wait is short (the usual case: the pods are
        terminating and their watch events are on the way), and then one GET per waited-on member.
        """
        now = time.monotonic()
        since = self._waiting_since.setdefault(gkey, now)
        recheck = self.ctx.config.member_recheck
        if now - since < recheck:
            self._request_later(gkey, since + recheck - now)
            return members
        still: list[state_.PodRecord] = []
        for pod in members:
            body = await self.ctx.api.get_pod(pod.key)
            self._pod_read(pod, body)
            current = self.ctx.state.pods.get(pod.key)
            if current is not None and current.uid == pod.uid and current.on_devices:
                still.append(current)
        self._waiting_since[gkey] = now
        if still:
            self._request_later(gkey, recheck)
        return still

    def _victim(
        self, gkey: state_.GroupKey, allocation: ledgers.Allocation | None, running: bool
    ) -> nominations.Victim | None:
        """The preemption whose victim the group is, while it applies: its devices on that node, and members
        either gone or still being evicted (past ``expires`` those a PodDisruptionBudget kept are left alone)."""
        victim = self.ctx.preempted.get(gkey)
        if victim is None:
            return None
        if allocation is None or allocation.node != victim.node or (running and victim.expires <= time.monotonic()):
            del self.ctx.preempted[gkey]
            return None
        return victim

    async def _release_preempted(self, group: state_.GroupRecord, victim: nominations.Victim) -> bool:
        """Every member evicted: Pending again, status first (conditional) then the ledger; the preemptor's
        nomination keeps the room for it."""
        why = f"preempted by {names.key_text(victim.by)} (priority {victim.priority}) on {victim.node}"
        self.ctx.state.keep(await self.ctx.api.patch_group_status(
            group.key, statuses.preempted(group, why), uid=group.uid, resource_version=group.resource_version
        ))
        await self._release_claim(group, group.key, self.ctx.ledger.allocation(group.key))
        self.ctx.ledger.release(group.key)
        del self.ctx.preempted[group.key]
        self._forget_conflicts(group.key)
        return True

    async def _release_lost(self, group: state_.GroupRecord, why: str) -> bool:
        """The node is gone or NotReady and nothing runs there: Pending again, status first then ledger."""
        self.ctx.state.keep(await self.ctx.api.patch_group_status(
            group.key, statuses.node_lost(group, why), uid=group.uid, resource_version=group.resource_version
        ))
        await self._release_claim(group, group.key, self.ctx.ledger.allocation(group.key))
        self.ctx.ledger.release(group.key)
        self.ctx.metrics.group_on_unhealthy(group.key, False)
        self.ctx.event(group, "NodeLost", f"{why}; devices released, the group will be placed again", warning=True)
        return True

    async def _set_finalizers(self, group: state_.GroupRecord, finalizers: list[str]) -> state_.GroupRecord:
        return self.ctx.state.keep(await self.ctx.api.set_group_finalizers(
            group.key, finalizers, uid=group.uid, resource_version=group.resource_version
        ))

    def _forget_conflicts(self, gkey: state_.GroupKey) -> None:
        """A released group no longer contests anything: its former rivals' conditions clear."""
        for other in self.ctx.conflicts.pop(gkey, set()):
            peers = self.ctx.conflicts.get(other)
            if peers is not None:
                peers.discard(gkey)
                if not peers:
                    del self.ctx.conflicts[other]
            self._request(other)

    async def _write_status(
        self, group: state_.GroupRecord, *, phase: str | None = None, node_lost: str | None = None
    ) -> None:
        ctx = self.ctx
        gkey = group.key
        allocation = ctx.ledger.allocation(gkey)
        live = ctx.state.live_members(gkey)
        skipped = statuses.skipped_webhook(live, ctx.config.scheduler_name)
        if allocation is None and not group.status.conditions and gkey not in ctx.unschedulable and not group.deleting:
            if any(not p.node_name and p not in skipped for p in live):
                return  # a brand-new group whose pod is being placed: the placement writes its first status
            # Brand new and no member yet: its pods usually follow within moments (one kubectl apply), and
            # then the placement writes the first status; say WaitingForMembers only if they do not.
            now = time.monotonic()
            first_seen = self._new_groups.setdefault(gkey, now)
            if now - first_seen < ctx.config.new_group_grace:
                self._request_later(gkey, first_seen + ctx.config.new_group_grace - now)
                return
        self._new_groups.pop(gkey, None)
        skipped_why = statuses.skipped_message(skipped, ctx.config.scheduler_name) if skipped else None
        kept = ctx.nominations.live(time.monotonic())
        if kept is not ctx.nominations:  # expired ones go
            ctx.nominations = kept
            ctx.metrics.nominations.set(len(kept))
        nomination = kept.by_group.get(gkey)
        nominated = None if nomination is None else nomination.node
        unhealthy = statuses.unhealthy_held(allocation, ctx.ledger.node(allocation.node) if allocation else None)
        ctx.metrics.group_on_unhealthy(gkey, unhealthy is not None)
        desired = statuses.reconciled(
            group, allocation, phase=phase, nominated=nominated,
            scheduled=statuses.scheduled(
                allocation, unschedulable=ctx.unschedulable.get(gkey), skipped=skipped_why, nominated=nominated,
                shown=group.status,
            ),
            node_lost=node_lost, conflicting_with=ctx.conflicts.get(gkey, ()),
            # Not a pod the pre-bind member check refuses: its annotation names the group, but it is no member.
            members=statuses.member_names(ctx.state, group, ctx.config.env_names),
            unhealthy=unhealthy,
        )
        current = group.status
        if statuses.unchanged(current, desired):
            return
        if node_lost and not any(c.type == names.CONDITION_NODE_LOST for c in current.conditions):
            ctx.event(group, "NodeLost", f"{node_lost}; devices stay held while a member still runs there",
                      warning=True)
        if unhealthy and not any(c.type == names.CONDITION_DEVICE_UNHEALTHY and c.message.startswith(unhealthy)
                                 for c in current.conditions):
            ctx.event(group, "DeviceUnhealthy", f"{unhealthy}; its pods keep running (not evicted)", warning=True)
        try:
            written = await ctx.api.patch_group_status(
                gkey, desired, uid=group.uid, resource_version=group.resource_version
            )
        except storage.Gone:
            return
        ctx.state.keep(written)

