"""Webhook faults: the webhook down, and its certificate (and CA) rotated while pods are being created.

Down: group pods are refused with a message naming the webhook (failurePolicy Fail), while pods
without the group annotation, and every pod in excluded namespaces, are created as usual. Rotation,
done the way cert-manager and its CA injector do it (both CAs in caBundle, swap the key pair, drop
the old CA): no pod creation fails and every group pod is still mutated.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client.exceptions import ApiException

from deviceshare.api import names
from deviceshare.webhooks import certs, configuration, server
from tests.operator.kube import Kube
from tests.reliability import workload


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_webhook_down_refuses_group_pods_clearly_and_spares_everything_else(
    cluster: Any, kube: Kube
) -> None:
    bundle = certs.generate(["127.0.0.1"])
    cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=f"https://127.0.0.1:{closed_port()}",
                                       timeout_seconds=1))
    await kube.create_group("team", "g")
    with pytest.raises(ApiException) as refused:
        await kube.create_pod("team", "member", "g", scheduler="default-scheduler")
    assert refused.value.status >= 400
    message = json.loads(str(refused.value.reason))["message"]
    assert f'failed calling webhook "{configuration.WEBHOOK_NAME}"' in message, message

    await kube.create_pod("team", "plain", None, scheduler="default-scheduler")  # not opted in
    await kube.create_pod("kube-system", "system", "g", scheduler="default-scheduler")  # excluded namespace
    assert cluster.get("pods", "plain", "team") is not None
    assert cluster.get("pods", "system", "kube-system") is not None
    assert cluster.get("pods", "member", "team") is None


async def test_certificate_rotation_under_load_loses_no_pod(cluster: Any, kube: Kube, tmp_path: Path) -> None:
    old, new = certs.generate(["127.0.0.1"]), certs.generate(["127.0.0.1"])
    _, cert, key = old.write(tmp_path / "tls")
    await kube.create_group("load", "g")  # known to the webhook's cache from its first list
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig),
                                      reload_interval_s=0.05)
    try:
        cluster.create(configuration.build(ca_bundle=old.ca_pem, url=hook.url))
        assert hook.index is not None
        await workload.until(lambda: hook.index is not None and hook.index.synced, "the webhook's group cache")
        created: list[str] = []
        failures: list[str] = []
        started = done = 0  # batches of 10 creations, one after the other
        rotated = asyncio.Event()

        async def create(i: int) -> None:
            try:
                await kube.create_pod("load", f"p{i}", "g", scheduler="default-scheduler")
                created.append(f"p{i}")
            except ApiException as e:
                failures.append(f"p{i}: {e.status} {e.reason}")

        async def load() -> None:
            """Batches of creations until the rotation is over: the load overlaps every step, however long."""
            nonlocal started, done
            while not rotated.is_set():
                first = 10 * started
                started += 1
                await asyncio.gather(*(create(i) for i in range(first, first + 10)))
                done += 1

        async def step_settled(what: str) -> None:
            """Every admission call that read the previous configuration or key pair has ended, and a full
            batch was admitted under the new one: the batch in flight at the change, then the next, are done.
            So a rotation in a cluster waits for the CA bundle to reach every API server."""
            mark = started
            await workload.until(lambda: done > mark, f"a batch of creations admitted after {what}")

        def set_ca_bundle(pem: bytes) -> None:
            cluster.patch("mutatingwebhookconfigurations", configuration.DEFAULT_NAME,
                          {"webhooks": [{**cluster.get("mutatingwebhookconfigurations", configuration.DEFAULT_NAME)[
                              "webhooks"][0], "clientConfig": {"url": hook.mutate_url,
                                                               "caBundle": base64.b64encode(pem).decode()}}]})

        traffic = asyncio.get_running_loop().create_task(load())
        await step_settled("the start")
        set_ca_bundle(old.ca_pem + new.ca_pem)  # trust both while the key pair is swapped
        await step_settled("both CAs were trusted")
        new.write(tmp_path / "tls")
        await workload.until(lambda: hook.reloader.generation >= 2, "the new certificate loaded")
        await step_settled("the new key pair was loaded")
        set_ca_bundle(new.ca_pem)
        await step_settled("the old CA was dropped")
        rotated.set()
        await traffic

        assert failures == []
        assert len(created) == 10 * done >= 50  # at least one full batch before and after each of the 4 steps
        for name in created:
            pod = cluster.get("pods", name, "load")
            assert pod["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME, name  # mutated
    finally:
        await hook.stop()


group_refs = st.sampled_from(["g", "g", "missing", "", "  ", "UPPER", "a" * 300, "g/../x", "limited"])
pods = st.fixed_dictionaries(
    {"group": st.one_of(st.none(), group_refs)},
    optional={
        "nodeName": st.sampled_from(["gpu-node-0", ""]),
        "schedulerName": st.sampled_from(["default-scheduler", names.DEFAULT_SCHEDULER_NAME, "other"]),
        "env": st.lists(st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "OTHER"]), max_size=2),
        "forged": st.sampled_from(['{"nvidia.com/gpu": "0,1,2,3"}', "junk"]),
        "init": st.booleans(),
    },
)


async def test_generated_pods_are_mutated_or_denied_with_a_message_never_an_error(
    cluster: Any, kube: Kube, tmp_path: Path
) -> None:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    await kube.create_group("gen", "g")
    await kube.create_group("gen", "limited", maxMembers=1)
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig))
    examples: list[dict[str, Any]] = []

    @settings(max_examples=20, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(pod=pods)
    @example(pod={"group": "g"})  # both outcomes, whatever the draw: one to mutate and one to deny
    @example(pod={"group": "UPPER"})
    def collect(pod: dict[str, Any]) -> None:
        examples.append(pod)

    try:
        cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        await workload.until(lambda: hook.index is not None and hook.index.synced, "the webhook's group cache")
        collect()
        outcomes: dict[str, int] = {}
        for i, ex in enumerate(examples):
            container: dict[str, Any] = {"name": "main", "image": "busybox",
                                         "env": [{"name": n, "value": "x"} for n in ex.get("env", [])]}
            annotations = {} if ex["group"] is None else {names.POD_GROUP_ANNOTATION: ex["group"]}
            if "forged" in ex:
                annotations[names.POD_SELECTED_DEVICES_ANNOTATION] = ex["forged"]
            spec: dict[str, Any] = {"containers": [container]}
            for field in ("nodeName", "schedulerName"):
                if ex.get(field):
                    spec[field] = ex[field]
            if ex.get("init"):
                spec["initContainers"] = [{"name": "init", "image": "busybox"}]
            body: Any = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"p{i}", "namespace": "gen", "annotations": annotations}, "spec": spec}
            try:
                created = await kube._json(kube.core.create_namespaced_pod("gen", body, _preload_content=False))
            except ApiException as e:
                assert e.status in (403, 422, 503), f"{ex}: {e.status} {e.reason}"
                message = json.loads(str(e.reason))["message"]
                assert "admission webhook" in message and "denied the request" in message, message
                outcomes["denied"] = outcomes.get("denied", 0) + 1
                continue
            if ex["group"] in ("g", "limited"):  # opted in and accepted: placed by deviceshare
                assert created["spec"]["schedulerName"] == names.DEFAULT_SCHEDULER_NAME, ex
                assert created["metadata"]["labels"][names.POD_GROUP_LABEL] == ex["group"], ex
            outcomes["allowed"] = outcomes.get("allowed", 0) + 1
        assert outcomes.get("denied") and outcomes.get("allowed"), (outcomes, [e.get("group") for e in examples])
    finally:
        await hook.stop()
