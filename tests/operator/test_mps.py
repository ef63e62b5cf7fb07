"""MPS end to end on the sandbox: the agent says which node runs an MPS daemon, the operator (``--mps``) puts
compute shares only there, and the real webhook (TLS, AdmissionReview from the API server) wires each member
to the daemon. Without a daemon anywhere, the pod says why it waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import models, names
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs, configuration, mpsclients, server
from tests.nodeagent import fakempsdaemon, servers
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube
from tests.operator.test_device_health import _refusal
from tests.operator.test_node_facts import GPU, NS, _devices

SHARE = {"share": {GPU: {"compute": "500m"}}}


@pytest.fixture
async def webhook(cluster: Sandbox, tmp_path: Path) -> AsyncIterator[server.RunningWebhook]:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig),
                                      mps=mpsclients.MpsMount(str(tmp_path / "mps")))
    try:
        cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        yield hook
    finally:
        await hook.stop()


@pytest.mark.parametrize("sandbox_options", [{"nodes": 2, "gpus": 4}])
async def test_compute_shares_go_where_mps_runs_and_their_pods_reach_the_daemon(
    cluster: Sandbox, kube: Kube, publish: Any, webhook: server.RunningWebhook, tmp_path: Path,
    sandbox_options: dict[str, int],
) -> None:
    pipe = tmp_path / "mps" / "pipe"
    daemon = fakempsdaemon.FakeMpsDaemon(pipe)
    with_mps = await publish("gpu-node-1", servers.NVLINK_PAIRS_2X2, mps_pipe_directory=pipe)
    await publish("gpu-node-0", servers.NVLINK_PAIRS_2X2, mps_pipe_directory=tmp_path / "nothing-here")
    running = await start_operator(operator_config(cluster, mps=True))
    try:
        await kube.create_group(NS, "half", {GPU: 1}, **SHARE)
        await kube.wait_for(lambda: _seen(webhook, "half"), "the webhook to see the group")
        created = await kube.create_pod(NS, "half-0", "half")
        container = created["spec"]["containers"][0]
        assert {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": str(pipe)} in container["env"]
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {str(pipe), "/dev/shm"}
        group = await kube.wait_group(NS, "half", lambda g: bool(_devices(g)), "placed")
        assert group["status"]["nodeName"] == "gpu-node-1"  # gpu-node-0 sorts first, but runs no MPS

        daemon.stop()  # the daemon stops: the agent stops saying ready
        await with_mps.agent.sync()
        assert names.NODE_MPS_ANNOTATION not in (cluster.get("nodes", "gpu-node-1") or {})["metadata"]["annotations"]
        await kube.create_group(NS, "quarter", {GPU: 1}, **SHARE)
        await kube.wait_for(lambda: _seen(webhook, "quarter"), "the webhook to see the group")
        await kube.create_pod(NS, "quarter-0", "quarter")
        message = await kube.wait_for(lambda: _refusal(kube, "quarter-0"), "quarter refused")
        assert message == "0/2 nodes are available: 2 node(s) had no MPS control daemon ready."

        await kube.create_group(NS, "whole", {GPU: 2})  # whole devices need no MPS
        await kube.wait_for(lambda: _seen(webhook, "whole"), "the webhook to see the group")
        whole = await kube.create_pod(NS, "whole-0", "whole")
        assert not any(e["name"] == "CUDA_MPS_PIPE_DIRECTORY" for e in whole["spec"]["containers"][0]["env"])
        await kube.wait_bound(NS, "whole-0")
    finally:
        await running.stop()


def _seen(webhook: server.RunningWebhook, group: str) -> bool:
    return webhook.index is not None and isinstance(webhook.index.group(NS, group), models.GroupSpec)
