"""Per-node device gauges kept as text per changed node: always what rendering every node afresh gives."""

from __future__ import annotations

import contextlib

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from prometheus_client.parser import text_string_to_metric_families

from deviceshare.core import capacity, ledger
from deviceshare.operator import nodemetrics
from tests.core import builders

GPU = builders.GPU
GI = 1 << 30
NODES = ("n0", "n1", "n2")
GROUPS = tuple(("ns", f"g{i}") for i in range(6))


def fresh(book: ledger.DeviceLedger) -> str:
    gauges = nodemetrics.NodeGauges()
    gauges.bind(book)
    return gauges.text()


class CachedEqualsFresh(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = ledger.DeviceLedger()
        self.gauges = nodemetrics.NodeGauges()
        self.gauges.bind(self.book)  # before any node: every node arrives as a change

    @rule(name=st.sampled_from(NODES), gpus=st.integers(1, 4), memory=st.booleans(), tiles=st.booleans())
    def upsert(self, name: str, gpus: int, memory: bool, tiles: bool) -> None:
        self.book.upsert_node(builders.node(name, gpus=gpus, device_memory={GPU: 40 * GI} if memory else None,
                                            device_tiles={GPU: 2} if tiles else None))  # fmt: skip

    @rule(name=st.sampled_from(NODES))
    def remove(self, name: str) -> None:
        self.book.remove_node(name)

    @rule(group=st.sampled_from(GROUPS), name=st.sampled_from(NODES), device=st.sampled_from("0123"),
          share=st.sampled_from([None, capacity.Share(250, 0), capacity.Share(0, 8 * GI), capacity.Share(0, 0, 1)]))
    def reserve(self, group: tuple[str, str], name: str, device: str, share: capacity.Share | None) -> None:
        tiles = {GPU: [f"{device}.0"]} if share is not None and share.tiles else None
        with contextlib.suppress(ledger.DeviceConflict, ValueError):  # taken, or not on this node
            self.book.reserve(group, name, {GPU: [device]}, {GPU: share} if share else None, tiles)

    @rule(group=st.sampled_from(GROUPS))
    def release(self, group: tuple[str, str]) -> None:
        self.book.release(group)

    @rule()
    def scrape(self) -> None:
        text = self.gauges.text()
        assert text == fresh(self.book)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) == {name for name, _ in nodemetrics.FAMILIES}
        for info in self.book.nodes():
            for resource, ids in info.devices.items():
                free = len(self.book.free_devices(info.name, resource))
                labels = {"node": info.name, "resource": resource}
                got = {s.name: s.value for f in families.values() for s in f.samples if s.labels == labels}
                assert got["deviceshare_devices_free"] == free
                assert got["deviceshare_devices_allocated"] == len(ids) - free

    def teardown(self) -> None:
        self.scrape()


TestCachedEqualsFresh = CachedEqualsFresh.TestCase
TestCachedEqualsFresh.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_a_standby_exports_the_families_without_samples() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("n0"))
    leading = [False]
    gauges = nodemetrics.NodeGauges(active=lambda: leading[0])
    gauges.bind(book)
    assert all(not f.samples for f in text_string_to_metric_families(gauges.text()))
    leading[0] = True
    assert 'deviceshare_devices_free{node="n0",resource="nvidia.com/gpu"} 4.0' in gauges.text()
