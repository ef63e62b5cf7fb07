"""Pure pieces of the operator: the scheduling queue, status builders, rebuild claims."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from deviceshare.api import envnames, names
from deviceshare.operator import conditions, memberannotations, queueing, rebuild, state
from tests import waiting

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)


async def test_queue_hands_out_each_pod_once_and_reruns_one_changed_in_flight() -> None:
    q: queueing.SchedulingQueue[str] = queueing.SchedulingQueue(backoff_initial=10)
    for key in ("a", "b", "a"):
        q.add(key)
    assert len(q) == 2
    first = await q.get()
    q.add(first)  # an event while it is being decided
    q.done(first)
    seen = {await q.get(), await q.get()}
    assert seen == {"a", "b"}


async def test_parked_pods_wait_their_backoff_then_move_on_a_cluster_change() -> None:
    clock = [0.0]
    q: queueing.SchedulingQueue[str] = queueing.SchedulingQueue(
        backoff_initial=1, backoff_max=4, clock=lambda: clock[0]
    )
    q.add("p")
    assert await q.get() == "p"
    q.done("p")
    assert q.park("p") == 1
    assert q.move_parked() == 0  # still backing off
    clock[0] = 1.5
    assert q.move_parked() == 1
    assert await asyncio.wait_for(q.get(), waiting.HANG_GUARD) == "p"
    q.done("p")
    assert [q.park("p") for _ in range(4)] == [2, 4, 4, 4]  # doubling, capped
    q.forget("p")
    assert q.park("p") == 1  # bound or gone: history forgotten


def test_device_annotations_carry_ids_per_env_var() -> None:
    env = envnames.EnvNames({"nvidia.com/": ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]})
    got = memberannotations.device_annotations({"nvidia.com/gpu": ["2", "3"], "example.com/fpga": ["f1"]}, env)
    assert got == {
        names.POD_SELECTED_DEVICES_ANNOTATION: '{"example.com/fpga":"f1","nvidia.com/gpu":"2,3"}',
        "deviceshare.io/env.EXAMPLE_FPGA_VISIBLE_DEVICES": "f1",
        "deviceshare.io/env.NVIDIA_VISIBLE_DEVICES": "2,3",
        "deviceshare.io/env.CUDA_VISIBLE_DEVICES": "2,3",
    }


def test_condition_keeps_transition_time_while_status_holds() -> None:
    first = conditions.condition([], "Scheduled", "False", "Unschedulable", "no room")
    again = conditions.condition(first, "Scheduled", "False", "Unschedulable", "still no room")
    flipped = conditions.condition(again, "Scheduled", "True", "Bound", "placed")
    assert again[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert again[0]["message"] == "still no room"
    assert flipped[0]["status"] == "True"


def _group(name: str, status: dict[str, object]) -> state.GroupRecord:
    return state.group_record({
        "metadata": {"namespace": "ns", "name": name, "uid": name, "resourceVersion": "1", "generation": 1},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
        "status": status,
    })


def _pod(name: str, group: str, node: str | None, selected: str | None, phase: str = "Running") -> state.PodRecord:
    ann = {names.POD_GROUP_ANNOTATION: group}
    if selected:
        ann[names.POD_SELECTED_DEVICES_ANNOTATION] = selected
    return state.pod_record({
        "metadata": {"namespace": "ns", "name": name, "uid": name, "annotations": ann},
        "spec": {"nodeName": node, "schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    })


def test_rebuild_claims_come_from_bound_statuses_and_running_members_only() -> None:
    groups = [
        _group("bound", {"phase": "Bound", "nodeName": "n1", "allocatedDevices": {"nvidia.com/gpu": ["0"]}}),
        _group("pending", {"phase": "Pending"}),
    ]
    pods = [
        _pod("runs", "bound", "n1", '{"nvidia.com/gpu":"0"}'),
        _pod("done", "bound", "n1", '{"nvidia.com/gpu":"1"}', phase="Succeeded"),
        _pod("unbound", "pending", None, '{"nvidia.com/gpu":"5"}'),
        _pod("garbled", "pending", "n2", "{not json"),
    ]
    sorted_claims = rebuild.sort_claims(groups, pods, names.DEFAULT_SCHEDULER_NAME)
    assert [(c.group, c.node, dict(c.devices), c.source) for c in sorted_claims.claims] == [
        (("ns", "bound"), "n1", {"nvidia.com/gpu": ("0",)}, "status of ns/bound"),
    ]
    assert sorted_claims.members == {("ns", "runs"): ("runs", "bound")}
    assert sorted_claims.untrusted == []


def test_an_assumed_binding_survives_an_older_event() -> None:
    cluster = state.ClusterState()
    pod = _pod("p", "g", None, None, phase="Pending")
    cluster.upsert_pod(pod)
    cluster.assume(pod, "n1", {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}',
                               names.env_annotation("NVIDIA_VISIBLE_DEVICES"): "0"}, "g")
    cluster.upsert_pod(_pod("p", "g", None, None, phase="Pending"))  # an event from before our writes
    assert cluster.pods[("ns", "p")].node_name == "n1"
    # ... which must not make the annotations we wrote look hand-edited (or missing)
    assert cluster.pods[("ns", "p")].selected_devices == '{"nvidia.com/gpu":"0"}'
    assert cluster.pods[("ns", "p")].env_annotations == {"NVIDIA_VISIBLE_DEVICES": "0"}
    cluster.upsert_pod(_pod("p", "g", "n1", None))
    assert cluster.members_on_devices(("ns", "g"))[0].name == "p"


@pytest.mark.parametrize("through_kopf", [False, True])
def test_only_event_handlers_so_kopf_needs_no_diff_base(through_kopf: bool) -> None:
    """NoDiffBase is only sound while Kopf has no change handler (on.create/update/delete/field) to feed; without
    one Kopf also keeps no progress or last-handled annotations and adds no finalizer of its own."""
    import kopf

    from deviceshare.operator import handlers
    from deviceshare.operator.config import OperatorConfig

    registry = kopf.OperatorRegistry()
    handlers.register(registry, OperatorConfig(groups_through_kopf=through_kopf))
    assert list(registry._changing.get_all_handlers()) == []
    assert list(registry._spawning.get_all_handlers()) == []
    assert list(registry._indexing.get_all_handlers()) == []
    # Groups through Kopf only when asked; nodes and pods always through our own reflectors.
    watched = [(h.selector.group, h.selector.any_name) for h in registry._watching.get_all_handlers() if h.selector]
    assert watched == ([(names.GROUP, names.PLURAL)] if through_kopf else [])
