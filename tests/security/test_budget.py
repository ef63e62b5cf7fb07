"""Quota bypass (issue 12): a namespace's ResourceQuota on nvidia.com/gpu now caps its groups.

Group pods may not request GPUs, so quota admission never saw what groups hold. The webhook checks
each group CREATE, and each UPDATE that asks for more, against ``requests.nvidia.com/gpu``.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.attacks import refused

pytestmark = pytest.mark.usefixtures("webhook")
NS, OTHER = attacks.TENANT_NAMESPACES


def gpu_quota(ns: str, hard: int, used: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ResourceQuota",
                            "metadata": {"name": "gpu-budget", "namespace": ns},
                            "spec": {"hard": {"requests.nvidia.com/gpu": str(hard)}}}
    if used is not None:  # what the quota controller reports for pods that request GPUs themselves
        body["status"] = {"hard": body["spec"]["hard"], "used": {"requests.nvidia.com/gpu": str(used)}}
    return body


async def until_quota_seen(sandbox: Sandbox, webhook: Any, ns: str) -> None:
    await attacks.until(lambda: bool(webhook.index.quotas(ns)), f"the webhook to see the quota in {ns}")


async def test_groups_over_the_namespace_quota_are_refused(
    tenant: Kube, sandbox: Sandbox, webhook: Any
) -> None:
    sandbox.create(gpu_quota(NS, 3))
    await until_quota_seen(sandbox, webhook, NS)
    await attacks.group(tenant, NS, "a", gpus=2)
    await attacks.until(lambda: "a" in webhook.index.group_resources(NS), "the webhook to see group a")

    refusal = await refused(attacks.group(tenant, NS, "b", gpus=2))
    assert refusal.status == 403
    assert refusal.message == (
        'admission webhook "groups.deviceshare.io" denied the request: SharedDeviceGroup \'b\' asks for '
        "2 nvidia.com/gpu, which exceeds ResourceQuota 'gpu-budget' in namespace 'team-a': "
        "requests.nvidia.com/gpu is 3 and other groups hold 2"
    )
    assert sandbox.get(names.PLURAL, "b", NS) is None
    assert await attacks.group(tenant, NS, "c", gpus=1)  # what is left still fits
    assert await attacks.group(tenant, OTHER, "b", gpus=4)  # another namespace has its own budget


async def test_a_group_may_not_grow_past_the_quota(tenant: Kube, sandbox: Sandbox, webhook: Any) -> None:
    sandbox.create(gpu_quota(NS, 2))
    await until_quota_seen(sandbox, webhook, NS)
    created = await attacks.group(tenant, NS, "a", gpus=1)
    grow = {"spec": {"resources": {attacks.GPU: 3}},
            "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}}
    refusal = await refused(tenant._json(tenant.custom.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, NS, names.PLURAL, "a", grow, _content_type="application/merge-patch+json",
        _preload_content=False)))
    assert "exceeds ResourceQuota 'gpu-budget'" in refusal.message
    assert sandbox.get(names.PLURAL, "a", NS)["spec"]["resources"] == {attacks.GPU: 1}  # type: ignore[index]


async def test_pods_that_request_gpus_share_the_budget(tenant: Kube, sandbox: Sandbox, webhook: Any) -> None:
    sandbox.create(gpu_quota(NS, 4, used=3))
    await attacks.until(lambda: any(q.used for q in webhook.index.quotas(NS)), "the quota's usage")
    refusal = await refused(attacks.group(tenant, NS, "a", gpus=2))
    assert "pods request 3" in refusal.message
