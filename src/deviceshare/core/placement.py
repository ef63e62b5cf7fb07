"""Where a new group goes, and which of the node's devices it gets.

Scoring is exact and deterministic: ``binpack`` takes the node with the fewest free devices left
after placement (fills nodes up, keeps whole nodes free for big groups), ``spread`` the one with
the most; ties go to the node name that sorts first. With several resources the score is the sum
over them.

The fast path walks the ledger's free-capacity index in score order and stops at the first
node that passes every filter, so a decision touches a handful of nodes, not the cluster. Only
when nothing fits does it scan every node, to count why (kube-scheduler's ``0/N nodes are
available: ...``). :func:`place_linear` is the naive filter-and-score over all nodes: the
reference the fast path is tested against and benchmarked beside.

A sharing group (``spec.share``) is placed by :mod:`shareplacement` through the same walk: nodes
come from the ledger's indexes of partly used and wholly free devices, binpack packing shares onto
partly used devices first. :class:`Policy` is the seam for other scoring (e.g. fragmentation-aware):
:func:`place_by_policy` offers it every node that fits. What a decision is asked and answers (the request,
placement, unschedulable, the policy seam) is in :mod:`placementterms`, re-exported here.
"""

from __future__ import annotations

import collections
from typing import cast

from deviceshare.core import (
    devicechoice,
    filterclasses,
    filters,
    inventory,
    linkscore,
    placementterms,
    reasons,
    shareplacement,
)
from deviceshare.core import ledger as ledgers  # the parameter `ledger` is the DeviceLedger

# The terms of a decision (what is asked, what comes back, the policy seam) live in placementterms;
# re-exported: what callers have always found here.
BINPACK = placementterms.BINPACK
SPREAD = placementterms.SPREAD
NVIDIA_PREFIX = placementterms.NVIDIA_PREFIX
GroupRequest = placementterms.GroupRequest
needs_mps = placementterms.needs_mps
Placement = placementterms.Placement
Unschedulable = placementterms.Unschedulable
Policy = placementterms.Policy
IndexedPolicy = placementterms.IndexedPolicy
choose_devices = devicechoice.choose_devices


def _failure(
    state: ledgers.NodeState, request: GroupRequest, pod: inventory.PodDemand
) -> str | None:
    if request.share:
        return filters.first_failure(
            state.info, state.free, state.cpu_used, state.memory_used,
            request.resources, request.node_selector, pod,
            devices_check=lambda: (reasons.NO_MPS if request.mps and not state.info.mps_ready else None)
            or shareplacement.devices_failure(state, request.resources, request.share),
        )
    return filters.first_failure(
        state.info, state.free, state.cpu_used, state.memory_used,
        request.resources, request.node_selector, pod,
    )


def _fits(state: ledgers.NodeState, request: GroupRequest, pod: inventory.PodDemand) -> bool:
    if request.share:
        # the cheap filters first, with the shared resources left out of the device count
        whole = {r: n for r, n in request.resources.items() if r not in request.share}
        return filters.passes(
            state.info, state.free, state.cpu_used, state.memory_used, whole, request.node_selector, pod
        ) and (not request.mps or state.info.mps_ready) and (
            shareplacement.devices_failure(state, request.resources, request.share) is None
        )
    return filters.passes(
        state.info, state.free, state.cpu_used, state.memory_used,
        request.resources, request.node_selector, pod,
    )


# Read-only, for the phases built on placement (gang start, preemption): the same filters it walks with.
node_failure = _failure  # why a group (first pod ``pod``) cannot go to a node; None if it can
fits = _fits  # node_failure(...) is None, cheapest checks first


def device_choice(state: ledgers.NodeState, request: GroupRequest, revision: int) -> Placement:
    """The devices (and tiles) the group gets on a node that fits, in the request's strategy order."""
    devices: dict[str, tuple[str, ...]] = {}
    tiles: dict[str, tuple[str, ...]] = {}
    for resource, need in sorted(request.resources.items()):
        share = request.share.get(resource)
        if share is None:
            devices[resource] = choose_devices(
                state.info.devices.get(resource, ()), state.free[resource], need, state.info.topology.get(resource)
            )
            continue
        devices[resource], chosen = shareplacement.choose(state, resource, need, share, request.strategy == SPREAD)
        if chosen:
            tiles[resource] = chosen
    return Placement(state.info.name, devices, revision, tiles)


_placement = device_choice


def _slack(state: ledgers.NodeState, request: GroupRequest) -> int:
    """Free devices the node keeps after placement, over the requested resources."""
    return sum(len(state.free.get(r, ())) - need for r, need in request.resources.items())


def explain(snapshot: ledgers.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand) -> Unschedulable:
    """Every node's first failing reason, counted: per class of alike nodes where the snapshot keeps them
    (:mod:`filterclasses`), else node by node (:func:`explain_each`, the same answer)."""
    bare, classes = filterclasses.without_resources(pod), snapshot.filter_classes
    counted = None if classes is None else classes.explain(
        snapshot, request.node_selector, pod, lambda s: _failure(s, request, bare))
    return explain_each(snapshot, request, pod) if counted is None else Unschedulable(counted, len(snapshot.nodes))


def explain_each(snapshot: ledgers.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand) -> Unschedulable:
    """Every node's first failing reason, counted, asking each node."""
    counted: collections.Counter[str] = collections.Counter()
    for state in snapshot.nodes.values():
        failure = _failure(state, request, pod)
        if failure is not None:
            counted[failure] += 1
    return Unschedulable(dict(counted), len(snapshot.nodes))


def place_on(
    snapshot: ledgers.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand
) -> Placement | Unschedulable:
    """The indexed decision on one snapshot (see the module docstring)."""
    descending = request.strategy == SPREAD
    nodes = snapshot.nodes
    if request.share:
        for state in shareplacement.candidates(snapshot, request.share, descending):
            if _fits(state, request, pod):
                return _placement(state, request, snapshot.revision)
        return explain(snapshot, request, pod)
    if len(request.resources) == 1:
        ((resource, need),) = request.resources.items()
        cpu, memory = pod.cpu_milli, pod.memory_bytes
        walk = snapshot.candidate_states(resource, need, descending)
        for state in walk:
            # Inline the commonest rejection on a busy cluster (out of cpu/memory): no calls.
            info = state.info
            if cpu > info.cpu_milli - state.cpu_used or memory > info.memory_bytes - state.memory_used:
                continue
            if _fits(state, request, pod):
                if need >= 2 and snapshot.linked_nodes:  # equal scores: the better-linked node (linkscore)
                    state = linkscore.prefer(
                        state, walk, lambda s: len(s.free[resource]),
                        lambda s: _fits(s, request, pod), request.resources,
                    )
                return _placement(state, request, snapshot.revision)
        return explain(snapshot, request, pod)
    if not request.resources:
        return explain(snapshot, request, pod)
    # Several resources: the index of the scarcest one bounds the candidates; score them all.
    resource = min(request.resources, key=lambda r: (snapshot.candidate_count(r, request.resources[r]), r))
    fitting = [
        (-_slack(state, request) if descending else _slack(state, request), name, state)
        for name in snapshot.candidates(resource, request.resources[resource])
        if _fits(state := nodes[name], request, pod)
    ]
    if not fitting:
        return explain(snapshot, request, pod)
    return _placement(_best_scored(snapshot, request, fitting), request, snapshot.revision)


def _best_scored(
    snapshot: ledgers.LedgerSnapshot, request: GroupRequest, fitting: list[tuple[int, str, ledgers.NodeState]]
) -> ledgers.NodeState:
    """The fitting node of the best score, name first; or, where links can tell (linkscore), the best-linked
    among the first of that score."""
    score, _, best = min(fitting, key=lambda f: f[:2])
    if request.share or not linkscore.applies(snapshot, request.resources):
        return best
    tied = sorted((f for f in fitting if f[0] == score), key=lambda f: f[1])
    return linkscore.best_of((s for _, _, s in tied), request.resources)


def place_by_policy(
    snapshot: ledgers.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand, policy: Policy
) -> Placement | Unschedulable:
    """A decision by another policy: every node that fits is offered to it, or, for an
    :class:`IndexedPolicy`, the policy walks its own index with this module's filter."""
    if callable(getattr(policy, "place", None)):  # not isinstance: on a runtime Protocol it costs ~16 us a decision
        return cast(IndexedPolicy, policy).place(snapshot, request, pod, lambda state: _fits(state, request, pod))
    feasible = [s for _, s in sorted(snapshot.nodes.items()) if _fits(s, request, pod)]
    chosen = policy.choose(snapshot, request, feasible) if feasible else None
    return explain(snapshot, request, pod) if chosen is None else chosen


def place_linear(
    snapshot: ledgers.LedgerSnapshot, request: GroupRequest, pod: inventory.PodDemand
) -> Placement | Unschedulable:
    """The naive reference: filter and score every node. Same answers as :func:`place_on`, slower."""
    descending = request.strategy == SPREAD
    counted: collections.Counter[str] = collections.Counter()
    best: ledgers.NodeState | None = None
    best_share_key: tuple[int, int, str] = (0, 0, "")
    fitting: list[tuple[int, str, ledgers.NodeState]] = []
    for name, state in snapshot.nodes.items():
        failure = _failure(state, request, pod)
        if failure is not None:
            counted[failure] += 1
            continue
        if request.share:
            share_key = (*shareplacement.order_key(state, request.share, descending), name)
            if best is None or share_key < best_share_key:
                best, best_share_key = state, share_key
            continue
        slack = _slack(state, request)
        fitting.append((-slack if descending else slack, name, state))
    if fitting:
        best = _best_scored(snapshot, request, fitting)
    if best is None:
        return Unschedulable(dict(counted), len(snapshot.nodes))
    return _placement(best, request, snapshot.revision)


def place_group(
    ledger: ledgers.DeviceLedger, request: GroupRequest, pod: inventory.PodDemand
) -> Placement | Unschedulable:
    """Decide where a new group goes, for its first pod ``pod``; reserves nothing."""
    return place_on(ledger.snapshot(), request, pod)


def schedule_group(
    ledger: ledgers.DeviceLedger,
    request: GroupRequest,
    pod: inventory.PodDemand,
    attempts: int = 5,
    policy: Policy | None = None,
) -> ledgers.Allocation | Unschedulable:
    """Place and reserve. A group that already holds devices gets its allocation back.

    If the reservation conflicts because the ledger moved since the snapshot, decide again on a
    fresh snapshot (the DRA scheduler's discipline). Raises ``DeviceConflict`` if the conflict
    persists for ``attempts`` tries, or if it happens on an unchanged revision (a bug).
    """
    existing = ledger.allocation(request.key)
    if existing is not None:
        return existing
    conflict: ledgers.DeviceConflict | None = None
    for _ in range(max(1, attempts)):
        snapshot = ledger.snapshot()
        decision = (
            place_on(snapshot, request, pod) if policy is None else place_by_policy(snapshot, request, pod, policy)
        )
        if isinstance(decision, Unschedulable):
            return decision
        try:
            return ledger.reserve(request.key, decision.node, decision.devices, request.share, decision.tiles)
        except ledgers.DeviceConflict as exc:
            if ledger.revision == decision.revision:
                raise
            conflict = exc
    assert conflict is not None
    raise conflict


def check_member(ledger: ledgers.DeviceLedger, node: str, pod: inventory.PodDemand) -> Unschedulable | None:
    """Can a pod join a group already bound to ``node``? None if it can.

    The node must exist and be Ready, its NoSchedule/NoExecute taints tolerated, the pod's own
    nodeSelector/affinity must match and its cpu/memory must fit beside the accounted pods (do
    not account ``pod`` itself before asking). Cordon and shared mode are not checked: they stop
    new groups from landing on a node, not members joining a group bound there already.
    """
    info = ledger.node(node)
    if info is None:
        return Unschedulable({reasons.NODE_NOT_FOUND: 1}, 1)
    cpu, memory = ledger.used(node)
    failure = filters.admission_failure(info, pod, cpu, memory)
    return None if failure is None else Unschedulable({failure: 1}, 1)
