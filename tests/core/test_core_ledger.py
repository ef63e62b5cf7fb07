"""The device ledger: reserve, commit, release, inventory changes and rebuilding from the API."""

from __future__ import annotations

import pytest
from tests.core import builders

from deviceshare.core import ledger

GPU = builders.GPU
A, B, C = ("ml", "a"), ("ml", "b"), ("ml", "c")


def book(*nodes: str, gpus: int = 4) -> ledger.DeviceLedger:
    result = ledger.DeviceLedger()
    for name in nodes:
        result.upsert_node(builders.node(name, gpus=gpus))
    return result


def test_reserve_commit_release_lifecycle() -> None:
    b = book("n1")
    rev = b.revision
    got = b.reserve(A, "n1", {GPU: ["1", "2"]})
    assert got == ledger.Allocation(A, "n1", {GPU: ("1", "2")}, ledger.AllocationState.RESERVED)
    assert b.revision > rev
    assert b.free_devices("n1", GPU) == ("0", "3")
    assert b.holder("n1", GPU, "1") == A and b.holder("n1", GPU, "0") is None
    committed = b.commit(A)
    assert committed.state is ledger.AllocationState.COMMITTED
    assert b.allocation(A) == committed
    assert b.release(A) == committed
    assert b.free_devices("n1", GPU) == ("0", "1", "2", "3")
    assert b.allocation(A) is None and b.release(A) is None


def test_a_held_device_is_never_given_to_a_second_group() -> None:
    b = book("n1")
    b.reserve(A, "n1", {GPU: ["1"]})
    with pytest.raises(ledger.DeviceConflict) as exc:
        b.reserve(B, "n1", {GPU: ["0", "1"]})
    assert (exc.value.node, exc.value.resource, exc.value.device, exc.value.holder) == ("n1", GPU, "1", A)
    assert "held by group ml/a" in str(exc.value)
    assert b.allocation(B) is None and b.free_devices("n1", GPU) == ("0", "2", "3")  # nothing half-done


@pytest.mark.parametrize(
    ("node", "devices", "fragment"),
    [
        ("n1", {GPU: ["9"]}, "not offered by the node's inventory"),
        ("n1", {"amd.com/gpu": ["0"]}, "not offered"),
        ("nowhere", {GPU: ["0"]}, "node is not in the inventory"),
    ],
)
def test_unknown_devices_cannot_be_reserved(node: str, devices: dict[str, list[str]], fragment: str) -> None:
    with pytest.raises(ledger.DeviceConflict, match=fragment) as exc:
        book("n1").reserve(A, node, devices)
    assert exc.value.holder is None


def test_reserve_is_idempotent_and_a_group_holds_one_allocation() -> None:
    b = book("n1", "n2")
    first = b.reserve(A, "n1", {GPU: ["0"]})
    rev = b.revision
    assert b.reserve(A, "n1", {GPU: ["0"]}) is first
    assert b.revision == rev  # no change, no bump
    with pytest.raises(ledger.DeviceConflict, match="already holds"):
        b.reserve(A, "n2", {GPU: ["0"]})
    with pytest.raises(ValueError, match="repeat"):
        b.reserve(B, "n1", {GPU: ["1", "1"]})


def test_commit_without_reservation_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        book("n1").commit(A)


def test_every_change_bumps_the_revision() -> None:
    b = ledger.DeviceLedger()
    seen = [b.revision]

    def bumped() -> bool:
        seen.append(b.revision)
        return seen[-1] > seen[-2]

    b.upsert_node(builders.node("n1"))
    assert bumped()
    b.upsert_node(builders.node("n1"))
    assert not bumped()  # same inventory
    b.account_pod(("ns", "p"), "n1", 100, 10)
    assert bumped()
    b.account_pod(("ns", "p"), "n1", 100, 10)
    assert not bumped()
    b.reserve(A, "n1", {GPU: ["0"]})
    assert bumped()
    b.commit(A)
    assert bumped()
    b.release(A)
    assert bumped()
    b.forget_pod(("ns", "p"))
    assert bumped()
    b.remove_node("n1")
    assert bumped()
    b.rebuild([])
    assert bumped()


def test_pod_usage_is_an_idempotent_upsert() -> None:
    b = book("n1")
    b.account_pod(("ns", "p"), "n1", 500, 100)
    b.account_pod(("ns", "q"), "n1", 250, 50)
    b.account_pod(("ns", "p"), "n1", 1000, 200)  # resized
    assert b.used("n1") == (1250, 250)
    b.account_pod(("ns", "p"), "n2", 1000, 200)  # moved (a recreated pod with the same name)
    assert b.used("n1") == (250, 50) and b.used("n2") == (1000, 200)
    b.forget_pod(("ns", "q"))
    b.forget_pod(("ns", "unknown"))
    assert b.used("n1") == (0, 0)
    assert b.snapshot().nodes["n1"].cpu_used == 0


def test_devices_that_vanish_while_held_stay_held_and_are_reported() -> None:
    b = book("n1")
    b.reserve(A, "n1", {GPU: ["2", "3"]})
    b.upsert_node(builders.node("n1", gpus=2))  # the device plugin now reports 2 GPUs
    assert b.free_devices("n1", GPU) == ("0", "1")
    assert b.capacity("n1", GPU) == 2
    assert any("nvidia.com/gpu=3" in p and "ml/a" in p for p in b.problems())
    b.upsert_node(builders.node("n1", gpus=4))  # they come back: still A's, not free
    assert b.free_devices("n1", GPU) == ("0", "1")
    assert b.problems() == ()


def test_removing_a_node_keeps_its_allocations_until_released() -> None:
    b = book("n1")
    b.reserve(A, "n1", {GPU: ["0"]})
    b.remove_node("n1")
    assert b.node("n1") is None and b.allocation(A) is not None
    assert b.holder("n1", GPU, "0") == A
    b.upsert_node(builders.node("n1"))
    assert b.free_devices("n1", GPU) == ("1", "2", "3")
    b.release(A)
    assert b.free_devices("n1", GPU) == ("0", "1", "2", "3")


def test_snapshot_is_immutable_and_cached_per_revision() -> None:
    b = book("n1", "n2")
    snap = b.snapshot()
    assert b.snapshot() is snap
    b.reserve(A, "n1", {GPU: ["0", "1", "2"]})
    assert snap.nodes["n1"].free[GPU] == ("0", "1", "2", "3")  # the old view did not move
    assert list(snap.candidates(GPU, 2)) == ["n1", "n2"]
    fresh = b.snapshot()
    assert fresh.revision > snap.revision
    assert fresh.nodes["n1"].free[GPU] == ("3",)
    assert list(fresh.candidates(GPU, 1)) == ["n1", "n2"]  # fewest free first
    assert list(fresh.candidates(GPU, 1, descending=True)) == ["n2", "n1"]
    assert list(fresh.candidates(GPU, 2)) == ["n2"]


@pytest.mark.parametrize(
    "change",
    [{"shared": False}, {"ready": False}, {"unschedulable": True}, {"problems": ("bad annotation",)}],
)
def test_closed_nodes_leave_the_index(change: dict[str, object]) -> None:
    b = book("n1", "n2")
    b.upsert_node(builders.node("n1", **change))  # type: ignore[arg-type]
    assert list(b.snapshot().candidates(GPU, 1)) == ["n2"]
    b.upsert_node(builders.node("n1"))
    assert list(b.snapshot().candidates(GPU, 1)) == ["n1", "n2"]


# --- rebuild ------------------------------------------------------------------------------------


def claim(group: tuple[str, str], node: str, ids: list[str], source: str = "") -> ledger.Claim:
    return ledger.Claim(group, node, {GPU: ids}, source or f"status of {group[0]}/{group[1]}")


def test_rebuild_replaces_everything_with_committed_allocations() -> None:
    b = book("n1", "n2")
    b.reserve(C, "n2", {GPU: ["0"]})  # in flight, not in the API: dropped
    report = b.rebuild(
        [claim(A, "n1", ["0", "1"]), claim(A, "n1", ["0", "1"], "pod ml/a-0"), claim(B, "n2", ["3"])]
    )
    assert report == ledger.RebuildReport(allocations=2, conflicts=(), problems=())
    assert [a.group for a in b.allocations()] == [A, B]
    assert all(a.state is ledger.AllocationState.COMMITTED for a in b.allocations())
    assert b.free_devices("n1", GPU) == ("2", "3") and b.free_devices("n2", GPU) == ("0", "1", "2")


def test_rebuild_reports_a_device_claimed_twice_and_keeps_it_held_by_both() -> None:
    b = book("n1")
    report = b.rebuild([claim(A, "n1", ["0", "1"]), claim(B, "n1", ["1", "2"])])
    assert report.conflicts == (ledger.ClaimConflict("n1", GPU, "1", (A, B)),)
    assert b.holders("n1", GPU, "1") == (A, B)
    assert b.free_devices("n1", GPU) == ("3",)
    assert b.contested() == report.conflicts
    with pytest.raises(ledger.DeviceConflict):
        b.reserve(C, "n1", {GPU: ["1"]})
    b.release(A)
    assert b.holders("n1", GPU, "1") == (B,) and b.free_devices("n1", GPU) == ("0", "3")
    with pytest.raises(ledger.DeviceConflict):
        b.reserve(C, "n1", {GPU: ["1"]})
    b.release(B)
    assert b.reserve(C, "n1", {GPU: ["1"]}).devices == {GPU: ("1",)}
    assert b.contested() == ()


def test_rebuild_status_beats_pods_of_the_same_group() -> None:
    b = book("n1")
    report = b.rebuild([claim(A, "n1", ["3"], "pod ml/a-0"), claim(A, "n1", ["0"])])
    assert b.allocation(A) is not None and b.allocation(A).devices == {GPU: ("0",)}  # type: ignore[union-attr]
    assert len(report.problems) == 1
    assert "pod ml/a-0" in report.problems[0] and "using status of ml/a" in report.problems[0]
    assert report.conflicts == ()


def test_rebuild_keeps_claims_on_unknown_nodes_and_devices_held() -> None:
    b = book("n1")
    report = b.rebuild([claim(A, "gone", ["0"]), claim(B, "n1", ["0", "7"])])
    assert report.allocations == 2
    assert any("unknown node gone" in p for p in report.problems)
    assert any("'7'" in p and "does not offer" in p for p in report.problems)
    assert b.holder("gone", GPU, "0") == A
    b.upsert_node(builders.node("gone"))
    assert b.free_devices("gone", GPU) == ("1", "2", "3")  # the node came back: A still holds 0
