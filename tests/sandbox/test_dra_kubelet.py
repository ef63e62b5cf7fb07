"""The sandbox's kubelet and pods with DRA claims: a pod starts only when each claim is allocated for its node
and reserved for it, and its containers get the CDI devices the driver prepared; otherwise it stays Pending with
the kubelet's ``FailedPrepareDynamicResources`` event, and starts once the claim is put right."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.dra_objects import MERGE, allocation, claim
from tests.sandbox.helpers import PODS, Http, pod
from tests.waiting import until


@pytest.fixture
async def dra(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=2, gpus=4, dra=True, kubelet_delay=0.01, kubeconfig_path=tmp_path / "kc") as running:
        yield running


def _member(name: str, claim_name: str = "group-devices") -> dict[str, Any]:
    """A pod as the webhook wires a group's member: the claim in the pod, every container naming it but one."""
    body = pod(name, resourceClaims=[{"name": "deviceshare", "resourceClaimName": claim_name}])
    body["spec"]["initContainers"] = [{"name": "init", "image": "busybox", "resources": {
        "claims": [{"name": "deviceshare"}]}}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "deviceshare"}]}
    body["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    return body


def _allocate(sandbox: Sandbox, node: str, *devices: str, reserve: tuple[str, ...] = ()) -> dict[str, Any]:
    """The claim allocated on ``node`` (a scheduler's write), reserved for the pods named in ``reserve``."""
    uids = {p: (sandbox.get("pods", p, "default") or {})["metadata"]["uid"] for p in reserve}
    reserved = [{"resource": "pods", "name": p, "uid": u} for p, u in uids.items()]
    status: dict[str, Any] = {"allocation": allocation(node, *devices), "reservedFor": reserved or None}
    return sandbox.patch("resourceclaims", "group-devices", {"status": status}, "default", subresource="status")


def _phase(sandbox: Sandbox, name: str) -> str:
    return str((sandbox.get("pods", name, "default") or {}).get("status", {}).get("phase"))


async def _failure(sandbox: Sandbox, pod_name: str, needle: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        return [e for e in sandbox.list("events", "default", field_selector=f"involvedObject.name={pod_name}")
                if e["reason"] == "FailedPrepareDynamicResources" and needle in e["message"]]

    (event,) = await until(found, f"a FailedPrepareDynamicResources event saying {needle!r}")
    assert event["type"] == "Warning" and event["source"] == {"component": "kubelet"}
    assert event["message"].startswith("Failed to prepare dynamic resources: prepare dynamic resources: ")
    assert _phase(sandbox, pod_name) == "Pending"
    return event


async def test_a_reserved_claim_allocated_on_the_node_starts_the_pod_with_its_cdi_devices(dra: Sandbox) -> None:
    created = dra.create(claim(count=2))
    dra.create(_member("m-0"))
    dra.create(_member("m-1"))
    _allocate(dra, "gpu-node-1", "gpu-1", "gpu-3", reserve=("m-0", "m-1"))
    for name in ("m-0", "m-1"):
        dra.bind("default", name, "gpu-node-1")
    await until(lambda: _phase(dra, "m-0") == "Running" and _phase(dra, "m-1") == "Running", "both members running")
    assert dra.kubelet is not None
    prefix = f"k8s.gpu.nvidia.com/claim={created['metadata']['uid']}"
    assert dra.kubelet.started_cdi[("default", "m-0")] == {
        "init": [f"{prefix}-gpu-1", f"{prefix}-gpu-3"],
        "main": [f"{prefix}-gpu-1", f"{prefix}-gpu-3"],
        "sidecar": [],  # names no claim: gets no device
    }
    assert dra.list("events", "default", field_selector="reason=FailedPrepareDynamicResources") == []


async def test_an_unreserved_pod_waits_and_starts_once_reserved(dra: Sandbox) -> None:
    created = dra.create(claim())
    member = dra.create(_member("m-0"))
    _allocate(dra, "gpu-node-0", "gpu-0")
    dra.bind("default", "m-0", "gpu-node-0")
    event = await _failure(dra, "m-0", "is not allowed to use ResourceClaim")
    assert event["message"].endswith(f"pod m-0 ({member['metadata']['uid']}) is not allowed to use ResourceClaim "
                                     f"group-devices ({created['metadata']['uid']})")
    uid = member["metadata"]["uid"]
    dra.patch("resourceclaims", "group-devices", {"status": {"reservedFor": [
        {"resource": "pods", "name": "m-0", "uid": uid}]}}, "default", subresource="status", content_type=MERGE)
    await until(lambda: _phase(dra, "m-0") == "Running", "the member running once reserved")


async def test_a_missing_claim_waits_until_it_exists(dra: Sandbox) -> None:
    dra.create(_member("m-0"))
    dra.bind("default", "m-0", "gpu-node-0")
    await _failure(dra, "m-0", 'fetch ResourceClaim group-devices: resourceclaims.resource.k8s.io "group-devices" '
                               "not found")
    dra.create(claim())
    _allocate(dra, "gpu-node-0", "gpu-2", reserve=("m-0",))
    await until(lambda: _phase(dra, "m-0") == "Running", "the member running once its claim exists")


@pytest.mark.parametrize(
    ("allocated_on", "device", "needle"),
    [
        ("gpu-node-1", "gpu-0", "ResourceClaim group-devices is allocated for other nodes: "
                                'status.allocation.nodeSelector does not match node "gpu-node-0"'),
        ("gpu-node-0", "gpu-9", "NodePrepareResources failed for ResourceClaim group-devices: error preparing "
                                "devices for claim default/group-devices:"),  # the node has gpu-0..gpu-3
    ],
)
async def test_a_claim_allocated_elsewhere_never_starts_the_pod(
    dra: Sandbox, allocated_on: str, device: str, needle: str
) -> None:
    dra.create(claim())
    dra.create(_member("m-0"))
    _allocate(dra, allocated_on, device, reserve=("m-0",))
    dra.bind("default", "m-0", "gpu-node-0")
    event = await _failure(dra, "m-0", needle)
    if device == "gpu-9":
        assert event["message"].endswith('prepare devices failed: allocatable not found for device "gpu-9"')


async def test_without_the_driver_on_the_node_the_claim_cannot_be_prepared(sandbox: Sandbox) -> None:
    sandbox.create(claim())
    sandbox.create(_member("m-0"))
    _allocate(sandbox, "gpu-node-0", "gpu-0", reserve=("m-0",))
    sandbox.bind("default", "m-0", "gpu-node-0")
    await _failure(sandbox, "m-0", "DRA driver gpu.nvidia.com is not registered")


async def test_a_claim_from_a_template_not_created_yet_or_not_the_pods(dra: Sandbox) -> None:
    dra.create(pod("m-0", resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]))
    dra.bind("default", "m-0", "gpu-node-0")
    await _failure(dra, "m-0", 'pod "default/m-0": ResourceClaim not created yet')
    dra.create(claim("m-0-gpu"))  # made from the template, but not owned by the pod
    dra.patch("pods", "m-0", {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "m-0-gpu"}]}},
              "default", subresource="status")
    await _failure(dra, "m-0", "ResourceClaim default/m-0-gpu was not created for pod default/m-0 (pod is not owner)")


async def test_a_pod_without_claims_starts_as_before(dra: Sandbox) -> None:
    dra.create(pod("plain"))
    dra.bind("default", "plain", "gpu-node-0")
    await until(lambda: _phase(dra, "plain") == "Running", "a pod without claims running")
    assert dra.kubelet is not None and ("default", "plain") not in dra.kubelet.started_cdi


async def test_the_nodes_plugin_has_the_devices_its_slice_publishes_now(dra: Sandbox) -> None:
    (node_slice,) = dra.list("resourceslices", field_selector="spec.nodeName=gpu-node-0")
    devices = node_slice["spec"]["devices"]
    dra.patch("resourceslices", node_slice["metadata"]["name"], {"spec": {"devices": devices[:3]}})  # gpu-3 gone
    dra.create(claim())
    dra.create(_member("m-0"))
    _allocate(dra, "gpu-node-0", "gpu-3", reserve=("m-0",))
    dra.bind("default", "m-0", "gpu-node-0")
    await _failure(dra, "m-0", 'allocatable not found for device "gpu-3"')


def _second_claim(sandbox: Sandbox, node: str, device: str, pod_name: str, **result: Any) -> dict[str, Any]:
    """Another claim, allocated ``device`` of ``node`` too, reserved for its own pod bound there."""
    created = sandbox.create(claim("other-devices"))
    sandbox.create(_member(pod_name, "other-devices"))
    uid = (sandbox.get("pods", pod_name, "default") or {})["metadata"]["uid"]
    sandbox.patch("resourceclaims", "other-devices", {"status": {
        "allocation": allocation(node, device, **result),
        "reservedFor": [{"resource": "pods", "name": pod_name, "uid": uid}]}}, "default", subresource="status")
    sandbox.bind("default", pod_name, node)
    return created


async def test_a_device_prepared_for_one_claim_is_refused_to_another_until_released(dra: Sandbox) -> None:
    first = dra.create(claim())
    dra.create(_member("m-0"))
    _allocate(dra, "gpu-node-0", "gpu-1", reserve=("m-0",))
    dra.bind("default", "m-0", "gpu-node-0")
    await until(lambda: _phase(dra, "m-0") == "Running", "the first claim's pod running")
    _second_claim(dra, "gpu-node-0", "gpu-1", "intruder")  # a double allocation, as a racing scheduler makes
    event = await _failure(dra, "intruder", "requested device gpu-1 is already allocated to different claim")
    assert event["message"].endswith(f"already allocated to different claim {first['metadata']['uid']}")
    dra.complete_pod("default", "m-0")  # the first claim's only pod on the node stops: its claim is unprepared
    await until(lambda: _phase(dra, "intruder") == "Running", "the second claim's pod running once the first left")


async def test_shares_of_one_device_are_prepared_for_several_claims(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, gpus=1, dra=True, dra_shared=True, kubelet_delay=0.01,
                       kubeconfig_path=tmp_path / "kc") as shared:
        shared.create(claim())
        shared.create(_member("m-0"))
        first = allocation("gpu-node-0", "gpu-0", shareID="0b7c1c6e-2d4f-4c1a-9a57-3f6f0c2c1a11",
                           consumedCapacity={"memory": "40Gi"})
        uid = (shared.get("pods", "m-0", "default") or {})["metadata"]["uid"]
        shared.patch("resourceclaims", "group-devices", {"status": {
            "allocation": first, "reservedFor": [{"resource": "pods", "name": "m-0", "uid": uid}]}},
            "default", subresource="status")
        shared.bind("default", "m-0", "gpu-node-0")
        _second_claim(shared, "gpu-node-0", "gpu-0", "n-0", shareID="7d3f3a52-9a0e-4c57-8f0c-5d3f4f1b2e33",
                      consumedCapacity={"memory": "40Gi"})
        await until(lambda: _phase(shared, "m-0") == "Running" and _phase(shared, "n-0") == "Running",
                    "both sharing pods running")
        assert shared.kubelet is not None
        assert shared.kubelet.started_cdi[("default", "n-0")]["main"][0].endswith(
            "-gpu-0-7d3f3a52-9a0e-4c57-8f0c-5d3f4f1b2e33")


async def test_a_container_may_only_name_the_pods_claims(http: Http) -> None:
    body = _member("m-0")
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}, {"name": "deviceshare"},
                                                            {"name": "deviceshare"}]
    status, refused = await http.call("POST", PODS, body)
    assert status == 422
    assert [f"{c['field']}: {c['message']}" for c in refused["details"]["causes"]] == [
        'spec.containers[0].resources.claims[0]: Not found: "gpus": must be one of the names in '
        "pod.spec.resourceClaims: deviceshare",
        'spec.containers[0].resources.claims[2]: Duplicate value: "deviceshare"',
    ]
    del body["spec"]["resourceClaims"]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "deviceshare"}]
    status, refused = await http.call("POST", PODS, body)
    assert "must be one of the names in pod.spec.resourceClaims which is empty" in refused["message"]
