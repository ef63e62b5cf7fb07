"""One scheduling cycle for one pod: check, decide with the core, persist, bind — or roll back.

The order is what makes a crash at any step safe:
0. read the namespace's ResourceQuotas and make sure the group carries our finalizer (so its deletion
   waits for the release); a group the quota has no room for is refused (see :mod:`.quotas`);
1. reserve devices in the ledger (in memory, in flight);
2. persist the allocation in the group's status, conditional on its resourceVersion — from here on a
   restarted operator rebuilds the claim from the API;
3. bind the pod to the group's node; the Binding carries the selected devices and env values as
   annotations, which the API server writes onto the pod in the same write as ``spec.nodeName``
   (kube-apiserver's ``BindingREST``), so a pod is never bound without them nor annotated but unbound.
A failure before step 2 completes releases the reservation. If the pod that placed its group vanishes
before binding, the group's status is put back to Pending first (conditional on the version we hold) and only
then are the devices released, so the API never shows a claim the ledger has already given away.

An outcome is never guessed (``storage`` reads back what a lost answer hid): a status write whose outcome stays
unknown keeps its reservation and leaves the group *unsettled* (``settling.py``) until a read tells; a Binding
whose outcome stays unknown keeps the group placed and the pod counted as our member (recorded before the
Binding is sent), and the pod is bound again later. Nothing is rolled back on cancellation: a deposed leader
writes nothing (the fence, ``storage.Fenced``), and the next term rebuilds from what the API shows.

Whether the pod may join at all is the core's decision (:func:`deviceshare.core.joining.verdict`: the
group is missing, deleting, invalid, conflicted or full; the pod fails the webhook's member rules); the
steps here only act on it. Nothing on the pod is taken on trust: the group name is checked before it is
used anywhere, and the member rules run again because a pod annotated after creation never met the
webhook. A binding the API refuses (400/403/422) is reported on the pod and retried with backoff; only a
404 or a 409 (deleted, another uid, bound by someone else) means the pod is not ours to place.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time

from deviceshare.api import models, names
from deviceshare.core import budget as budget_
from deviceshare.core import joining, placement
from deviceshare.core import ledger as ledgers

from . import quotas, settling, statuses, storage
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


class PodScheduler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.quotas = quotas.QuotaCache()  # fed by the runtime's quota reflector

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
        """The cycle, top-down: may it join; the group's devices (placing it if none); one write; outcome."""
        await self.ctx.unsettled.settle(self.ctx.api, self.ctx.ledger, self.ctx.state, gkey)
        group = await self._group(gkey)
        held = self.ctx.ledger.allocation(gkey)
        verdict = joining.verdict(
            gkey, group, containers=pod.containers, env_names=self.ctx.config.env_names,
            conflicting_with=self.ctx.conflicts.get(gkey, ()), allocation=held,
            running_others=lambda: sum(p.key != pod.key for p in self.ctx.state.members_on_devices(gkey)),
        )
        if isinstance(verdict, joining.Refuse):
            return Outcome(Result.UNSCHEDULABLE, verdict.message)
        if isinstance(verdict, joining.Wait):
            return Outcome(Result.RETRY, verdict.message, retry_after=verdict.retry_after)
        assert group is not None and group.spec is not None  # what a Join implies (for mypy)
        if held is None:  # verdict.places_group
            devices = await self._place_group(pod, group, group.spec)
        else:
            devices = self._room_for_member(pod, held)
        if isinstance(devices, Outcome):
            return devices
        return await self._bind(pod, group, devices, fresh=held is None)

    async def _group(self, gkey: state_.GroupKey) -> state_.GroupRecord | None:
        group = self.ctx.state.groups.get(gkey)
        # Pods and groups come on separate watches: a pod often arrives before its group (the webhook
        # let it in because the group exists). Ask the API once before calling the pod unschedulable.
        if group is None and (read := await self.ctx.api.read_group_if_exists(gkey)) is not None:
            self.ctx.state.keep(read)
            group = self.ctx.state.groups.get(gkey)
        return group

    def _room_for_member(
        self, pod: state_.PodRecord, allocation: ledgers.Allocation
    ) -> ledgers.Allocation | Outcome:
        """A later member goes where its group is, if that node still has room for the pod itself."""
        problem = placement.check_member(self.ctx.ledger, allocation.node, pod.demand)
        if problem is not None:
            return Outcome(Result.UNSCHEDULABLE, f"group is on node {allocation.node}: {problem.message()}")
        return allocation

    async def _place_group(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec
    ) -> ledgers.Allocation | Outcome:
        """The group's first pod places it: finalizer, quota, decision, then persist in the group's status."""
        budget = await quotas.read(self.quotas, self.ctx.api, group.key[0])  # checked after the last await
        marked = await self._ensure_finalizer(group, spec)
        if marked is None:
            return Outcome(Result.RETRY, "the group changed while its finalizer was added", retry_after=0.05)
        # No await from here to the reservation: another group of the namespace cannot slip in between.
        decided = self._reserve(pod, marked, spec, budget)
        if isinstance(decided, str):
            self.ctx.unschedulable[group.key] = decided
            return Outcome(Result.UNSCHEDULABLE, decided)
        try:
            persisted = await self._persist(marked, decided, members := self._members(marked))
        except storage.Uncertain:
            # The claim may be in the API: the devices stay reserved until a read-back tells (settling.py).
            self.ctx.unsettled.add(marked, statuses.bound(marked, decided, members))
            raise
        except Exception:  # refused, conflicted, gone or not sent: the API does not show the claim
            self.ctx.ledger.release(group.key)
            raise
        allocation = self.ctx.ledger.commit(group.key)
        self.ctx.state.keep(persisted)
        self.ctx.unschedulable.pop(group.key, None)
        return allocation

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

    def _reserve(
        self, pod: state_.PodRecord, group: state_.GroupRecord, spec: models.GroupSpec, budget: list[budget_.Quota]
    ) -> ledgers.Allocation | str:
        """Quota, then the core's decision, reserved in the ledger; or why the group cannot be placed."""
        ctx = self.ctx
        over = quotas.refusal(ctx.ledger, group.key, dict(spec.resources), budget)
        if over is not None:
            return over
        request = placement.GroupRequest.from_spec(group.key, spec)
        policy = ctx.fgd.for_pod(pod.demand) if spec.scheduling_strategy == "fgd" else None
        decided = placement.schedule_group(ctx.ledger, request, pod.demand, policy=policy)
        if isinstance(decided, placement.Unschedulable):
            return decided.message()
        ctx.fgd.observe(request, pod.demand.cpu_milli)  # every group placed shapes fgd's target workload
        return decided

    def _members(self, group: state_.GroupRecord) -> list[str]:
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

    async def _bind(
        self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation, *, fresh: bool
    ) -> Outcome:
        """Annotate-and-bind in one write; a group placed for this pod alone is rolled back if it fails for sure."""
        ctx = self.ctx
        gkey = group.key
        node = ctx.ledger.node(allocation.node)
        annotations = statuses.allocation_annotations(allocation, ctx.config.env_names, node)
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
            await self._roll_back_alone(gkey, fresh, "the pod that placed the group went away before it was bound")
            return Outcome(Result.SKIPPED, str(e))
        except storage.Invalid as e:
            # Refused (an admission policy, RBAC, validation): the pod is still ours and still Pending.
            ctx.state.forget_binding(pod.key, pod.uid)
            logger.warning("binding pod %s/%s refused: %s", *pod.key, e)
            await self._roll_back_alone(gkey, fresh, "the API server refused the binding of the first member")
            return Outcome(Result.REFUSED, f"the API server refused the binding to {allocation.node}: {e}")
        except (storage.RetryLater, storage.Fenced):
            # Not applied (throttled, or not sent): the group stays placed and the pod is bound on a later try.
            ctx.state.forget_binding(pod.key, pod.uid)
            raise
        self._assume(pod, group, allocation, annotations, fresh=fresh)
        return Outcome(Result.BOUND, node=allocation.node)

    def _assume(
        self, pod: state_.PodRecord, group: state_.GroupRecord, allocation: ledgers.Allocation,
        annotations: dict[str, str], *, fresh: bool,
    ) -> None:
        """Seen as bound right away, so the next member counts it before the watch event arrives."""
        ctx = self.ctx
        ctx.state.assume(pod, allocation.node, annotations, group.name)
        ctx.ledger.account_pod(pod.key, allocation.node, pod.demand.cpu_milli, pod.demand.memory_bytes)
        devices = statuses.describe_allocation(allocation)
        if fresh:
            ctx.event(group, "Bound", f"Placed on node {allocation.node} with {devices}")
        ctx.event(
            pod, "Scheduled",
            f"Successfully assigned {names.key_text(pod.key)} to {allocation.node} with {devices} "
            f'(SharedDeviceGroup "{group.name}")',
        )

    async def _roll_back_alone(self, gkey: state_.GroupKey, fresh: bool, why: str) -> None:
        """A group placed for a pod that did not get bound is un-placed, unless another member runs on it."""
        if fresh and not self.ctx.state.members_on_devices(gkey):
            await self._roll_back(gkey, why)

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
        ctx.ledger.release(gkey)
