"""An API that lies: a write lands and its answer says otherwise (504 Timeout, a dropped connection, a 409).

kube-apiserver under load can apply a write and still answer ``504 Timeout``; a connection can drop after the
write landed; a ``409 already assigned`` on a Binding can come from our own earlier Binding. The operator must
find out what happened by reading back, never by guessing: here one node has two GPUs, group ``a``'s Binding
lands and its answer lies, then group ``b`` asks for the same two GPUs. ``a`` must stay Bound on its pod's
devices and ``b`` must wait, saying why. (The operator before this fix rolled ``a`` back and gave ``b`` the
GPUs its pod was running on.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "lies"

LIES: dict[str, dict[str, Any]] = {
    "504 after the binding landed": {"status": 504, "message": "the server was unable to return a response in "
                                     "the time allotted, but may still be processing the request"},
    "connection dropped after the binding landed": {"drop": True},
    "409 from our own binding that landed": {"status": 409, "message": 'pod "a-0" is already assigned to node '
                                             '"gpu-node-0"'},
}


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 2}


def unschedulable(cluster: Any, pod: str) -> str | None:
    conditions = ((cluster.get("pods", pod, NS) or {}).get("status") or {}).get("conditions") or []
    found = [c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"]
    return found[0].get("message") if found else None


@pytest.mark.parametrize("lie", list(LIES))
async def test_a_binding_whose_answer_lies_keeps_its_devices_and_the_next_group_waits(
    cluster: Any, watchdog: Watchdog, lie: str
) -> None:
    workload.ensure_namespace(cluster, NS)
    fault = cluster.inject_fault("POST", rf"/namespaces/{NS}/pods/a-0/binding$", applied=True, **LIES[lie])
    running = await launch(operator_config(cluster))
    try:
        cluster.create(workload.group_body(NS, "a", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "a-0", "a"))
        await workload.until(lambda: fault.fired and workload.bound_pods(cluster, NS), "a-0 bound, its answer lost")

        cluster.create(workload.group_body(NS, "b", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "b-0", "b"))
        why = await workload.until(lambda: unschedulable(cluster, "b-0"), "b-0 told why it waits")
        assert why == "0/1 nodes are available: 1 insufficient nvidia.com/gpu."
        # The groups' statuses follow by their reconciles (a moment later on a slow machine).
        await workload.until(lambda: (cluster.get(names.PLURAL, "a", NS).get("status") or {}).get("members")
                             and (cluster.get(names.PLURAL, "b", NS).get("status") or {}).get("phase"),
                             "both groups' statuses reconciled")

        a = cluster.get(names.PLURAL, "a", NS)["status"]
        pod = cluster.get("pods", "a-0", NS)
        assert fault.fired == 1
        assert (a["phase"], a["nodeName"]) == ("Bound", pod["spec"]["nodeName"])
        selected = json.loads(pod["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION])
        assert {r: ",".join(ids) for r, ids in a["allocatedDevices"].items()} == selected
        assert a["members"] == ["a-0"]
        b = cluster.get(names.PLURAL, "b", NS).get("status") or {}
        assert b.get("phase") == "Pending" and not b.get("allocatedDevices")
        assert running.alive
    finally:
        cluster.clear_faults()
        await kill(running)


WRITES = {
    "group status": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/[^/]+/status$"),
    "group finalizers": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/[^/]+$"),
    "binding": ("POST", rf"/namespaces/{NS}/pods/[^/]+/binding$"),
    "event": ("POST", rf"/namespaces/{NS}/events$"),
}


@pytest.mark.parametrize("answer", ["504", "drop"])
@pytest.mark.parametrize("write", list(WRITES))
async def test_every_write_whose_answer_is_lost_is_resolved_and_nothing_is_held_twice(
    cluster: Any, watchdog: Watchdog, write: str, answer: str
) -> None:
    """Each kind of write the placement makes lands and loses its answer twice; every group still ends Bound on
    the devices its pods have, the node full, the overflow group Pending."""
    workload.ensure_namespace(cluster, NS)
    method, path = WRITES[write]
    lie: dict[str, Any] = {"status": 504} if answer == "504" else {"drop": True}
    fault = cluster.inject_fault(method, path, applied=True, times=2, **lie)
    running = await launch(operator_config(cluster))
    try:
        for name in ("x", "y"):
            cluster.create(workload.group_body(NS, name, {workload.GPU: 1}))
            cluster.create(workload.pod_body(NS, f"{name}-0", name))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 2, "both pods bound")
        cluster.create(workload.group_body(NS, "z", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "z-0", "z"))
        await workload.until(lambda: unschedulable(cluster, "z-0"), "z-0 told why it waits")
        await workload.until(lambda: fault.fired == 2, f"the {write} lost its answer twice")
        for name in ("x", "y"):
            status = cluster.get(names.PLURAL, name, NS)["status"]
            pod = cluster.get("pods", f"{name}-0", NS)
            assert status["phase"] == "Bound" and status["members"] == [f"{name}-0"]
            selected = json.loads(pod["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION])
            assert {r: ",".join(ids) for r, ids in status["allocatedDevices"].items()} == selected
        assert running.alive
    finally:
        cluster.clear_faults()
        await kill(running)
