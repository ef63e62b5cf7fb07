"""DRA devices in the core (CONTRACT §13): what a node offers but withholds (device taints, other claims'
allocations), and a group's claim selectors narrowing the devices of its class."""

from __future__ import annotations

import dataclasses

import pytest
from tests.core import builders

from deviceshare.core import drareasons, eligibility, inventory, placement, reasonkinds, reasons
from deviceshare.core import ledger as ledgers

CLASS = "gpu.nvidia.com"


def dra_node(name: str, withheld: tuple[str, ...] = ()) -> inventory.NodeInfo:
    base = builders.node(name, gpus=0)
    ids = tuple(f"{name}/gpu-{i}" for i in range(4))
    return dataclasses.replace(base, devices={CLASS: ids},
                               withheld={CLASS: frozenset(f"{name}/{d}" for d in withheld)} if withheld else {})


def request(count: int, strategy: str = "binpack") -> placement.GroupRequest:
    return placement.GroupRequest(key=("ml", "g"), resources={CLASS: count}, node_selector={}, strategy=strategy)


def test_withheld_devices_are_never_free_nor_reservable() -> None:
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(dra_node("a", withheld=("gpu-0", "gpu-2")))
    assert ledger.free_devices("a", CLASS) == ("a/gpu-1", "a/gpu-3")
    with pytest.raises(ledgers.DeviceConflict, match="tainted or allocated by another ResourceClaim"):
        ledger.reserve(("ml", "x"), "a", {CLASS: ["a/gpu-0"]})
    decision = placement.place_group(ledger, request(3), inventory.PodDemand())
    assert isinstance(decision, placement.Unschedulable)
    assert decision.message() == f"0/1 nodes are available: 1 insufficient {CLASS}."
    placed = placement.place_group(ledger, request(2), inventory.PodDemand())
    assert isinstance(placed, placement.Placement) and placed.devices == {CLASS: ("a/gpu-1", "a/gpu-3")}


def test_a_group_holding_a_device_keeps_it_when_it_becomes_withheld() -> None:
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(dra_node("a"))
    ledger.reserve(("ml", "g"), "a", {CLASS: ["a/gpu-0"]})
    ledger.upsert_node(dra_node("a", withheld=("gpu-0", "gpu-1")))
    assert ledger.allocation(("ml", "g")) is not None
    assert ledger.problems() == ()
    assert ledger.free_devices("a", CLASS) == ("a/gpu-2", "a/gpu-3")


def test_selectors_narrow_the_devices_a_group_may_take() -> None:
    ledger = ledgers.DeviceLedger()
    for name in ("a", "b"):
        ledger.upsert_node(dra_node(name))
    excluded = {"a": frozenset({"a/gpu-0", "a/gpu-1", "a/gpu-3"}), "b": frozenset({"b/gpu-0", "b/gpu-2"})}
    snapshot = eligibility.restrict(ledger.snapshot(), CLASS, excluded)
    placed = placement.place_on(snapshot, request(2), inventory.PodDemand())
    assert isinstance(placed, placement.Placement) and placed.devices == {CLASS: ("b/gpu-1", "b/gpu-3")}
    none = placement.place_on(snapshot, request(3), inventory.PodDemand())
    assert isinstance(none, placement.Unschedulable)
    assert none.message() == f"0/2 nodes are available: 2 insufficient {CLASS}."
    assert ledger.free_devices("a", CLASS) == tuple(f"a/gpu-{i}" for i in range(4))  # the ledger is untouched


def test_why_nothing_fits_is_said_in_dra_terms() -> None:
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(dra_node("taken", withheld=("gpu-0", "gpu-1", "gpu-2")))
    ledger.upsert_node(dra_node("full"))
    ledger.reserve(("ml", "other"), "full", {CLASS: [f"full/gpu-{i}" for i in range(3)]})
    ledger.upsert_node(builders.node("plugin-only", gpus=4))
    ledger.upsert_node(dra_node("unmatched"))
    snapshot = ledger.snapshot()
    excluded = {"unmatched": frozenset(f"unmatched/gpu-{i}" for i in range(4))}
    narrowed = eligibility.restrict(snapshot, CLASS, excluded)
    said = placement.place_on(narrowed, request(2), inventory.PodDemand())
    assert isinstance(said, placement.Unschedulable)
    assert said.message() == f"0/4 nodes are available: 4 insufficient {CLASS}."
    refined = drareasons.refine(said, snapshot, request(2), inventory.PodDemand(), excluded)
    assert refined.message() == (
        f"0/4 nodes are available: 1 insufficient {CLASS}, "
        f"1 node(s) had {CLASS} devices tainted or allocated by another ResourceClaim, "
        f"1 node(s) had no device of DeviceClass {CLASS}, 1 node(s) had no {CLASS} device the claim's selectors match.")


@pytest.mark.parametrize("reason", [reasons.no_class_device(CLASS), reasons.no_selected_device(CLASS),
                                    reasons.withheld_devices(CLASS)])
def test_dra_reasons_count_as_devices_for_the_waiting_groups_gauge(reason: str) -> None:
    assert reasonkinds.reason_kind(reason) == reasonkinds.DEVICES
    assert reasonkinds.kind_of(f"0/3 nodes are available: 3 {reason}.") == reasonkinds.DEVICES


def test_the_memo_of_narrowed_nodes_follows_the_ledger() -> None:
    ledger = ledgers.DeviceLedger()
    for name in ("a", "b"):
        ledger.upsert_node(dra_node(name))
    excluded = {"a": frozenset({"a/gpu-0"}), "b": frozenset({"b/gpu-0", "b/gpu-1"})}
    memo: eligibility.Narrowed = {}
    first = eligibility.restrict(ledger.snapshot(), CLASS, excluded, memo)
    assert first.nodes["b"].free[CLASS] == ("b/gpu-2", "b/gpu-3")
    ledger.reserve(("ml", "x"), "b", {CLASS: ["b/gpu-2"]})
    again = eligibility.restrict(ledger.snapshot(), CLASS, excluded, memo)
    assert again.nodes["b"].free[CLASS] == ("b/gpu-3",)  # b changed: narrowed again
    assert again.nodes["a"] is first.nodes["a"]  # a did not: its narrowed state reused
    assert again.nodes["a"].free[CLASS] == ("a/gpu-1", "a/gpu-2", "a/gpu-3")
