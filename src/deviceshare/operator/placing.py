"""Placing a group that holds nothing yet: the phases from pre-filter to reserve, for the pod that places it.

Each phase is one method of :class:`GroupPlacer`, called in order by the scheduler (``scheduler.py``):

- :meth:`~GroupPlacer.pre_filter`: a gang short of members stops here (``WaitingForMembers``: nothing written,
  nothing held); the namespace's device quotas are read, and our finalizer put on the group (so a deletion from
  here on waits for the release) if the webhook did not;
- :meth:`~GroupPlacer.permit`: **filter, score, permit** in one pure call, :func:`deviceshare.core.gang.permit`,
  on the ledger's snapshot as this group sees it (devices kept for a nominated preemptor of equal or higher
  priority withheld, :func:`deviceshare.core.nominations.overlay`), after the quota check. It runs the placement
  engine (filters with reasons, binpack/spread/fgd) for the group's members together: without a gang that is the
  placing pod alone; a gang (``minMembers: N``) needs a node with room for all N (CONTRACT §8). A decision only;
- :meth:`~GroupPlacer.reserve`: the decision reserved in the ledger (the scheduler awaits nothing between the
  quota check and the reservation, so another group of the namespace cannot slip in between), then persisted in
  the group's status, conditional on its resourceVersion; a status write whose outcome stays unknown keeps the
  reservation (``settling.py``). Another kind of claim reserved for the group would sit beside it here;
- :meth:`~GroupPlacer.unreserve`: when no pod of a group placed in this cycle could be bound, the placement undone,
  status first (conditional), then the ledger (a DRA group's claim allocation cleared before the ledger's release).

What the API answered and what follows from it for the operator's records is noted on the cycle's
:class:`~.cyclechanges.CycleChanges`, not done here. Bind (or the post-filter when nothing fits) is the scheduler's.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from deviceshare.api import models, names
from deviceshare.core import budget as budget_
from deviceshare.core import gang, inventory, nominations, placement
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules

from . import draallocation, draplacing, quotas, settling, statuses, storage
from . import state as state_
from .context import Context
from .cyclechanges import CycleChanges

logger = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class PreFiltered:
    """Past the pre-filter: ``group`` as it now carries our finalizer, and its namespace's device ``budget``."""

    group: state_.GroupRecord
    budget: list[budget_.Quota]
    counted: dict[str, int] = dataclasses.field(default_factory=dict)  # of the group's own claim, by status.used


@dataclasses.dataclass(frozen=True)
class Permitted:
    """The permit's answer: reserve ``start.placement`` for the group and bind ``start.members``."""

    start: gang.Start
    request: placement.GroupRequest
    together: inventory.PodDemand  # what the gang's first N members ask together (fgd learns from it)


class GroupPlacer:
    def __init__(self, ctx: Context, quota_cache: quotas.QuotaCache) -> None:
        self.ctx = ctx
        self.quotas = quota_cache

    async def pre_filter(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec, changes: CycleChanges
    ) -> PreFiltered | NotPlaced:
        """A gang short of members stops here (nothing written, nothing held); then the namespace's quotas are
        read (checked in :meth:`permit`, after the last await) and our finalizer put on the group."""
        if spec.min_members > 1:  # only a gang counts its members before anything is written
            live = self.ctx.state.view(group.key, pod.key).live
            short = gang.waiting(spec.min_members, len(self.members(pod, spec, live)))
            if short is not None:
                return NotPlaced(short.message())
        await draplacing.prepare(self.ctx, spec)  # DRA hook: claim selectors evaluated off the event loop
        budget = await quotas.read(self.quotas, self.ctx.api, group.key[0])
        counted = await quotas.own_claim_counted(
            self.ctx.api, group.key, spec.claim.device_class_name if spec.claim is not None else None, budget)
        marked = await self._ensure_finalizer(group, spec, changes)
        if marked is None:
            return NotPlaced("the group changed while its finalizer was added", retry=True)
        return PreFiltered(marked, budget, counted)

    def permit(
        self, pod: state_.PodRecord, pre: PreFiltered, spec: models.GroupSpec, view: state_.GroupView
    ) -> Permitted | NotPlaced:
        """Quota, then filter + score + permit in one core call (``gang.permit``) on the ledger's snapshot as this
        group sees it: a decision, nothing held. ``view``: the group's members, read after the last await."""
        ctx, group = self.ctx, pre.group
        over = (quotas.refusal(ctx.ledger, group.key, spec.requested, pre.budget, pre.counted)
                or draplacing.refusal(spec))
        if over is not None:
            return NotPlaced(over)
        request = placement.GroupRequest.from_spec(group.key, spec, mps=ctx.config.mps)
        members = self.members(pod, spec, view.live)
        live = ctx.nominations.live(time.monotonic())
        snapshot = nominations.overlay(ctx.ledger.snapshot(), live, view.priority, group.key)
        together = gang.demand([m.demand for m in members[: gang.needed(spec.min_members)]])
        policy = ctx.fgd.for_pod(together) if spec.scheduling_strategy == "fgd" else None
        offered = draplacing.narrowed(ctx, spec, snapshot)  # DRA hook: only devices the claim's selectors match
        if offered is None:
            return NotPlaced("the ResourceSlices changed while the claim's selectors were evaluated; they are "
                             "evaluated again", retry=True)
        verdict = gang.permit(offered, request, spec.min_members, members, policy)
        if isinstance(verdict, gang.WaitingForMembers):
            return NotPlaced(verdict.message())
        if isinstance(verdict, placement.Unschedulable):
            verdict = draplacing.explained(ctx, spec, verdict, snapshot, request, together)  # DRA hook: its reasons
            return NotPlaced(gang.describe(verdict, spec.min_members), unschedulable=verdict)
        return Permitted(verdict, request, together)

    async def reserve(
        self, group: state_.GroupRecord, permitted: Permitted, view: state_.GroupView, changes: CycleChanges
    ) -> Placed:
        """Reserve: the devices held in the ledger before anything is awaited (so nothing else is decided between
        the permit and this), then the claim persisted in the group's status, conditional on its resourceVersion.

        A write certainly not applied releases the reservation (and raises); one whose outcome stays unknown
        keeps it, the group unsettled until a read-back tells (``settling.py``). Never a guess that it is not."""
        ctx, chosen = self.ctx, permitted.start.placement
        request = permitted.request
        allocation = ctx.ledger.reserve(group.key, chosen.node, chosen.devices, request.share, chosen.tiles)
        ctx.fgd.observe(request, permitted.together.cpu_milli)  # every group placed shapes fgd's target workload
        # Pending members count too (statuses.listed_members): the status is then already right once they are
        # bound, and no second write follows the placement's.
        members = [p.name for p in statuses.listed_members(view.live, group.spec, ctx.config.env_names)]
        try:
            persisted = await self._persist(group, allocation, members, changes)
        except NOT_APPLIED as e:
            if isinstance(e, storage.Uncertain):  # a RetryLater, but one whose write may have landed
                ctx.unsettled.add(group, statuses.bound(group, allocation, members))
                raise
            changes.released(group.key)  # refused, conflicted, gone or not sent: the API does not show the claim
            raise
        except Exception:
            # An error nobody foresaw (an answer that could not be read...): the claim may be in the API, so the
            # devices stay reserved until a read-back tells (settling.py).
            ctx.unsettled.add(group, statuses.bound(group, allocation, members))
            raise
        changes.seen(persisted)
        changes.placed(group.key)
        return Placed(allocation, permitted.start.members)

    async def unreserve(self, gkey: state_.GroupKey, why: str, changes: CycleChanges) -> None:
        """Unreserve (kube-scheduler's name for undoing a reservation when a later phase fails): un-place a group none
        of whose pods got bound, status first (conditional), then the ledger.

        A 409 means the group changed: read again; while it still shows our claim, write again on top of it.
        Any other failure keeps the devices held (the API may still show the claim): the group stays placed."""
        ctx = self.ctx
        allocation = ctx.ledger.allocation(gkey)
        group = ctx.state.groups.get(gkey)
        for _ in range(3):
            if group is None or allocation is None or not settling.shows(group, allocation):
                break  # the API does not show our claim (any more): nothing to undo there
            try:
                group = changes.seen(await ctx.api.patch_group_status(
                    gkey, statuses.rolled_back(group, why), uid=group.uid, resource_version=group.resource_version
                ))
                break
            except storage.Conflict:
                group = await ctx.api.read_group_if_exists(gkey)
            except storage.Gone:
                break
            except Exception as e:
                logger.warning("could not roll back the placement of group %s/%s (devices stay held): %s", *gkey, e)
                return
        else:
            logger.warning("group %s/%s kept changing while its placement was rolled back; devices stay held", *gkey)
            return
        if draallocation.holds_claim(ctx, group, gkey):  # DRA hook: the claim's allocation goes before the ledger's
            try:
                await draallocation.release_claim_allocation(ctx, gkey, allocation)
            except Exception as e:
                logger.warning("could not release the ResourceClaim of group %s/%s (devices stay held): %s", *gkey, e)
                return
        changes.released(gkey)

    def members(
        self, pod: state_.PodRecord, spec: models.GroupSpec, live: tuple[state_.PodRecord, ...]
    ) -> list[gang.Member]:
        """The pods a placement considers, the placing pod first: alone without a gang; with one, every pending
        member of ``live`` we may schedule that passes the webhook's member rules, oldest first."""
        if spec.min_members <= 1:
            return [gang.Member(pod.key, pod.demand)]
        env = member_rules.visibility_env(spec.resources, self.ctx.config.env_names)
        others = sorted(
            (p for p in live
             if p.key != pod.key and self._pending(p)
             and next(member_rules.conflicts(p.containers, spec.resources, env), None) is None),
            key=lambda p: (p.created, p.key),
        )
        return [gang.Member(p.key, p.demand) for p in (pod, *others)]

    def _pending(self, pod: state_.PodRecord) -> bool:
        return (pod.scheduler_name == self.ctx.config.scheduler_name and not pod.node_name
                and not pod.deleting and not pod.terminated)

    async def _ensure_finalizer(
        self, group: state_.GroupRecord, spec: models.GroupSpec, changes: CycleChanges
    ) -> state_.GroupRecord | None:
        """Before the group claims anything: a deletion from here on waits for us (Releasing), even one that
        comes before the reconciler would have got round to adding the finalizer. None: the group changed."""
        if names.GROUP_FINALIZER in group.finalizers:
            return group
        marked = changes.seen(await self.ctx.api.set_group_finalizers(
            group.key, [*group.finalizers, names.GROUP_FINALIZER], uid=group.uid,
            resource_version=group.resource_version,
        ))
        if marked.deleting or marked.spec != spec:
            return None
        return dataclasses.replace(group, resource_version=marked.resource_version, finalizers=marked.finalizers)

    async def _persist(
        self, group: state_.GroupRecord, allocation: ledgers.Allocation, members: list[str], changes: CycleChanges
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
                changes.seen(current)
        raise storage.Conflict(f"status of shareddevicegroup {names.key_text(group.key)} kept changing")
