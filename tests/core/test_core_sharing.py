"""Fractional sharing in the core (CONTRACT §7): capacity read from nodes, fits, reasons, placement.

Table-driven: each row is a situation an admin or a user would recognise, and what they should see.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.core import builders

from deviceshare.core import capacity, inventory, ledger, placement, reasons

GPU = builders.GPU
I915 = "gpu.intel.com/i915"
GI = 1 << 30
MI = 1 << 20
ANY_POD = inventory.PodDemand()


# --- device capacity from the node --------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "annotations", "allocatable", "memory", "tiles", "problem"),
    [
        ({"nvidia.com/gpu.memory": "81920"}, {}, None, {GPU: 80 * GI}, {}, None),
        (
            {"nvidia.com/gpu.memory": "81920"},
            {"deviceshare.io/device-memory": json.dumps({GPU: "40Gi"})},
            None, {GPU: 40 * GI}, {}, None,
        ),  # the annotation wins over GFD's label
        ({}, {"deviceshare.io/device-memory": json.dumps({GPU: 12884901888})}, None, {GPU: 12 * GI}, {}, None),
        ({}, {}, None, {}, {}, None),  # nothing declared: no memory, whole devices still fine
        ({"gpu.intel.com/tiles": "4"}, {}, {I915: "2"}, {}, {I915: 2}, None),  # node total / cards
        (
            {"gpu.intel.com/tiles": "4"},
            {"deviceshare.io/device-tiles": json.dumps({I915: 1})},
            {I915: "2"}, {}, {I915: 1}, None,
        ),
        ({"gpu.intel.com/tiles": "3"}, {}, {I915: "2"}, {}, {}, "does not divide evenly"),
        ({"nvidia.com/gpu.memory": "lots"}, {}, None, {}, {}, "is not a positive number of MiB"),
        ({}, {"deviceshare.io/device-memory": "{not json"}, None, {}, {}, "is not valid JSON"),
        ({}, {"deviceshare.io/device-memory": json.dumps({GPU: "-1Gi"})}, None, {}, {}, "must be positive"),
        ({}, {"deviceshare.io/device-memory": json.dumps([1])}, None, {}, {}, "must be a JSON object"),
        ({}, {"deviceshare.io/device-tiles": json.dumps({I915: "2"})}, {I915: "1"}, {}, {}, "positive integer"),
        ({}, {"deviceshare.io/device-tiles": json.dumps({"tiles": 2})}, None, {}, {}, "not an extended resource"),
    ],
)
def test_device_capacity_is_read_from_annotations_and_vendor_labels(
    labels: dict[str, str],
    annotations: dict[str, str],
    allocatable: dict[str, str] | None,
    memory: dict[str, int],
    tiles: dict[str, int],
    problem: str | None,
) -> None:
    body = builders.node_body(
        labels={**builders.SHARED, **labels},
        annotations=annotations,
        allocatable={"cpu": "8", "memory": "32Gi", **(allocatable or {GPU: "4"})},
    )
    info = inventory.node_from_object(body)  # never raises
    assert (dict(info.device_memory), dict(info.device_tiles)) == (memory, tiles)
    if problem is None:
        assert info.problems == ()
    else:
        assert len(info.problems) == 1 and problem in info.problems[0], info.problems


# --- the arithmetic of one device ---------------------------------------------------------------

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")
TILE = capacity.Share(0, 0, 1)


def use(*parts: tuple[tuple[str, str], capacity.Share, tuple[int, ...]]) -> capacity.DeviceUse | None:
    out: capacity.DeviceUse | None = None
    for group, share, tiles in parts:
        out = capacity.with_part(out, capacity.Part(group, share, tiles))
    return out


@pytest.mark.parametrize(
    ("held", "share", "memory_cap", "fits"),
    [
        ((), capacity.Share(1000), None, True),
        (((A, capacity.Share(500), ()),), capacity.Share(500), None, True),
        (((A, capacity.Share(500), ()),), capacity.Share(501), None, False),
        (((A, capacity.Share(460, 12 * GI), ()),), capacity.Share(0, 68 * GI), 80 * GI, True),
        (((A, capacity.Share(460, 12 * GI), ()),), capacity.Share(0, 68 * GI + 1), 80 * GI, False),
        (((A, capacity.Share(1000), ()),), capacity.Share(0, GI), 80 * GI, True),  # memory-only beside full compute
        (((A, capacity.Share(1000), ()),), capacity.Share(1, GI), 80 * GI, False),
        ((), capacity.Share(0, GI), None, False),  # memory asked, none declared
        (((A, capacity.Share(0, 0, 1), (0,)),), capacity.Share(0, 0, 1), None, True),
        (((A, TILE, (0,)), (B, TILE, (1,))), TILE, None, False),
        (((A, capacity.Share(0, 0, 1), (0,)),), capacity.Share(100), None, False),  # kinds never mix
        (((A, capacity.Share(100), ()),), capacity.Share(0, 0, 1), None, False),
    ],
)
def test_a_share_fits_beside_what_a_device_holds(
    held: tuple[Any, ...], share: capacity.Share, memory_cap: int | None, fits: bool
) -> None:
    current = use(*held)
    left = (
        capacity.fresh("0", memory_cap, 2, share.kind)
        if current is None
        else capacity.left_of("0", current, memory_cap, 2)
    )
    assert left is not None
    assert capacity.fits(left, share) is fits


@pytest.mark.parametrize(
    ("held", "memory_cap", "whole", "problem"),
    [
        (((A, capacity.Share(600), ()), (B, capacity.Share(500), ())), None, False, "compute 1100m given out"),
        (((A, capacity.Share(0, 50 * GI), ()), (B, capacity.Share(0, 40 * GI), ())), 80 * GI, False, "memory 90Gi"),
        (((A, capacity.Share(0, GI), ()),), None, False, "declares no device memory"),
        (((A, capacity.Share(100), ()), (B, capacity.Share(0, 0, 1), (0,))), 80 * GI, False, "tile holders"),
        (((A, TILE, (0,)), (B, TILE, (0,))), None, False, "tile is held by several"),
        (((A, capacity.Share(100), ()),), None, True, "used both whole and in parts"),
        (((A, capacity.Share(500), ()), (B, capacity.Share(500, 40 * GI), ())), 80 * GI, False, None),
    ],
)
def test_rebuild_judges_what_a_device_was_found_holding(
    held: tuple[Any, ...], memory_cap: int | None, whole: bool, problem: str | None
) -> None:
    current = use(*held)
    assert current is not None
    found = capacity.overcommit(current, memory_cap, 2, whole)
    assert (found is None) if problem is None else (found is not None and problem in found), found


# --- reasons, kube-scheduler style --------------------------------------------------------------


def book_with(*nodes: inventory.NodeInfo) -> ledger.DeviceLedger:
    book = ledger.DeviceLedger()
    for n in nodes:
        book.upsert_node(n)
    return book


def request(name: str, share: capacity.Share | None, count: int = 1, resource: str = GPU,
            strategy: str = "binpack") -> placement.GroupRequest:
    return placement.GroupRequest(
        ("ns", name), {resource: count}, {}, strategy, {resource: share} if share else {}
    )


@pytest.mark.parametrize(
    ("share", "node_kwargs", "taken", "reason"),
    [
        (capacity.Share(0, 12 * GI), {}, (), reasons.no_declared(GPU, "memory")),
        (capacity.Share(0, 0, 1), {}, (), reasons.no_declared(GPU, "tiles")),
        (capacity.Share(0, 12 * GI), {"device_memory": {GPU: 8 * GI}}, (), f"insufficient {GPU} memory"),
        (capacity.Share(600), {}, (capacity.Share(500),), f"insufficient {GPU} compute"),
        (capacity.Share(100, 50 * GI), {"device_memory": {GPU: 80 * GI}},
         (capacity.Share(100, 40 * GI),), f"insufficient {GPU} memory"),
        (capacity.Share(0, 0, 2), {"device_tiles": {GPU: 2}}, (capacity.Share(0, 0, 1),), f"insufficient {GPU} tiles"),
        (capacity.Share(100), {}, (None,), f"insufficient {GPU}"),  # held whole by another group
    ],
)
def test_a_node_that_cannot_take_a_share_says_why(
    share: capacity.Share, node_kwargs: dict[str, Any], taken: tuple[capacity.Share | None, ...], reason: str
) -> None:
    book = book_with(builders.node("n1", gpus=1, **node_kwargs))
    for i, held in enumerate(taken):
        tiles = {GPU: ("0.0",)} if held is not None and held.tiles else None
        book.reserve(("other", str(i)), "n1", {GPU: ["0"]}, {GPU: held} if held else None, tiles)
    got = placement.place_group(book, request("g", share), ANY_POD)
    assert isinstance(got, placement.Unschedulable)
    assert got.message() == f"0/1 nodes are available: 1 {reason}."
    assert placement.place_linear(book.snapshot(), request("g", share), ANY_POD) == got


def test_reasons_are_counted_across_nodes() -> None:
    book = book_with(
        builders.node("a", gpus=1), builders.node("b", gpus=1),
        builders.node("c", gpus=1, device_memory={GPU: 8 * GI}),
        builders.node("d", gpus=1, shared=False),
    )
    got = placement.place_group(book, request("g", capacity.Share(250, 12 * GI)), ANY_POD)
    assert isinstance(got, placement.Unschedulable)
    assert got.message() == (
        f"0/4 nodes are available: 1 insufficient {GPU} memory, 2 no declared device memory for {GPU}, "
        "1 not in shared mode."
    )


# --- where shares go ----------------------------------------------------------------------------


def test_binpack_fills_partly_used_devices_tightest_first_and_spread_the_opposite() -> None:
    mem = {GPU: 80 * GI}
    book = book_with(builders.node("a", gpus=2, device_memory=mem), builders.node("b", gpus=2, device_memory=mem))
    book.reserve(("x", "1"), "a", {GPU: ["0"]}, {GPU: capacity.Share(0, 40 * GI)})
    book.reserve(("x", "2"), "b", {GPU: ["1"]}, {GPU: capacity.Share(0, 60 * GI)})
    binpack = placement.schedule_group(book, request("p", capacity.Share(0, 10 * GI)), ANY_POD)
    assert isinstance(binpack, ledger.Allocation)
    assert (binpack.node, binpack.devices[GPU]) == ("b", ("1",))  # 20Gi left there: the tightest
    spread = placement.schedule_group(book, request("s", capacity.Share(0, 10 * GI), strategy="spread"), ANY_POD)
    assert isinstance(spread, ledger.Allocation)
    assert (spread.node, spread.devices[GPU]) == ("a", ("1",))  # a fresh device on the node with most free
    # a share that no partly used device takes starts a fresh device, on the fullest node first
    big = placement.schedule_group(book, request("big", capacity.Share(0, 75 * GI)), ANY_POD)
    assert isinstance(big, ledger.Allocation) and (big.node, big.devices[GPU]) == ("b", ("0",))


def test_whole_groups_never_land_on_shared_devices_and_shares_never_on_whole_ones() -> None:
    book = book_with(builders.node("a", gpus=2))
    book.reserve(("x", "whole"), "a", {GPU: ["0"]})
    shared = placement.schedule_group(book, request("s", capacity.Share(300)), ANY_POD)
    assert isinstance(shared, ledger.Allocation) and shared.devices[GPU] == ("1",)
    whole = placement.place_group(book, request("w", None), ANY_POD)
    assert isinstance(whole, placement.Unschedulable)
    assert whole.message() == f"0/1 nodes are available: 1 insufficient {GPU}."
    with pytest.raises(ledger.DeviceConflict, match="shared by ns/s"):
        book.reserve(("ns", "w"), "a", {GPU: ["1"]})
    with pytest.raises(ledger.DeviceConflict, match="held by group x/whole"):
        book.reserve(("ns", "t"), "a", {GPU: ["0"]}, {GPU: capacity.Share(100)})


def test_tiles_are_handed_out_one_group_each_and_come_back_on_release() -> None:
    book = book_with(builders.node("a", gpus=2, device_tiles={GPU: 2}))
    got = [placement.schedule_group(book, request(f"t{i}", capacity.Share(0, 0, 1)), ANY_POD) for i in range(4)]
    assert all(isinstance(g, ledger.Allocation) for g in got)
    tiles = sorted(t for g in got if isinstance(g, ledger.Allocation) for t in g.tiles[GPU])
    assert tiles == ["0.0", "0.1", "1.0", "1.1"]
    fifth = placement.place_group(book, request("t4", capacity.Share(0, 0, 1)), ANY_POD)
    assert isinstance(fifth, placement.Unschedulable) and f"insufficient {GPU} tiles" in fifth.message()
    book.release(("ns", "t1"))
    again = placement.schedule_group(book, request("t5", capacity.Share(0, 0, 1)), ANY_POD)
    assert isinstance(again, ledger.Allocation)
    first = got[1]
    assert isinstance(first, ledger.Allocation) and again.tiles == first.tiles


def test_a_share_over_several_devices_takes_the_same_part_of_each() -> None:
    book = book_with(builders.node("a", gpus=4, device_memory={GPU: 16 * GI}))
    got = placement.schedule_group(book, request("two", capacity.Share(500, 8 * GI), count=2), ANY_POD)
    assert isinstance(got, ledger.Allocation) and got.devices[GPU] == ("0", "1")
    for device in ("0", "1"):
        held = book.use("a", GPU, device)
        assert held is not None and (held.compute_milli, held.memory_bytes) == (500, 8 * GI)


def test_reserve_refuses_what_does_not_fit_and_names_it() -> None:
    book = book_with(builders.node("a", gpus=1, device_memory={GPU: 16 * GI}))
    book.reserve(A, "a", {GPU: ["0"]}, {GPU: capacity.Share(700, 10 * GI)})
    with pytest.raises(ledger.DeviceConflict, match=r"compute=400m does not fit .*300m compute, 6Gi memory left"):
        book.reserve(B, "a", {GPU: ["0"]}, {GPU: capacity.Share(400)})
    book.reserve(B, "a", {GPU: ["0"]}, {GPU: capacity.Share(300, 6 * GI)})
    assert book.reserve(B, "a", {GPU: ["0"]}, {GPU: capacity.Share(300, 6 * GI)}).group == B  # idempotent
    with pytest.raises(ValueError, match="needs 1 distinct tiles"):
        book.reserve(C, "a", {GPU: ["0"]}, {GPU: capacity.Share(0, 0, 1)}, {GPU: []})
    with pytest.raises(ValueError, match="does not take in tiles"):
        book.reserve(C, "a", {GPU: ["0"]}, {GPU: capacity.Share(100)}, {GPU: ["0.0"]})
    assert book.allocation(C) is None


def test_rebuild_reports_over_commitment_and_mixing_and_keeps_every_claim() -> None:
    book = book_with(builders.node("a", gpus=2, device_memory={GPU: 16 * GI}))
    report = book.rebuild([
        ledger.Claim(A, "a", {GPU: ["0"]}, "status of ns/a", {GPU: capacity.Share(700)}),
        ledger.Claim(B, "a", {GPU: ["0"]}, "status of ns/b", {GPU: capacity.Share(600)}),
        ledger.Claim(C, "a", {GPU: ["1"]}, "status of ns/c"),
        ledger.Claim(("ns", "d"), "a", {GPU: ["1"]}, "status of ns/d", {GPU: capacity.Share(100)}),
    ])
    assert report.allocations == 4
    assert [(c.device, c.groups, c.reason) for c in report.conflicts] == [
        ("0", (A, B), "compute 1300m given out, more than 1"),
        ("1", (C, ("ns", "d")), "used both whole and in parts"),
    ]
    assert book.contested() == report.conflicts
    # nobody new gets any part of either device until the claimants let go
    assert isinstance(placement.place_group(book, request("e", capacity.Share(1)), ANY_POD), placement.Unschedulable)
    book.release(B)
    book.release(C)
    assert book.contested() == ()
    assert isinstance(placement.schedule_group(book, request("e", capacity.Share(300)), ANY_POD), ledger.Allocation)


def test_a_sharing_group_is_placed_like_a_whole_one_by_the_node_filters() -> None:
    book = book_with(
        builders.node("a", gpus=1, labels={"zone": "x"}),
        builders.node("b", gpus=1, labels={"zone": "y"}, cpu_milli=100),
    )
    req = placement.GroupRequest(("ns", "g"), {GPU: 1}, {"zone": "y"}, "binpack", {GPU: capacity.Share(250)})
    got = placement.place_group(book, req, inventory.PodDemand(cpu_milli=500))
    assert isinstance(got, placement.Unschedulable)
    assert got.message() == (
        "0/2 nodes are available: 1 insufficient cpu, 1 node(s) didn't match group nodeSelector."
    )
