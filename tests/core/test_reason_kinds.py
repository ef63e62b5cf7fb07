"""A group's unschedulable message reduced to the bounded ``reason`` label, from the real messages."""

from __future__ import annotations

import pytest
from tests.core import builders

from deviceshare.core import capacity, inventory, ledger, placement, reasonkinds, reasons
from deviceshare.operator import quotas

GPU = builders.GPU
GI = 1 << 30


def message_for(
    request: placement.GroupRequest, *nodes: inventory.NodeInfo, pod: inventory.PodDemand | None = None
) -> str:
    book = ledger.DeviceLedger()
    for n in nodes:
        book.upsert_node(n)
    got = placement.schedule_group(book, request, pod or inventory.PodDemand())
    assert isinstance(got, placement.Unschedulable), got
    return got.message()


def request(**kw: object) -> placement.GroupRequest:
    return placement.GroupRequest(key=("ns", "g"), **{"resources": {GPU: 2}, "node_selector": {}, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: message_for(request(resources={GPU: 9}), builders.node("a"), builders.node("b", shared=False)),
         reasonkinds.DEVICES),
        (lambda: message_for(request(node_selector={"model": "H100"}), builders.node("a")), reasonkinds.SELECTOR),
        (lambda: message_for(request(), builders.node("a", ready=False), builders.node("b", unschedulable=True)),
         reasonkinds.NOT_READY),
        (lambda: message_for(request(), builders.node("a", taints=(inventory.Taint("gpu", "x", "NoSchedule"),))),
         reasonkinds.TAINTS),
        (lambda: message_for(request(), builders.node("a"), pod=inventory.PodDemand(cpu_milli=99_000)),
         reasonkinds.CPU),
        (lambda: message_for(request(), builders.node("a"), pod=inventory.PodDemand(memory_bytes=999 * GI)),
         reasonkinds.MEMORY),
        (lambda: message_for(request(resources={GPU: 1}, share={GPU: capacity.Share(0, 8 * GI)}), builders.node("a")),
         reasonkinds.DEVICE_MEMORY),
        (lambda: message_for(request(resources={GPU: 1}, share={GPU: capacity.Share(0, 0, 1)}), builders.node("a")),
         reasonkinds.TILES),
        (lambda: message_for(request(resources={GPU: 1}, share={GPU: capacity.Share(0, 80 * GI)}),
                             builders.node("a", device_memory={GPU: 40 * GI})), reasonkinds.DEVICE_MEMORY),
        (lambda: message_for(request(), builders.node("a", shared=False)), reasonkinds.OTHER),
        (lambda: message_for(request()), reasonkinds.OTHER),
        (lambda: "2/3 member pods exist", reasonkinds.GANG_WAITING),
        (lambda: "anything else", reasonkinds.OTHER),
    ],
)
def test_each_message_the_scheduler_writes_has_its_kind(make: object, kind: str) -> None:
    message = make()  # type: ignore[operator]
    assert reasonkinds.kind_of(message) == kind, message


def test_compute_shortfall_on_a_shared_device() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=1))
    book.reserve(("ns", "other"), "a", {GPU: ["0"]}, {GPU: capacity.Share(800, 0)})
    got = placement.schedule_group(book, request(resources={GPU: 1}, share={GPU: capacity.Share(500, 0)}),
                                   inventory.PodDemand())
    assert isinstance(got, placement.Unschedulable)
    assert reasonkinds.kind_of(got.message()) == reasonkinds.COMPUTE, got.message()


def test_the_reason_that_rejected_most_nodes_wins_and_ties_go_to_the_first_kind() -> None:
    assert reasonkinds.kind_of(
        f"0/9 nodes are available: 2 {reasons.insufficient(GPU)}, 4 {reasons.NOT_READY}, 3 {reasons.NOT_SHARED}."
    ) == reasonkinds.NOT_READY
    assert reasonkinds.kind_of(
        f"0/4 nodes are available: 2 {reasons.GROUP_SELECTOR}, 2 {reasons.insufficient(GPU)}."
    ) == reasonkinds.DEVICES


def test_a_quota_refusal_is_the_quota_kind() -> None:
    from deviceshare.core import budget

    book = ledger.DeviceLedger()
    quota = budget.Quota(name="gpus", hard={GPU: 1})
    message = quotas.refusal(book, ("ns", "g"), {GPU: 2}, [quota])
    assert message is not None
    assert reasonkinds.kind_of(message) == reasonkinds.QUOTA, message
