"""Filters: tolerations, node affinity and the order reasons are reported in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core import builders

from deviceshare.core import filters, inventory, reasons

T = inventory.Taint
Tol = inventory.Toleration
Req = inventory.Requirement
Term = inventory.NodeSelectorTerm


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (Tol("gpu", "Equal", "a100", "NoSchedule"), T("gpu", "a100", "NoSchedule"), True),
        (Tol("gpu", "Equal", "h100", "NoSchedule"), T("gpu", "a100", "NoSchedule"), False),
        (Tol("gpu", "Exists", "", "NoSchedule"), T("gpu", "a100", "NoSchedule"), True),
        (Tol("gpu", "Exists", "", ""), T("gpu", "a100", "NoExecute"), True),
        (Tol("gpu", "Exists", "", "NoExecute"), T("gpu", "a100", "NoSchedule"), False),
        (Tol("", "Exists", "", ""), T("anything", "v", "NoExecute"), True),
        (Tol("other", "Exists", "", ""), T("gpu", "", "NoSchedule"), False),
        (Tol("gpu", "", "", "NoSchedule"), T("gpu", "", "NoSchedule"), True),
        (Tol("gpu", "Bogus", "", ""), T("gpu", "", "NoSchedule"), False),
    ],
)
def test_toleration_matches_taint(
    toleration: inventory.Toleration, taint: inventory.Taint, expected: bool
) -> None:
    assert filters.tolerates(toleration, taint) is expected


def test_prefer_no_schedule_is_not_a_filter() -> None:
    taints = (T("soft", "", "PreferNoSchedule"), T("hard", "x", "NoExecute"))
    assert filters.untolerated(taints, ()) == taints[1]
    assert filters.untolerated(taints, (Tol("hard", "Exists", "", ""),)) is None


LABELS = {"model": "A100", "zone": "a", "gen": "4"}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        (Term((Req("model", "In", ("A100", "H100")),)), True),
        (Term((Req("model", "In", ("H100",)),)), False),
        (Term((Req("model", "NotIn", ("H100",)),)), True),
        (Term((Req("missing", "NotIn", ("x",)),)), True),
        (Term((Req("zone", "Exists"),)), True),
        (Term((Req("missing", "Exists"),)), False),
        (Term((Req("missing", "DoesNotExist"),)), True),
        (Term((Req("zone", "DoesNotExist"),)), False),
        (Term((Req("gen", "Gt", ("3",)),)), True),
        (Term((Req("gen", "Gt", ("4",)),)), False),
        (Term((Req("gen", "Lt", ("5",)),)), True),
        (Term((Req("model", "Lt", ("5",)),)), False),  # a non-integer label never compares
        (Term((Req("model", "In", ("A100",)), Req("zone", "In", ("b",)))), False),  # ANDed
        (Term((), (Req("metadata.name", "In", ("n1",)),)), True),
        (Term((), (Req("metadata.name", "NotIn", ("n1",)),)), False),
        (Term((), (Req("metadata.labels", "In", ("n1",)),)), False),
        (Term(), False),  # an empty term matches nothing
        (Term((Req("model", "Matches", ("A100",)),)), False),
    ],
)
def test_node_selector_term(term: inventory.NodeSelectorTerm, expected: bool) -> None:
    assert filters.term_matches(term, "n1", LABELS) is expected


def test_terms_are_ored_and_node_selector_is_anded_with_them() -> None:
    node = builders.node(labels=LABELS)
    miss, hit = Term((Req("model", "In", ("H100",)),)), Term((Req("zone", "In", ("a",)),))
    assert filters.pod_matches(node, inventory.PodDemand(required_terms=(miss, hit)))
    assert not filters.pod_matches(node, inventory.PodDemand(required_terms=(miss,)))
    assert not filters.pod_matches(
        node, inventory.PodDemand(node_selector={"zone": "b"}, required_terms=(hit,))
    )
    assert filters.pod_matches(node, inventory.PodDemand(node_selector={"zone": "a"}))


GPU = builders.GPU
EVERYTHING_WRONG = dict(
    shared=False,
    ready=False,
    unschedulable=True,
    taints=(T("k", "v", "NoSchedule"),),
    labels={"zone": "b"},
    gpus=0,
    cpu_milli=0,
    memory_bytes=0,
)


@pytest.mark.parametrize(
    ("fixed", "reason"),
    [
        # each row repairs one more thing than the last, so the next reason in order shows
        ({}, reasons.NOT_SHARED),
        ({"shared": True}, reasons.NOT_READY),
        ({"shared": True, "ready": True}, reasons.UNSCHEDULABLE),
        ({"shared": True, "ready": True, "unschedulable": False}, "node(s) had untolerated taint {k: v}"),
        ({"shared": True, "ready": True, "unschedulable": False, "taints": ()}, reasons.NODE_AFFINITY),
        (
            {"shared": True, "ready": True, "unschedulable": False, "taints": (), "labels": {"zone": "a"}},
            reasons.GROUP_SELECTOR,
        ),
        (
            {
                "shared": True,
                "ready": True,
                "unschedulable": False,
                "taints": (),
                "labels": {"zone": "a", "model": "A100"},
            },
            "insufficient nvidia.com/gpu",
        ),
        (
            {
                "shared": True,
                "ready": True,
                "unschedulable": False,
                "taints": (),
                "labels": {"zone": "a", "model": "A100"},
                "gpus": 2,
            },
            reasons.INSUFFICIENT_CPU,
        ),
        (
            {
                "shared": True,
                "ready": True,
                "unschedulable": False,
                "taints": (),
                "labels": {"zone": "a", "model": "A100"},
                "gpus": 2,
                "cpu_milli": 1000,
            },
            reasons.INSUFFICIENT_MEMORY,
        ),
        (
            {
                "shared": True,
                "ready": True,
                "unschedulable": False,
                "taints": (),
                "labels": {"zone": "a", "model": "A100"},
                "gpus": 2,
                "cpu_milli": 1000,
                "memory_bytes": 2**30,
            },
            None,
        ),
    ],
)
def test_first_failure_follows_the_documented_order(fixed: dict[str, object], reason: str | None) -> None:
    node = builders.node(**{**EVERYTHING_WRONG, **fixed})
    pod = inventory.PodDemand(cpu_milli=1000, memory_bytes=2**30, node_selector={"zone": "a"})
    got = filters.first_failure(node, node.devices, 0, 0, {GPU: 2}, {"model": "A100"}, pod)
    assert got == reason


def test_cpu_and_memory_count_what_pods_already_use() -> None:
    node = builders.node(cpu_milli=4000, memory_bytes=8 << 30)
    pod = inventory.PodDemand(cpu_milli=1000, memory_bytes=1 << 30)
    assert filters.first_failure(node, node.devices, 3000, 7 << 30, {GPU: 1}, {}, pod) is None
    assert filters.first_failure(node, node.devices, 3001, 0, {GPU: 1}, {}, pod) == reasons.INSUFFICIENT_CPU
    assert (
        filters.first_failure(node, node.devices, 0, (7 << 30) + 1, {GPU: 1}, {}, pod)
        == reasons.INSUFFICIENT_MEMORY
    )


def test_devices_reason_names_the_first_short_resource_and_invalid_inventory() -> None:
    node = builders.node(gpus=1, extra={"amd.com/gpu": ("0",)})
    assert (
        filters.devices_failure(node, node.devices, {GPU: 1, "amd.com/gpu": 2}) == "insufficient amd.com/gpu"
    )
    broken = builders.node(gpus=0, problems=("annotation deviceshare.io/devices is not valid JSON",))
    assert filters.devices_failure(broken, broken.devices, {GPU: 1}) == reasons.INVALID_INVENTORY


def test_member_admission_ignores_cordon_and_shared_mode_but_not_readiness() -> None:
    pod = inventory.PodDemand()
    assert filters.admission_failure(builders.node(unschedulable=True, shared=False), pod, 0, 0) is None
    assert filters.admission_failure(builders.node(ready=False), pod, 0, 0) == reasons.NOT_READY


@settings(max_examples=300, deadline=None)
@given(
    shared=st.booleans(),
    ready=st.booleans(),
    unschedulable=st.booleans(),
    taint=st.sampled_from([None, T("k", "v", "NoSchedule"), T("k", "v", "PreferNoSchedule")]),
    tolerate=st.booleans(),
    zone=st.sampled_from(["a", "b"]),
    pod_zone=st.sampled_from([None, "a", "b"]),
    term_zone=st.sampled_from([None, "a", "b"]),
    group_zone=st.sampled_from([None, "a", "b"]),
    gpus=st.integers(0, 4),
    need=st.integers(1, 4),
    cpu=st.integers(0, 4),
    used=st.integers(0, 4),
    problems=st.booleans(),
)
def test_the_fast_check_agrees_with_first_failure(
    shared: bool,
    ready: bool,
    unschedulable: bool,
    taint: inventory.Taint | None,
    tolerate: bool,
    zone: str,
    pod_zone: str | None,
    term_zone: str | None,
    group_zone: str | None,
    gpus: int,
    need: int,
    cpu: int,
    used: int,
    problems: bool,
) -> None:
    node = builders.node(
        shared=shared,
        ready=ready,
        unschedulable=unschedulable,
        taints=(taint,) if taint else (),
        labels={"zone": zone},
        gpus=gpus,
        cpu_milli=4000,
        problems=("bad",) if problems else (),
    )
    pod = inventory.PodDemand(
        cpu_milli=cpu * 1000,
        node_selector={"zone": pod_zone} if pod_zone else {},
        tolerations=(Tol("k", "Exists", "", ""),) if tolerate else (),
        required_terms=(Term((Req("zone", "In", (term_zone,)),)),) if term_zone else (),
    )
    selector = {"zone": group_zone} if group_zone else {}
    slow = filters.first_failure(node, node.devices, used * 1000, 0, {GPU: need}, selector, pod)
    assert filters.passes(node, node.devices, used * 1000, 0, {GPU: need}, selector, pod) is (slow is None)


def test_a_node_with_any_inventory_problem_offers_nothing() -> None:
    # Unreadable cpu leaves the GPUs listed, but the node is still closed, by both checks.
    node = builders.node(gpus=4, problems=("status.allocatable[cpu]: not a quantity: 'lots'",))
    pod = inventory.PodDemand()
    assert filters.first_failure(node, node.devices, 0, 0, {GPU: 1}, {}, pod) == reasons.INVALID_INVENTORY
    assert not filters.passes(node, node.devices, 0, 0, {GPU: 1}, {}, pod)
