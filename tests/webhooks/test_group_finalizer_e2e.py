"""The group finalizer set in the group's CREATE, end to end: the sandbox's admission calls the real webhook
over TLS (the MutatingWebhookConfiguration the chart ships), the group is stored with the finalizer, and the
real operator places it with no finalizer write of its own: binding, status and one event. With the webhook
down (``failurePolicy: Ignore``) the group is created all the same and the operator adds the finalizer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs, configuration, server
from tests import waiting
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Sandbox]:
    options = {"nodes": 2, "gpus": 4, "kubelet_delay": 0.01, "kubeconfig_path": tmp_path / "kubeconfig",
               "bookmark_interval": 0.1}
    async with Sandbox(**options) as box:  # type: ignore[arg-type]
        yield box


def writes(operator: object) -> dict[tuple[str, str], float]:
    """The operator's ``deviceshare_api_writes_total`` by (verb, resource), every result."""
    metrics = operator.memo.runtime.ctx.metrics  # type: ignore[attr-defined]
    out: dict[tuple[str, str], float] = {}
    for sample in next(iter(metrics.api_writes.collect())).samples:
        if sample.name.endswith("_total"):
            key = (sample.labels["verb"], sample.labels["resource"])
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def test_a_group_created_through_the_api_carries_the_finalizer_and_the_operator_writes_none(
    cluster: Sandbox, tmp_path: Path
) -> None:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig))
    operator = None
    try:
        cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        async with Kube.connect(str(cluster.kubeconfig)) as kube:
            created = await kube.create_group("ml", "solo", {GPU: 1})
            assert created["metadata"]["finalizers"] == [names.GROUP_FINALIZER]  # in the CREATE's answer
            finalized = hook.webhook.metrics.admissions.labels(path=server.MUTATE_GROUPS_PATH, result="patched")
            assert finalized._value.get() == 1

            # The pod before the operator: its first look at the group finds a member waiting, so the placement's
            # status write is the group's first, whatever the machine's speed.
            await kube.create_pod("ml", "solo-0", "solo")
            operator = await start_operator(operator_config(cluster))
            await kube.wait_bound("ml", "solo-0")
            await kube.wait_for(lambda: kube.events("ml", "solo-0"), "the pod's Scheduled event")
            await kube.wait_group("ml", "solo", lambda g: g["status"].get("phase") == names.PHASE_BOUND, "Bound")
            await operator.stop()  # waits for its background event posts: every write it will make is made
            done = writes(operator)
            operator = None
            assert done == {("patch", "shareddevicegroups/status"): 1, ("bind", "pods/binding"): 1,
                            ("create", "events"): 1}
            assert [e["reason"] for e in await kube.events("ml", "solo")] == []  # placement is in the status
    finally:
        if operator is not None:
            await operator.stop()
        await hook.stop()


async def test_with_the_webhook_down_a_group_is_created_and_the_operator_adds_the_finalizer(
    cluster: Sandbox, tmp_path: Path
) -> None:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig))
    url = hook.url
    await hook.stop()  # nothing listens there any more
    cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=url))
    async with Kube.connect(str(cluster.kubeconfig)) as kube:
        created = await kube.create_group("ml", "solo", {GPU: 1})  # failurePolicy Ignore: not blocked
        assert not created["metadata"].get("finalizers")
        operator = await start_operator(operator_config(cluster))
        try:
            group = await kube.wait_group(
                "ml", "solo", lambda g: names.GROUP_FINALIZER in (g["metadata"].get("finalizers") or ()),
                "the operator's finalizer",
            )
            assert group["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
            # The write is counted once its answer is in, which may come after the test's watch has seen it land.
            await waiting.until(lambda: writes(operator).get(("patch", "shareddevicegroups")), "the write counted")
            assert writes(operator)[("patch", "shareddevicegroups")] == 1
        finally:
            await operator.stop()
