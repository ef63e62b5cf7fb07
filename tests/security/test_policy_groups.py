"""The group's own records (issue 12): the policy of manifests/base keeps a SharedDeviceGroup's finalizer and
status the operator's.

The attack it stops: a tenant removes the operator's finalizer from their own group (which then vanishes from
the API at its deletion while a member still runs), strips that member's ``selected-devices`` and waits for an
operator restart, after which nothing in the API says the member's devices are taken. The same with a status
rewritten to claim nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.operator.kube import Kube
from tests.security import attacks
from tests.security.attacks import refused

pytestmark = pytest.mark.usefixtures("webhook", "operator")
NS = attacks.TENANT_NAMESPACES[0]


async def _merge_patch(kube: Kube, name: str, body: dict[str, Any], *, status: bool = False) -> Any:
    api = kube.custom.patch_namespaced_custom_object_status if status else kube.custom.patch_namespaced_custom_object
    return await kube._json(api(names.GROUP, names.VERSION, NS, names.PLURAL, name, body,
                                _content_type="application/merge-patch+json", _preload_content=False))


def _group(sandbox: Sandbox, name: str) -> dict[str, Any]:
    group = sandbox.get(names.PLURAL, name, NS)
    assert group is not None
    return group


async def test_only_the_operator_removes_a_groups_finalizer_or_writes_its_status(
    tenant: Kube, sandbox: Sandbox
) -> None:
    await attacks.group(tenant, NS, "a", gpus=2)
    await attacks.member(tenant, NS, "a", "a-0")
    held = _group(sandbox, "a")["status"]
    assert names.GROUP_FINALIZER in _group(sandbox, "a")["metadata"]["finalizers"]

    # kubectl patch sdg a --type=merge -p '{"metadata":{"finalizers":null}}'
    unguarded = await refused(_merge_patch(tenant, "a", {"metadata": {"finalizers": None}}))
    assert unguarded.status == 403
    assert "rule group-finalizer-operator-only" in unguarded.message
    assert "tenant-alice may not remove them" in unguarded.message

    # kubectl patch sdg a --subresource=status --type=merge -p '{"status":{"allocatedDevices":null,...}}'
    forged = await refused(_merge_patch(
        tenant, "a", {"status": {"phase": names.PHASE_PENDING, "allocatedDevices": None, "members": []}},
        status=True))
    assert forged.status == 403
    assert "rule group-status-operator-only" in forged.message

    # A tenant's own finalizers and labels are not the policy's business.
    await _merge_patch(tenant, "a", {"metadata": {"finalizers": [names.GROUP_FINALIZER, "example.com/keep"]}})
    await _merge_patch(tenant, "a", {"metadata": {"finalizers": [names.GROUP_FINALIZER], "labels": {"x": "y"}}})

    # Deleted while its member runs: still held (Releasing), and still the finalizer cannot be taken off.
    await tenant.delete_group(NS, "a")
    await tenant.wait_group(NS, "a", lambda g: g["status"].get("phase") == names.PHASE_RELEASING, "Releasing")
    late = await refused(_merge_patch(tenant, "a", {"metadata": {"finalizers": []}}))
    assert "rule group-finalizer-operator-only" in late.message
    assert _group(sandbox, "a")["status"]["allocatedDevices"] == held["allocatedDevices"]

    # The operator removes its finalizer itself once the member is gone: the group goes.
    await tenant.delete_pod(NS, "a-0")
    await tenant.wait_for(lambda: sandbox.get(names.PLURAL, "a", NS) is None, "the group released and gone")
