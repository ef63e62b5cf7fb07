"""Placement with what the node agent tells (CONTRACT §9): links break ties, unhealthy devices are never
given, and a share enforced by MPS goes only where MPS runs."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core import builders
from tests.core.test_topology import topology_of
from tests.nodeagent import servers

from deviceshare.core import capacity, fgdplacement, inventory, ledger, linkscore, placement, reasons, workloadmix
from deviceshare.core import fragmentation as frag
from deviceshare.core import topology as topologies

GPU = builders.GPU
POD = inventory.PodDemand()


def linked(name: str, server: servers.Server, **facts: object) -> inventory.NodeInfo:
    ids, topo = topology_of(server)
    return dataclasses.replace(builders.node(name, gpus=ids), topology={GPU: topo}, **facts)  # type: ignore[arg-type]


def request(name: str, count: int, strategy: str = "binpack", **kw: object) -> placement.GroupRequest:
    return placement.GroupRequest(("ns", name), {GPU: count}, {}, strategy, **kw)  # type: ignore[arg-type]


def test_among_equally_scored_nodes_a_pair_goes_where_it_is_nvlinked() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(linked("a-pcie", servers.PCIE_2SOCKET_4))
    book.upsert_node(linked("b-nvlink", servers.NVLINK_PAIRS_2X2))
    got = placement.place_group(book, request("pair", 2), POD)
    assert isinstance(got, placement.Placement)
    assert got.node == "b-nvlink" and got.devices[GPU] == ("g0", "g1")


def test_a_better_score_still_beats_better_links() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(linked("a-pcie", servers.PCIE_2SOCKET_4))
    book.upsert_node(linked("b-nvlink", servers.NVLINK_PAIRS_2X2))
    book.reserve(("ns", "one"), "a-pcie", {GPU: ["g0"]})
    got = placement.place_group(book, request("pair", 2), POD)  # binpack: a has fewer left
    assert isinstance(got, placement.Placement) and got.node == "a-pcie"
    assert got.devices[GPU] == ("g2", "g3")  # and there, the pair on one socket
    spread = placement.place_group(book, request("pair", 2, "spread"), POD)
    assert isinstance(spread, placement.Placement) and spread.node == "b-nvlink"


@pytest.mark.parametrize(("position", "chosen"), [(linkscore.WINDOW - 1, "n15"), (linkscore.WINDOW, "n00")])
def test_the_tie_is_broken_among_the_first_window_of_feasible_nodes(position: int, chosen: str) -> None:
    book = ledger.DeviceLedger()
    for i in range(linkscore.WINDOW + 4):
        book.upsert_node(linked(f"n{i:02d}", servers.NVLINK_PAIRS_2X2 if i == position else servers.PCIE_2SOCKET_4))
    got = placement.place_group(book, request("pair", 2), POD)
    assert isinstance(got, placement.Placement) and got.node == chosen
    assert placement.place_linear(book.snapshot(), request("pair", 2), POD) == got


def test_without_any_topology_decisions_are_the_ones_of_before() -> None:
    book = ledger.DeviceLedger()
    for name in ("b", "a", "c"):
        book.upsert_node(builders.node(name, gpus=4))
    assert book.snapshot().linked_nodes == 0
    got = placement.place_group(book, request("four", 2), POD)
    assert isinstance(got, placement.Placement) and (got.node, got.devices[GPU]) == ("a", ("0", "1"))


def _random_cluster(rng: random.Random, nodes: int) -> ledger.DeviceLedger:
    book = ledger.DeviceLedger()
    for i in range(nodes):
        server = rng.choice([*servers.ALL, None])
        if server is None:
            info = builders.node(f"n{i:02d}", gpus=rng.choice((2, 4, 8)))
        else:
            info = linked(f"n{i:02d}", server)
        ids = info.devices[GPU]
        sick = frozenset(d for d in ids if rng.random() < 0.1)
        book.upsert_node(dataclasses.replace(info, unhealthy={GPU: sick} if sick else {}))
    return book


def _requests(rng: random.Random, n: int) -> list[placement.GroupRequest]:
    out = []
    for i in range(n):
        if rng.random() < 0.25:
            share = capacity.Share(rng.choice((250, 500)))
            out.append(request(f"s{i}", rng.choice((1, 2)), rng.choice(("binpack", "spread")), share={GPU: share}))
        else:
            out.append(request(f"g{i}", rng.choice((1, 2, 2, 3, 4, 8)), rng.choice(("binpack", "spread", "fgd"))))
    return out


def _fgd() -> fgdplacement.FGDPlacement:
    shapes = [frag.Shape(0, 1000, k, GPU) for k in (1, 2, 4)] + [frag.Shape(0, 500, 1, GPU)]
    return fgdplacement.FGDPlacement(workloadmix.ShapeHistogram.seeded(shapes))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_an_unhealthy_device_is_never_allocated_by_any_policy(seed: int) -> None:
    rng = random.Random(seed)
    book = _random_cluster(rng, rng.randint(2, 6))
    fgd = _fgd()
    live: list[tuple[str, str]] = []
    for req in _requests(rng, 30):
        policy = fgd.for_pod(POD) if req.strategy == "fgd" else None
        got = placement.schedule_group(book, req, POD, policy=policy)
        if isinstance(got, ledger.Allocation):
            sick = book.node(got.node).unhealthy.get(GPU, frozenset())  # type: ignore[union-attr]
            assert not sick & set(got.devices[GPU]), (got, sick)
            live.append(req.key)
        if live and rng.random() < 0.3:
            book.release(live.pop(rng.randrange(len(live))))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_indexed_decisions_equal_the_linear_reference_with_links_and_health(seed: int) -> None:
    rng = random.Random(seed)
    book = _random_cluster(rng, rng.randint(2, 24))
    fgd = _fgd()
    for req in _requests(rng, 25):
        snap = book.snapshot()
        if req.strategy == "fgd":
            fast = placement.place_by_policy(snap, req, POD, fgd.for_pod(POD))
            slow = placement.place_by_policy(snap, req, POD, fgd.naive_for_pod(POD))
        else:
            fast, slow = placement.place_on(snap, req, POD), placement.place_linear(snap, req, POD)
        assert fast == slow, req
        if isinstance(fast, placement.Placement):
            book.reserve(req.key, fast.node, fast.devices, req.share, fast.tiles)


def test_a_holder_keeps_a_device_that_fell_ill_and_nobody_new_gets_it() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("n", gpus=2))
    book.reserve(("ns", "holder"), "n", {GPU: ["0"]})
    book.commit(("ns", "holder"))
    book.upsert_node(dataclasses.replace(builders.node("n", gpus=2), unhealthy={GPU: frozenset({"0", "1"})}))
    assert book.allocation(("ns", "holder")) is not None  # not released: its pods are not evicted by us
    got = placement.place_group(book, request("new", 1), POD)
    assert isinstance(got, placement.Unschedulable) and got.reasons == {reasons.insufficient(GPU): 1}
    try:
        book.reserve(("ns", "forced"), "n", {GPU: ["1"]})
    except ledger.DeviceConflict as e:
        assert "unhealthy" in str(e)
    else:
        raise AssertionError("an unhealthy device was reserved")


def test_with_mps_required_a_compute_share_goes_only_where_mps_is_ready() -> None:
    book = ledger.DeviceLedger()
    book.upsert_node(builders.node("a-plain", gpus=2))
    book.upsert_node(builders.node("b-plain", gpus=2))
    book.upsert_node(dataclasses.replace(builders.node("c-mps", gpus=2), mps_ready=True))
    share = {GPU: capacity.Share(500)}
    enforced = placement.GroupRequest(("ns", "s"), {GPU: 1}, {}, "binpack", share, mps=True)
    got = placement.place_group(book, enforced, POD)
    assert isinstance(got, placement.Placement) and got.node == "c-mps"
    book.upsert_node(dataclasses.replace(builders.node("c-mps", gpus=2), mps_ready=False))
    refused = placement.place_group(book, enforced, POD)
    assert isinstance(refused, placement.Unschedulable)
    assert refused.message() == f"0/3 nodes are available: 3 {reasons.NO_MPS}."
    promised = dataclasses.replace(enforced, mps=False)  # without --mps: a scheduling promise, anywhere
    assert isinstance(placement.place_group(book, promised, POD), placement.Placement)


def test_only_compute_or_memory_shares_of_nvidia_devices_need_mps() -> None:
    assert placement.needs_mps({GPU: capacity.Share(250)})
    assert placement.needs_mps({GPU: capacity.Share(0, 1 << 30)})
    assert not placement.needs_mps({"gpu.intel.com/i915": capacity.Share(250)})
    assert not placement.needs_mps({GPU: capacity.Share(0, 0, 1)})  # tiles
    assert not placement.needs_mps({})


def test_describe_names_the_links_a_group_got() -> None:
    _ids, topo = topology_of(servers.DGX1_V100)
    assert topologies.describe(topo, ["g0", "g3"]) == "NV2"
    assert topologies.describe(topo, ["g0", "g1", "g4"]) == "NV2 to SYS"
    assert topologies.describe(topo, ["g0"]) == ""
