"""Preemption and nominations by example: who is evicted where, and what a nomination keeps.

The general claim (the choice is the brute-force optimum) is in test_preemption_properties.py; these are
the cases a user would name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tests.core import builders

from deviceshare.core import (
    capacity,
    eligibility,
    inventory,
    ledger,
    nominations,
    placement,
    preemption,
    reasons,
    victimindex,
    victims,
)

GPU = builders.GPU
GI = 1 << 30
PREEMPTOR = ("ml", "llm")
POD = inventory.PodDemand()


class Cluster:
    """A ledger plus the groups bound on it, as the operator would hand them to preemption."""

    def __init__(self, *nodes: inventory.NodeInfo) -> None:
        self.book = ledger.DeviceLedger()
        for node in nodes:
            self.book.upsert_node(node)
        self.bound: dict[str, list[victims.BoundGroup]] = {}

    def bind(
        self, name: str, node: str, devices: Sequence[str], priority: int, *, pods: int = 1, cpu: int = 0,
        share: capacity.Share | None = None,
    ) -> None:
        key = ("batch", name)
        allocation = self.book.reserve(key, node, {GPU: tuple(devices)}, {GPU: share} if share else None)
        self.book.commit(key)
        for p in range(pods):
            self.book.account_pod(("batch", f"{name}-{p}"), node, cpu // pods, 0)
        self.bound.setdefault(node, []).append(victims.BoundGroup(allocation, priority, pods, cpu, 0))

    def decide(
        self, request: placement.GroupRequest, priority: int,
        pending: Sequence[inventory.PodDemand] = (POD,), **kw: object,
    ) -> preemption.Preemption | preemption.NoPreemption:
        by_node = victims.by_node(g for gs in self.bound.values() for g in gs)
        return preemption.decide(self.book.snapshot(), request, pending, priority, by_node, **kw)  # type: ignore[arg-type]


def whole(gpus: int = 1) -> placement.GroupRequest:
    return placement.GroupRequest(PREEMPTOR, {GPU: gpus}, {})


def shared(compute: int, memory: int = 0) -> placement.GroupRequest:
    return placement.GroupRequest(PREEMPTOR, {GPU: 1}, {}, share={GPU: capacity.Share(compute, memory)})


def test_a_250m_sharer_evicts_one_250m_sharer_not_the_whole_device() -> None:
    c = Cluster(builders.node("a", gpus=2, device_memory={GPU: 80 * GI}))
    for i in range(4):
        c.bind(f"nb{i}", "a", ["0"], 10, pods=1 + (i == 0), share=capacity.Share(250))
    for i in range(4):
        c.bind(f"nc{i}", "a", ["1"], 10, share=capacity.Share(250))
    decision = c.decide(shared(250), 100)
    assert isinstance(decision, preemption.Preemption)
    assert decision.victim_keys == (("batch", "nb1"),)  # fewest pods, then the name
    assert decision.placement.devices == {GPU: ("0",)}


def test_the_lowest_highest_victim_priority_wins_over_fewer_victims() -> None:
    c = Cluster(builders.node("a", gpus=2), builders.node("b", gpus=2))
    c.bind("important", "a", ["0", "1"], 50)
    c.bind("x", "b", ["0"], 10)
    c.bind("y", "b", ["1"], 10)
    decision = c.decide(whole(2), 100)
    assert isinstance(decision, preemption.Preemption)
    assert (decision.node, decision.highest_priority) == ("b", 10)
    assert decision.victim_keys == (("batch", "x"), ("batch", "y"))


def test_then_the_fewest_groups_then_the_fewest_pods() -> None:
    c = Cluster(builders.node("a", gpus=2), builders.node("b", gpus=2), builders.node("c", gpus=2))
    c.bind("a1", "a", ["0"], 10)
    c.bind("a2", "a", ["1"], 10)
    c.bind("big", "b", ["0", "1"], 10, pods=3)
    c.bind("small", "c", ["0", "1"], 10, pods=2)
    decision = c.decide(whole(2), 100)
    assert isinstance(decision, preemption.Preemption)
    assert (decision.node, decision.victim_keys, decision.victim_pods) == ("c", (("batch", "small"),), 2)


def test_the_fewest_groups_even_where_kubes_reprieve_would_take_two() -> None:
    # Three groups of one priority; kube's reprieve takes "a" and "b" back first... or evicts both.
    c = Cluster(builders.node("n", gpus=4))
    c.bind("a", "n", ["0"], 10)
    c.bind("b", "n", ["1"], 10)
    c.bind("c", "n", ["2", "3"], 10)
    decision = c.decide(whole(2), 100)
    assert isinstance(decision, preemption.Preemption) and decision.victim_keys == (("batch", "c"),)


def test_equal_or_higher_priority_is_never_a_victim() -> None:
    c = Cluster(builders.node("a", gpus=1), builders.node("b", gpus=1))
    c.bind("same", "a", ["0"], 100)
    c.bind("higher", "b", ["0"], 1000)
    decision = c.decide(whole(), 100)
    assert isinstance(decision, preemption.NoPreemption)
    assert decision.message() == (
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    )


def test_a_protected_group_is_not_a_victim_and_the_next_best_is() -> None:
    c = Cluster(builders.node("a", gpus=1), builders.node("b", gpus=1))
    c.bind("cheap", "a", ["0"], 0)
    c.bind("dearer", "b", ["0"], 50)
    first = c.decide(whole(), 100)
    assert isinstance(first, preemption.Preemption) and first.victim_keys == (("batch", "cheap"),)
    second = c.decide(whole(), 100, protected={("batch", "cheap")})
    assert isinstance(second, preemption.Preemption) and second.victim_keys == (("batch", "dearer"),)


def test_cpu_of_the_pending_members_is_freed_too() -> None:
    c = Cluster(builders.node("a", gpus=2, cpu_milli=4000))
    c.bind("gpu-holder", "a", ["0"], 10, cpu=1000)
    c.bind("cpu-hog", "a", ["1"], 20, cpu=3000)
    one = c.decide(whole(), 100, pending=[inventory.PodDemand(cpu_milli=1000)])
    assert isinstance(one, preemption.Preemption) and one.victim_keys == (("batch", "gpu-holder"),)
    hog = c.decide(whole(), 100, pending=[inventory.PodDemand(cpu_milli=1500)] * 2)
    assert isinstance(hog, preemption.Preemption) and hog.victim_keys == (("batch", "cpu-hog"),)
    two = c.decide(whole(), 100, pending=[inventory.PodDemand(cpu_milli=1600)] * 2)
    assert isinstance(two, preemption.Preemption)
    assert two.victim_keys == (("batch", "cpu-hog"), ("batch", "gpu-holder"))


def test_what_no_eviction_can_change_is_not_helpful() -> None:
    c = Cluster(builders.node("a", gpus=1), builders.node("off", gpus=4, shared=False))
    c.bind("v", "a", ["0"], 0)
    decision = c.decide(whole(2), 100)
    assert isinstance(decision, preemption.NoPreemption)
    assert decision.message() == (
        "preemption: 0/2 nodes are available: 1 Preemption is not helpful for scheduling, "
        "1 insufficient nvidia.com/gpu."
    )


def test_a_group_the_caller_did_not_list_keeps_the_node_out_of_the_search() -> None:
    c = Cluster(builders.node("a", gpus=2))
    c.bind("listed", "a", ["0"], 0)
    c.bind("unlisted", "a", ["1"], 0)
    del c.bound["a"][1]  # the ledger holds device 1 for a group preemption is not told about
    decision = c.decide(whole(), 100)
    assert isinstance(decision, preemption.NoPreemption)  # not "device 1 is free: no victim needed"
    assert decision.reasons == {preemption.UNKNOWN_HOLDERS: 1}


def nomination(priority: int, devices: tuple[str, ...] = ("1",), **kw: object) -> nominations.Nomination:
    return nominations.Nomination(("ml", "nominee"), "a", priority, {GPU: devices}, expires=60.0, **kw)  # type: ignore[arg-type]


def test_nominated_devices_are_not_offered_to_equal_or_lower_priority() -> None:
    c = Cluster(builders.node("a", gpus=2))
    noms = nominations.NONE.nominate(nomination(100))
    snapshot = c.book.snapshot()
    for priority, offered in ((50, ("0",)), (100, ("0",)), (101, ("0", "1"))):
        view = nominations.overlay(snapshot, noms, priority, PREEMPTOR)
        assert view.nodes["a"].free[GPU] == offered
    equal = placement.place_on(nominations.overlay(snapshot, noms, 100), whole(2), POD)
    assert isinstance(equal, placement.Unschedulable)
    assert equal.message() == "0/1 nodes are available: 1 insufficient nvidia.com/gpu."
    higher = placement.place_on(nominations.overlay(snapshot, noms, 101), whole(2), POD)
    assert isinstance(higher, placement.Placement)
    mine = nominations.overlay(snapshot, noms, 100, ("ml", "nominee"))
    assert mine is snapshot  # its own nomination is no obstacle to the nominee


def test_a_nominated_share_leaves_the_rest_of_the_device() -> None:
    c = Cluster(builders.node("a", gpus=2, device_memory={GPU: 80 * GI}))
    c.bind("full", "a", ["0"], 1000)
    noms = nominations.NONE.nominate(nomination(100, share={GPU: capacity.Share(600)}))
    view = nominations.overlay(c.book.snapshot(), noms, 50)
    assert placement.place_on(view, shared(400), POD) == placement.Placement(
        "a", {GPU: ("1",)}, c.book.revision
    )
    refused = placement.place_on(view, shared(500), POD)
    assert isinstance(refused, placement.Unschedulable)
    assert refused.reasons == {"insufficient nvidia.com/gpu compute": 1}


def test_nominations_expire_and_clear() -> None:
    noms = nominations.NONE.nominate(nomination(100)).nominate(
        nominations.Nomination(("ml", "later"), "b", 5, {GPU: ("0",)}, expires=120.0)
    )
    assert [n.group for n in noms.expired(60.0)] == [("ml", "nominee")]
    assert list(noms.live(60.0).by_group) == [("ml", "later")]
    assert len(noms.clear(("ml", "later"))) == 1 and noms.clear(("x", "y")) is noms


def test_preemption_respects_a_higher_nomination_on_the_node() -> None:
    c = Cluster(builders.node("a", gpus=2), builders.node("b", gpus=1))
    c.bind("v-a", "a", ["0"], 10)
    c.bind("v-b", "b", ["0"], 20)
    kept = nominations.NONE.nominate(nomination(500))  # device "1" of node a is kept for someone else
    decision = c.decide(whole(2), 100, nominated=kept)
    assert isinstance(decision, preemption.NoPreemption)
    lower = nominations.NONE.nominate(nomination(50))  # a lower nominee yields
    taken = c.decide(whole(2), 100, nominated=lower)
    assert isinstance(taken, preemption.Preemption) and taken.node == "a"


def test_the_index_follows_a_priority_change_that_moves_no_device() -> None:
    c = Cluster(builders.node("a", gpus=1), builders.node("b", gpus=1))
    c.bind("on-a", "a", ["0"], 100)
    c.bind("on-b", "b", ["0"], 50)
    index = victimindex.VictimIndex(victims.by_node(g for gs in c.bound.values() for g in gs))
    assert preemption.decide(c.book.snapshot(), whole(), [POD], 200, index) == c.decide(whole(), 200)
    lowered = dataclasses.replace(c.bound["a"][0], priority=10)  # e.g. its high-priority member left
    c.bound["a"] = [lowered]

    index.file("a", victims.NodeGroups.of([lowered]))
    decision = preemption.decide(c.book.snapshot(), whole(), [POD], 200, index)

    assert isinstance(decision, preemption.Preemption)
    assert (decision.node, decision.victim_keys) == ("a", (("batch", "on-a"),))


def test_a_group_holding_only_devices_the_claim_selectors_do_not_match_is_never_evicted() -> None:
    # Node a: A100s 0-1 (held by a low-priority group) and H100s 2-3 (held by a group of the preemptor's priority).
    c = Cluster(builders.node("a", gpus=4, device_memory={GPU: 80 * GI}))
    c.bind("a100s", "a", ["0", "1"], 10)
    c.bind("h100s", "a", ["2", "3"], 100)
    h100_only = eligibility.Ineligible(GPU, {"a": frozenset({"0", "1"})})
    for request in (whole(1), shared(0, 40 * GI)):
        decision = c.decide(request, 100, ineligible=h100_only)
        assert isinstance(decision, preemption.NoPreemption), request
        assert decision.reasons == {reasons.no_selected_victim_device(GPU): 1}
        # Without selectors, the A100s would do: the same low group is the victim.
        assert isinstance(c.decide(request, 100), preemption.Preemption)


def test_the_victim_is_the_group_whose_devices_the_claim_selectors_match() -> None:
    # Node a: 0 A100 (x), 1 H100 (y); node b: 0 A100 (z, the lowest priority of all). The preemptor asks for one H100.
    c = Cluster(builders.node("a", gpus=2), builders.node("b", gpus=1))
    c.bind("x", "a", ["0"], 10)
    c.bind("y", "a", ["1"], 20)
    c.bind("z", "b", ["0"], 5)
    h100_only = eligibility.Ineligible(GPU, {"a": frozenset({"0"}), "b": frozenset({"0"})})
    decision = c.decide(whole(1), 100, ineligible=h100_only)
    assert isinstance(decision, preemption.Preemption)
    assert (decision.node, decision.victim_keys) == ("a", (("batch", "y"),))
    assert decision.placement.devices == {GPU: ("1",)}
    # A gang of two pods whose CPU only both of node a's groups free: a victim may free CPU, never devices it
    # cannot use.
    cpu = Cluster(builders.node("a", gpus=2, cpu_milli=2000))
    cpu.bind("x", "a", ["0"], 10, cpu=1000)
    cpu.bind("y", "a", ["1"], 20, cpu=1000)
    gang = [inventory.PodDemand(cpu_milli=1000)] * 2
    both = cpu.decide(whole(1), 100, gang, ineligible=eligibility.Ineligible(GPU, {"a": frozenset({"0"})}))
    assert isinstance(both, preemption.Preemption) and both.placement.devices == {GPU: ("1",)}
    assert both.victim_keys == (("batch", "x"), ("batch", "y"))
