"""`inspect` and `explain` see a node's DRA devices as the operator does (CONTRACT §13): under their DeviceClass with
``<pool>/<device>`` IDs, held by the DRA group whose status names them, tainted ones and those another claim holds
not free, and the extended resource the DRA devices replace (``nvidia.com/gpu``) not offered at all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare import cli
from deviceshare.api import names
from deviceshare.cli import draview, inspect
from deviceshare.sandbox import Sandbox, dradriver
from tests.operator import dra
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube
from tests.sandbox.dra_objects import allocation, resource_slice

NS = "ml"
CLASS = dra.CLASS
NODE = "gpu-node-0"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4, "dra": True}


async def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


async def _bound_dra_group(kube: Kube) -> str:
    """gpu-0 allocated by kube-scheduler for other/theirs, gpu-1 tainted, then the DRA group "trainer" (1 device)
    bound by the operator: the device it got."""
    await dra.allocate_foreign(kube, "other", "theirs", NODE, ["gpu-0"])
    await dra.taint_device(kube, NODE, "gpu-1")
    await dra.create_dra_group(kube, NS, "trainer", 1)
    await dra.create_member(kube, NS, "trainer-0", "trainer")
    await kube.wait_bound(NS, "trainer-0")
    group = await kube.wait_group(NS, "trainer", lambda g: bool((g.get("status") or {}).get("allocatedDevices")),
                                  "devices in its status")
    (device,) = group["status"]["allocatedDevices"][CLASS]
    assert device in (f"{NODE}/gpu-2", f"{NODE}/gpu-3")
    return str(device)


async def test_a_dra_nodes_devices_under_their_class_with_holders_taints_and_other_claims(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    held = await _bound_dra_group(kube)
    free = ({f"{NODE}/gpu-2", f"{NODE}/gpu-3"} - {held}).pop()
    kubeconfig = str(cluster.kubeconfig)
    rc, out, err = await _main(capsys, "inspect", "--kubeconfig", kubeconfig, "-o", "json")
    assert rc == 0 and err == ""
    (node,) = json.loads(out)["nodes"]
    # The node's nvidia.com/gpu are these same GPUs: the operator does not offer them, inspect does not either.
    assert set(node["resources"]) == {CLASS}
    shown = node["resources"][CLASS]
    devices = {d["id"]: d for d in shown["devices"]}
    assert list(devices) == [f"{NODE}/gpu-{i}" for i in range(4)]
    assert all(d["inInventory"] and not d["conflict"] for d in devices.values())
    assert [g["name"] for g in devices[held]["groups"]] == ["trainer"]
    assert devices[f"{NODE}/gpu-0"]["claims"] == ["other/theirs"]
    assert devices[f"{NODE}/gpu-1"].get("tainted") is True
    assert (shown["total"], shown["allocated"], shown["free"]) == (4, 2, [free])

    rc, out, _ = await _main(capsys, "inspect", "--kubeconfig", kubeconfig)
    rows = {r.split()[2]: r.split() for r in out.splitlines() if r.startswith(f"{NODE} ")}
    assert rows[f"{NODE}/gpu-0"][3] == "claim:other/theirs"
    assert rows[f"{NODE}/gpu-1"][-1] == "TAINTED"
    assert rows[held][3] == "ml/trainer"
    assert "NOT-IN-INVENTORY" not in out and "nvidia.com/gpu" not in out
    assert f"{NODE}: {CLASS} 2/4 allocated" in out.splitlines()
    # Its member got the devices from the DRA driver through the claim, not by an env var.
    assert f"  ml/trainer-0  {NODE}  dra claim trainer-devices" in out.splitlines()


async def test_explain_counts_a_dra_nodes_free_devices_and_no_extended_resource(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await _bound_dra_group(kube)
    await dra.create_dra_group(kube, NS, "wide", 2)
    await dra.create_member(kube, NS, "wide-0", "wide")
    await dra.create_dra_group(kube, NS, "all", 4)
    await dra.create_member(kube, NS, "all-0", "all")
    await kube.create_group(NS, "plugin", {"nvidia.com/gpu": 1})
    await kube.create_pod(NS, "plugin-0", "plugin")
    for group in ("wide", "all", "plugin"):
        await kube.wait_group(NS, group, lambda g: "nodes are available" in _scheduled(g), "a reason")
    kubeconfig = str(cluster.kubeconfig)
    rc, out, _ = await _main(capsys, "explain", "--kubeconfig", kubeconfig, "wide-0", "-n", NS)
    assert rc == 0
    assert (f"  - 1 node(s) would fit the group but for {CLASS} devices tainted NoSchedule/NoExecute or allocated by "
            f"a ResourceClaim deviceshare did not make: {NODE} (1 free; {NODE}/gpu-0 claim other/theirs, "
            f"{NODE}/gpu-1 tainted). Remove the device taint or free that claim; `deviceshare inspect` shows "
            "them.") in out.splitlines()
    rc, out, _ = await _main(capsys, "explain", "--kubeconfig", kubeconfig, "all-0", "-n", NS)
    assert f"  - The group needs 4 {CLASS} on ONE node; free {CLASS} per shared node: {NODE} 1/4." in out.splitlines()
    rc, out, _ = await _main(capsys, "explain", "--kubeconfig", kubeconfig, "plugin-0", "-n", NS)
    assert rc == 0
    assert ("  - The group needs 1 nvidia.com/gpu on ONE node; free nvidia.com/gpu per shared node: no shared node "
            "has any.") in out.splitlines()


async def test_claims_the_user_may_not_read_are_said_in_one_line_and_the_rest_shown(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    held = await _bound_dra_group(kube)
    fault = cluster.inject_fault("GET", r"^/apis/resource\.k8s\.io/v1/resourceclaims$", status=403, times=None,
                                 message="resourceclaims.resource.k8s.io is forbidden")
    try:
        rc, out, err = await _main(capsys, "inspect", "--kubeconfig", str(cluster.kubeconfig), "-o", "json")
    finally:
        cluster.clear_faults()
    assert fault.fired >= 1
    assert rc == 0
    (line,) = err.splitlines()
    assert line.startswith("deviceshare inspect: Not allowed to list resourceclaims (resource.k8s.io/v1, 403")
    (node,) = json.loads(out)["nodes"]
    devices = {d["id"]: d for d in node["resources"][CLASS]["devices"]}
    assert [g["name"] for g in devices[held]["groups"]] == ["trainer"]
    assert devices[f"{NODE}/gpu-1"].get("tainted") is True
    assert "claims" not in devices[f"{NODE}/gpu-0"]  # what it could not read, it does not make up

    # explain, for a pod that waits, says it before its hints (here the slices are forbidden too).
    await dra.create_dra_group(kube, NS, "all", 4)
    await dra.create_member(kube, NS, "all-0", "all")
    await kube.wait_group(NS, "all", lambda g: "nodes are available" in _scheduled(g), "a reason")
    fault = cluster.inject_fault("GET", r"^/apis/resource\.k8s\.io/v1/resource(slices|claims)$", status=403,
                                 times=None)
    try:
        rc, out, _ = await _main(capsys, "explain", "--kubeconfig", str(cluster.kubeconfig), "all-0", "-n", NS)
    finally:
        cluster.clear_faults()
    assert fault.fired >= 2
    assert rc == 0
    notes = [line for line in out.splitlines() if line.startswith("Not allowed to list")]
    assert notes == [out.splitlines()[out.splitlines().index("What would help:") - 1]]
    assert notes[0].startswith("Not allowed to list resourceslices, resourceclaims (resource.k8s.io/v1, 403")


def _scheduled(group: dict[str, Any]) -> str:
    return next((str(c.get("message") or "") for c in (group.get("status") or {}).get("conditions") or []
                 if c["type"] == "Scheduled"), "")


_STATES = ("free", "tainted", "theirs", "ours", "ours-tainted")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_STATES), min_size=1, max_size=6))
def test_a_dra_device_is_free_only_when_no_group_no_other_claim_and_no_taint_holds_it(states: list[str]) -> None:
    """Whatever mix of held, claimed and tainted devices: free is exactly the rest, each device listed once under
    its class, holders and claims as the API says, and the node's nvidia.com/gpu never offered beside them."""
    ids = [f"{NODE}/gpu-{i}" for i in range(len(states))]
    devices = []
    for i, state in enumerate(states):
        device = dradriver.gpu_device(NODE, i, 81920, shared=False)
        if state.endswith("tainted"):
            device["taints"] = [{"key": "example.com/broken", "value": "true", "effect": "NoExecute"}]
        devices.append(device)
    ours = [d for d, s in zip(ids, states, strict=True) if s.startswith("ours")]
    theirs = [d for d, s in zip(ids, states, strict=True) if s == "theirs"]
    node = {"metadata": {"name": NODE, "labels": {names.NODE_MODE_LABEL: names.NODE_MODE_SHARED}},
            "status": {"allocatable": {"nvidia.com/gpu": str(len(states)), "cpu": "8", "memory": "8Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    group = {"metadata": {"namespace": NS, "name": "trainer"}, "spec": {"claim": {"deviceClassName": CLASS}},
             "status": {"phase": "Bound", "members": ["trainer-0"], "nodeName": NODE, "allocatedDevices": {CLASS: ours}}
             if ours else {}}

    def claim(ns: str, name: str, held: list[str], owned: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"namespace": ns, "name": name}
        if owned:
            meta["ownerReferences"] = [{"apiVersion": names.API_VERSION, "kind": names.KIND, "name": "trainer",
                                        "controller": True, "uid": "u"}]
        return {"metadata": meta, "status": {"allocation": allocation(NODE, *(d.split("/")[1] for d in held))}}

    claims = [claim(NS, "trainer-devices", ours, True)] if ours else []
    claims += [claim("other", "theirs", theirs, False)] if theirs else []
    objects = draview.DraObjects([resource_slice(NODE, *devices)], [dradriver.device_class()], claims)
    (shown,) = inspect.device_map([node], [group], objects)

    assert set(shown.resources) == {CLASS}
    listed = {d.id: d for d in shown.resources[CLASS]}
    assert list(listed) == ids
    assert shown.free(CLASS) == [d for d, s in zip(ids, states, strict=True) if s == "free"]
    for device_id, state in zip(ids, states, strict=True):
        d = listed[device_id]
        assert d.in_inventory and not d.conflict
        assert d.tainted == state.endswith("tainted")
        assert [h.ref for h in d.holders] == ([f"{NS}/trainer"] if state.startswith("ours") else [])
        assert d.claims == (("other/theirs",) if state == "theirs" else ())
