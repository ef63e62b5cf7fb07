"""Counting why nothing fits per class of alike nodes says what asking every node says (random clusters).

Each seed builds a cluster through the real ledger (open, cordoned, not ready, tainted, not shared and
broken nodes; whole and shared devices of declared or undeclared memory and tiles; pods of random CPU
and memory, some nodes overcommitted) and asks, after every change of a random sequence of placements,
releases and node updates, why random requests fit nowhere: :func:`placement.explain` (per class,
the classes following the snapshots) must count what :func:`placement.explain_each` counts.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from tests.core import builders

from deviceshare.core import capacity, inventory, ledger, placement

GPU = builders.GPU
GI = 1 << 30
TAINT = inventory.Taint("dedicated", "ml", "NoSchedule")


def _node(rng: random.Random, name: str) -> inventory.NodeInfo:
    info = builders.node(
        name, gpus=rng.choice((0, 2, 4)), cpu_milli=rng.choice((4000, 8000)), memory_bytes=rng.choice((8, 32)) * GI,
        device_memory={GPU: 40 * GI} if rng.random() < 0.7 else None,
        device_tiles={GPU: 4} if rng.random() < 0.3 else None,
        shared=rng.random() < 0.9, ready=rng.random() < 0.9, unschedulable=rng.random() < 0.1,
        taints=(TAINT,) if rng.random() < 0.15 else (), problems=("bad inventory",) if rng.random() < 0.05 else (),
    )
    return dataclasses.replace(info, mps_ready=rng.random() < 0.5)


def _request(rng: random.Random, key: inventory.GroupKey) -> placement.GroupRequest:
    mps = rng.random() < 0.2
    if rng.random() < 0.5:
        return placement.GroupRequest(key, {GPU: rng.choice((1, 2, 3, 5))}, {}, mps=mps)
    share = rng.choice((capacity.Share(250), capacity.Share(750), capacity.Share(250, 20 * GI),
                        capacity.Share(0, 30 * GI), capacity.Share(tiles=rng.choice((1, 3)))))
    return placement.GroupRequest(key, {GPU: rng.choice((1, 2))}, {}, share={GPU: share}, mps=mps)


def _pod(rng: random.Random) -> inventory.PodDemand:
    tolerations = (inventory.Toleration("dedicated", "Exists", "", ""),) if rng.random() < 0.3 else ()
    return inventory.PodDemand(rng.choice((0, 1000, 3000, 7000)), rng.choice((0, 4, 16)) * GI, tolerations=tolerations)


def _agree(book: ledger.DeviceLedger, rng: random.Random, asked: list[int]) -> None:
    snapshot = book.snapshot()
    assert snapshot.filter_classes is not None
    for i in range(3):
        request, pod = _request(rng, ("ask", f"r{i}")), _pod(rng)
        expected = placement.explain_each(snapshot, request, pod)
        assert placement.explain(snapshot, request, pod) == expected
        asked[0] += 1


@pytest.mark.parametrize("seed", range(40))
def test_counting_per_class_equals_asking_every_node(seed: int) -> None:
    rng = random.Random(seed)
    book = ledger.DeviceLedger()
    names = [f"n{i}" for i in range(rng.choice((3, 8, 20)))]
    for name in names:
        book.upsert_node(_node(rng, name))
    asked, bound = [0], []
    for step in range(30):
        roll = rng.random()
        if roll < 0.6:
            key = ("ns", f"g{step}")
            pod = _pod(rng)
            decision = placement.schedule_group(book, _request(rng, key), dataclasses.replace(pod, tolerations=()))
            if not isinstance(decision, placement.Unschedulable):
                book.account_pod(("ns", f"g{step}-0"), decision.node, pod.cpu_milli + rng.choice((0, 6000)), 0)
                bound.append(key)
        elif roll < 0.8 and bound:
            key = bound.pop(rng.randrange(len(bound)))
            book.release(key)
            book.forget_pod((key[0], f"{key[1]}-0"))
        elif roll < 0.85:  # a pod of another scheduler, sometimes more than the node has (overcommitted)
            cpu, memory = rng.choice((2000, 9000)), rng.choice((0, 40)) * GI
            book.account_pod(("other", f"p{step}"), rng.choice(names), cpu, memory)
        elif roll < 0.9:
            book.upsert_node(_node(rng, rng.choice(names)))
        else:
            book.remove_node(name := rng.choice(names))
            book.upsert_node(_node(rng, name))
        _agree(book, rng, asked)
    assert asked[0] == 90


def test_a_request_that_reads_labels_is_asked_node_by_node() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a", gpus=1, labels={"zone": "x"}))
    book.upsert_node(builders.node("b", gpus=1))
    book.reserve(("ns", "full"), "a", {GPU: ("0",)})
    snapshot = book.snapshot()
    request = placement.GroupRequest(("ns", "g"), {GPU: 1}, {"zone": "x"})
    pod = inventory.PodDemand(cpu_milli=100_000)

    unschedulable = placement.explain(snapshot, request, pod)

    assert unschedulable.reasons == {"insufficient nvidia.com/gpu": 1, "node(s) didn't match group nodeSelector": 1}
    assert snapshot.filter_classes is not None
    assert snapshot.filter_classes.explain(snapshot, request.node_selector, pod, lambda s: None) is None


def test_a_full_cluster_is_a_few_classes() -> None:
    book = ledger.DeviceLedger()
    for i in range(50):
        book.upsert_node(builders.node(f"n{i:02d}", gpus=2))
        book.reserve(("ns", f"g{i}"), f"n{i:02d}", {GPU: ("0", "1")})
        book.account_pod(("ns", f"p{i}"), f"n{i:02d}", 100 * i, 0)
    snapshot = book.snapshot()
    request = placement.GroupRequest(("ns", "g"), {GPU: 1}, {})

    unschedulable = placement.explain(snapshot, request, inventory.PodDemand(cpu_milli=1000))

    assert unschedulable.reasons == {"insufficient nvidia.com/gpu": 50}
    assert snapshot.filter_classes is not None and snapshot.filter_classes.classes == 1
