"""Fake claims and refused writes, against the operator alone (no admission policy).

- A pod outside deviceshare with ``spec.nodeName`` and a forged ``selected-devices`` must not count as a claim
  when the operator rebuilds: it is reported (event, metric), the real holder is not frozen, and free devices
  still go to new groups.
- A binding the API server refuses (400/403/422) leaves a reason on the pod and is retried; nothing is left
  silently Pending.
"""

from __future__ import annotations

import json

import pytest

from deviceshare.api import names
from tests.security.operator_attacks import (
    GPU,
    System,
    assert_safe,
    group_status,
    node_of,
    refusal,
)


async def forge(
    system: System, name: str, node: str, devices: list[str], *, group: str | None = None, ours: bool = False
) -> None:
    """A pod created straight onto ``node`` claiming ``devices``; the group annotation, if any, added after
    creation (a pod naming a group at CREATE would meet the webhook, which refuses spec.nodeName)."""
    spec: dict[str, object] = {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}
    if ours:
        spec["schedulerName"] = names.DEFAULT_SCHEDULER_NAME
    await system.raw_pod("mallory", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "mallory", "annotations": {
            names.POD_SELECTED_DEVICES_ANNOTATION: json.dumps({GPU: ",".join(devices)})}},
        "spec": spec,
    })
    if group is not None:
        await system.kube.patch_pod_annotations("mallory", name, {names.POD_GROUP_ANNOTATION: group})


async def test_forged_claims_after_a_restart_freeze_no_holder_and_take_no_free_device(system: System) -> None:
    kube = system.kube
    await system.group("team-h", "holder", 2)
    await system.member("team-h", "holder-0", "holder")
    node = node_of(system, "team-h", "holder-0")
    assert node is not None
    held = group_status(system, "team-h", "holder")["allocatedDevices"][GPU]
    free = sorted({"0", "1", "2", "3"} - set(held))

    # Outside deviceshare: the holder's devices (naming a group of the attacker's whose status says nothing of
    # them), and the node's free ones (naming a group that does not exist, one of them with our scheduler
    # name, as a pod whose group vanished would).
    await system.group("mallory", "decoy", 2)  # a group of the attacker's own, never placed
    await forge(system, "copycat", node, held, group="decoy")
    await forge(system, "squatter", node, free, group="ghost")
    await forge(system, "ghost-0", node, free, group="ghost", ours=True)
    await system.restart_operator()

    async def reported() -> bool:
        events = await kube.events("mallory", "copycat")
        return any(e.get("reason") == "UntrustedDeviceClaim" for e in events)

    await kube.wait_for(reported, "an UntrustedDeviceClaim event on the forged pod")
    assert system.metric("deviceshare_untrusted_claims_total") >= 2  # copycat and squatter (not ours)
    assert system.metric("deviceshare_rebuild_untrusted_claims") >= 2  # what DeviceshareUntrustedClaim reads
    assert not [
        c for c in group_status(system, "team-h", "holder").get("conditions", [])
        if c["type"] == names.CONDITION_CONFLICT
    ]
    # The holder is not frozen: another member joins it.
    await system.member("team-h", "holder-1", "holder")
    # ghost-0 uses our scheduler and names a vanished group: it may keep the free devices it runs on, so a new
    # group needing the whole node goes elsewhere... but one needing the other node's devices is placed.
    await system.group("team-n", "newcomer", 4)
    await system.member("team-n", "newcomer-0", "newcomer")
    assert node_of(system, "team-n", "newcomer-0") != node
    assert_safe(system)


async def test_a_forged_claim_on_a_holders_devices_is_untrusted_even_naming_a_vanished_group(system: System) -> None:
    kube = system.kube
    await system.group("team-h", "holder", 4)
    await system.member("team-h", "holder-0", "holder")
    node = node_of(system, "team-h", "holder-0")
    assert node is not None
    await forge(system, "ghost-0", node, ["0", "1"], group="ghost", ours=True)
    await system.restart_operator()

    async def reported() -> bool:
        return any(e.get("reason") == "UntrustedDeviceClaim" for e in await kube.events("mallory", "ghost-0"))

    await kube.wait_for(reported, "an UntrustedDeviceClaim event naming the holder's devices")
    await system.member("team-h", "holder-1", "holder")  # not frozen by a DeviceConflict
    assert_safe(system)


@pytest.mark.parametrize("status", [400, 403, 422])
async def test_a_refused_binding_is_reported_on_the_pod_and_retried(system: System, status: int) -> None:
    await system.group("team-a", "g", 1)
    message = f"pods/binding denied by policy test-{status}"
    fault = system.cluster.inject_fault(
        "POST", r"/namespaces/team-a/pods/g-0/binding$", status=status, times=2, message=message
    )
    await system.member("team-a", "g-0", "g", bound=False)
    await refusal(system, "team-a", "g-0", message, reason="SchedulerError")
    # Retried with backoff once the API lets it through.
    await system.kube.wait_bound("team-a", "g-0")
    assert fault.fired == 2
    assert group_status(system, "team-a", "g")["phase"] == names.PHASE_BOUND
    assert_safe(system)
