"""Reading nodes and pods: what the scheduler sees of them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.core import builders

from deviceshare.core import inventory

GPU = builders.GPU


@pytest.mark.parametrize(
    ("quantity", "milli"),
    [
        ("100m", 100),
        ("2", 2000),
        ("0.5", 500),
        ("1.5", 1500),
        (".25", 250),
        ("1k", 1_000_000),
        ("1e3", 1_000_000),
        ("3m", 3),
        ("0.0001", 1),
        (4, 4000),
        (0.5, 500),
    ],
)
def test_parse_cpu(quantity: str | int | float, milli: int) -> None:
    assert inventory.parse_cpu(quantity) == milli


@pytest.mark.parametrize(
    ("quantity", "size"),
    [
        ("512Mi", 512 * 2**20),
        ("1Gi", 2**30),
        ("1G", 10**9),
        ("1e9", 10**9),
        ("1E", 10**18),
        ("128974848", 128974848),
        ("129M", 129_000_000),
        ("1.5Ki", 1536),
        ("100m", 1),
        (2048, 2048),
    ],
)
def test_parse_memory(quantity: str | int, size: int) -> None:
    assert inventory.parse_memory(quantity) == size


@pytest.mark.parametrize("bad", ["", "abc", "1x", "--1", "1.2.3", "Mi", "1 Gi", True])
def test_bad_quantities_raise_value_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        inventory.parse_cpu(bad)


def test_node_with_allocatable_gpus_offers_ids_0_to_n_minus_1() -> None:
    info = inventory.node_from_object(
        builders.node_body(allocatable={"cpu": "16", "memory": "64Gi", GPU: "3"})
    )
    assert info.shared and info.ready and not info.unschedulable
    assert info.devices == {GPU: ("0", "1", "2")}
    assert (info.cpu_milli, info.memory_bytes) == (16000, 64 * 2**30)
    assert info.problems == ()


def test_only_extended_resources_are_devices() -> None:
    allocatable = {
        "cpu": "4",
        "memory": "1Gi",
        "pods": "110",
        "ephemeral-storage": "10Gi",
        "hugepages-2Mi": "0",
        "example.com/fpga": "2",
        "kubernetes.io/batteries": "1",
        GPU: "1",
    }
    info = inventory.node_from_object(builders.node_body(allocatable=allocatable))
    assert set(info.devices) == {GPU, "example.com/fpga"}


def test_annotation_lists_ids_verbatim_and_overrides_allocatable() -> None:
    ids = ["GPU-6f1c", "GPU-9a2e"]
    body = builders.node_body(
        allocatable={GPU: "8", "amd.com/gpu": "2"},
        annotations={"deviceshare.io/devices": json.dumps({GPU: ids})},
    )
    info = inventory.node_from_object(body)
    assert info.devices == {GPU: tuple(ids), "amd.com/gpu": ("0", "1")}


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ('["GPU-1"]', "must be a JSON object"),
        ('{"nvidia.com/gpu": "GPU-1"}', "must list nvidia.com/gpu device IDs"),
        ('{"nvidia.com/gpu": [1, 2]}', "must list nvidia.com/gpu device IDs"),
        ('{"nvidia.com/gpu": ["a", "a"]}', "twice"),
        ('{"gpu": ["a"]}', "not an extended resource"),
    ],
)
def test_bad_annotation_is_reported_and_the_node_offers_no_devices(annotation: str, fragment: str) -> None:
    body = builders.node_body(
        allocatable={"cpu": "1", GPU: "2"}, annotations={"deviceshare.io/devices": annotation}
    )
    info = inventory.node_from_object(body)
    assert info.devices == {}
    assert len(info.problems) == 1
    assert "deviceshare.io/devices" in info.problems[0] and fragment in info.problems[0]
    assert info.cpu_milli == 1000  # the rest of the node is still read


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"metadata": None, "spec": "x", "status": []},
        {"metadata": {"name": "n", "labels": None}, "status": {"allocatable": {"cpu": "lots", GPU: "1.5"}}},
        {
            "metadata": {"name": "n"},
            "spec": {"taints": ["bad", {"key": "k"}]},
            "status": {"conditions": "no"},
        },
    ],
)
def test_malformed_nodes_never_raise(body: dict[str, Any]) -> None:
    info = inventory.node_from_object(body)
    assert not info.ready and not info.shared


def test_malformed_quantities_are_problems() -> None:
    info = inventory.node_from_object(
        builders.node_body(allocatable={"cpu": "lots", "memory": "1Gi", GPU: "1.5"})
    )
    assert info.devices == {}
    assert any("cpu" in p for p in info.problems) and any(GPU in p for p in info.problems)


@pytest.mark.parametrize(
    ("kwargs", "shared", "ready", "unschedulable"),
    [
        ({}, True, True, False),
        ({"labels": {"deviceshare.io/mode": "exclusive"}}, False, True, False),
        ({"labels": {}}, False, True, False),
        ({"ready": "False"}, True, False, False),
        ({"ready": "Unknown"}, True, False, False),
        ({"ready": None}, True, False, False),
        ({"unschedulable": True}, True, True, True),
    ],
)
def test_node_flags(kwargs: dict[str, Any], shared: bool, ready: bool, unschedulable: bool) -> None:
    info = inventory.node_from_object(builders.node_body(**kwargs))
    assert (info.shared, info.ready, info.unschedulable) == (shared, ready, unschedulable)


def test_taints_are_read() -> None:
    body = builders.node_body(
        taints=[
            {"key": "gpu", "value": "a100", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ]
    )
    assert inventory.node_from_object(body).taints == (
        inventory.Taint("gpu", "a100", "NoSchedule"),
        inventory.Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),
    )


@pytest.mark.parametrize(
    ("containers", "init", "overhead", "cpu", "memory"),
    [
        ([], [], None, 0, 0),
        (
            [builders.container("500m", "1Gi"), builders.container("250m", "512Mi")],
            [],
            None,
            750,
            1536 * 2**20,
        ),
        # the largest init container wins when it is bigger than the app containers together
        (
            [builders.container("500m", "1Gi")],
            [builders.container("2", "100Mi"), builders.container("1", "3Gi")],
            None,
            2000,
            3 * 2**30,
        ),
        # limits stand in for missing requests
        ([builders.container("1", "1Gi", limits=True)], [], None, 1000, 2**30),
        # a sidecar (restartable init container) runs beside the app and before later init containers
        (
            [builders.container("1", "1Gi")],
            [builders.container("500m", "256Mi", restart="Always"), builders.container("2", "1Gi")],
            None,
            2500,
            1280 * 2**20,
        ),
        ([builders.container("1", "1Gi")], [], {"cpu": "100m", "memory": "64Mi"}, 1100, 1088 * 2**20),
    ],
)
def test_pod_effective_request(
    containers: list[Any], init: list[Any], overhead: Any, cpu: int, memory: int
) -> None:
    extra = {"overhead": overhead} if overhead else {}
    demand = inventory.pod_demand(builders.pod_body(containers, init=init, **extra))
    assert (demand.cpu_milli, demand.memory_bytes) == (cpu, memory)


def test_pod_selector_tolerations_and_affinity_are_read() -> None:
    body = builders.pod_body(
        [builders.container("1")],
        nodeSelector={"zone": "a"},
        tolerations=[
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "x", "value": "y"},
        ],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "model", "operator": "In", "values": ["A100", "H100"]}
                            ],
                            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}],
                        },
                    ]
                }
            }
        },
    )
    demand = inventory.pod_demand(body)
    assert demand.node_selector == {"zone": "a"}
    assert demand.tolerations == (
        inventory.Toleration("gpu", "Exists", "", "NoSchedule"),
        inventory.Toleration("x", "Equal", "y", ""),
    )
    assert demand.required_terms == (
        inventory.NodeSelectorTerm(
            expressions=(inventory.Requirement("model", "In", ("A100", "H100")),),
            fields=(inventory.Requirement("metadata.name", "NotIn", ("n9",)),),
        ),
    )


def test_pod_with_bad_quantity_raises_value_error() -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        inventory.pod_demand(builders.pod_body([builders.container("fast")]))
