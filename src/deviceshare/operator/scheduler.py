"""One scheduling cycle for one pod, as kube-scheduler's framework shapes it: the phases in order, each one call.

:meth:`PodScheduler.schedule` checks the pod's group name (before it is used anywhere) and takes the group's lock;
:meth:`PodScheduler._phases` then reads top-down (queue sort is the :class:`~.queueing.SchedulingQueue`'s):

1. **pre-filter** (:meth:`~PodScheduler._pre_filter`): may the pod join its group now,
   :func:`deviceshare.core.joining.verdict` (the group is missing, deleting, invalid, conflicted, full or being
   preempted; the pod fails the webhook's member rules): join, wait or refuse. An earlier cycle's uncertain claim
   is read back first (``settling.py``);
2. a group that already holds devices: **filter** (``placement.check_member``: its node still has room for the
   pod), then **bind** (5);
3. a group that holds nothing yet (:class:`~.placing.GroupPlacer`): **pre-filter** (a gang short of members,
   the namespace's quota, our finalizer), then **filter + score + permit** in one pure core call
   (``gang.permit``: a gang needs one node for all its members; nominated room withheld) on the group's members
   read once after the last await (``ClusterState.view``); when nothing fits, the **post-filter**
   (:class:`~.preempting.Preemptor`: evict lower-priority groups, nominate) and the pod waits;
4. **reserve** (:meth:`.placing.GroupPlacer.reserve`): the devices held in the ledger, then the claim persisted
   in the group's status, conditional on its resourceVersion. Permit comes before reserve, as CONTRACT §8 holds
   nothing for a gang that has not started (coscheduling's permit would wait holding the reservation);
5. **bind** (:meth:`~PodScheduler._bind`): every member the permit named (a whole gang in this cycle), each with
   a Binding that carries its device annotations.

A DRA group (``spec.claim``, CONTRACT §13) takes the same phases, with three hooks: its claim's selectors are
evaluated in a worker thread during the pre-filter and narrow what the permit offers (``draplacing.py``), and
before each member's Binding its ResourceClaim is allocated as the ledger holds it and reserved for the pod
(``draallocation.reserve_for``); a roll-back clears the claim's allocation before the ledger's release.

The core decides (a verdict, a placement, a victim set) and hands back values; it never calls the operator. What a
cycle changes in the operator's own records (``state.py``, the ledger's commit and release, why a group waits,
events) is noted on a :class:`~.cyclechanges.CycleChanges` and made so in one step: when the bind phase starts (the
claim, and every pod about to be bound recorded as our member before its Binding is sent), before a post-filter,
and when the cycle ends. So a cycle enters ``state.py`` three times for the first pod of a new group (one read,
two applies), four for a gang of two (its members counted once more before anything is written), two or three
for a later member (as before); it entered it six and ten times for the first two before, and the core called back
into the operator two to nine times a cycle (``docs/architecture.md``, "The path of one pod").

The order of writes is what makes a crash at any step safe: devices reserved in the ledger, the claim persisted
in the group's status conditional on its resourceVersion (from here on a restarted operator rebuilds it from the
API), then each pod bound with a Binding that carries its device annotations (kube-apiserver's ``BindingREST``
writes them with ``spec.nodeName``). A failure before the claim lands releases the reservation. If no pod of a
freshly placed group got bound, its status is put back to Pending first (conditional) and only then are the
devices released (:meth:`.placing.GroupPlacer.unreserve`), so the API never shows a claim the ledger has already
given away.

An outcome is never guessed (``storage`` reads back what a lost answer hid): a status write whose outcome stays
unknown keeps its reservation (``settling.py``); a Binding whose outcome stays unknown keeps the group placed and
the pod counted as our member (recorded before the Binding is sent), and the pod is bound again later. Nothing is
rolled back on cancellation: a deposed leader writes nothing (the fence), and the next term rebuilds from the API.
Nothing on the pod is taken on trust: the group name is checked before it is used anywhere, and the member rules
run again because a pod annotated after creation never met the webhook.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from deviceshare.api import models, names
from deviceshare.core import joining, placement
from deviceshare.core import ledger as ledgers

from . import draallocation, outcomes, placing, preempting, quotas, statuses, storage
from . import state as state_
from .context import Context
from .cyclechanges import CycleChanges

logger = logging.getLogger(__name__)


# What a cycle answers, routed by the workers (``deciding.py``); re-exported: what callers have always found here.
Result = outcomes.Result
Outcome = outcomes.Outcome


class PodScheduler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.quotas = quotas.QuotaCache()  # fed by the runtime's quota reflector
        self.placer = placing.GroupPlacer(ctx, self.quotas)
        self.preemptor = preempting.Preemptor(ctx)

    def is_ours(self, pod: state_.PodRecord) -> bool:
        return (
            pod.scheduler_name == self.ctx.config.scheduler_name
            and not pod.node_name
            and not pod.deleting
            and not pod.terminated
        )

    async def schedule(self, key: state_.PodKey) -> Outcome:
        """Queue → pre-filter → filter (score, permit) → reserve → bind for the pod ``key``, or the post-filter."""
        pod = self.ctx.state.pods.get(key)
        if pod is None or not self.is_ours(pod):
            return Outcome(Result.SKIPPED)
        if pod.group_key is None or (pod.group is not None and not pod.group_valid):
            # Before any use: the name goes into API paths, locks and statuses.
            refused = joining.name_refusal(pod.group, self.ctx.config.scheduler_name)
            if refused is not None:
                return Outcome(Result.UNSCHEDULABLE, refused.message)
        if pod.group_key is None:  # a well-formed name always gives a key: only to say so to mypy
            return Outcome(Result.SKIPPED)
        started = time.perf_counter()
        async with self.ctx.locks.hold(pod.group_key):
            pod = self.ctx.state.pods.get(key)  # it may have changed while we waited
            if pod is None or not self.is_ours(pod) or pod.group_key is None:
                return Outcome(Result.SKIPPED)
            outcome = await self._cycle(pod, pod.group_key)
        if outcome.result is Result.BOUND:
            self.ctx.metrics.placement_seconds.observe(time.perf_counter() - started)
        return outcome

    async def _cycle(self, pod: state_.PodRecord, gkey: state_.GroupKey) -> Outcome:
        """One cycle under the group's lock; what it changes in the operator's records is applied in one step
        (:class:`~.cyclechanges.CycleChanges`) when its bind phase starts, before a post-filter, and when it ends."""
        changes = CycleChanges(self.ctx)
        try:
            return await self._phases(pod, gkey, changes)
        except storage.Fenced as e:  # this replica is being deposed: its queue is about to be cleared
            return Outcome(Result.RETRY, str(e), retry_after=1.0)
        except storage.RetryLater as e:
            self.ctx.metrics.api_retries.inc()
            return Outcome(Result.RETRY, str(e), retry_after=e.delay)
        except storage.Conflict as e:
            self.ctx.metrics.api_conflicts.inc()
            return Outcome(Result.RETRY, str(e), retry_after=0.2)
        except storage.Gone:
            # The group vanished while its status write was in flight (the reservation is released).
            changes.gone(gkey)
            return Outcome(
                Result.UNSCHEDULABLE, f'SharedDeviceGroup "{gkey[1]}" not found in namespace "{gkey[0]}"',
            )
        except storage.Invalid as e:
            # Say why on the pod; retried with backoff (an admission policy or RBAC may be fixed).
            return Outcome(Result.REFUSED, f"the API server refused the placement: {e}")
        finally:
            changes.apply()

    async def _phases(self, pod: state_.PodRecord, gkey: state_.GroupKey, changes: CycleChanges) -> Outcome:
        """The phases in order: a member joins where its group is, or the group is placed (or room made)."""
        ctx = self.ctx
        await ctx.unsettled.settle(ctx.api, ctx.ledger, ctx.state, gkey)  # an earlier cycle's uncertain claim
        group = await self._group(gkey, changes)
        held = ctx.ledger.allocation(gkey)
        stop = self._pre_filter(pod, gkey, group, held)
        if stop is not None:
            return stop
        assert group is not None and group.spec is not None  # what a Join implies (for mypy)
        if held is not None:
            stop = self._filter(pod, held)
            return stop if stop is not None else await self._bind(pod, group, held, (pod.key,), changes)
        pre = await self.placer.pre_filter(pod, group, group.spec, changes)
        if isinstance(pre, placing.NotPlaced):
            return self._not_placed(gkey, pre, changes)
        view = ctx.state.view(gkey, pod.key)  # the members and priority the decision reads, after the last await
        permitted = self.placer.permit(pod, pre, group.spec, view)
        if isinstance(permitted, placing.NotPlaced):
            return await self._post_filter(pod, group, group.spec, permitted, view, changes)
        placed = await self.placer.reserve(pre.group, permitted, view, changes)  # no await since the permit
        return await self._bind(pod, group, placed.allocation, placed.members, changes, placed_now=True)

    def _pre_filter(
        self, pod: state_.PodRecord, gkey: state_.GroupKey, group: state_.GroupRecord | None,
        held: ledgers.Allocation | None,
    ) -> Outcome | None:
        """Pre-filter: may the pod join its group now (:func:`deviceshare.core.joining.verdict`); None if so."""
        ctx = self.ctx
        limited = held is not None and group is not None and group.spec is not None and group.spec.max_members
        preempted = ctx.preempted.get(gkey)
        verdict = joining.verdict(
            gkey, group, containers=pod.containers, env_names=ctx.config.env_names,
            conflicting_with=ctx.conflicts.get(gkey, ()), allocation=held,
            running_others=ctx.state.view(gkey, pod.key).running_others if limited else 0,
            preempted_by=None if preempted is None else names.key_text(preempted.by),
        )
        if isinstance(verdict, joining.Refuse):
            return Outcome(Result.UNSCHEDULABLE, verdict.message)
        if isinstance(verdict, joining.Wait):
            return Outcome(Result.RETRY, verdict.message, retry_after=verdict.retry_after)
        return None

    def _filter(self, pod: state_.PodRecord, held: ledgers.Allocation) -> Outcome | None:
        """Filter, for a member of a group that holds devices: its node still has room for the pod; None if so."""
        problem = placement.check_member(self.ctx.ledger, held.node, pod.demand)
        if problem is None:
            return None
        return Outcome(Result.UNSCHEDULABLE, f"group is on node {held.node}: {problem.message()}")

    def _not_placed(self, gkey: state_.GroupKey, placed: placing.NotPlaced, changes: CycleChanges) -> Outcome:
        if placed.retry:
            return Outcome(Result.RETRY, placed.message, retry_after=0.05)
        changes.waits(gkey, placed.message)
        return Outcome(Result.UNSCHEDULABLE, placed.message)

    async def _post_filter(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec, placed: placing.NotPlaced,
        view: state_.GroupView, changes: CycleChanges,
    ) -> Outcome:
        """Post-filter, when nothing fits: make room by preemption, if the group's priority and pods allow."""
        outcome = self._not_placed(group.key, placed, changes)
        if placed.unschedulable is None:  # a gang waiting for its members: nothing to make room for
            return outcome
        changes.apply()  # the preemptor reads the group as the API last answered
        why = await self.preemptor.post_filter(group, spec, pod, placed.message, view, changes)
        changes.waits(group.key, why)  # the group's status says what preemption did, or why it could not help
        return Outcome(Result.UNSCHEDULABLE, why)

    async def _group(self, gkey: state_.GroupKey, changes: CycleChanges) -> state_.GroupRecord | None:
        group = self.ctx.state.groups.get(gkey)
        # Pods and groups come on separate watches: a pod often arrives before its group (the webhook
        # let it in because the group exists). Ask the API once before calling the pod unschedulable.
        if group is None and (read := await self.ctx.api.read_group_if_exists(gkey)) is not None:
            group = changes.seen(read)
        return group

    async def _bind(
        self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation,
        members: tuple[state_.PodKey, ...], changes: CycleChanges, *, placed_now: bool = False,
    ) -> Outcome:
        """Bind every member the permit named, the placing pod first (a gang starts together, in this cycle); a
        later member alone. Each Binding carries the device annotations (one write per pod).

        Every member about to be bound is recorded as ours first, with the claim, in one step: should a Binding
        land unseen (its answer lost), the pod is still our member and its group never releases the devices under
        it. A member that cannot be bound now (throttled, its answer lost) is bound in its own cycle as a later
        member. Only if the group was placed in this cycle (``placed_now``) and every one of them is certainly not
        bound (gone, bound by someone else, refused) is the group un-placed again (status first, then the
        ledger); a Binding that may have landed keeps it."""
        ctx = self.ctx
        chosen = [pod if i == 0 else ctx.state.pods.get(key) for i, key in enumerate(members)]
        chosen = [m if m is not None and self.is_ours(m) else None for m in chosen]
        for member in chosen:
            if member is not None:
                changes.binding(member, group.name)
        changes.apply()
        outcomes: list[Outcome | None] = []  # None: may have landed, or to be tried again
        error: storage.RetryLater | storage.Fenced | None = None
        try:
            for i, member in enumerate(chosen):
                if member is None:
                    outcomes.append(Outcome(Result.SKIPPED))
                    continue
                try:
                    outcomes.append(await self._bind_one(member, group, allocation, changes))
                except (storage.RetryLater, storage.Fenced) as e:
                    outcomes.append(None)
                    if i == 0:
                        error = e
        finally:
            # Members after one whose Binding failed unforeseen were never sent one: not ours after all (unless
            # an earlier cycle counted them already). The failed one's may have landed: it stays ours.
            for member in chosen[len(outcomes) + 1:]:
                if member is not None and member.member_of is None:
                    changes.not_bound(member)
        if placed_now and all(o is not None and o.result is not Result.BOUND for o in outcomes):
            changes.apply()  # the members certainly not bound forgotten before the group's are counted
            if not ctx.state.members_on_devices(group.key):
                await self.placer.unreserve(group.key, "no pod of the group could be bound; it is placed again by "
                                            "its next pod", changes)
        if error is not None:
            raise error
        first = outcomes[0]
        assert first is not None
        others = tuple(k for k, o in zip(members[1:], outcomes[1:], strict=True)
                       if o is not None and o.result is Result.BOUND)
        return dataclasses.replace(first, also_bound=others)

    async def _bind_one(
        self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation, changes: CycleChanges
    ) -> Outcome:
        """Annotate-and-bind in one write. Raises ``RetryLater`` (``Uncertain`` included) when the pod is to be
        bound on a later try, having kept what an uncertain Binding could have landed."""
        ctx = self.ctx
        node = ctx.ledger.node(allocation.node)
        annotations = statuses.allocation_annotations(allocation, ctx.config.env_names, node)
        # The node's hand-over (CONTRACT §12) adds what its container runtime reads, in the same Binding.
        handover = ctx.config.handovers.for_node(node.labels if node else None)
        annotations.update(handover.pod_annotations(allocation.devices, [c.name for c in pod.containers]))
        if draallocation.is_dra(group):  # DRA hook (CONTRACT §13): claim allocated, pod reserved, before binding
            try:
                await draallocation.reserve_for(ctx, group, allocation, pod)
            except storage.Invalid as e:
                changes.not_bound(pod)  # recorded ours ahead of the Binding (``_bind``), which is not sent now
                return Outcome(Result.REFUSED, f"the group's ResourceClaim cannot be used: {e}")
            except storage.Uncertain:
                raise  # the reservation may have landed: the pod stays our member and is bound on a later try
            except (storage.RetryLater, storage.Fenced):
                if pod.member_of is None:  # certainly not reserved; an earlier cycle's lost Binding may have landed
                    changes.not_bound(pod)
                raise
        try:
            # One write: the API server copies the Binding's annotations onto the pod with spec.nodeName.
            await ctx.api.bind_pod(pod.key, pod.uid, allocation.node, annotations)
        except storage.Uncertain:
            # Maybe bound: keep the group placed and the pod our member; it is bound again (or found bound) later.
            raise
        except (storage.Gone, storage.Conflict) as e:
            # Deleted, recreated under the same name (another uid), or bound by someone else: not ours now.
            changes.not_bound(pod)
            logger.info("pod %s/%s not bound: %s", *pod.key, e)
            return Outcome(Result.SKIPPED, str(e))
        except storage.Invalid as e:
            # Refused (an admission policy, RBAC, validation): the pod is still ours and still Pending.
            changes.not_bound(pod)
            logger.warning("binding pod %s/%s refused: %s", *pod.key, e)
            return Outcome(Result.REFUSED, f"the API server refused the binding to {allocation.node}: {e}")
        except (storage.RetryLater, storage.Fenced):
            # Not applied (throttled, or not sent): the group stays placed and the pod is bound on a later try; it
            # stays our member if an earlier cycle counted it (that Binding's answer was lost: it may have landed).
            if pod.member_of is None:
                changes.not_bound(pod)
            raise
        # Seen as bound right away (the next member counts it before the watch event arrives); the pod gets
        # kube-scheduler's Scheduled event. The group's placement is in its status (``Scheduled`` condition).
        changes.bound(pod, group.name, allocation, annotations)
        return Outcome(Result.BOUND, node=allocation.node)
