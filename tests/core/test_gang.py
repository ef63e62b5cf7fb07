"""Gang start, by table: a gang waits for its members, then starts where all of them fit, or says why not."""

from __future__ import annotations

import pytest
from tests.core import builders

from deviceshare.core import capacity, gang, inventory, ledger, placement

GPU = builders.GPU
GI = 1 << 30
KEY = ("ml", "train")


def members(*cpus: int, **constraints: object) -> list[gang.Member]:
    return [
        gang.Member(("ml", f"p{i}"), inventory.PodDemand(cpu_milli=cpu, **constraints))  # type: ignore[arg-type]
        for i, cpu in enumerate(cpus)
    ]


def book(*nodes: inventory.NodeInfo) -> ledger.DeviceLedger:
    b = ledger.DeviceLedger()
    for n in nodes:
        b.upsert_node(n)
    return b


def whole(gpus: int = 2, **kw: object) -> placement.GroupRequest:
    return placement.GroupRequest(KEY, {GPU: gpus}, {}, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("present", "message"), [(0, "0/3 member pods exist"), (2, "2/3 member pods exist")])
def test_a_gang_waits_for_its_members(present: int, message: str) -> None:
    verdict = gang.permit(book(builders.node("a")).snapshot(), whole(), 3, members(*[100] * present))
    assert isinstance(verdict, gang.WaitingForMembers)
    assert (verdict.reason, gang.describe(verdict, 3)) == ("WaitingForMembers", message)


def test_the_third_member_starts_the_gang_on_a_node_with_room_for_all_three() -> None:
    # "a" has the devices but CPU for two of the pods only; "b" takes all three.
    b = book(builders.node("a", cpu_milli=2000), builders.node("b", cpu_milli=3000))
    verdict = gang.permit(b.snapshot(), whole(), 3, members(1000, 1000, 1000))
    assert isinstance(verdict, gang.Start)
    assert verdict.placement.node == "b" and verdict.members == (("ml", "p0"), ("ml", "p1"), ("ml", "p2"))
    assert b.allocations() == []  # a verdict holds nothing; reserve is the caller's next step


def test_a_gang_no_node_fits_binds_none_and_counts_why_for_the_whole_gang() -> None:
    b = book(builders.node("a", cpu_milli=2000), builders.node("b", cpu_milli=2500), builders.node("c", gpus=1))
    verdict = gang.permit(b.snapshot(), whole(), 3, members(1000, 1000, 1000))
    assert isinstance(verdict, placement.Unschedulable)
    assert gang.describe(verdict, 3) == (
        "gang of 3 member pods: 0/3 nodes are available: 2 insufficient cpu, 1 insufficient nvidia.com/gpu."
    )


def test_only_the_first_n_members_must_fit_together() -> None:
    b = book(builders.node("a", cpu_milli=2000))
    verdict = gang.permit(b.snapshot(), whole(), 2, members(1000, 1000, 1000))
    assert isinstance(verdict, gang.Start) and verdict.members == (("ml", "p0"), ("ml", "p1"))


def test_without_a_gang_the_first_pod_places_the_group_as_before() -> None:
    b = book(builders.node("a"), builders.node("b"))
    pod = inventory.PodDemand(cpu_milli=500)
    verdict = gang.permit(b.snapshot(), whole(), 0, [gang.Member(("ml", "p0"), pod)])
    assert isinstance(verdict, gang.Start)
    assert verdict.placement == placement.place_on(b.snapshot(), whole(), pod)


def test_a_sharing_gang_needs_its_share_and_every_pods_memory() -> None:
    b = book(
        builders.node("a", memory_bytes=8 * GI, device_memory={GPU: 80 * GI}),
        builders.node("b", memory_bytes=32 * GI, device_memory={GPU: 80 * GI}),
    )
    request = whole(1, share={GPU: capacity.Share(250, 20 * GI)})
    pods = [gang.Member(("ml", f"p{i}"), inventory.PodDemand(memory_bytes=6 * GI)) for i in range(2)]
    verdict = gang.permit(b.snapshot(), request, 2, pods)
    assert isinstance(verdict, gang.Start) and verdict.placement.node == "b"


def test_members_node_constraints_all_hold_on_the_chosen_node() -> None:
    zone = "topology.kubernetes.io/zone"
    b = book(builders.node("a", labels={zone: "x"}), builders.node("b", labels={zone: "y"}))
    pods = [
        gang.Member(("ml", "p0"), inventory.PodDemand()),
        gang.Member(("ml", "p1"), inventory.PodDemand(node_selector={zone: "y"})),
    ]
    verdict = gang.permit(b.snapshot(), whole(), 2, pods)
    assert isinstance(verdict, gang.Start) and verdict.placement.node == "b"
    clash = [*pods, gang.Member(("ml", "p2"), inventory.PodDemand(node_selector={zone: "x"}))]
    refused = gang.permit(b.snapshot(), whole(), 3, clash)
    assert isinstance(refused, placement.Unschedulable)
    assert refused.reasons == {"node(s) didn't match Pod's node affinity/selector": 2}


def test_a_taint_must_be_tolerated_by_every_member() -> None:
    taint = inventory.Taint("dedicated", "ml", "NoSchedule")
    tolerate = (inventory.Toleration("dedicated", "Equal", "ml", "NoSchedule"),)
    b = book(builders.node("a", taints=[taint]))
    one = gang.permit(b.snapshot(), whole(), 2, members(0, 0, tolerations=tolerate))
    assert isinstance(one, gang.Start)
    mixed = [gang.Member(("ml", "p0"), inventory.PodDemand(tolerations=tolerate)), *members(0)[:1]]
    assert isinstance(gang.permit(b.snapshot(), whole(), 2, mixed), placement.Unschedulable)


def test_the_demand_of_one_pod_is_that_pod() -> None:
    pod = inventory.PodDemand(cpu_milli=3, memory_bytes=4, node_selector={"k": "v"})
    assert gang.demand([pod]) == pod
    assert gang.demand([]) == inventory.PodDemand()
