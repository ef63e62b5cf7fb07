"""Preemption chooses what trying every subset of victims on every node chooses (200 random clusters, with and
without claim selectors).

Each seed builds a small cluster through the real ledger: whole-device and sharing groups of random
priorities with pods of random CPU, pods outside any group, sometimes a protected group (a PDB refused)
and a nomination of another preemptor. The brute force ranks every (node, subset of the strictly
lower-priority, unprotected groups) whose removal lets the preemptor fit — as CONTRACT §8 ranks them:
lowest highest-victim priority, fewest groups, fewest pods, then the node's name and the groups' — and
:func:`preemption.decide` must name the same node and the same victims. Then the decision is carried
out on the ledger itself: the victims released, the preemptor's devices reserved without a conflict.
With claim selectors (a DRA group's, CONTRACT §13), some devices of each node are ones the preemptor may not
take, held or free: the brute force offers it only the others, so evicting a group for devices it cannot use
never wins, and the decision must agree.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence

import pytest
from tests.core import builders

from deviceshare.core import (
    capacity,
    eligibility,
    inventory,
    ledger,
    nominations,
    placement,
    preemption,
    victimindex,
    victims,
)

GPU = builders.GPU
GI = 1 << 30
PRIORITIES = (0, 10, 10, 10, 20, 100)


def _request(rng: random.Random, key: inventory.GroupKey) -> placement.GroupRequest:
    if rng.random() < 0.5:
        return placement.GroupRequest(key, {GPU: rng.choice((1, 1, 2, 3))}, {})
    share = rng.choice(
        (capacity.Share(250), capacity.Share(500), capacity.Share(250, 20 * GI), capacity.Share(0, 40 * GI))
    )
    return placement.GroupRequest(key, {GPU: rng.choice((1, 1, 2))}, {}, share={GPU: share})


def cluster(
    seed: int, sizes: Sequence[int] = (1, 2, 3, 6)
) -> tuple[ledger.DeviceLedger, dict[str, list[victims.BoundGroup]], random.Random]:
    rng = random.Random(seed)
    book = ledger.DeviceLedger()
    nodes = rng.choice(sizes)
    for n in range(nodes):
        book.upsert_node(builders.node(
            f"n{n}", gpus=rng.choice((2, 3, 4)), cpu_milli=rng.choice((4000, 8000)),
            device_memory={GPU: 80 * GI} if rng.random() < 0.8 else None,
        ))
    bound: dict[str, list[victims.BoundGroup]] = {}
    for i in range(rng.randint(3, 5 * nodes)):  # mostly a full cluster
        key = ("ns", f"g{i}")
        pods = rng.choice((1, 1, 2))
        cpu = rng.choice((0, 500, 1000, 2000))
        decision = placement.schedule_group(book, _request(rng, key), inventory.PodDemand(cpu_milli=cpu * pods))
        if isinstance(decision, placement.Unschedulable):
            continue
        book.commit(key)
        for p in range(pods):
            book.account_pod(("ns", f"g{i}-{p}"), decision.node, cpu, 0)
        bound.setdefault(decision.node, []).append(
            victims.BoundGroup(book.allocation(key) or decision, rng.choice(PRIORITIES), pods, cpu * pods, 0)
        )
    for node in book.nodes():  # pods of other schedulers: never victims, their CPU stays taken
        if rng.random() < 0.3:
            book.account_pod(("other", node.name), node.name, 1000, 0)
    return book, bound, rng


def brute_force(
    snapshot: ledger.LedgerSnapshot,
    request: placement.GroupRequest,
    demand: inventory.PodDemand,
    priority: int,
    bound: dict[str, list[victims.BoundGroup]],
    protected: set[inventory.GroupKey],
    nominated: nominations.Nominations,
    ineligible: eligibility.Ineligible = eligibility.NONE,
) -> tuple[str, tuple[inventory.GroupKey, ...]] | None:
    best: tuple[object, ...] | None = None
    for name in sorted(snapshot.nodes):
        state = snapshot.nodes[name]
        groups = bound.get(name, [])
        candidates = [g for g in groups if g.priority < priority and g.key not in protected]
        kept = nominated.binding(name, priority, request.key)
        for size in range(len(candidates) + 1):
            for subset in itertools.combinations(candidates, size):
                removed = {g.key for g in subset}
                after = nominations.withhold(victims.without(state, groups, removed), kept)
                after = eligibility.narrow(after, GPU, ineligible.by_node.get(name, frozenset()))
                if not placement.fits(after, request, demand):
                    continue
                highest = max((g.priority for g in subset), default=None)
                rank = (0 if highest is None else 1, highest or 0, size, sum(g.pods for g in subset),
                        name, tuple(sorted(removed)))
                if best is None or rank < best:
                    best = rank
    if best is None:
        return None
    return str(best[-2]), tuple(best[-1])  # type: ignore[arg-type]


def _selectors(rng: random.Random, book: ledger.DeviceLedger) -> eligibility.Ineligible:
    """What a claim's selectors leave out: on each node none, all, or a random part of its devices."""
    by_node: dict[str, frozenset[str]] = {}
    for node in book.nodes():
        ids, pick = node.devices.get(GPU, ()), rng.random()
        if pick < 0.3:
            by_node[node.name] = frozenset(d for d in ids if rng.random() < 0.5)
        elif pick < 0.8:  # the commonest case: the node's devices of another model, or of the one asked for
            by_node[node.name] = frozenset(ids) if rng.random() < 0.5 else frozenset()
    return eligibility.Ineligible(GPU, by_node)


def _pending(rng: random.Random) -> Sequence[inventory.PodDemand]:
    return [inventory.PodDemand(cpu_milli=rng.choice((0, 500, 1500, 3000))) for _ in range(rng.choice((1, 1, 2, 3)))]


@pytest.mark.parametrize("selectors", [False, True], ids=["any-device", "claim-selectors"])
@pytest.mark.parametrize("seed", range(200))
def test_the_choice_is_the_brute_force_optimum(seed: int, selectors: bool) -> None:
    book, bound, rng = cluster(seed)
    preemptor = ("ml", "preemptor")
    request = _request(rng, preemptor)
    pending = _pending(rng)
    priority = rng.choice((10, 20, 50, 100))
    groups = [g for gs in bound.values() for g in gs]
    protected = {rng.choice(groups).key} if groups and rng.random() < 0.3 else set()
    nominated = nominations.NONE
    free_nodes = [n for n in book.nodes() if book.free_devices(n.name, GPU)]
    if free_nodes and rng.random() < 0.3:  # another preemptor keeps a free device on a node
        node = rng.choice(free_nodes)
        nominated = nominated.nominate(nominations.Nomination(
            ("ml", "other"), node.name, rng.choice((5, 50, 200)), {GPU: book.free_devices(node.name, GPU)[:1]},
            expires=60.0, cpu_milli=rng.choice((0, 1000)),
        ))
    ineligible = _selectors(rng, book) if selectors else eligibility.NONE
    snapshot = book.snapshot()
    demand = preemption.gang.demand(pending)
    expected = brute_force(snapshot, request, demand, priority, bound, protected, nominated, ineligible)

    decision = preemption.decide(snapshot, request, pending, priority, victims.by_node(groups), protected=protected,
                                 nominated=nominated, ineligible=ineligible)

    # The scan answers the commonest request inline and any other through the general bound: both agree.
    general = preemption.decide(snapshot, request, pending, priority, victims.by_node(groups),
                                protected={*protected, ("no", "such-group")}, nominated=nominated,
                                ineligible=ineligible)
    assert general == decision, seed
    # Walking the index of nodes by their cheapest victims decides the same as scanning every node.
    indexed = preemption.decide(snapshot, request, pending, priority, victimindex.VictimIndex(victims.by_node(groups)),
                                protected=protected, nominated=nominated, ineligible=ineligible)
    assert indexed == decision, seed
    if expected is None:
        assert isinstance(decision, preemption.NoPreemption), (seed, decision)
        assert sum(decision.reasons.values()) == len(snapshot.nodes)
        return
    assert isinstance(decision, preemption.Preemption), (seed, expected, decision)
    assert (decision.node, decision.victim_keys) == expected, seed
    assert all(v.priority < priority and v.key not in protected for v in decision.victims)
    assert not set(decision.placement.devices[GPU]) & ineligible.on(decision.node)
    # Carried out on the ledger: once the victims are gone the preemptor's devices are its to take.
    for victim in decision.victims:
        book.release(victim.key)
        for p in range(victim.pods):
            book.forget_pod((victim.key[0], f"{victim.key[1]}-{p}"))
    taken = book.reserve(preemptor, decision.node, decision.placement.devices, request.share, decision.placement.tiles)
    assert taken.node == decision.node
    info = book.node(decision.node)
    assert info is not None
    kept_cpu = sum(n.cpu_milli for n in nominated.binding(decision.node, priority, preemptor))
    assert demand.cpu_milli + kept_cpu <= info.cpu_milli - book.used(decision.node)[0]
    for nomination in nominated.binding(decision.node, priority, preemptor):
        for resource, ids in nomination.devices.items():
            assert not set(ids) & set(decision.placement.devices.get(resource, ()))


@pytest.mark.parametrize("selectors", [False, True], ids=["any-device", "claim-selectors"])
@pytest.mark.parametrize("seed", range(60))
def test_the_index_kept_as_the_cluster_changes_chooses_the_brute_force_optimum(seed: int, selectors: bool) -> None:
    """Larger clusters, where the index's order lets a decision skip most nodes; after each preemption is
    carried out (and a random group leaves, another's priority changes), the index is told only the nodes
    whose groups changed (it follows their devices through the snapshots itself)."""
    book, bound, rng = cluster(seed + 1000, sizes=(8, 12, 16))
    index = victimindex.VictimIndex(victims.by_node(g for gs in bound.values() for g in gs))
    for turn in range(4):
        preemptor = ("ml", f"preemptor-{turn}")
        request, pending, priority = _request(rng, preemptor), _pending(rng), rng.choice((10, 20, 50, 100))
        ineligible = _selectors(rng, book) if selectors else eligibility.NONE
        snapshot, demand = book.snapshot(), preemption.gang.demand(pending)
        expected = brute_force(snapshot, request, demand, priority, bound, set(), nominations.NONE, ineligible)

        decision = preemption.decide(snapshot, request, pending, priority, index, ineligible=ineligible)

        if expected is None:
            assert isinstance(decision, preemption.NoPreemption), (seed, turn, decision)
            assert decision == preemption.decide(snapshot, request, pending, priority, victims.by_node(
                g for gs in bound.values() for g in gs), ineligible=ineligible), (seed, turn)
            continue
        assert isinstance(decision, preemption.Preemption), (seed, turn, expected, decision)
        assert (decision.node, decision.victim_keys) == expected, (seed, turn)
        changed = {decision.node}
        for victim in decision.victims:
            _leave(book, bound, victim)
        book.reserve(preemptor, decision.node, decision.placement.devices, request.share, decision.placement.tiles)
        book.commit(preemptor)
        allocation = book.allocation(preemptor)
        assert allocation is not None
        bound.setdefault(decision.node, []).append(victims.BoundGroup(allocation, priority, 1, demand.cpu_milli, 0))
        book.account_pod((preemptor[0], f"{preemptor[1]}-0"), decision.node, demand.cpu_milli, 0)
        leaving = [g for gs in bound.values() for g in gs if g.key != preemptor]
        if leaving and rng.random() < 0.5:  # a group finishes elsewhere: its node has room again
            gone = rng.choice(leaving)
            _leave(book, bound, gone)
            changed.add(gone.node)
        staying = [g for gs in bound.values() for g in gs]
        if staying and rng.random() < 0.5:  # a group's priority changes (a new member), its devices do not
            group = rng.choice(staying)
            changed_priority = dataclasses.replace(group, priority=rng.choice(PRIORITIES))
            bound[group.node][bound[group.node].index(group)] = changed_priority
            changed.add(group.node)
        for node in changed:
            index.file(node, victims.NodeGroups.of(bound.get(node, [])))


def _leave(book: ledger.DeviceLedger, bound: dict[str, list[victims.BoundGroup]], group: victims.BoundGroup) -> None:
    book.release(group.key)
    for p in range(group.pods):
        book.forget_pod((group.key[0], f"{group.key[1]}-{p}"))
    bound[group.node].remove(group)
