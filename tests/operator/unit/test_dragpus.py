"""The memo of what a node's DRA devices stood for (operator/dragpus.py): its index by device answers which nodes a
claim's devices stood for exactly as a walk over every node's memo does, whatever was remembered and forgotten."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.operator import dragpus

NODES = ["n1", "n2", "n3"]
DEVICES = ["n1/gpu-0", "n1/gpu-1", "n2/gpu-0", "shared/gpu-0"]  # a pool name two nodes' slices might both use
memo = st.one_of(st.none(), st.tuples(st.frozensets(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu"])),
                                      st.frozensets(st.sampled_from(DEVICES))))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NODES), memo), max_size=12), st.frozensets(st.sampled_from(DEVICES)))
def test_the_nodes_a_claims_devices_stood_for_are_those_a_walk_finds(
    steps: list[tuple[str, dragpus.Memo | None]], claimed: frozenset[str]
) -> None:
    gpus = dragpus.DraGpus()
    remembered: dict[str, dragpus.Memo] = {}
    for node, value in steps:
        gpus.remember(node, value)
        if value is None:
            remembered.pop(node, None)
        else:
            remembered[node] = value
        assert gpus.get(node) == value
    assert gpus.nodes_of(claimed) == {n for n, (_, ids) in remembered.items() if ids & claimed}
    for node in NODES:
        gpus.remember(node, None)
    assert gpus.nodes_of(DEVICES) == set() and gpus._nodes == {}  # nothing left behind
