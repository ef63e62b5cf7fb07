"""Bad input: generated groups against the CRD schema, malformed node inventories, hand-edited pod annotations.

Each one gets a clear answer (a 422 naming the field, a condition, an event, or the annotation put
back) and the operator neither crashes nor loops, nor lets the bad input reach another group's devices.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceshare.api import names
from deviceshare.sandbox import errors
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "bad"

resource_names = st.sampled_from(
    ["nvidia.com/gpu", "example.com/fpga", "gpu", "", "NVIDIA.com/gpu", "nvidia.com/", "a/b", "x" * 250 + ".io/gpu"]
)
counts = st.one_of(st.integers(-3, 70), st.sampled_from([2**63, "2", 1.5, None]))
arbitrary_specs = st.fixed_dictionaries(
    {"resources": st.dictionaries(resource_names, counts, max_size=3)},
    optional={
        "maxMembers": st.one_of(st.integers(-2, 10_002), st.just("many")),
        "schedulingStrategy": st.sampled_from(["binpack", "spread", "random", ""]),
        "nodeSelector": st.dictionaries(st.sampled_from(["zone", "pin", "x/y"]), st.text(max_size=70), max_size=2),
        "surprise": st.integers(),
    },
)
# Valid but awkward: more devices than a node has, a selector no node matches, a member limit of 1.
valid_specs = st.fixed_dictionaries(
    {"resources": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "example.com/fpga"]), st.integers(1, 64),
                                  min_size=1, max_size=2)},
    optional={
        "maxMembers": st.integers(0, 3),
        "schedulingStrategy": st.sampled_from(["binpack", "spread"]),
        "nodeSelector": st.dictionaries(st.sampled_from(["zone", "kubernetes.io/os"]),
                                        st.sampled_from(["linux", "a"]), max_size=1),
    },
)
specs = st.one_of(arbitrary_specs, valid_specs)


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 4}


def scheduled_condition(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Scheduled", "PodScheduled"):
            return dict(c)
    return None


def answered(cluster: Any, pod_name: str) -> bool:
    """Bound, or told why not."""
    pod = cluster.get("pods", pod_name, NS)
    return bool((pod or {}).get("spec", {}).get("nodeName") or (scheduled_condition(pod) or {}).get("message"))


async def test_generated_groups_are_refused_clearly_or_handled(cluster: Any, watchdog: Watchdog) -> None:
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster))
    accepted: list[str] = []
    refusals: list[str] = []

    @settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(spec=specs)
    def submit(spec: dict[str, Any]) -> None:
        name = f"g{len(accepted) + len(refusals)}"
        try:
            cluster.create({**workload.group_body(NS, name), "spec": spec})
        except errors.ApiError as e:
            assert e.code == 422, e
            message = str(e)
            assert "spec" in message, f"a refusal must name the field: {message}"
            refusals.append(message)
            return
        accepted.append(name)
        cluster.create(workload.pod_body(NS, f"{name}-0", name))

    try:
        submit()
        assert accepted and refusals, f"the generator must produce both valid and invalid groups: {refusals[:5]}"
        # Every accepted group is answered: its pod bound, or a PodScheduled=False with a reason.
        for name in accepted:
            await workload.until(lambda: answered(cluster, f"{name}-0"), f"an answer for group {name}")  # noqa: B023
        assert running.alive
    finally:
        await kill(running)
    invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))


BAD_INVENTORIES = {
    "not-json": "{nvidia.com/gpu: [0, 1]",
    "a-list": '["0", "1"]',
    "not-extended": '{"gpu": ["0"]}',
    "ids-not-strings": '{"nvidia.com/gpu": [0, 1]}',
    "empty-id": '{"nvidia.com/gpu": ["", "1"]}',
    "duplicate-id": '{"nvidia.com/gpu": ["GPU-a", "GPU-a"]}',
    "ids-not-a-list": '{"nvidia.com/gpu": "GPU-a,GPU-b"}',
}


@pytest.fixture
def _no_default_nodes(sandbox_options: dict[str, object]) -> None:
    sandbox_options["nodes"] = 0


@pytest.mark.usefixtures("_no_default_nodes")
async def test_malformed_node_inventories_offer_nothing_and_say_why(cluster: Any, watchdog: Watchdog) -> None:
    workload.ensure_namespace(cluster, NS)
    for case, raw in BAD_INVENTORIES.items():
        cluster.add_node(f"bad-{case}", gpus=4, labels={"case": case}, annotations={names.NODE_DEVICES_ANNOTATION: raw})
    cluster.add_node("good", gpus=4, labels={"case": "good"},
                     annotations={names.NODE_DEVICES_ANNOTATION: '{"nvidia.com/gpu": ["GPU-a", "GPU-b"]}'})
    running = await launch(operator_config(cluster))
    try:
        for case in [*BAD_INVENTORIES, "good"]:
            cluster.create(workload.group_body(NS, case, {workload.GPU: 1}, nodeSelector={"case": case}))
            cluster.create(workload.pod_body(NS, f"{case}-0", case))
        good = await workload.until(lambda: workload.bound_pods(cluster, NS), "the good node used")
        assert [p["metadata"]["name"] for p in good] == ["good-0"]
        assert json.loads(good[0]["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]) == {
            workload.GPU: "GPU-a"
        }
        for case in BAD_INVENTORIES:
            cond = await workload.until(
                lambda: scheduled_condition(cluster.get("pods", f"{case}-0", NS)), f"{case} refused"  # noqa: B023
            )
            assert cond["status"] == "False"
            assert "invalid device inventory" in cond["message"], (case, cond)
        # No hot loop: a refused pod is parked, and decided again only after its backoff (doubling from
        # backoff_initial to backoff_max), at the periodic flush, or both. That is a budget of decisions for
        # any window of time; a slow machine only makes fewer. (A window counted in the pods' own decisions,
        # or their events, would let a loop that is hot for every pod pass.)
        config, decisions = running.config, running.runtime.ctx.metrics.placements.labels("unschedulable")
        before, started = decisions._value.get(), time.monotonic()
        await asyncio.sleep(2 * config.unschedulable_flush)  # deliberate: the window lasts two flush periods...
        await workload.until(lambda: decisions._value.get() - before >= len(BAD_INVENTORIES),  # ...and has decisions
                             "each refused pod decided again (on average)")
        made, window = decisions._value.get() - before, time.monotonic() - started
        doublings = math.ceil(math.log2(config.backoff_max / config.backoff_initial)) + 1
        per_pod = doublings + window / config.backoff_max + window / config.unschedulable_flush + 2
        budget = len(BAD_INVENTORIES) * per_pod
        assert made <= budget, f"{made} decisions in {window:.1f}s, budget {budget:.0f}: a hot loop"
        assert running.alive
        assert len(workload.bound_pods(cluster, NS)) == 1
    finally:
        await kill(running)


HAND_EDITS: dict[str, str | None] = {
    "other-devices": None,  # filled in with the other group's devices
    "not-json": "{{{",
    "removed": None,
    "wrong-resource": '{"example.com/fpga": "0"}',
}


@pytest.fixture
def _one_node(sandbox_options: dict[str, object]) -> None:
    sandbox_options["nodes"] = 1


@pytest.mark.usefixtures("_one_node")
@pytest.mark.parametrize("edit", list(HAND_EDITS))
async def test_hand_edited_pod_annotations_are_put_back(cluster: Any, edit: str) -> None:
    # No watchdog while the edit stands: the hand-edited claim is the injected fault itself.
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster))
    try:
        for group in ("g", "h"):  # one node, 4 GPUs: g and h hold two each
            cluster.create(workload.group_body(NS, group, {workload.GPU: 2}))
            cluster.create(workload.pod_body(NS, f"{group}-0", group))
        cluster.create(workload.pod_body(NS, "g-1", "g"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 3, "all members bound")
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
        want = cluster.get("pods", "g-0", NS)["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]
        theirs = cluster.get("pods", "h-0", NS)["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]
        edited = theirs if edit == "other-devices" else HAND_EDITS[edit]  # claim the other group's devices

        cluster.patch("pods", "g-0", {"metadata": {"annotations": {
            names.POD_SELECTED_DEVICES_ANNOTATION: edited}}}, NS)
        await workload.until(
            lambda: cluster.get("pods", "g-0", NS)["metadata"]["annotations"].get(
                names.POD_SELECTED_DEVICES_ANNOTATION) == want,
            "the annotation put back",
        )
        await workload.until(
            lambda: any(e.get("reason") == "DeviceAnnotationsRestored"
                        for e in cluster.list("events", NS) if e["involvedObject"]["name"] == "g-0"),
            "a DeviceAnnotationsRestored event",
        )
        assert running.alive
        snap = invariants.from_sandbox(cluster)
        invariants.assert_no_double_allocation(snap)
        assert invariants.half_bound(snap) == []
    finally:
        await kill(running)
