"""The examples, applied as they stand to a sandbox with the webhook and the operator, end up running.

Everything goes through the API as ``kubectl apply -f examples/`` would: the webhook is registered
as a MutatingWebhookConfiguration and called by the sandbox's admission over TLS, the operator
places the groups and binds the pods. Then every example pod must be bound, with the env wiring
the webhook injects and the device annotations the operator writes, matching its group's status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import envnames, models, names
from deviceshare.cli import inspect
from deviceshare.kube import applying, connecting
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs, configuration, server
from tests import waiting
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GPU = "nvidia.com/gpu"
ENV = envnames.EnvNames().for_resource(GPU)


class Stack:
    def __init__(self, cluster: Sandbox, kube: Kube, applier: applying.Applier) -> None:
        self.cluster, self.kube, self.applier = cluster, kube, applier


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    bundle = certs.generate(["127.0.0.1", "localhost"])
    _, cert, key = bundle.write(tmp_path / "tls")
    async with Sandbox(nodes=4, gpus=8, intel_nodes=1, kubelet_delay=0.01,
                       kubeconfig_path=tmp_path / "kubeconfig") as cluster:
        api = await connecting.api_client(str(cluster.kubeconfig))
        webhook = await server.start_webhook(tls_cert=cert, tls_key=key, api_client=api)
        operator = await start_operator(operator_config(cluster))
        try:
            applier = applying.Applier(api)
            await applier.apply(configuration.build(url=webhook.url, ca_bundle=bundle.ca_pem))
            assert webhook.index is not None and await webhook.index.wait_synced(waiting.HANG_GUARD)
            async with Kube.connect(str(cluster.kubeconfig)) as kube:
                yield Stack(cluster, kube, applier)
        finally:
            await operator.stop()
            await webhook.stop()
            await api.close()


async def _apply(applier: applying.Applier, obj: dict[str, Any]) -> dict[str, Any]:
    # The webhook knows groups from a watch, so a pod sent milliseconds after its group can be
    # denied with "does not exist" (a ReplicaSet would retry; so does this test, until the hang guard).
    deadline = asyncio.get_running_loop().time() + waiting.HANG_GUARD
    while True:
        try:
            return await applier.apply(obj)
        except applying.ApplyError as e:
            if "does not exist" not in str(e) or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)  # a retry's pause, as a controller's requeue


async def _apply_examples(applier: applying.Applier) -> list[dict[str, Any]]:
    applied: list[dict[str, Any]] = []
    # The node first, as a user would label/annotate a node before creating groups.
    for path in sorted(EXAMPLES.glob("*.yaml"), key=lambda p: (p.name != "gpu-node.yaml", p.name)):
        for obj in applying.load(path):
            stored = await _apply(applier, obj)
            applied.append(stored)
            if obj["kind"] == "Deployment":
                applied += await _pods_of(applier, stored)
    return applied


async def _pods_of(applier: applying.Applier, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    # The sandbox runs no controller-manager, so nothing turns a Deployment into pods: create the
    # pods its ReplicaSet would, from the template, through the API (so the webhook sees them).
    template = deployment["spec"]["template"]
    pods = []
    for i in range(int(deployment["spec"].get("replicas", 1))):
        meta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{deployment['metadata']['name']}-{i}",
                         "namespace": deployment["metadata"]["namespace"],
                         "labels": dict(meta.get("labels") or {}),
                         "annotations": dict(meta.get("annotations") or {})},
            "spec": template["spec"],
        }
        pods.append(await _apply(applier, pod))
    return pods


async def test_every_example_pod_runs_with_its_groups_devices(stack: Stack) -> None:
    applied = await _apply_examples(stack.applier)
    pods = [o for o in applied if o["kind"] == "Pod"]
    # trainer + evaluator, two notebooks, three inference replicas; 3 + 4 sharing pods, 2 on Intel tiles
    assert len(pods) >= 15
    kube = stack.kube

    for created in pods:
        ns, name = created["metadata"]["namespace"], created["metadata"]["name"]
        pod = await kube.wait_bound(ns, name)
        group_name = pod["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]
        group = await kube.wait_group(
            ns, group_name, lambda g, n=name: n in ((g.get("status") or {}).get("members") or []), f"{name} as a member"
        )
        status = group["status"]
        assert status["phase"] == names.PHASE_BOUND
        assert pod["spec"]["nodeName"] == status["nodeName"]
        spec = models.GroupSpec.model_validate(group["spec"])
        (resource,) = spec.resources
        wired = envnames.EnvNames().for_group(spec)
        # The webhook's part: our scheduler, and each container reads the env vars from the annotations.
        assert pod["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env") or []}
            for var in wired:
                assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == names.env_field_path(var)
            assert resource not in ((container.get("resources") or {}).get("requests") or {})
        # The operator's part: the group's devices, on the pod; and what the containers started with.
        annotations = pod["metadata"]["annotations"]
        devices = status["allocatedDevices"][resource]
        assert json.loads(annotations[names.POD_SELECTED_DEVICES_ANNOTATION]) == {resource: ",".join(devices)}
        assert len(devices) == spec.resources[resource]
        seen = await kube.wait_for(lambda k=(ns, name): stack.cluster.kubelet.started_env.get(k), f"{name} started")
        assert seen["main" if "main" in seen else pod["spec"]["containers"][0]["name"]] == {
            var: annotations[names.env_annotation(var)] for var in wired}
        share = spec.shares.get(resource)
        if share is None or share.tiles is None:
            assert all(annotations[names.env_annotation(v)] == ",".join(devices) for v in ENV if v in wired)
        if share is not None and share.memory is not None:
            mib = share.memory_bytes // 2**20
            assert annotations[names.env_annotation("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")] == f"0={mib}M"
        if share is not None and share.compute is not None:
            percent = str(share.compute_milli // 10)  # 250m -> 25, 500m -> 50
            assert annotations[names.env_annotation("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")] == percent
        if share is not None and share.tiles is not None:
            tile = annotations[names.env_annotation("ZE_AFFINITY_MASK")].split(".")[1]
            assert status["allocatedTiles"][resource] == [f"{devices[0]}.{tile}"]

    # The examples' promises: trainer and evaluator share two GPUs; the inference replicas share one.
    by_group: dict[tuple[str, str], set[str]] = {}
    for created in pods:
        pod = await kube.pod(created["metadata"]["namespace"], created["metadata"]["name"])
        assert pod is not None
        key = (pod["metadata"]["namespace"], pod["metadata"]["annotations"][names.POD_GROUP_ANNOTATION])
        by_group.setdefault(key, set()).add(pod["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION])
    assert all(len(selections) == 1 for selections in by_group.values()), by_group
    assert len(by_group[("serving", "inference")]) == 1
    # Three inference groups on one GPU by memory; the two tile groups on the two tiles of one card.
    placed = {(g["metadata"]["namespace"], g["metadata"]["name"]): g["status"] for g in await kube.groups()}
    on = {(placed[("inference", g)]["nodeName"], *placed[("inference", g)]["allocatedDevices"][GPU])
          for g in ("llm", "embeddings", "speech")}
    assert len(on) == 1, on
    tiles = [placed[("media", g)]["allocatedTiles"]["gpu.intel.com/i915"] for g in ("encode", "decode")]
    assert sorted(t for ts in tiles for t in ts) == ["0.0", "0.1"]
    assert len({placed[("notebooks", f"nb-{u}")]["nodeName"] for u in ("alice", "bob", "carol", "dave")}) == 1

    # The node example was applied over the sandbox's node: inspect shows its explicit device IDs.
    node = await kube._json(kube.core.read_node("gpu-node-1", _preload_content=False))
    mapped = {n.name: n for n in inspect.device_map([node], await kube.groups())}
    assert [d.id for d in mapped["gpu-node-1"].resources[GPU] if d.in_inventory] == json.loads(
        node["metadata"]["annotations"][names.NODE_DEVICES_ANNOTATION])[GPU]
    assert node["metadata"]["labels"]["deviceshare.io/gpu-model"] == "A100"


async def test_a_member_that_sets_its_own_share_limit_is_refused(stack: Stack) -> None:
    """A sharing group's limit variables are the operator's to write: a pod may not raise its own."""
    group = {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": "nb", "namespace": "lab"},
             "spec": {"resources": {GPU: 1}, "share": {GPU: {"compute": "250m", "memory": "8Gi"}}}}
    await _apply(stack.applier, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lab"}})
    await _apply(stack.applier, group)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "greedy", "namespace": "lab", "annotations": {names.POD_GROUP_ANNOTATION: "nb"}},
           "spec": {"containers": [{"name": "main", "image": "busybox",
                                    "env": [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]}]}}
    with pytest.raises(applying.ApplyError, match="sets env var CUDA_MPS_ACTIVE_THREAD_PERCENTAGE itself"):
        await _apply(stack.applier, pod)
    # Without the variable it is admitted, and starts with the limits of its share.
    del pod["spec"]["containers"][0]["env"]
    await _apply(stack.applier, pod)
    await stack.kube.wait_bound("lab", "greedy")
    seen = await stack.kube.wait_for(lambda: stack.cluster.kubelet.started_env.get(("lab", "greedy")), "started")
    assert seen["main"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert seen["main"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"


async def test_applying_again_sends_only_what_the_file_changed(stack: Stack, tmp_path: Path) -> None:
    api = stack.applier._api
    path = EXAMPLES / "spread-group.yaml"
    first = await applying.apply_file(api, path)
    await stack.kube.wait_bound("research", "notebook-alice")  # mutated by the webhook and operator since

    async def running() -> dict[str, Any] | None:  # the kubelet's status writes are done by then
        pod = await stack.kube.pod("research", "notebook-alice")
        return pod if pod and (pod.get("status") or {}).get("phase") == "Running" else None

    pod = await stack.kube.wait_for(running, "notebook-alice to run")

    # Unchanged file: nothing is written (a pod's spec could not be patched back anyway). The sandbox's Namespace,
    # made without managedFields, has its unowned fields adopted once at the second apply ("before-first-apply",
    # sandbox/applying.py): from then on, nothing.
    again = await applying.apply_file(api, path)
    third = await applying.apply_file(api, path)
    assert [o["metadata"]["resourceVersion"] for o in third] == [o["metadata"]["resourceVersion"] for o in again]
    assert [o["metadata"]["uid"] for o in third] == [o["metadata"]["uid"] for o in first]
    assert (await stack.kube.pod("research", "notebook-alice"))["metadata"]["resourceVersion"] == \
        pod["metadata"]["resourceVersion"]  # type: ignore[index]

    # A label added in the file is added; removed from the file, it is removed; the rest is kept.
    objects = applying.load(path)
    group = next(o for o in objects if o["kind"] == "SharedDeviceGroup")
    group["metadata"]["labels"] = {"team": "research"}
    labelled = await applying.apply(api, group)
    assert labelled["metadata"]["labels"] == {"team": "research"}
    del group["metadata"]["labels"]
    unlabelled = await applying.apply(api, group)
    assert not unlabelled["metadata"].get("labels")
    assert unlabelled["metadata"]["uid"] == first[1]["metadata"]["uid"]
    assert unlabelled["status"]["phase"] == names.PHASE_BOUND  # the operator's status is not touched


async def test_unknown_kinds_and_refusals_name_the_object(tmp_path: Path) -> None:
    async with Sandbox(nodes=1, kubelet_delay=None, kubeconfig_path=tmp_path / "kubeconfig") as cluster, \
            await connecting.api_client(str(cluster.kubeconfig)) as api:
        await _refusals(api)


async def _refusals(api: Any) -> None:
    with pytest.raises(applying.ApplyError, match="serves no Widget"):
        await applying.apply(api, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    bad_group = {"apiVersion": names.API_VERSION, "kind": names.KIND,
                 "metadata": {"name": "bad", "namespace": "default"}, "spec": {"resources": {}}}
    with pytest.raises(applying.ApplyError, match="SharedDeviceGroup default/bad") as refused:
        await applying.apply(api, bad_group)
    assert refused.value.status == 422
