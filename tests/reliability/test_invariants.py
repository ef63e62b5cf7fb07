"""The checker itself: it must flag every kind of breach it claims to, and nothing else."""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest

from deviceshare.api import models, names
from deviceshare.core import capacity, inventory
from deviceshare.core import ledger as ledgers
from tests.reliability import invariants

GPU = "nvidia.com/gpu"


INTEL = "gpu.intel.com/i915"


def node(name: str, gpus: int = 4, annotation: str | None = None, memory_mib: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotation is not None:
        meta["annotations"] = {names.NODE_DEVICES_ANNOTATION: annotation}
    if memory_mib is not None:
        meta["labels"] = {names.NVIDIA_GPU_MEMORY_LABEL: str(memory_mib)}
    return {"metadata": meta, "status": {"allocatable": {GPU: str(gpus), "cpu": "8"}}}


def intel_node(name: str, cards: int = 2, tiles: int = 4) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {names.INTEL_TILES_LABEL: str(tiles)}},
            "status": {"allocatable": {INTEL: str(cards)}}}


def group(name: str, node_name: str | None, ids: list[str] | None, share: dict[str, Any] | None = None,
          tiles: list[str] | None = None, resource: str = GPU) -> dict[str, Any]:
    status: dict[str, Any] = {"nodeName": node_name, "allocatedDevices": {resource: ids}} if ids else {}
    if tiles:
        status["allocatedTiles"] = {resource: tiles}
    spec = {"resources": {resource: len(ids or [1])}, **({"share": {resource: share}} if share else {})}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}


def pod(name: str, group_name: str, node_name: str | None, ids: str | None, phase: str = "Running") -> dict[str, Any]:
    ann = {names.POD_GROUP_ANNOTATION: group_name}
    if ids is not None:
        ann[names.POD_SELECTED_DEVICES_ANNOTATION] = json.dumps({GPU: ids})
    return {"metadata": {"name": name, "namespace": "ns", "annotations": ann},
            "spec": {"nodeName": node_name}, "status": {"phase": phase}}


CASES: dict[str, tuple[invariants.Snapshot, list[str]]] = {
    "clean": (invariants.Snapshot([node("n")], [group("a", "n", ["0", "1"]), group("b", "n", ["2"])],
                                  [pod("p", "a", "n", "0,1")]), []),
    "two groups, one device": (invariants.Snapshot([node("n")], [group("a", "n", ["0", "1"]), group("b", "n", ["1"])],
                                                   []), ["device 1 held by 2 groups"]),
    "pod of one group on another's device": (
        invariants.Snapshot([node("n")], [group("a", "n", ["0"]), group("b", "n", ["1"])], [pod("p", "b", "n", "0")]),
        ["device 0 held by 2 groups"]),
    "finished pods hold nothing": (
        invariants.Snapshot([node("n")], [group("a", "n", ["0"])], [pod("p", "b", "n", "0", phase="Succeeded")]), []),
    "unbound pods hold nothing": (
        invariants.Snapshot([node("n")], [group("a", "n", ["0"])], [pod("p", "b", None, "0")]), []),
    "an ID the node does not have": (
        invariants.Snapshot([node("n", gpus=2)], [group("a", "n", ["0", "1", "2"])], []),
        ["device '2' is not offered", "3 devices allocated, capacity 2"]),
    "annotated IDs replace the count": (
        invariants.Snapshot([node("n", annotation='{"nvidia.com/gpu": ["GPU-a", "GPU-b"]}')],
                            [group("a", "n", ["GPU-a"]), group("b", "n", ["0"])], []),
        ["device '0' is not offered"]),
    "a malformed annotation offers nothing": (
        invariants.Snapshot([node("n", annotation="{oops")], [group("a", "n", ["0"])], []),
        ["device '0' is not offered", "1 devices allocated, capacity 0"]),
    "sharers within the device": (
        invariants.Snapshot([node("n", memory_mib=81920)],
                            [group("a", "n", ["0"], {"compute": "500m", "memory": "40Gi"}),
                             group("b", "n", ["0"], {"compute": "0.5", "memory": "40Gi"})],
                            [pod("p", "a", "n", "0")]), []),
    "compute over-committed": (
        invariants.Snapshot([node("n", memory_mib=81920)],
                            [group("a", "n", ["0"], {"compute": "600m"}), group("b", "n", ["0"], {"compute": "500m"})],
                            []), ["over-committed: compute 1100m"]),
    "memory over-committed": (
        invariants.Snapshot([node("n", memory_mib=81920)],
                            [group("a", "n", ["0"], {"memory": "50Gi"}), group("b", "n", ["0"], {"memory": "40Gi"})],
                            []), ["over-committed: memory"]),
    "memory on a node that declares none": (
        invariants.Snapshot([node("n")], [group("a", "n", ["0"], {"memory": "1Gi"})], []),
        ["over-committed: memory 1073741824 bytes (declared None)"]),
    "a sharer on a wholly held device": (
        invariants.Snapshot([node("n", memory_mib=81920)],
                            [group("a", "n", ["0"]), group("b", "n", ["0"], {"compute": "100m"})], []),
        ["device 0 held by 2 groups"]),
    "tiles held once each": (
        invariants.Snapshot([intel_node("n")],
                            [group("a", "n", ["0"], {"tiles": 1}, ["0.0"], INTEL),
                             group("b", "n", ["0"], {"tiles": 1}, ["0.1"], INTEL)], []), []),
    "a tile held twice": (
        invariants.Snapshot([intel_node("n")],
                            [group("a", "n", ["0"], {"tiles": 1}, ["0.1"], INTEL),
                             group("b", "n", ["0"], {"tiles": 1}, ["0.1"], INTEL)], []), ["a tile is held twice"]),
    "a tile beyond the device": (
        invariants.Snapshot([intel_node("n")], [group("a", "n", ["1"], {"tiles": 1}, ["1.2"], INTEL)], []),
        ["beyond its 2 tiles"]),
    "tiles and compute sharers mixed": (
        invariants.Snapshot([intel_node("n")],
                            [group("a", "n", ["0"], {"tiles": 1}, ["0.0"], INTEL),
                             group("b", "n", ["0"], {"compute": "100m"}, None, INTEL)], []),
        ["mixes compute/memory sharers and tile holders"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_checker_flags_exactly_the_breaches(case: str) -> None:
    snapshot, expected = CASES[case]
    found = invariants.violations(snapshot)
    assert len(found) == len(expected), found
    for line, fragment in zip(found, expected, strict=True):
        assert fragment in line, (line, fragment)


def test_half_bound_finds_members_that_disagree_with_their_group() -> None:
    snap = invariants.Snapshot(
        [node("n")],
        [group("a", "n", ["0", "1"])],
        [pod("ok", "a", "n", "0,1"), pod("other", "a", "n", "2,3"), pod("bare", "a", "n", None),
         pod("orphan", "zzz", "n", "0")],
    )
    found = invariants.half_bound(snap)
    assert [line.split()[1] for line in found] == ["ns/other", "ns/bare", "ns/orphan"]


_SHARES = st.one_of(
    st.none(),
    st.fixed_dictionaries({"compute": st.sampled_from(["100m", "250m", "0.5", "600m", "1"])}),
    st.fixed_dictionaries({"memory": st.sampled_from(["8Gi", "20Gi", "40Gi", "60Gi"])}),
    st.fixed_dictionaries({"compute": st.sampled_from(["250m", "500m"]), "memory": st.sampled_from(["16Gi", "50Gi"])}),
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(st.lists(st.tuples(_SHARES, st.sampled_from(["0", "1"])), min_size=1, max_size=6))
def test_the_checker_and_the_ledgers_rebuild_agree_on_which_devices_are_wrong(
    held: list[tuple[dict[str, str] | None, str]]
) -> None:
    """The checker is written apart from deviceshare.core; on random holdings both must flag the same devices."""
    groups = [group(f"g{i}", "n", [device], share) for i, (share, device) in enumerate(held)]
    snapshot = invariants.Snapshot([node("n", gpus=2, memory_mib=81920)], groups, [])
    flagged = {line.split()[3] for line in invariants.violations(snapshot)}
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(inventory.node_from_object({**snapshot.nodes[0], "metadata": {
        **snapshot.nodes[0]["metadata"], "labels": {**snapshot.nodes[0]["metadata"]["labels"],
                                                    names.NODE_MODE_LABEL: names.NODE_MODE_SHARED}}}))
    report = ledger.rebuild([
        ledgers.Claim(("ns", g["metadata"]["name"]), "n", g["status"]["allocatedDevices"], "status",
                      capacity.shares_from_spec(models.GroupSpec.model_validate(g["spec"]).share))
        for g in groups])
    assert flagged == {c.device for c in report.conflicts}
