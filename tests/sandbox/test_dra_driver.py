"""The simulated NVIDIA DRA driver (``Sandbox(dra=True)``): its DeviceClass and one ResourceSlice per GPU node, with
the attributes and capacity NVIDIA's kubelet plugin publishes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from deviceshare.sandbox import Sandbox, dradriver
from tests.sandbox.dra_objects import allocation, claim
from tests.sandbox.test_clients import KUBECTL, kubectl
from tests.waiting import until


async def test_off_by_default(sandbox: Sandbox) -> None:
    assert sandbox.list("resourceslices") == []
    assert sandbox.get("deviceclasses", "gpu.nvidia.com") is None


async def test_one_slice_per_gpu_node_with_nvidias_attributes(tmp_path: Path) -> None:
    async with Sandbox(nodes=2, gpus=4, dra=True, intel_nodes=1, kubeconfig_path=tmp_path / "kc") as sandbox:
        slices = sandbox.list("resourceslices")
        assert sorted(s["spec"]["nodeName"] for s in slices) == ["gpu-node-0", "gpu-node-1"]  # no Intel node
        one = next(s for s in slices if s["spec"]["nodeName"] == "gpu-node-0")
        assert one["metadata"]["name"].startswith("gpu-node-0-gpu.nvidia.com-")
        assert one["spec"]["driver"] == "gpu.nvidia.com"
        assert one["spec"]["pool"] == {"name": "gpu-node-0", "generation": 1, "resourceSliceCount": 1}
        assert [d["name"] for d in one["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        gpu = one["spec"]["devices"][0]
        assert gpu["attributes"]["type"] == {"string": "gpu"}
        assert gpu["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
        assert gpu["attributes"]["uuid"]["string"].startswith("GPU-")
        assert gpu["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
        assert gpu["capacity"] == {"memory": {"value": "80Gi"}}
        assert "allowMultipleAllocations" not in gpu
        uuids = {d["attributes"]["uuid"]["string"] for s in slices for d in s["spec"]["devices"]}
        assert len(uuids) == 8
        selector = sandbox.get("deviceclasses", "gpu.nvidia.com")["spec"]["selectors"][0]["cel"]["expression"]
        assert selector == "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


async def test_shared_devices_allow_multiple_allocations(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, gpus=1, dra=True, dra_shared=True, gpu_memory_mib=40960,
                       kubeconfig_path=tmp_path / "kc") as sandbox:
        (gpu,) = sandbox.list("resourceslices")[0]["spec"]["devices"]
        assert gpu["allowMultipleAllocations"] is True
        assert gpu["capacity"]["memory"] == {"value": "40Gi", "requestPolicy": {
            "default": "40Gi", "validRange": {"min": "1Gi", "step": "1Gi", "max": "40Gi"}}}


async def test_a_node_added_later_gets_its_slice_and_a_deleted_one_loses_it(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, gpus=2, dra=True, kubeconfig_path=tmp_path / "kc") as sandbox:
        sandbox.add_node("cpu-only", gpus=0)
        sandbox.add_node("late", gpus=3)  # published after whatever the driver does for cpu-only
        late = await until(lambda: [s for s in sandbox.list("resourceslices") if s["spec"]["nodeName"] == "late"],
                           "the late node's slice")
        assert len(late) == 1 and len(late[0]["spec"]["devices"]) == 3
        assert sorted(s["spec"]["nodeName"] for s in sandbox.list("resourceslices")) == ["gpu-node-0", "late"]
        sandbox.delete("nodes", "late")  # the slice is owned by its Node
        assert [s["spec"]["nodeName"] for s in sandbox.list("resourceslices")] == ["gpu-node-0"]


def test_cdi_device_names_follow_nvidias_plugin() -> None:
    claim = {"metadata": {"uid": "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"}, "status": {"allocation": {"devices": {
        "results": [
            {"request": "devices", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"},
            {"request": "devices", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-1",
             "shareID": "0b7c1c6e-2d4f-4c1a-9a57-3f6f0c2c1a11"},
            {"request": "nic", "driver": "net.example.com", "pool": "n", "device": "eth0"},
        ]}}}}
    assert dradriver.prepare(claim, "n", {"gpu-0", "gpu-1"}) == [
        "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0",
        "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-1-0b7c1c6e-2d4f-4c1a-9a57-3f6f0c2c1a11",
    ]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")
async def test_kubectl_lists_slices_and_applies_a_claim(tmp_path: Path) -> None:
    async with Sandbox(nodes=2, gpus=2, dra=True, kubeconfig_path=tmp_path / "kc") as sandbox:
        manifest = tmp_path / "claim.yaml"
        manifest.write_text(json.dumps(claim(count=2)))

        async def run(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(kubectl, sandbox.kubeconfig, *args)

        listed = await run("get", "resourceslices", "--field-selector", "spec.nodeName=gpu-node-1", "-o", "name")
        assert listed.returncode == 0, listed.stderr
        assert [line.split("/")[0] for line in listed.stdout.split()] == ["resourceslice.resource.k8s.io"]
        applied = await run("apply", "-f", str(manifest))
        assert applied.returncode == 0, applied.stderr
        assert "resourceclaim.resource.k8s.io/group-devices created" in applied.stdout
        manifest.write_text(json.dumps(claim(count=3)))
        changed = await run("apply", "-f", str(manifest))
        assert changed.returncode != 0 and "field is immutable" in changed.stderr
        classes = await run("get", "deviceclasses", "-o", "name")
        assert classes.stdout.split() == ["deviceclass.resource.k8s.io/gpu.nvidia.com"]
        slices = await run("get", "resourceslices")
        header, row = slices.stdout.splitlines()[:2]
        assert header.split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
        assert row.split()[1:4] == ["gpu-node-0", "gpu.nvidia.com", "gpu-node-0"]
        claims = await run("get", "resourceclaims")
        assert claims.stdout.splitlines()[1].split()[:2] == ["group-devices", "pending"]
        sandbox.patch("resourceclaims", "group-devices", {"status": {
            "allocation": allocation("gpu-node-1", "gpu-0", "gpu-1"),
            "reservedFor": [{"resource": "pods", "name": "m-0", "uid": "00000000-0000-4000-8000-000000000000"}]}},
            "default", subresource="status")
        claims = await run("get", "resourceclaims")
        assert claims.stdout.splitlines()[1].split()[:2] == ["group-devices", "allocated,reserved"]
