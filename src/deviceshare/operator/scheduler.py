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
before binding, the group's status is put back to Pending first and only then are the devices released,
so the API never shows a claim the ledger has already given away.

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

from . import quotas, statuses, storage
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
            persisted = await self._persist(marked, decided)
        except BaseException:
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
            group.key, [*group.finalizers, names.GROUP_FINALIZER], resource_version=group.resource_version
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
        request = placement.GroupRequest.from_spec(group.key, spec, mps=ctx.config.mps)
        policy = ctx.fgd.for_pod(pod.demand) if spec.scheduling_strategy == "fgd" else None
        decided = placement.schedule_group(ctx.ledger, request, pod.demand, policy=policy)
        if isinstance(decided, placement.Unschedulable):
            return decided.message()
        ctx.fgd.observe(request, pod.demand.cpu_milli)  # every group placed shapes fgd's target workload
        return decided

    async def _persist(self, group: state_.GroupRecord, allocation: ledgers.Allocation) -> state_.GroupRecord:
        """Write the allocation into the group's status, conditional on what we last saw of the group."""
        current = group
        # Pending members count too (statuses.member_names): the status is then already right once they
        # are bound, and no second write follows this one.
        members = statuses.member_names(self.ctx.state, group, self.ctx.config.env_names)
        for _ in range(5):
            try:
                return await self.ctx.api.patch_group_status(
                    group.key, statuses.bound(current, allocation, members), resource_version=current.resource_version
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
        """Annotate-and-bind in one write; a group placed for this pod alone is rolled back if it fails."""
        ctx = self.ctx
        gkey = group.key
        node = ctx.ledger.node(allocation.node)
        annotations = statuses.allocation_annotations(allocation, ctx.config.env_names, node)
        try:
            # One write: the API server copies the Binding's annotations onto the pod with spec.nodeName.
            await ctx.api.bind_pod(pod.key, pod.uid, allocation.node, annotations)
        except (storage.Gone, storage.Conflict) as e:
            # Deleted, recreated under the same name (another uid), or bound by someone else: not ours now.
            logger.info("pod %s/%s not bound: %s", *pod.key, e)
            await self._roll_back_alone(gkey, fresh, "the pod that placed the group went away before it was bound")
            return Outcome(Result.SKIPPED, str(e))
        except storage.Invalid as e:
            # Refused (an admission policy, RBAC, validation): the pod is still ours and still Pending.
            logger.warning("binding pod %s/%s refused: %s", *pod.key, e)
            await self._roll_back_alone(gkey, fresh, "the API server refused the binding of the first member")
            return Outcome(Result.REFUSED, f"the API server refused the binding to {allocation.node}: {e}")
        except BaseException:
            await self._roll_back_alone(gkey, fresh, "binding the first member failed; the group will be placed again")
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
        """Un-place a group none of whose pods got bound: status first, then the ledger."""
        group = self.ctx.state.groups.get(gkey)
        try:
            self.ctx.state.keep(await self.ctx.api.patch_group_status(gkey, statuses.rolled_back(group, why)))
        except storage.Gone:
            pass
        except Exception:
            # The API may still show the claim: keep the devices held; the reconciler retries.
            logger.exception("could not roll back the placement of group %s/%s; devices stay held", *gkey)
            return
        self.ctx.ledger.release(gkey)
