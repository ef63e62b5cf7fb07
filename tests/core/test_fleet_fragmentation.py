"""The fragmentation gauge: FGD's measure over the open nodes, kept incrementally from the ledger's changes.

The property that matters: after any sequence of ledger changes (reservations whole and shared,
releases, pods' CPU, nodes cordoned, lost, added) and workload changes, read at any moments, the
incremental value equals a full recomputation over the ledger's nodes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from tests.core import builders

from deviceshare.core import capacity, fleetfragmentation, ledger
from deviceshare.core import fragmentation as frag

GPU = builders.GPU
NPU = "vendor.example/npu"
GI = 1 << 30
NODES = ("n0", "n1", "n2", "n3")
GROUPS = tuple(("ns", f"g{i}") for i in range(10))

WHOLE = frag.Shape(1000, 1000, 1, GPU)
PAIR = frag.Shape(2000, 1000, 2, GPU)
THIRD = frag.Shape(500, 300, 1, GPU)
NPU_ONE = frag.Shape(1000, 1000, 1, NPU)
WORKLOADS = (
    (),
    (frag.WeightedShape(WHOLE, 1.0),),
    (frag.WeightedShape(WHOLE, 0.5), frag.WeightedShape(THIRD, 0.5)),
    (frag.WeightedShape(PAIR, 0.25), frag.WeightedShape(THIRD, 0.5), frag.WeightedShape(NPU_ONE, 0.25)),
)


def node(name: str, **kw: Any) -> Any:
    return builders.node(name, gpus=4, extra={NPU: ("a", "b")}, device_memory={GPU: 40 * GI}, **kw)


def rates(book: ledger.DeviceLedger, workload: fleetfragmentation.Workload) -> dict[str, float]:
    return fleetfragmentation.recompute(book.snapshot().nodes.values(), workload)


class IncrementalEqualsFullScan(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = ledger.DeviceLedger()
        for name in NODES:
            self.book.upsert_node(node(name))
        self.gauge = fleetfragmentation.FleetFragmentation()
        self.book.subscribe(self.gauge.node_changed)  # subscribed after nodes exist: it is told them at once
        self.workload: fleetfragmentation.Workload = WORKLOADS[2]

    @rule(group=st.sampled_from(GROUPS), name=st.sampled_from(NODES),
          devices=st.sets(st.sampled_from("0123"), min_size=1, max_size=3),
          compute=st.sampled_from([0, 250, 300, 500, 1000]), npu=st.booleans())
    def reserve(self, group: tuple[str, str], name: str, devices: set[str], compute: int, npu: bool) -> None:
        share = {GPU: capacity.Share(compute, 0)} if compute else None
        wanted = {GPU: sorted(devices), **({NPU: ["a"]} if npu else {})}
        with contextlib.suppress(ledger.DeviceConflict, ValueError):  # taken, or not this node's
            self.book.reserve(group, name, wanted, share)

    @rule(group=st.sampled_from(GROUPS))
    def release(self, group: tuple[str, str]) -> None:
        self.book.release(group)

    @rule(pod=st.integers(0, 5), name=st.sampled_from(NODES), cpu=st.sampled_from([0, 500, 2000, 7000]))
    def account_pod(self, pod: int, name: str, cpu: int) -> None:
        self.book.account_pod(("ns", f"p{pod}"), name, cpu, 0)

    @rule(pod=st.integers(0, 5))
    def forget_pod(self, pod: int) -> None:
        self.book.forget_pod(("ns", f"p{pod}"))

    @rule(name=st.sampled_from(NODES), cordoned=st.booleans(), ready=st.booleans(), shared=st.booleans())
    def change_node(self, name: str, cordoned: bool, ready: bool, shared: bool) -> None:
        self.book.upsert_node(node(name, unschedulable=cordoned, ready=ready, shared=shared))

    @rule(name=st.sampled_from(NODES))
    def remove_node(self, name: str) -> None:
        self.book.remove_node(name)

    @rule(workload=st.sampled_from(WORKLOADS))
    def change_workload(self, workload: fleetfragmentation.Workload) -> None:
        self.workload = workload

    @rule()
    def read(self) -> None:
        got = self.gauge.rates(self.workload)
        assert got == pytest.approx(rates(self.book, self.workload), abs=1e-9)
        assert all(0.0 <= v <= 1.0 for v in got.values())

    def teardown(self) -> None:
        self.read()


TestIncrementalEqualsFullScan = IncrementalEqualsFullScan.TestCase
TestIncrementalEqualsFullScan.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_node_with_a_third_used_gpu_is_fragmented_for_whole_gpu_groups_only() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("n0", gpus=2, device_memory={GPU: 40 * GI}))
    gauge = fleetfragmentation.FleetFragmentation()
    book.subscribe(gauge.node_changed)
    book.reserve(("ns", "third"), "n0", {GPU: ["0"]}, {GPU: capacity.Share(300, 0)})
    # idle: 700 on device 0 and 1000 on device 1; a whole-GPU group cannot use the 700
    assert gauge.rates((frag.WeightedShape(WHOLE, 1.0),)) == {GPU: pytest.approx(700 / 1700)}
    # a 0.3-GPU group can use every idle milli that is at least 300
    assert gauge.rates((frag.WeightedShape(THIRD, 1.0),)) == {GPU: 0.0}
    book.release(("ns", "third"))
    assert gauge.rates((frag.WeightedShape(WHOLE, 1.0),)) == {GPU: 0.0}


def test_only_open_nodes_count_and_a_resource_is_measured_against_its_own_groups() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(node("open"))
    book.upsert_node(node("cordoned", unschedulable=True))
    gauge = fleetfragmentation.FleetFragmentation()
    book.subscribe(gauge.node_changed)
    book.reserve(("ns", "g"), "cordoned", {GPU: ["0"]}, {GPU: capacity.Share(500, 0)})
    mix = (frag.WeightedShape(WHOLE, 0.5), frag.WeightedShape(NPU_ONE, 0.5))
    # the half-used GPU is on a cordoned node: not counted; NPU shapes do not weigh on the GPUs
    assert gauge.rates(mix) == {GPU: 0.0, NPU: 0.0}
    book.reserve(("ns", "h"), "open", {GPU: ["1"]}, {GPU: capacity.Share(500, 0)})
    assert gauge.rates(mix) == {GPU: pytest.approx(500 / 3500), NPU: 0.0}
    book.remove_node("open")
    assert gauge.rates(mix) == {}
