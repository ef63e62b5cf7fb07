"""Placement: which node a new group gets, which devices, and why not when it gets none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core import builders

from deviceshare.api import models
from deviceshare.core import inventory, ledger, placement, reasons

GPU = builders.GPU
AMD = "amd.com/gpu"
ANY_POD = inventory.PodDemand()


def cluster(free: Mapping[str, int], total: int = 8) -> ledger.DeviceLedger:
    """Nodes with ``total`` GPUs of which ``free[name]`` are free (the rest held by filler groups)."""
    book = ledger.DeviceLedger()
    for name, n in free.items():
        book.upsert_node(builders.node(name, gpus=total))
        if total - n:
            book.reserve(("fill", name), name, {GPU: [str(i) for i in range(total - n)]})
    return book


def request(
    n: int = 1, strategy: str = "binpack", extra: Mapping[str, int] | None = None
) -> placement.GroupRequest:
    return placement.GroupRequest(("ml", "g"), {GPU: n, **(extra or {})}, {}, strategy)


@pytest.mark.parametrize(
    ("free", "need", "strategy", "node"),
    [
        ({"a": 8, "b": 3, "c": 5}, 2, "binpack", "b"),
        ({"a": 8, "b": 3, "c": 5}, 4, "binpack", "c"),
        ({"a": 8, "b": 3, "c": 5}, 2, "spread", "a"),
        ({"a": 8, "b": 3, "c": 5}, 6, "spread", "a"),
        ({"b": 4, "a": 4, "c": 4}, 1, "binpack", "a"),  # ties: first name
        ({"b": 4, "a": 4, "c": 4}, 1, "spread", "a"),
        ({"a": 1, "b": 2}, 2, "binpack", "b"),
        ({"a": 0, "b": 8}, 1, "binpack", "b"),
    ],
)
def test_strategy_picks_the_node(free: dict[str, int], need: int, strategy: str, node: str) -> None:
    decision = placement.place_group(cluster(free), request(need, strategy), ANY_POD)
    assert isinstance(decision, placement.Placement)
    assert decision.node == node
    assert len(decision.devices[GPU]) == need


def test_binpack_skips_a_fuller_node_that_fails_a_filter() -> None:
    book = cluster({"a": 2, "b": 6})
    book.upsert_node(builders.node("a", gpus=8, taints=(inventory.Taint("team", "x", "NoSchedule"),)))
    decision = placement.place_group(book, request(1), ANY_POD)
    assert isinstance(decision, placement.Placement) and decision.node == "b"
    tolerant = inventory.PodDemand(tolerations=(inventory.Toleration("team", "Equal", "x", ""),))
    decision = placement.place_group(book, request(1), tolerant)
    assert isinstance(decision, placement.Placement) and decision.node == "a"


def test_several_resources_are_scored_together() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=2, extra={AMD: ("0", "1", "2", "3")}))
    book.upsert_node(builders.node("b", gpus=4, extra={AMD: ("0",)}))
    book.upsert_node(builders.node("c", gpus=8, extra={AMD: ("0", "1")}))
    # free after placement (gpu + amd): a 0+3, b 2+0, c 6+1
    decision = placement.place_group(book, request(2, extra={AMD: 1}), ANY_POD)
    assert isinstance(decision, placement.Placement)
    assert decision.node == "b" and decision.devices == {AMD: ("0",), GPU: ("0", "1")}
    spread = placement.place_group(book, request(2, "spread", extra={AMD: 2}), ANY_POD)
    assert isinstance(spread, placement.Placement) and spread.node == "c"
    too_many = placement.place_group(book, request(9, extra={AMD: 2}), ANY_POD)
    assert isinstance(too_many, placement.Unschedulable)  # a node counts under its first short resource
    assert too_many.reasons == {"insufficient amd.com/gpu": 1, "insufficient nvidia.com/gpu": 2}


@pytest.mark.parametrize(
    ("offered", "free", "count", "chosen"),
    [
        ("01234567", "01234567", 2, "01"),
        ("01234567", "1357", 2, "13"),  # no run: the lowest
        ("01234567", "0134567", 2, "01"),  # shortest fitting run
        ("01234567", "0124567", 3, "012"),
        ("01234567", "0234567", 2, "23"),
        ("01234567", "0145", 2, "01"),  # equal runs: the first
        ("01234567", "012567", 3, "012"),
        ("01234567", "01256", 1, "5"),  # a single device from the shorter run keeps 0-2 whole
        ("01234567", "0123", 4, "0123"),
        ("01234567", "", 0, ""),
        ("76543210", "7531", 2, "75"),  # inventory order, not ID order
        ("7654", "765", 2, "76"),
    ],
)
def test_device_choice(offered: str, free: str, count: int, chosen: str) -> None:
    assert placement.choose_devices(tuple(offered), tuple(free), count) == tuple(chosen)


def test_device_choice_uses_inventory_order_for_uuids() -> None:
    offered = ("GPU-c", "GPU-a", "GPU-d", "GPU-b")
    assert placement.choose_devices(offered, ("GPU-c", "GPU-d", "GPU-b"), 2) == ("GPU-d", "GPU-b")


@pytest.mark.parametrize(
    ("counted", "total", "message"),
    [
        (
            {"not in shared mode": 5, "insufficient nvidia.com/gpu": 7},
            12,
            "0/12 nodes are available: 7 insufficient nvidia.com/gpu, 5 not in shared mode.",
        ),
        ({reasons.NOT_READY: 1}, 1, "0/1 nodes are available: 1 node(s) not ready."),
        ({}, 0, "0/0 nodes are available: no nodes in the cluster."),
    ],
)
def test_unschedulable_message(counted: dict[str, int], total: int, message: str) -> None:
    assert placement.Unschedulable(counted, total).message() == message


def test_a_full_cluster_explains_every_node_once() -> None:
    book = cluster({f"gpu-{i}": 1 for i in range(7)})
    for i in range(5):
        book.upsert_node(builders.node(f"cpu-{i}", shared=False))
    decision = placement.place_group(book, request(2), ANY_POD)
    assert isinstance(decision, placement.Unschedulable)
    assert (
        decision.message() == "0/12 nodes are available: 7 insufficient nvidia.com/gpu, 5 not in shared mode."
    )


def test_empty_cluster() -> None:
    decision = placement.place_group(ledger.DeviceLedger(), request(1), ANY_POD)
    assert isinstance(decision, placement.Unschedulable)
    assert decision.message() == "0/0 nodes are available: no nodes in the cluster."


def test_group_request_from_spec() -> None:
    spec = models.GroupSpec.model_validate(
        {"resources": {GPU: 2}, "nodeSelector": {"model": "A100"}, "schedulingStrategy": "spread"}
    )
    got = placement.GroupRequest.from_spec(("ml", "t"), spec)
    assert got == placement.GroupRequest(("ml", "t"), {GPU: 2}, {"model": "A100"}, "spread")


def test_schedule_group_reserves_and_is_idempotent() -> None:
    book = cluster({"a": 4})
    first = placement.schedule_group(book, request(2), ANY_POD)
    assert isinstance(first, ledger.Allocation) and first.state is ledger.AllocationState.RESERVED
    assert book.free_devices("a", GPU) == ("6", "7")
    assert placement.schedule_group(book, request(2), ANY_POD) == first


class StaleOnce(ledger.DeviceLedger):
    """Hands out one snapshot taken earlier, as if another scheduler thread raced us."""

    stale: ledger.LedgerSnapshot | None = None

    def snapshot(self) -> ledger.LedgerSnapshot:
        stale, self.stale = self.stale, None
        return stale if stale is not None else super().snapshot()


def test_schedule_group_retries_on_a_fresh_snapshot_when_raced() -> None:
    book = StaleOnce()
    book.upsert_node(builders.node("a", gpus=4))
    book.upsert_node(builders.node("b", gpus=8))
    book.stale = book.snapshot()
    book.reserve(("other", "x"), "a", {GPU: ["0", "1"]})  # lands after the stale snapshot
    got = placement.schedule_group(book, request(3), ANY_POD)
    assert isinstance(got, ledger.Allocation)
    assert got.node == "b"  # a has only 2 free now


def test_schedule_group_reports_unschedulable() -> None:
    got = placement.schedule_group(cluster({"a": 1}), request(2), ANY_POD)
    assert isinstance(got, placement.Unschedulable)
    assert got.reasons == {"insufficient nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    ("node", "pod", "reason"),
    [
        (builders.node("a", unschedulable=True), ANY_POD, None),  # cordon stops new groups, not members
        (builders.node("a", shared=False), ANY_POD, None),
        (builders.node("a", ready=False), ANY_POD, reasons.NOT_READY),
        (
            builders.node("a", taints=(inventory.Taint("t", "v", "NoExecute"),)),
            ANY_POD,
            "node(s) had untolerated taint {t: v}",
        ),
        (builders.node("a"), inventory.PodDemand(node_selector={"zone": "x"}), reasons.NODE_AFFINITY),
        (builders.node("a", cpu_milli=1500), inventory.PodDemand(cpu_milli=1000), reasons.INSUFFICIENT_CPU),
        (builders.node("a"), inventory.PodDemand(memory_bytes=32 << 30), reasons.INSUFFICIENT_MEMORY),
    ],
)
def test_check_member(node: inventory.NodeInfo, pod: inventory.PodDemand, reason: str | None) -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(node)
    book.account_pod(("ns", "running"), "a", 1000, 1 << 30)
    got = placement.check_member(book, "a", pod)
    assert (got.reasons if got else None) == ({reason: 1} if reason else None)


def test_check_member_on_a_vanished_node() -> None:
    got = placement.check_member(ledger.DeviceLedger(), "gone", ANY_POD)
    assert got is not None and got.message() == "0/1 nodes are available: 1 node(s) were not found."


# --- the indexed walk agrees with the naive scan --------------------------------------------------

node_specs = st.fixed_dictionaries(
    {
        "gpus": st.integers(0, 8),
        "amd": st.integers(0, 3),
        "shared": st.booleans() | st.just(True),
        "ready": st.just(True) | st.booleans(),
        "unschedulable": st.just(False) | st.booleans(),
        "tainted": st.just(False) | st.booleans(),
        "zone": st.sampled_from(["a", "b"]),
        "cpu": st.integers(0, 4),
        "held": st.integers(0, 8),
    }
)


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(node_specs, min_size=0, max_size=12),
    need=st.integers(1, 4),
    amd=st.integers(0, 2),
    strategy=st.sampled_from(["binpack", "spread"]),
    selector=st.sampled_from([{}, {"zone": "a"}]),
    pod_zone=st.sampled_from([None, "b"]),
    cpu=st.integers(0, 3),
    tolerate=st.booleans(),
)
def test_indexed_placement_equals_the_linear_scan(
    specs: Sequence[dict[str, int]],
    need: int,
    amd: int,
    strategy: str,
    selector: dict[str, str],
    pod_zone: str | None,
    cpu: int,
    tolerate: bool,
) -> None:
    book = ledger.DeviceLedger()
    for i, s in enumerate(specs):
        name = f"n{(i * 7) % 13:02d}-{i}"
        book.upsert_node(
            builders.node(
                name,
                gpus=s["gpus"],
                extra={AMD: tuple(str(d) for d in range(s["amd"]))},
                shared=bool(s["shared"]),
                ready=bool(s["ready"]),
                unschedulable=bool(s["unschedulable"]),
                taints=(inventory.Taint("t", "", "NoSchedule"),) if s["tainted"] else (),
                labels={"zone": str(s["zone"])},
                cpu_milli=s["cpu"] * 1000,
            )
        )
        held = min(s["held"], s["gpus"])
        if held:
            book.reserve(("fill", name), name, {GPU: [str(d) for d in range(0, held)]})
    pod = inventory.PodDemand(
        cpu_milli=cpu * 1000,
        node_selector={"zone": pod_zone} if pod_zone else {},
        tolerations=(inventory.Toleration("t", "Exists", "", ""),) if tolerate else (),
    )
    req = placement.GroupRequest(("ml", "g"), {GPU: need, **({AMD: amd} if amd else {})}, selector, strategy)
    snap = book.snapshot()
    assert placement.place_on(snap, req, pod) == placement.place_linear(snap, req, pod)
