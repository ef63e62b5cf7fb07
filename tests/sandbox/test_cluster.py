"""The simulated cluster: nodes, pod binding, the kubelet, events and Table output."""

from __future__ import annotations

from typing import Any

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.helpers import PODS, SDG, Http, pod, sdg

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def running(sandbox: Sandbox, name: str) -> dict[str, Any] | None:
    pod = sandbox.get("pods", name, "default")
    return pod if pod and pod["status"]["phase"] == "Running" else None


async def kubelet_caught_up(sandbox: Sandbox, witness: str) -> None:
    """A pod bound to a Ready node now runs once the kubelet's delay has passed: every pod it saw before,
    with the same delay, has been decided by then (its timers fire in order)."""
    sandbox.create(pod(witness))
    sandbox.bind("default", witness, "gpu-node-0")
    await waiting.until(lambda: running(sandbox, witness), f"{witness} Running")


async def test_nodes_are_shared_gpu_nodes(sandbox: Sandbox) -> None:
    nodes = sandbox.list("nodes")
    assert [n["metadata"]["name"] for n in nodes] == [f"gpu-node-{i}" for i in range(4)]
    for node in nodes:
        assert node["metadata"]["labels"]["deviceshare.io/mode"] == "shared"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {"cpu", "memory"} <= set(node["status"]["allocatable"])
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


async def test_add_node_with_options(sandbox: Sandbox) -> None:
    node = sandbox.add_node(
        "odd",
        gpus=2,
        labels={"deviceshare.io/gpu-model": "A100"},
        unschedulable=True,
        taints=[{"key": "k", "effect": "NoSchedule"}],
        ready=False,
        annotations={"deviceshare.io/devices": '{"nvidia.com/gpu": ["GPU-a", "GPU-b"]}'},
    )
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"][0]["key"] == "k"
    assert node["metadata"]["labels"]["deviceshare.io/gpu-model"] == "A100"
    assert node["status"]["conditions"][0]["status"] == "False"


async def test_binding_sets_node_and_a_second_binding_is_409(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", PODS, pod("p"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "annotations": {"a": "b"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-2"},
    }
    status, body = await http.call("POST", f"{PODS}/p/binding", binding)
    assert (status, body["status"]) == (201, "Success")
    bound = sandbox.get("pods", "p", "default")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-node-2"
    assert bound["metadata"]["annotations"] == {"a": "b"}
    scheduled = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["status"] == "True"
    status, error = await http.call("POST", f"{PODS}/p/binding", dict(binding, target={"name": "gpu-node-3"}))
    assert (status, error["reason"]) == (409, "Conflict")
    assert 'is already assigned to node "gpu-node-2"' in error["message"]
    status, _ = await http.call("POST", "/api/v1/namespaces/default/bindings", binding)
    assert status == 409


async def test_kubelet_runs_bound_pods_and_completes_them(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", PODS, pod("p"))
    await kubelet_caught_up(sandbox, "witness")
    unbound = sandbox.get("pods", "p", "default")
    assert unbound is not None and unbound["status"]["phase"] == "Pending"
    sandbox.bind("default", "p", "gpu-node-0")
    started = await waiting.until(lambda: running(sandbox, "p"), "p Running")
    ready = {c["type"]: c["status"] for c in started["status"]["conditions"]}
    assert ready == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    assert started["status"]["containerStatuses"][0]["state"]["running"]
    done = sandbox.complete_pod("default", "p")
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


async def test_pods_bound_to_a_missing_or_not_ready_node_stay_pending(sandbox: Sandbox) -> None:
    sandbox.add_node("sick", ready=False)
    for name, node in (("a", "sick"), ("b", "ghost-node")):
        sandbox.create(pod(name))
        sandbox.bind("default", name, node)
    await kubelet_caught_up(sandbox, "witness")
    assert {p["metadata"]["name"]: p["status"]["phase"] for p in sandbox.list("pods", "default")} == {
        "a": "Pending", "b": "Pending", "witness": "Running"}


async def test_deleting_a_pod_without_finalizers_removes_it(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", PODS, pod("p"))
    status, _ = await http.call("DELETE", f"{PODS}/p", {"kind": "DeleteOptions", "gracePeriodSeconds": 30})
    assert status == 200 and sandbox.get("pods", "p", "default") is None


async def test_events_are_stored_and_selected_by_involved_object(sandbox: Sandbox, http: Http) -> None:
    for name, reason in (("p1", "Scheduled"), ("p1", "FailedScheduling"), ("p2", "Scheduled")):
        event = {
            "metadata": {"generateName": f"{name}."},
            "reason": reason,
            "message": f"{reason} {name}",
            "type": "Normal",
            "involvedObject": {"kind": "Pod", "name": name, "namespace": "default"},
        }
        status, _ = await http.call("POST", "/api/v1/namespaces/default/events", event)
        assert status == 201
    status, found = await http.call(
        "GET",
        "/api/v1/namespaces/default/events",
        params={"fieldSelector": "involvedObject.name=p1,reason=Scheduled"},
    )
    assert [e["message"] for e in found["items"]] == ["Scheduled p1"]
    found = sandbox.list("events", "default", field_selector="involvedObject.kind=Pod,reason=Scheduled")
    assert sorted(e["involvedObject"]["name"] for e in found) == ["p1", "p2"]
    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e1"},
        "reason": "Scheduled",
        "regarding": {"kind": "Pod", "name": "p1"},
        "eventTime": None,
        "action": "Binding",
        "reportingController": "x",
        "reportingInstance": "y",
        "type": "Normal",
    }
    status, _ = await http.call("POST", "/apis/events.k8s.io/v1/namespaces/default/events", new_style)
    assert status == 201
    _, table = await http.call(
        "GET",
        "/api/v1/namespaces/default/events",
        headers={"Accept": TABLE},
        params={"fieldSelector": "involvedObject.name=p2"},
    )
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Last Seen",
        "Type",
        "Reason",
        "Object",
        "Message",
        "Name",
    ]
    assert table["rows"][0]["cells"][1:5] == ["Normal", "Scheduled", "pod/p2", "Scheduled p2"]


async def test_table_output_uses_the_crd_printer_columns(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("g", 2))
    sandbox.patch(
        "sdg",
        "g",
        {
            "status": {
                "phase": "Bound",
                "nodeName": "gpu-node-1",
                "memberCount": 2,
                "allocatedDevices": {"nvidia.com/gpu": ["0", "1"]},
            }
        },
        "default",
        subresource="status",
    )
    status, table = await http.call("GET", SDG, headers={"Accept": TABLE})
    assert (status, table["kind"], table["apiVersion"]) == (200, "Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Phase",
        "Node",
        "Devices",
        "Share",
        "Claim",
        "Members",
        "Age",
    ]
    cells = table["rows"][0]["cells"]
    assert cells[:7] == ["g", "Bound", "gpu-node-1", '{"nvidia.com/gpu":["0","1"]}', None, None, 2]  # no claim
    assert cells[7].endswith("s")  # an age, like "0s"
    await http.call("POST", SDG, sdg("h", 1, share={"nvidia.com/gpu": {"compute": "250m"}}))
    _, table = await http.call("GET", SDG, headers={"Accept": TABLE})
    assert table["rows"][1]["cells"][4] == '{"nvidia.com/gpu":{"compute":"250m"}}'
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    status, one = await http.call("GET", f"{SDG}/g", headers={"Accept": TABLE})
    assert one["rows"][0]["cells"][0] == "g"
    _, pods = await http.call("GET", PODS, headers={"Accept": TABLE})
    assert [c["name"] for c in pods["columnDefinitions"]][:3] == ["Name", "Ready", "Status"]
