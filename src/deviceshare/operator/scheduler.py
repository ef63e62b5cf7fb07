"""One scheduling cycle for one pod, as kube-scheduler's framework shapes it, each phase one call:

- **pre-filter**: may the pod join its group now (:func:`deviceshare.core.joining.verdict`: the group is
  missing, deleting, invalid, conflicted, full or being preempted; the pod fails the webhook's member rules);
- a group that already holds devices: **filter** (``placement.check_member``: the node still has room for the
  pod) and **bind**;
- a group that holds nothing yet (:mod:`.placing`): **pre-filter** (quota, finalizer), **filter + score +
  permit** in one core call (``gang.permit``: a gang waits for its members and needs one node for all of them;
  nominated room withheld), **reserve** (ledger, then the claim persisted in the group's status); when nothing
  fits, the **post-filter** (:mod:`.preempting`: evict lower-priority groups, nominate); then **bind** every
  member the permit named (the whole gang in this one cycle).
(Queue sort, kube-scheduler's PrioritySort, is the :class:`~.queueing.SchedulingQueue`'s.)

The order of writes is what makes a crash at any step safe: devices reserved in the ledger, the claim persisted
in the group's status conditional on its resourceVersion (from here on a restarted operator rebuilds it from the
API), then each pod bound with a Binding that carries its device annotations (kube-apiserver's ``BindingREST``
writes them with ``spec.nodeName``). A failure before the claim lands releases the reservation. If no pod of a
freshly placed group got bound, its status is put back to Pending first (conditional) and only then are the
devices released, so the API never shows a claim the ledger has already given away.

An outcome is never guessed (``storage`` reads back what a lost answer hid): a status write whose outcome stays
unknown keeps its reservation (``settling.py``); a Binding whose outcome stays unknown keeps the group placed and
the pod counted as our member (recorded before the Binding is sent), and the pod is bound again later. Nothing is
rolled back on cancellation: a deposed leader writes nothing (the fence), and the next term rebuilds from the API.
Nothing on the pod is taken on trust: the group name is checked before it is used anywhere, and the member rules
run again because a pod annotated after creation never met the webhook.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time

from deviceshare.api import names
from deviceshare.core import joining, placement
from deviceshare.core import ledger as ledgers

from . import draallocation, placing, preempting, quotas, settling, statuses, storage
from . import state as state_
from .context import Context

logger = logging.getLogger(__name__)


class Result(enum.Enum):
    BOUND = "bound"
    UNSCHEDULABLE = "unschedulable"
    SKIPPED = "skipped"  # not ours, already bound, deleted: nothing to do
    RETRY = "retry"  # transient API failure
    REFUSED = "refused"  # the API server refused a write (400/403/422): say so on the pod, retry with backoff


@dataclasses.dataclass(frozen=True)
class Outcome:
    result: Result
    message: str = ""
    node: str | None = None
    retry_after: float = 0.0
    also_bound: tuple[state_.PodKey, ...] = ()  # other members bound in the same cycle (a gang's)


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
            try:
                outcome = await self._schedule_locked(pod, pod.group_key)
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
                self.ctx.state.groups.pop(pod.group_key, None)
                return Outcome(
                    Result.UNSCHEDULABLE,
                    f'SharedDeviceGroup "{pod.group_key[1]}" not found in namespace "{pod.group_key[0]}"',
                )
            except storage.Invalid as e:
                # Say why on the pod; retried with backoff (an admission policy or RBAC may be fixed).
                return Outcome(Result.REFUSED, f"the API server refused the placement: {e}")
        if outcome.result is Result.BOUND:
            self.ctx.metrics.placement_seconds.observe(time.perf_counter() - started)
        return outcome

    async def _schedule_locked(self, pod: state_.PodRecord, gkey: state_.GroupKey) -> Outcome:
        """The cycle, top-down: pre-filter; then a member joins where its group is, or the group is placed."""
        ctx = self.ctx
        await ctx.unsettled.settle(ctx.api, ctx.ledger, ctx.state, gkey)
        group = await self._group(gkey)
        held = ctx.ledger.allocation(gkey)
        preempted = ctx.preempted.get(gkey)
        verdict = joining.verdict(
            gkey, group, containers=pod.containers, env_names=ctx.config.env_names,
            conflicting_with=ctx.conflicts.get(gkey, ()), allocation=held,
            running_others=lambda: sum(p.key != pod.key for p in ctx.state.members_on_devices(gkey)),
            preempted_by=None if preempted is None else names.key_text(preempted.by),
        )
        if isinstance(verdict, joining.Refuse):
            return Outcome(Result.UNSCHEDULABLE, verdict.message)
        if isinstance(verdict, joining.Wait):
            return Outcome(Result.RETRY, verdict.message, retry_after=verdict.retry_after)
        assert group is not None and group.spec is not None  # what a Join implies (for mypy)
        if held is not None:
            problem = placement.check_member(ctx.ledger, held.node, pod.demand)  # filter
            if problem is not None:
                return Outcome(Result.UNSCHEDULABLE, f"group is on node {held.node}: {problem.message()}")
            return await self._bind(pod, group, held)
        placed = await self.placer.place(pod, group, group.spec)
        if isinstance(placed, placing.NotPlaced):
            if placed.retry:
                return Outcome(Result.RETRY, placed.message, retry_after=0.05)
            if placed.unschedulable is not None:  # post-filter: make room by preemption, if allowed
                message = await self.preemptor.post_filter(group, group.spec, pod, placed.message)
                return Outcome(Result.UNSCHEDULABLE, message)
            return Outcome(Result.UNSCHEDULABLE, placed.message)
        return await self._bind_members(pod, group, placed)

    async def _group(self, gkey: state_.GroupKey) -> state_.GroupRecord | None:
        group = self.ctx.state.groups.get(gkey)
        # Pods and groups come on separate watches: a pod often arrives before its group (the webhook
        # let it in because the group exists). Ask the API once before calling the pod unschedulable.
        if group is None and (read := await self.ctx.api.read_group_if_exists(gkey)) is not None:
            self.ctx.state.keep(read)
            group = self.ctx.state.groups.get(gkey)
        return group

    async def _bind_members(
        self, pod: state_.PodRecord, group: state_.GroupRecord, placed: placing.Placed
    ) -> Outcome:
        """Bind every member the permit named, the placing pod first: a gang starts together, in this cycle.

        A member that cannot be bound now (throttled, its answer lost) is bound in its own cycle as a later
        member. Only if every one of them is certainly not bound (gone, bound by someone else, refused) is
        the group un-placed again (status first, then the ledger); a Binding that may have landed keeps it."""
        outcomes: list[Outcome | None] = []  # None: may have landed, or to be tried again
        error: storage.RetryLater | storage.Fenced | None = None
        for i, key in enumerate(placed.members):
            member = pod if i == 0 else self.ctx.state.pods.get(key)
            if member is None or not self.is_ours(member):
                outcomes.append(Outcome(Result.SKIPPED))
                continue
            try:
                outcomes.append(await self._bind(member, group, placed.allocation))
            except (storage.RetryLater, storage.Fenced) as e:
                outcomes.append(None)
                if i == 0:
                    error = e
        if all(o is not None and o.result is not Result.BOUND for o in outcomes) and not (
            self.ctx.state.members_on_devices(group.key)
        ):
            await self._roll_back(group.key, "no pod of the group could be bound; it is placed again by its next pod")
        if error is not None:
            raise error
        first = outcomes[0]
        assert first is not None
        others = tuple(k for k, o in zip(placed.members[1:], outcomes[1:], strict=True)
                       if o is not None and o.result is Result.BOUND)
        return dataclasses.replace(first, also_bound=others)

    async def _bind(self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation) -> Outcome:
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
                return Outcome(Result.REFUSED, f"the group's ResourceClaim cannot be used: {e}")
        # Written ahead: should the Binding land unseen (its answer lost), the pod is still our member, so its
        # group never releases the devices under it.
        ctx.state.record_binding(pod.key, pod.uid, group.name)
        try:
            # One write: the API server copies the Binding's annotations onto the pod with spec.nodeName.
            await ctx.api.bind_pod(pod.key, pod.uid, allocation.node, annotations)
        except storage.Uncertain:
            # Maybe bound: keep the group placed and the pod our member; it is bound again (or found bound) later.
            raise
        except (storage.Gone, storage.Conflict) as e:
            # Deleted, recreated under the same name (another uid), or bound by someone else: not ours now.
            ctx.state.forget_binding(pod.key, pod.uid)
            logger.info("pod %s/%s not bound: %s", *pod.key, e)
            return Outcome(Result.SKIPPED, str(e))
        except storage.Invalid as e:
            # Refused (an admission policy, RBAC, validation): the pod is still ours and still Pending.
            ctx.state.forget_binding(pod.key, pod.uid)
            logger.warning("binding pod %s/%s refused: %s", *pod.key, e)
            return Outcome(Result.REFUSED, f"the API server refused the binding to {allocation.node}: {e}")
        except (storage.RetryLater, storage.Fenced):
            # Not applied (throttled, or not sent): the group stays placed and the pod is bound on a later try.
            ctx.state.forget_binding(pod.key, pod.uid)
            raise
        self._assume(pod, group, allocation, annotations)
        return Outcome(Result.BOUND, node=allocation.node)

    def _assume(
        self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation,
        annotations: dict[str, str],
    ) -> None:
        """Seen as bound right away, so the next member counts it before the watch event arrives. The group's
        placement is recorded in its status (``Scheduled`` condition); the pod gets kube-scheduler's event."""
        ctx = self.ctx
        ctx.state.assume(pod, allocation.node, annotations, group.name)
        ctx.ledger.account_pod(pod.key, allocation.node, pod.demand.cpu_milli, pod.demand.memory_bytes)
        ctx.event(
            pod, "Scheduled",
            f"Successfully assigned {names.key_text(pod.key)} to {allocation.node} with "
            f'{statuses.describe_allocation(allocation)} (SharedDeviceGroup "{group.name}")',
        )

    async def _roll_back(self, gkey: state_.GroupKey, why: str) -> None:
        """Un-place a group none of whose pods got bound: status first (conditional), then the ledger.

        A 409 means the group changed: read again; while it still shows our claim, write again on top of it.
        Any other failure keeps the devices held (the API may still show the claim): the group stays placed."""
        ctx = self.ctx
        allocation = ctx.ledger.allocation(gkey)
        group = ctx.state.groups.get(gkey)
        for _ in range(3):
            if group is None or allocation is None or not settling.shows(group, allocation):
                break  # the API does not show our claim (any more): nothing to undo there
            try:
                group = ctx.state.keep(await ctx.api.patch_group_status(
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
        ctx.ledger.release(gkey)
