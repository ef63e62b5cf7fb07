"""Clients nobody here wrote must work against the sandbox: Kopf, kubernetes_asyncio and kubectl."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes_asyncio import client, config, watch

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.helpers import sdg

KUBECTL = shutil.which("kubectl")


async def _bound(sandbox: Sandbox, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        group = sandbox.get("sdg", name, "default")
        return group if group and group.get("status", {}).get("phase") == "Bound" else None

    result: dict[str, Any] = await waiting.until(bound, f"{name} handled")
    return result


async def test_a_kopf_operator_runs_in_process_against_the_sandbox(sandbox: Sandbox) -> None:
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=sandbox.url, insecure=True)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 1
        settings.watching.client_timeout = 2
        settings.posting.enabled = False

    @kopf.on.create("deviceshare.io", "v1alpha1", "shareddevicegroups", registry=registry)
    def created(name: str, patch: kopf.Patch, **_: Any) -> None:
        seen.append(name)
        patch.status["phase"] = "Bound"
        patch.status["nodeName"] = "gpu-node-0"

    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)
    )
    try:
        sandbox.create(sdg("g"))
        group = await _bound(sandbox, "g")
        assert group["status"] == {"phase": "Bound", "nodeName": "gpu-node-0"}
        assert seen == ["g"]
        # a change Kopf never sees on its stream, then the history is gone and the stream drops:
        # Kopf resumes from its last version, gets 410 Gone, lists again and handles the change
        sandbox.stall_watches()
        sandbox.create(sdg("after-410"))
        sandbox.compact()
        sandbox.drop_watches()
        gone_before = sandbox.api.watches_gone
        sandbox.resume_watches()
        await _bound(sandbox, "after-410")
        assert sandbox.api.watches_gone > gone_before
        assert seen == ["g", "after-410"]
    finally:
        stop.set_result(None)
        await asyncio.wait_for(task, waiting.HANG_GUARD)


async def test_kubernetes_asyncio_with_the_written_kubeconfig(sandbox: Sandbox) -> None:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(sandbox.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)
        nodes = await core.list_node(label_selector="deviceshare.io/mode=shared")
        assert len(nodes.items) == 4 and nodes.metadata.resource_version
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name="p"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")]),
        )
        created = await core.create_namespaced_pod("default", body)
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name="p"),
            target=client.V1ObjectReference(kind="Node", name="gpu-node-1"),
        )
        await core.create_namespaced_binding("default", binding, _preload_content=False)
        phases = []
        async with watch.Watch().stream(
            core.list_namespaced_pod,
            "default",
            resource_version=created.metadata.resource_version,
            timeout_seconds=1,
        ) as stream:
            async for event in stream:
                phases.append((event["type"], event["object"].spec.node_name, event["object"].status.phase))
                if event["object"].status.phase == "Running":
                    break
        assert phases[-1] == ("MODIFIED", "gpu-node-1", "Running")
        custom = client.CustomObjectsApi(api)
        with pytest.raises(client.ApiException) as rejected:
            await custom.create_namespaced_custom_object(
                "deviceshare.io", "v1alpha1", "default", "shareddevicegroups", sdg("bad", gpus=0)
            )
        assert rejected.value.status == 422
        stale = dict(created.to_dict()["metadata"])
        with pytest.raises(client.ApiException) as conflict:
            await core.patch_namespaced_pod(
                "p",
                "default",
                {"metadata": {"resourceVersion": stale["resource_version"], "labels": {"a": "b"}}},
            )
        assert conflict.value.status == 409



async def test_leases_for_leader_election_are_served_with_optimistic_concurrency(sandbox: Sandbox) -> None:
    """What client-go's (and our operator's) Lease lock relies on: discovery, create-once, 409 when stale."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(sandbox.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        resources = await client.CoordinationV1Api(api).get_api_resources()
        lease_type = next(r for r in resources.resources if r.name == "leases")
        assert lease_type.namespaced and lease_type.kind == "Lease"
        assert {"get", "create", "update"} <= set(lease_type.verbs)
        leases = client.CoordinationV1Api(api)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lock"},
                "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0}}
        created = await leases.create_namespaced_lease("default", body)
        with pytest.raises(client.ApiException) as twice:
            await leases.create_namespaced_lease("default", body)
        assert twice.value.status == 409
        renewed = await leases.replace_namespaced_lease("lock", "default", dict(
            body, metadata={"name": "lock", "resourceVersion": created.metadata.resource_version},
            spec=dict(body["spec"], renewTime="2026-11-23T12:00:00.000000Z"),
        ))
        assert renewed.spec.renew_time is not None and renewed.spec.holder_identity == "a"
        with pytest.raises(client.ApiException) as stale:
            await leases.replace_namespaced_lease("lock", "default", dict(
                body, metadata={"name": "lock", "resourceVersion": created.metadata.resource_version},
                spec=dict(body["spec"], holderIdentity="b"),
            ))
        assert stale.value.status == 409
        assert sandbox.get("leases", "lock", "default")["spec"]["holderIdentity"] == "a"

def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")
async def test_kubectl_apply_get_describe_delete(sandbox: Sandbox, tmp_path: Path) -> None:
    manifest = tmp_path / "group.yaml"
    manifest.write_text(json.dumps(sdg("trainer", gpus=2)))

    async def run(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(kubectl, sandbox.kubeconfig, *args)

    applied = await run("apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    assert "shareddevicegroup.deviceshare.io/trainer created" in applied.stdout
    again = await run("apply", "-f", str(manifest))
    assert "unchanged" in again.stdout, again.stderr
    sandbox.patch(
        "sdg",
        "trainer",
        {"status": {"phase": "Bound", "nodeName": "gpu-node-3", "memberCount": 1}},
        "default",
        subresource="status",
    )
    listed = await run("get", "sdg")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "NODE", "DEVICES", "SHARE", "CLAIM", "MEMBERS", "AGE"]
    assert row.split()[:3] == ["trainer", "Bound", "gpu-node-3"]
    nodes = await run("get", "nodes", "-l", "deviceshare.io/mode=shared", "-o", "name")
    assert nodes.stdout.split() == [f"node/gpu-node-{i}" for i in range(4)]
    described = await run("describe", "sdg", "trainer")
    assert described.returncode == 0 and "Name:         trainer" in described.stdout, described.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(sdg("bad", gpus=100)))
    rejected = await run("apply", "-f", str(bad))
    assert rejected.returncode != 0 and "less than or equal to 64" in rejected.stderr
    namespace = await run("create", "namespace", "team")  # sent as protobuf by kubectl's typed client
    assert namespace.returncode == 0, namespace.stderr
    configmap = await run("create", "configmap", "cfg", "-n", "team", "--from-literal=a=b")
    assert configmap.returncode == 0, configmap.stderr
    assert (sandbox.get("configmaps", "cfg", "team") or {}).get("data") == {"a": "b"}
    deleted = await run("delete", "-f", str(manifest))
    assert deleted.returncode == 0, deleted.stderr
    assert sandbox.get("sdg", "trainer", "default") is None
