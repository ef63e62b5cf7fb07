"""Preemption, the post-filter: a group that fits nowhere makes room by evicting lower-priority groups (CONTRACT §8).

The decision is the core's (:func:`deviceshare.core.preemption.decide`: whole groups of strictly lower priority
on one node, kube-scheduler's order). Carrying it out, in this order:

1. **nominate**: the preemptor's status carries ``nominatedNodeName`` (a conditional write), and the room being
   freed is kept for it in ``ctx.nominations`` (devices, shares, CPU/memory) until it binds or the nomination
   expires: no group of equal or lower priority is offered it meanwhile (``placing.py`` places on the overlay);
2. **evict** each victim group's member pods on that node through ``pods/eviction`` (policy/v1), so
   PodDisruptionBudgets hold: a refusal (429) protects that group for a while, and the next decision picks other
   victims, another node, or waits. Pods outside deviceshare groups are never victims;
3. mark the victims *preempted*: a new member of one waits instead of joining the node being emptied, and the
   reconciler releases the group once its members are gone (status first, then the ledger, as every release).

Events ``Preempting`` on the preemptor and ``Preempted`` on every victim group and pod; metrics
``deviceshare_preemptions_total{result}``, ``deviceshare_preemption_victims_total``, ``deviceshare_nominations``.
The victims per node (:class:`~deviceshare.core.victims.NodeGroups`) are kept between decisions and rebuilt only
for nodes whose holdings changed since (the ledger says which), in a :class:`~deviceshare.core.victimindex.VictimIndex`
that orders the nodes by the cheapest victims they could offer, so a decision searches a few nodes, not all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from deviceshare.api import models, names
from deviceshare.core import capacity, gang, inventory, nominations, placement, preemption, victimindex, victims
from deviceshare.core import ledger as ledgers
from deviceshare.core import priority as priority_

from . import draplacing, statuses, storage
from . import state as state_
from .context import Context
from .cyclechanges import CycleChanges

logger = logging.getLogger(__name__)

PROTECTED_FOR = 30.0  # s: a group whose eviction a PodDisruptionBudget refused is not chosen again for this long


class Preemptor:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._protected: dict[state_.GroupKey, float] = {}
        self._by_node = victimindex.VictimIndex()
        self._dirty = ledgers.ChangedNodes()  # filled by the ledger as nodes change, taken when asked
        self._ledger: ledgers.DeviceLedger | None = None

    async def post_filter(
        self, group: state_.GroupRecord, spec: models.GroupSpec, pod: state_.PodRecord, why: str,
        view: state_.GroupView, changes: CycleChanges,
    ) -> str:
        """Make room for ``group`` (which fits nowhere, ``why``), if its priority and its pods allow; returns
        what the pod and the group show. ``view``: the group's members as the failed permit read them; what the
        API answers about the group is noted on the cycle's ``changes``."""
        ctx, now = self.ctx, time.monotonic()
        live = ctx.nominations = ctx.nominations.live(now)
        held = live.by_group.get(group.key)
        if held is not None:  # a preemption for it is under way: wait for its victims to leave
            leaving = sorted(k for k, p in ctx.preempted.items() if p.by == group.key)
            return f"{why} Preempting on node {held.node}: waiting for {_names(leaving) or 'the room'} to be freed."
        pending = [p for p in view.live if not p.node_name and not p.deleting]
        if not priority_.may_preempt([p.priority for p in pending]):
            return f"{why} preemption: {preemption.NEVER}."
        priority = view.priority
        by_node = self.groups_by_node()
        if not any(g.priorities and g.priorities[0] < priority for g in by_node.values()):
            return why  # no group of lower priority anywhere: nothing to preempt, nothing to add
        ineligible = draplacing.ineligible(ctx, spec)  # DRA hook: room only of devices the claim's selectors match
        if ineligible is None:
            return f"{why} preemption: the ResourceSlices changed while the claim's selectors were evaluated."
        request = placement.GroupRequest.from_spec(group.key, spec, mps=ctx.config.mps)
        members = pending if spec.min_members > 1 else [pod]
        demands = [m.demand for m in members[: gang.needed(spec.min_members)]]
        decision = preemption.decide(
            ctx.ledger.snapshot(), request, demands, priority, by_node,
            protected=self._protected_now(now), nominated=live, ineligible=ineligible,
        )
        if isinstance(decision, preemption.NoPreemption):
            return f"{why} {decision.message()}"
        changed = [v.key for v in decision.victims if ctx.state.priority(v.key) >= priority]
        if changed:  # a victim's priority rose since its node was filed (a new member): decide again later
            self._dirty.add(decision.node)
            return f"{why} preemption: the priority of {_names(changed)} changed; deciding again."
        return await self._carry_out(group, priority, decision, demands, why, now, changes)

    async def _carry_out(
        self, group: state_.GroupRecord, priority: int, decision: preemption.Preemption,
        demands: list[inventory.PodDemand], why: str, now: float, changes: CycleChanges,
    ) -> str:
        ctx = self.ctx
        victim_names = _names(decision.victim_keys)
        told = f"preempting {victim_names} (lower priority) on node {decision.node}"
        chosen = decision.placement
        ctx.nominations = ctx.nominations.nominate(nominations.Nomination(
            group.key, decision.node, priority, chosen.devices, now + ctx.config.nomination_ttl,
            share=capacity.shares_from_spec(group.spec.share) if group.spec is not None else {},
            tiles=chosen.tiles,
            cpu_milli=sum(d.cpu_milli for d in demands),
            memory_bytes=sum(d.memory_bytes for d in demands),
        ))
        await self._nominate(group.key, decision.node, f"{why} {told}", changes)
        ctx.event(group, "Preempting", f"{told} to make room for this group (priority {priority})")
        result = "evicted"
        for victim in decision.victims:
            expires = now + ctx.config.nomination_ttl
            ctx.preempted[victim.key] = nominations.Victim(group.key, priority, decision.node, expires)
            outcome = await self._evict(victim.key, decision.node, group.key, priority)
            if outcome != "evicted":
                result = outcome
                ctx.preempted.pop(victim.key, None)  # it keeps running (a budget refused): no longer a victim
        if result != "evicted":
            # Not all the room will be freed: decide again on the next try (without the protected groups).
            ctx.nominations = ctx.nominations.clear(group.key)
        ctx.metrics.nominations.set(len(ctx.nominations))
        ctx.metrics.preemptions.labels(result).inc()
        ctx.metrics.preemption_victims.inc(len(decision.victims))
        return f"{why} {told}."

    async def _nominate(self, key: state_.GroupKey, node: str, message: str, changes: CycleChanges) -> None:
        """``status.nominatedNodeName`` and ``Scheduled=False/Preempting``, conditional on what we hold."""
        group = self.ctx.state.groups.get(key)
        if group is None:
            return
        try:
            changes.seen(await self.ctx.api.patch_group_status(
                group.key, statuses.nominated(group, node, message), uid=group.uid,
                resource_version=group.resource_version,
            ))
        except (storage.Conflict, storage.RetryLater) as e:  # the reconciler writes it from the nomination later
            logger.info("nominating group %s/%s: %s", *group.key, e)

    async def _evict(self, victim: state_.GroupKey, node: str, by: state_.GroupKey, priority: int) -> str:
        """Evict the victim's members on ``node``: evicted, refused (a PodDisruptionBudget), or failed."""
        ctx = self.ctx
        said = f"preempted by {names.key_text(by)} (priority {priority}) on {node}"
        group = ctx.state.groups.get(victim)
        if group is not None:
            ctx.event(group, "Preempted", said, warning=True)
        result = "evicted"
        for pod in [p for p in ctx.state.members_on_devices(victim) if p.node_name == node]:
            try:
                evicted = await ctx.api.evict_pod(pod.key, pod.uid)
            except storage.RetryLater as e:  # unresolved (Uncertain) or the API unavailable: decided again later
                logger.warning("evicting pod %s/%s for %s: %s", *pod.key, names.key_text(by), e)
                result = "failed"
                continue
            if not evicted:
                logger.info("eviction of pod %s/%s refused by a PodDisruptionBudget", *pod.key)
                self._protected[victim] = time.monotonic() + PROTECTED_FOR
                result = "refused"
                continue
            ctx.event(pod, "Preempted", said, warning=True)
        return result

    def _protected_now(self, now: float) -> frozenset[state_.GroupKey]:
        for key in [k for k, until in self._protected.items() if until <= now]:
            del self._protected[key]
        return frozenset(self._protected)

    def groups_by_node(self) -> victimindex.VictimIndex:
        """Every group bound on each node, as the core weighs them, with the nodes ordered by the cheapest
        victims they could offer; refiled for the nodes that changed (their devices the index follows itself)."""
        ledger = self.ctx.ledger
        if ledger is not self._ledger:  # a rebuild: a new ledger, nothing known of it yet
            self._ledger, self._by_node, self._dirty = ledger, victimindex.VictimIndex(), ledgers.ChangedNodes()
            ledger.subscribe(self._dirty)
        for name in self._dirty.take():
            self._by_node.file(name, victims.NodeGroups.of(self._bound_on(ledger, name)))
        return self._by_node

    def _bound_on(self, ledger: ledgers.DeviceLedger, node: str) -> list[victims.BoundGroup]:
        info = ledger.node(node)
        if info is None:
            return []
        holders = {g for r, ids in info.devices.items() for d in ids for g in ledger.holders(node, r, d)}
        out = []
        for key in sorted(holders):
            allocation = ledger.allocation(key)
            if allocation is None or allocation.node != node:
                continue
            pods = [p for p in self.ctx.state.members_on_devices(key) if p.node_name == node]
            out.append(victims.BoundGroup(
                allocation, self.ctx.state.priority(key), len(pods),
                sum(p.demand.cpu_milli for p in pods), sum(p.demand.memory_bytes for p in pods),
            ))
        return out


def _names(keys: Iterable[state_.GroupKey]) -> str:
    return ", ".join(names.key_text(k) for k in keys)
