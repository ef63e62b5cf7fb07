"""The policy's invariant under random edits: whatever a tenant sends, a bound member's group and
device annotations stay exactly as the operator left them, and an edit that leaves them alone goes
through (the policy refuses only what it must). Also what ``kubectl`` shows the tenant."""

from __future__ import annotations

import asyncio
import random
import shutil

import pytest
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.sandbox import Sandbox, identity
from tests.operator.kube import Kube
from tests.security import attacks

pytestmark = pytest.mark.usefixtures("webhook", "operator")
NS = attacks.TENANT_NAMESPACES[0]
PROTECTED = (names.POD_GROUP_ANNOTATION, names.POD_SELECTED_DEVICES_ANNOTATION, attacks.ENV_VISIBLE,
             names.env_annotation("CUDA_VISIBLE_DEVICES"))
KEYS = (*PROTECTED, "example.com/owner", "note")
VALUES = (None, "all", "0", "0,1", "a", "b", '{"nvidia.com/gpu":"3"}')


def _protected(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k in PROTECTED}


async def test_random_annotation_edits_never_move_a_members_devices(tenant: Kube) -> None:
    await attacks.group(tenant, NS, "a")
    await attacks.group(tenant, NS, "b")
    bound = await attacks.member(tenant, NS, "a", "a-0")
    kept = _protected(bound["metadata"]["annotations"])
    rng = random.Random(12)
    refusals = accepted = 0
    for _ in range(60):
        edit = {k: rng.choice(VALUES) for k in rng.sample(KEYS, rng.randint(1, 3))}
        before = (await tenant.pod(NS, "a-0"))["metadata"].get("annotations") or {}  # type: ignore[index]
        touches = any(before.get(k) != v for k, v in edit.items() if k in PROTECTED)
        try:
            await attacks.annotate(tenant, NS, "a-0", edit)
        except k8s.ApiException as e:
            assert e.status == 403 and touches, f"{edit} refused: {e.reason}"
            refusals += 1
        else:
            assert not touches, f"{edit} went through"
            accepted += 1
        after = (await tenant.pod(NS, "a-0"))["metadata"]["annotations"]  # type: ignore[index]
        assert _protected(after) == kept
    assert refusals and accepted  # the walk tried both kinds


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_shows_the_tenant_which_rule_refused(tenant: Kube, sandbox: Sandbox) -> None:
    await attacks.group(tenant, NS, "a")
    await attacks.member(tenant, NS, "a", "a-0")
    kubeconfig = sandbox.kubeconfig_as(identity.TENANT_TOKEN)
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kubeconfig), "-n", NS, "annotate", "pod", "a-0", "--overwrite",
        f"{names.POD_GROUP_ANNOTATION}-", f"{attacks.ENV_VISIBLE}=all",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert "rule group-annotation-immutable" in err.decode(), err.decode()
