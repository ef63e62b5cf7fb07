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

Nothing on the pod is taken on trust: the group name is checked before it is used anywhere, and the pod
must pass the same member rules as the webhook applies at CREATE (a pod annotated after creation never
met the webhook). A binding the API refuses (400/403/422) is reported on the pod and retried with backoff;
only a 404 or a 409 (deleted, another uid, bound by someone else) means the pod is not ours to place.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time

from deviceshare.api import names
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules
from deviceshare.core import placement

from . import quotas, statuses, storage
from . import state as state_
from .context import Context

logger = logging.getLogger("deviceshare.operator.scheduler")


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
        if pod.group is not None and not pod.group_valid:
            # Before any use: the name goes into API paths, locks and status (a name like
            # "../shareddevicegroups?watch=true" once turned a GET into a collection watch).
            problem = member_rules.group_name_problem(pod.group)
            return Outcome(Result.UNSCHEDULABLE, problem or "invalid group name")
        if pod.group_key is None:
            return Outcome(
                Result.UNSCHEDULABLE,
                f"pod has no {names.POD_GROUP_ANNOTATION} annotation; "
                f"{self.ctx.config.scheduler_name} only schedules members of a SharedDeviceGroup",
            )
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
        ctx = self.ctx
        group = ctx.state.groups.get(gkey)
        # Pods and groups come on separate watches: a pod often arrives before its group (the webhook
        # let it in because the group exists). Ask the API once before calling the pod unschedulable.
        if group is None and (read := await ctx.api.read_group_if_exists(gkey)) is not None:
            ctx.state.keep(read)
            group = ctx.state.groups.get(gkey)
        if group is None:
            return Outcome(Result.UNSCHEDULABLE, f'SharedDeviceGroup "{gkey[1]}" not found in namespace "{gkey[0]}"')
        if group.deleting:
            return Outcome(Result.UNSCHEDULABLE, f'SharedDeviceGroup "{gkey[1]}" is being deleted')
        if group.spec is None:
            return Outcome(
                Result.UNSCHEDULABLE, f'SharedDeviceGroup "{gkey[1]}" has an invalid spec: {group.spec_error}'
            )
        spec = group.spec
        env = ctx.config.env_names.for_group(spec)  # visibility, and a share's limits (CONTRACT §7)
        refused = next(member_rules.conflicts(pod.containers, spec.resources, env), None)
        if refused is not None:
            # The webhook denies such a pod at CREATE; this one never met it (annotated after creation).
            return Outcome(Result.UNSCHEDULABLE, f"pod did not pass admission for SharedDeviceGroup "
                                                 f'"{gkey[1]}": {refused}')
        if gkey in ctx.conflicts:
            others = ", ".join(f"{ns}/{n}" for ns, n in sorted(ctx.conflicts[gkey]))
            return Outcome(
                Result.UNSCHEDULABLE,
                f'SharedDeviceGroup "{gkey[1]}" holds devices also claimed by {others}; '
                "no new member is placed until the conflict is resolved",
            )

        allocation = ctx.ledger.allocation(gkey)
        fresh = allocation is None
        if allocation is None:
            budget = await quotas.read(self.quotas, ctx.api, gkey[0])  # checked below, after the last await
            if names.GROUP_FINALIZER not in group.finalizers:
                # Before the group claims anything: a deletion from here on waits for us (Releasing), even
                # one that comes before the reconciler would have got round to adding the finalizer.
                marked = ctx.state.keep(await ctx.api.set_group_finalizers(
                    gkey, [*group.finalizers, names.GROUP_FINALIZER], resource_version=group.resource_version
                ))
                if marked.deleting or marked.spec != spec:
                    return Outcome(Result.RETRY, "the group changed while its finalizer was added", retry_after=0.05)
                group = dataclasses.replace(group, resource_version=marked.resource_version,
                                            finalizers=marked.finalizers)
            # No await from here to the reservation: another group of the namespace cannot slip in between.
            over = quotas.refusal(ctx.ledger, gkey, dict(spec.resources), budget)
            if over is not None:
                ctx.unschedulable[gkey] = over
                return Outcome(Result.UNSCHEDULABLE, over)
            request = placement.GroupRequest.from_spec(gkey, spec)
            policy = ctx.fgd.for_pod(pod.demand) if spec.scheduling_strategy == "fgd" else None
            decided = placement.schedule_group(ctx.ledger, request, pod.demand, policy=policy)
            if isinstance(decided, placement.Unschedulable):
                ctx.unschedulable[gkey] = decided.message()
                return Outcome(Result.UNSCHEDULABLE, decided.message())
            ctx.fgd.observe(request, pod.demand.cpu_milli)  # every group placed shapes fgd's target workload
            allocation = decided
            try:
                persisted = await self._persist(group, allocation)
            except BaseException:
                ctx.ledger.release(gkey)
                raise
            allocation = ctx.ledger.commit(gkey)
            ctx.state.keep(persisted)
            ctx.unschedulable.pop(gkey, None)
        else:
            if allocation.state is not ledgers.AllocationState.COMMITTED:
                return Outcome(Result.RETRY, "group placement in flight", retry_after=0.1)
            limit = spec.max_members
            if limit:
                placed = [p for p in ctx.state.members_on_devices(gkey) if p.key != pod.key]
                if len(placed) >= limit:
                    return Outcome(
                        Result.UNSCHEDULABLE,
                        f'SharedDeviceGroup "{gkey[1]}" already has {len(placed)} running member(s), '
                        f"its maxMembers is {limit}",
                    )
            problem = placement.check_member(ctx.ledger, allocation.node, pod.demand)
            if problem is not None:
                return Outcome(Result.UNSCHEDULABLE, f"group is on node {allocation.node}: {problem.message()}")

        node = ctx.ledger.node(allocation.node)
        annotations = statuses.allocation_annotations(allocation, ctx.config.env_names, node)
        try:
            # One write: the API server copies the Binding's annotations onto the pod with spec.nodeName.
            await ctx.api.bind_pod(pod.key, pod.uid, allocation.node, annotations)
        except (storage.Gone, storage.Conflict) as e:
            # Deleted, recreated under the same name (another uid), or bound by someone else: not ours now.
            logger.info("pod %s/%s not bound: %s", *pod.key, e)
            if fresh and not ctx.state.members_on_devices(gkey):
                await self._roll_back(gkey, "the pod that placed the group went away before it was bound")
            return Outcome(Result.SKIPPED, str(e))
        except storage.Invalid as e:
            # Refused (an admission policy, RBAC, validation): the pod is still ours and still Pending.
            logger.warning("binding pod %s/%s refused: %s", *pod.key, e)
            if fresh and not ctx.state.members_on_devices(gkey):
                await self._roll_back(gkey, "the API server refused the binding of the first member")
            return Outcome(Result.REFUSED, f"the API server refused the binding to {allocation.node}: {e}")
        except BaseException:
            if fresh and not ctx.state.members_on_devices(gkey):
                await self._roll_back(gkey, "binding the first member failed; the group will be placed again")
            raise

        # Seen as bound right away, so the next member counts it before the watch event arrives.
        ctx.state.assume(pod, allocation.node, annotations, gkey[1])
        ctx.ledger.account_pod(pod.key, allocation.node, pod.demand.cpu_milli, pod.demand.memory_bytes)
        devices = statuses.describe_allocation(allocation)
        if fresh:
            ctx.event(group, "Bound", f"Placed on node {allocation.node} with {devices}")
        ctx.event(
            pod, "Scheduled",
            f"Successfully assigned {pod.key[0]}/{pod.key[1]} to {allocation.node} with {devices} "
            f'(SharedDeviceGroup "{gkey[1]}")',
        )
        return Outcome(Result.BOUND, node=allocation.node)

    async def _persist(self, group: state_.GroupRecord, allocation: ledgers.Allocation) -> state_.GroupRecord:
        """Write the allocation into the group's status, conditional on what we last saw of the group."""
        current = group
        # The members too (pending ones count, as in every status write): the status is then already
        # right once they are bound, and no second write follows this one.
        live = self.ctx.state.live_members(group.key)
        members = [p.name for p in statuses.listed_members(live, group.spec, self.ctx.config.env_names)]
        for _ in range(5):
            status = {
                "phase": names.PHASE_BOUND,
                "members": members,
                "memberCount": len(members),
                "nodeName": allocation.node,
                **statuses.allocated_fields(allocation),
                "observedGeneration": current.generation,
                "conditions": statuses.condition(
                    statuses.wire_conditions(current.status.conditions), names.CONDITION_SCHEDULED, "True", "Bound",
                    f"placed on node {allocation.node} with {statuses.describe_allocation(allocation)}",
                    current.generation,
                ),
            }
            try:
                return await self.ctx.api.patch_group_status(
                    group.key, status, resource_version=current.resource_version
                )
            except storage.Conflict:
                self.ctx.metrics.api_conflicts.inc()
                current = await self.ctx.api.read_group(group.key)
                if current.uid != group.uid or current.deleting or current.spec != group.spec:
                    raise
                self.ctx.state.upsert_group(current)
        raise storage.Conflict(f"status of shareddevicegroup {group.key[0]}/{group.key[1]} kept changing")

    async def _roll_back(self, gkey: state_.GroupKey, why: str) -> None:
        """Un-place a group none of whose pods got bound: status first, then the ledger."""
        group = self.ctx.state.groups.get(gkey)
        status = {
            "phase": names.PHASE_PENDING,
            "nodeName": None,
            **statuses.allocated_fields(None),
            "conditions": statuses.condition(
                statuses.wire_conditions(group.status.conditions) if group else [],
                names.CONDITION_SCHEDULED, "False", "RolledBack", why,
            ),
        }
        try:
            self.ctx.state.keep(await self.ctx.api.patch_group_status(gkey, status))
        except storage.Gone:
            pass
        except Exception:
            # The API may still show the claim: keep the devices held; the reconciler retries.
            logger.exception("could not roll back the placement of group %s/%s; devices stay held", *gkey)
            return
        self.ctx.ledger.release(gkey)
