"""Placing a group that holds nothing yet: the phases from pre-filter to reserve, for the pod that places it.

- **pre-filter**: the namespace's device budget (``quotas``), and our finalizer on the group (so a deletion from
  here on waits for the release);
- **filter, score, permit**: one pure call, :func:`deviceshare.core.gang.permit`, on the ledger's snapshot as this
  group sees it (devices kept for a nominated preemptor of equal or higher priority withheld,
  :func:`deviceshare.core.nominations.overlay`). It runs the placement engine (filters with reasons,
  binpack/spread/fgd) for the group's members together: without a gang that is the placing pod alone; a gang
  (``minMembers: N``) waits until N member pods exist (``WaitingForMembers``) and needs a node with room for all
  N (CONTRACT §8). Nothing is held before this says start;
- **reserve**: the decision reserved in the ledger (no await between the quota read and the reservation, so
  another group of the namespace cannot slip in between), then persisted in the group's status, conditional on
  its resourceVersion; a status write whose outcome stays unknown keeps the reservation (``settling.py``).

What is left to do (bind every member the permit named, or the post-filter when nothing fits) is the
scheduler's; this module only decides, reserves and records.
"""

from __future__ import annotations

import dataclasses
import time

from deviceshare.api import models, names
from deviceshare.core import budget as budget_
from deviceshare.core import gang, nominations, placement
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules

from . import draplacing, quotas, statuses, storage
from . import state as state_
from .context import Context

# What a status write raises when it was certainly not applied (storage.errors): the API refused it (409, 404,
# 400/403/422, a 429, another 4xx) or it never left (Fenced; a RetryLater for a connection never made). An
# ``Uncertain`` is a RetryLater too, and is told apart where this is caught.
NOT_APPLIED = (storage.Conflict, storage.Gone, storage.Invalid, storage.Fenced, storage.RetryLater)


@dataclasses.dataclass(frozen=True)
class Placed:
    """Reserved and persisted: bind ``members`` (the placing pod first) to ``allocation``'s node."""

    allocation: ledgers.Allocation
    members: tuple[state_.PodKey, ...]


@dataclasses.dataclass(frozen=True)
class NotPlaced:
    """Nothing held. ``unschedulable``: no node fits (the post-filter may make room); otherwise a gang waits
    for its members, or the group changed under us (``retry``)."""

    message: str
    unschedulable: placement.Unschedulable | None = None
    retry: bool = False


class GroupPlacer:
    def __init__(self, ctx: Context, quota_cache: quotas.QuotaCache) -> None:
        self.ctx = ctx
        self.quotas = quota_cache

    async def place(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec
    ) -> Placed | NotPlaced:
        ctx = self.ctx
        short = gang.waiting(spec.min_members, len(self.members(pod, group.key, spec)))
        if short is not None:  # a gang short of members: nothing is written, nothing held
            ctx.unschedulable[group.key] = short.message()
            return NotPlaced(short.message())
        await draplacing.prepare(ctx, spec)  # DRA hook: claim selectors evaluated off the event loop
        budget = await quotas.read(self.quotas, ctx.api, group.key[0])  # checked after the last await
        marked = await self._ensure_finalizer(group, spec)
        if marked is None:
            return NotPlaced("the group changed while its finalizer was added", retry=True)
        # No await from here to the reservation: another group of the namespace cannot slip in between.
        decided = self._decide(pod, marked, spec, budget)
        if isinstance(decided, NotPlaced):
            ctx.unschedulable[group.key] = decided.message
            return decided
        allocation, start = decided
        try:
            persisted = await self._persist(marked, allocation, members := self._member_names(marked))
        except NOT_APPLIED as e:
            if isinstance(e, storage.Uncertain):  # a RetryLater, but one whose write may have landed
                ctx.unsettled.add(marked, statuses.bound(marked, allocation, members))
                raise
            ctx.ledger.release(group.key)  # refused, conflicted, gone or not sent: the API does not show the claim
            raise
        except Exception:
            # Uncertain, or an error nobody foresaw (an answer that could not be read...): the claim may be in the
            # API, so the devices stay reserved until a read-back tells (settling.py). Never a guess that it is not.
            ctx.unsettled.add(marked, statuses.bound(marked, allocation, members))
            raise
        allocation = ctx.ledger.commit(group.key)
        ctx.state.keep(persisted)
        ctx.unschedulable.pop(group.key, None)
        ctx.nominations = ctx.nominations.clear(group.key)
        return Placed(allocation, start.members)

    def members(self, pod: state_.PodRecord, key: state_.GroupKey, spec: models.GroupSpec) -> list[gang.Member]:
        """The pods a placement considers, the placing pod first: alone without a gang; with one, every pending
        member we may schedule that passes the webhook's member rules, oldest first."""
        if spec.min_members <= 1:
            return [gang.Member(pod.key, pod.demand)]
        env = member_rules.visibility_env(spec.resources, self.ctx.config.env_names)
        others = sorted(
            (p for p in self.ctx.state.live_members(key)
             if p.key != pod.key and self._pending(p)
             and next(member_rules.conflicts(p.containers, spec.resources, env), None) is None),
            key=lambda p: (p.created, p.key),
        )
        return [gang.Member(p.key, p.demand) for p in (pod, *others)]

    def _pending(self, pod: state_.PodRecord) -> bool:
        return (pod.scheduler_name == self.ctx.config.scheduler_name and not pod.node_name
                and not pod.deleting and not pod.terminated)

    def _decide(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec, budget: list[budget_.Quota]
    ) -> tuple[ledgers.Allocation, gang.Start] | NotPlaced:
        """Quota, then filter + score + permit in one core call, reserved in the ledger; or why not."""
        ctx = self.ctx
        over = quotas.refusal(ctx.ledger, group.key, dict(spec.resources), budget) or draplacing.refusal(spec)
        if over is not None:
            return NotPlaced(over)
        request = placement.GroupRequest.from_spec(group.key, spec, mps=ctx.config.mps)
        members = self.members(pod, group.key, spec)
        live = ctx.nominations.live(time.monotonic())
        snapshot = nominations.overlay(ctx.ledger.snapshot(), live, ctx.state.priority(group.key), group.key)
        together = gang.demand([m.demand for m in members[: gang.needed(spec.min_members)]])
        policy = ctx.fgd.for_pod(together) if spec.scheduling_strategy == "fgd" else None
        verdict = gang.permit(draplacing.narrowed(ctx, spec, snapshot), request, spec.min_members, members, policy)
        if isinstance(verdict, gang.WaitingForMembers):
            return NotPlaced(verdict.message())
        if isinstance(verdict, placement.Unschedulable):
            verdict = draplacing.explained(ctx, spec, verdict, snapshot, request, together)  # DRA hook: its reasons
            return NotPlaced(gang.describe(verdict, spec.min_members), unschedulable=verdict)
        chosen = verdict.placement
        allocation = ctx.ledger.reserve(group.key, chosen.node, chosen.devices, request.share, chosen.tiles)
        ctx.fgd.observe(request, together.cpu_milli)  # every group placed shapes fgd's target workload
        return allocation, verdict

    async def _ensure_finalizer(
        self, group: state_.GroupRecord, spec: models.GroupSpec
    ) -> state_.GroupRecord | None:
        """Before the group claims anything: a deletion from here on waits for us (Releasing), even one that
        comes before the reconciler would have got round to adding the finalizer. None: the group changed."""
        if names.GROUP_FINALIZER in group.finalizers:
            return group
        marked = self.ctx.state.keep(await self.ctx.api.set_group_finalizers(
            group.key, [*group.finalizers, names.GROUP_FINALIZER], uid=group.uid,
            resource_version=group.resource_version,
        ))
        if marked.deleting or marked.spec != spec:
            return None
        return dataclasses.replace(group, resource_version=marked.resource_version, finalizers=marked.finalizers)

    def _member_names(self, group: state_.GroupRecord) -> list[str]:
        # Pending members count too (statuses.member_names): the status is then already right once they
        # are bound, and no second write follows the placement's.
        return statuses.member_names(self.ctx.state, group, self.ctx.config.env_names)

    async def _persist(
        self, group: state_.GroupRecord, allocation: ledgers.Allocation, members: list[str]
    ) -> state_.GroupRecord:
        """Write the allocation into the group's status, conditional on what we last saw of the group."""
        current = group
        for _ in range(5):
            try:
                return await self.ctx.api.patch_group_status(
                    group.key, statuses.bound(current, allocation, members), uid=current.uid,
                    resource_version=current.resource_version,
                )
            except storage.Conflict:
                self.ctx.metrics.api_conflicts.inc()
                current = await self.ctx.api.read_group(group.key)
                if current.uid != group.uid or current.deleting or current.spec != group.spec:
                    raise
                self.ctx.state.keep(current)
        raise storage.Conflict(f"status of shareddevicegroup {names.key_text(group.key)} kept changing")
