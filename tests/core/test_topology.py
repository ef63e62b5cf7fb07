"""Device links (CONTRACT §9): reading the annotation, and the best-linked set of devices on one node."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core import builders
from tests.nodeagent import servers

from deviceshare.api import names
from deviceshare.core import devicechoice, filters, inventory, reasons
from deviceshare.core import topology as topologies


def topology_of(server: servers.Server) -> tuple[tuple[str, ...], topologies.Topology]:
    """The server's GPUs in NVML index order, and their links as the agent publishes them."""
    order = server.order or tuple(range(server.gpus))
    ids = tuple(f"g{row}" for row in order)
    links = {(f"g{a}", f"g{b}"): server.matrix[a][b] for a in order for b in order if a != b}
    numa = {f"g{row}": server.numa[row] for row in order}
    return ids, topologies.from_links(ids, links, numa)


def island_of(device: str) -> int:
    return int(device[1:]) // 4


# -- the annotation -------------------------------------------------------------------------------


def test_the_annotation_round_trips_and_is_one_object_per_text() -> None:
    _ids, topo = topology_of(servers.DGX1_V100)
    text = topologies.annotation({builders.GPU: topo})
    parsed, error = topologies.parse(text)
    assert error == ""
    again = parsed[builders.GPU]
    assert again is topologies.parse(text)[0][builders.GPU]  # nodes of one model share one object
    assert topologies.annotation(parsed) == text
    assert again.link("g0", "g3") == "NV2" and again.link("g0", "g5") == "SYS" and again.numa["g6"] == 1


@pytest.mark.parametrize(("value", "words"), [
    ("{not json", "is not valid JSON"),
    ('["g0"]', "must be a JSON object"),
    ('{"nvidia.com/gpu": {"g0": {"links": {"g1": "NV"}}, "g1": {}}}', "is 'NV'; a link is NV<n>"),
    ('{"nvidia.com/gpu": {"g0": {"links": {"g9": "PIX"}}}}', "names 'g9', which is no other device"),
    ('{"nvidia.com/gpu": {"g0": {"links": {"g1": "PIX"}}, "g1": {"links": {"g0": "SYS"}}}}', "one way"),
    ('{"nvidia.com/gpu": {"g0": {"numa": "zero"}}}', "numa must be an integer"),
])
def test_a_bad_topology_annotation_is_a_problem_of_the_node_that_names_it(value: str, words: str) -> None:
    body = builders.node_body(annotations={names.NODE_TOPOLOGY_ANNOTATION: value})
    info = inventory.node_from_object(body)
    assert any(words in p and names.NODE_TOPOLOGY_ANNOTATION in p for p in info.problems), info.problems
    # Such a node takes no new group, and says why.
    assert filters.devices_failure(info, info.devices, {builders.GPU: 1}) == reasons.INVALID_INVENTORY


def test_health_and_mps_are_read_from_the_node() -> None:
    body = builders.node_body(annotations={
        names.NODE_HEALTH_ANNOTATION: json.dumps({builders.GPU: ["2"]}),
        names.NODE_MPS_ANNOTATION: "ready",
    })
    info = inventory.node_from_object(body)
    assert info.unhealthy == {builders.GPU: frozenset({"2"})} and info.mps_ready and not info.problems
    bad = inventory.node_from_object(builders.node_body(annotations={names.NODE_HEALTH_ANNOTATION: '{"x": 1}'}))
    assert any("not an extended resource" in p for p in bad.problems)


# -- the best-linked set --------------------------------------------------------------------------


def test_four_of_eight_take_one_nvlink_island_where_the_device_order_alternates_islands() -> None:
    ids, topo = topology_of(servers.TWO_ISLANDS_8)
    chosen = devicechoice.choose_devices(ids, ids, 4, topo)
    assert len({island_of(d) for d in chosen}) == 1
    # Without the links, the contiguous run straddles both islands: the topology is what decides.
    assert len({island_of(d) for d in devicechoice.choose_devices(ids, ids, 4)}) == 2


def test_the_rest_of_a_used_island_goes_before_a_whole_one() -> None:
    ids, topo = topology_of(servers.TWO_ISLANDS_8)
    free = tuple(d for d in ids if d != "g5")  # one GPU of the second island is taken
    one = devicechoice.choose_devices(ids, free, 1, topo)
    assert island_of(one[0]) == 1  # the first island stays whole for a 4-GPU group
    three = devicechoice.choose_devices(ids, free, 3, topo)
    assert {island_of(d) for d in three} == {1}


def test_dgx1_cube_mesh_gives_a_fully_nvlinked_quad_and_the_pair_with_most_links() -> None:
    ids, topo = topology_of(servers.DGX1_V100)
    quad = devicechoice.choose_devices(ids, ids, 4, topo)
    assert topo.quality(quad)[0] == topologies.NV_CLASS
    pair = devicechoice.choose_devices(ids, ids, 2, topo)
    assert topo.link(*pair) == "NV2"


def test_two_of_a_two_socket_pcie_node_share_a_socket() -> None:
    ids, topo = topology_of(servers.PCIE_2SOCKET_4)
    free = ids[1:]  # GPU0 is taken: the contiguous run 1,2 would cross sockets
    chosen = devicechoice.choose_devices(ids, free, 2, topo)
    assert chosen == ("g2", "g3") and topo.link(*chosen) == "NODE"
    assert devicechoice.choose_devices(ids, free, 2) == ("g1", "g2")  # what order alone would give


def _random_topology(n: int, classes: list[int], nv: list[int]) -> tuple[tuple[str, ...], topologies.Topology]:
    ids = tuple(f"d{i}" for i in range(n))
    names_ = [f"NV{k}" for k in (1, 2, 4, 12, 18)] + list(topologies.PCIE_KINDS)
    links = {}
    for x, (a, b) in enumerate(itertools.combinations(ids, 2)):
        c = classes[x % len(classes)]
        links[(a, b)] = names_[nv[x % len(nv)] % 5] if c == 0 else names_[4 + c]
    return ids, topologies.from_links(ids, links)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 9),
    classes=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    nv=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    data=st.data(),
)
def test_the_chosen_set_is_the_best_linked_of_all_sets(
    n: int, classes: list[int], nv: list[int], data: st.DataObject
) -> None:
    ids, topo = _random_topology(n, classes, nv)
    free = tuple(d for d in ids if data.draw(st.booleans()) or d == ids[0])
    count = data.draw(st.integers(1, len(free)))
    chosen = devicechoice.choose_devices(ids, free, count, topo)
    assert len(chosen) == count and set(chosen) <= set(free) and len(set(chosen)) == count
    best = min(topo.quality(c) for c in itertools.combinations(free, count))
    assert topo.quality(chosen) == best


def test_beyond_the_exhaustive_size_the_set_is_still_sound() -> None:
    ids = tuple(f"d{i}" for i in range(16))
    links = {(a, b): "NV18" if int(a[1:]) % 4 == int(b[1:]) % 4 else "SYS"
             for a, b in itertools.combinations(ids, 2)}
    topo = topologies.from_links(ids, links)
    chosen = devicechoice.choose_devices(ids, ids, 4, topo)
    assert topo.quality(chosen)[0] == topologies.NV_CLASS  # the four d0, d4, d8, d12 (or another class)
