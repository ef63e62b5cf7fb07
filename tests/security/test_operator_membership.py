"""Tenant attacks on membership, against the operator alone (no admission policy): what a pod's owner writes on
the pod after the fact (its group annotation, its device annotations) decides nothing about who holds a device.
"""

from __future__ import annotations

from deviceshare.api import names
from tests.security.operator_attacks import (
    ENV,
    GPU,
    System,
    assert_safe,
    decided_again,
    group_status,
    node_of,
    refusal,
    requests_naming,
    visible_twice,
)

SELECTED = names.POD_SELECTED_DEVICES_ANNOTATION


async def test_unjoin_and_forge_on_a_running_member_is_undone_and_the_group_keeps_its_devices(system: System) -> None:
    kube = system.kube
    await system.group("team-a", "a", 2)
    await system.member("team-a", "a-0", "a")
    node = node_of(system, "team-a", "a-0")
    bound = group_status(system, "team-a", "a")["allocatedDevices"][GPU]

    # kubectl annotate pod a-0 deviceshare.io/device-group- deviceshare.io/env.NVIDIA_VISIBLE_DEVICES=all
    await kube.patch_pod_annotations("team-a", "a-0", {
        names.POD_GROUP_ANNOTATION: None, names.env_annotation(ENV): "all", SELECTED: None,
    })

    async def restored() -> bool:
        pod = await kube.pod("team-a", "a-0")
        ann = (pod or {})["metadata"].get("annotations") or {}
        return ann.get(names.env_annotation(ENV)) == ",".join(bound) and ann.get(names.POD_GROUP_ANNOTATION) == "a"

    await kube.wait_for(restored, "the member's annotations put back")
    assert_safe(system)

    # Deleting the group now must not free the devices under the running pod.
    await kube.delete_group("team-a", "a")
    await kube.wait_group("team-a", "a", lambda g: g["status"].get("phase") == names.PHASE_RELEASING, "Releasing")
    # Another tenant wants the whole node the pod runs on: it must not get a's devices.
    await system.group("team-b", "b", 4, nodeSelector={"kubernetes.io/hostname": node})
    await system.member("team-b", "b-0", "b", bound=False)
    await refusal(system, "team-b", "b-0", "0/2 nodes are available")
    assert group_status(system, "team-a", "a")["members"] == ["a-0"]
    assert_safe(system)

    # The member ends: only now are a's devices released and b placed.
    await kube.delete_pod("team-a", "a-0")
    system.bound_with.pop(("team-a", "a-0"))
    await kube.wait_bound("team-b", "b-0")
    assert_safe(system)


async def test_a_member_pointed_at_another_group_never_gets_that_groups_devices(system: System) -> None:
    kube = system.kube
    await system.group("team-a", "a2", 4)  # a whole node
    await system.member("team-a", "a2-0", "a2")
    await system.group("team-a", "a1", 2)  # the other node, with a victim beside it
    await system.member("team-a", "a1-0", "a1")
    await system.group("team-v", "v", 2)
    await system.member("team-v", "v-0", "v")
    assert node_of(system, "team-a", "a1-0") == node_of(system, "team-v", "v-0") != node_of(system, "team-a", "a2-0")
    a1 = group_status(system, "team-a", "a1")["allocatedDevices"][GPU]

    # kubectl annotate pod a1-0 deviceshare.io/device-group=a2 --overwrite
    await kube.patch_pod_annotations("team-a", "a1-0", {names.POD_GROUP_ANNOTATION: "a2"})

    async def pointed_back() -> bool:
        pod = await kube.pod("team-a", "a1-0")
        return ((pod or {})["metadata"].get("annotations") or {}).get(names.POD_GROUP_ANNOTATION) == "a1"

    await kube.wait_for(pointed_back, "a1-0's group annotation put back")
    # A new member joins each group: the statuses that list them come from reconciles that ran after the
    # operator saw its own put-back (one ordered pod watch), so they show its settled view of a1-0.
    await system.member("team-a", "a1-1", "a1")
    await system.member("team-a", "a2-1", "a2")
    await kube.wait_for(lambda: group_status(system, "team-a", "a1").get("members") == ["a1-0", "a1-1"]
                        and group_status(system, "team-a", "a2").get("members") == ["a2-0", "a2-1"],
                        "both groups' statuses listing their new member")
    pod = await kube.pod("team-a", "a1-0")
    assert pod is not None
    assert pod["metadata"]["annotations"][names.env_annotation(ENV)] == ",".join(a1)
    assert group_status(system, "team-a", "a1")["allocatedDevices"][GPU] == a1
    assert_safe(system)


async def test_a_pod_that_skipped_admission_and_joined_late_is_refused_with_the_webhooks_reason(
    system: System,
) -> None:
    kube = system.kube
    await system.group("team-a", "g", 1)
    # schedulerName set by hand and no group annotation: the webhook never sees this pod.
    await system.raw_pod("team-a", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "team-a"},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{
            "name": "main", "image": "cuda", "resources": {"limits": {GPU: "4"}},
            "env": [{"name": ENV, "value": "all"}],
        }]},
    })
    await refusal(system, "team-a", "late", "has no deviceshare.io/device-group annotation")
    await kube.patch_pod_annotations("team-a", "late", {names.POD_GROUP_ANNOTATION: "g"})
    message = await refusal(system, "team-a", "late", "did not pass admission", f"requests {GPU} in resources.limits")
    assert "SharedDeviceGroup \"g\"" in message
    await decided_again(system, "team-a", "late")  # a second chance to place it, refused again
    assert node_of(system, "team-a", "late") is None
    assert group_status(system, "team-a", "g").get("allocatedDevices") is None  # nothing placed for it

    # The same pod without the device limit still sets the visibility env var itself: refused just the same.
    await system.raw_pod("team-a", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late-env", "namespace": "team-a"},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{
            "name": "main", "image": "cuda", "env": [{"name": ENV, "value": "all"}],
        }]},
    })
    await kube.patch_pod_annotations("team-a", "late-env", {names.POD_GROUP_ANNOTATION: "g"})
    await refusal(system, "team-a", "late-env", f"sets env var {ENV} itself")
    assert node_of(system, "team-a", "late-env") is None
    assert_safe(system)


async def test_group_names_that_look_like_paths_are_refused_without_an_api_call_and_hold_no_worker(
    system: System,
) -> None:
    kube = system.kube
    await system.group("team-a", "honest", 1)
    bad = ["../shareddevicegroups?watch=true&x=1", "a/../../b", "UPPER", "x" * 64, "a%2Fb", " "]
    for i in range(32):
        await system.raw_pod("team-a", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"evil-{i}", "namespace": "team-a"},
            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "busybox"}]},
        })
    for i in range(32):
        await kube.patch_pod_annotations("team-a", f"evil-{i}", {names.POD_GROUP_ANNOTATION: bad[i % len(bad)]})
    await system.member("team-a", "honest-0", "honest")
    for i in range(len(bad)):
        await refusal(system, "team-a", f"evil-{i}", "is not a valid group name" if bad[i].strip() else "is empty")
    assert all(node_of(system, "team-a", f"evil-{i}") is None for i in range(32))
    # Refused from the name alone: no request ever carried one of them (a GET of
    # "../shareddevicegroups?watch=true" would be a 30 s watch holding a worker), so none held a worker.
    assert [r for name in bad for r in requests_naming(system, name) if name.strip()] == []
    assert requests_naming(system, "honest-0")  # the check sees requests (honest-0's binding among them)
    assert_safe(system)


async def test_a_member_stripped_while_the_operator_is_down_is_still_a_member_after_the_restart(
    system: System,
) -> None:
    kube = system.kube
    await system.group("team-a", "a", 2)
    await system.member("team-a", "a-0", "a")
    node = node_of(system, "team-a", "a-0")
    bound = group_status(system, "team-a", "a")["allocatedDevices"][GPU]
    await system.operator.stop()
    # Everything the pod says about its group and devices, gone or forged, while nobody watches.
    await kube.patch_pod_annotations("team-a", "a-0", {
        names.POD_GROUP_ANNOTATION: None, SELECTED: None, names.env_annotation(ENV): "all",
    })
    await system.restart_operator()

    async def restored() -> bool:
        pod = await kube.pod("team-a", "a-0")
        ann = (pod or {})["metadata"].get("annotations") or {}
        return ann.get(names.env_annotation(ENV)) == ",".join(bound) and bool(ann.get(SELECTED))

    await kube.wait_for(restored, "the member's annotations put back from the group's status")
    # The devices stay the group's: a group wanting that whole node waits.
    await system.group("team-b", "b", 4, nodeSelector={"kubernetes.io/hostname": node})
    await system.member("team-b", "b-0", "b", bound=False)
    await refusal(system, "team-b", "b-0", "0/2 nodes are available")
    assert_safe(system)


async def test_a_member_of_a_group_whose_finalizer_was_removed_keeps_its_devices_across_a_restart(
    system: System,
) -> None:
    """Without the policy a tenant can take the operator's finalizer off their deleted group, so the group (and
    its status) leaves the API while its member runs; the member's annotations are then the only record left.
    The operator keeps them true while it runs, and a restart rebuilds the claim from them."""
    kube = system.kube
    await system.group("team-a", "a", 2)
    await system.member("team-a", "a-0", "a")
    node = node_of(system, "team-a", "a-0")
    bound = group_status(system, "team-a", "a")["allocatedDevices"][GPU]
    await kube.delete_group("team-a", "a")
    await kube.wait_group("team-a", "a", lambda g: g["status"].get("phase") == names.PHASE_RELEASING, "Releasing")
    await kube.custom.patch_namespaced_custom_object(
        names.GROUP, names.VERSION, "team-a", names.PLURAL, "a", {"metadata": {"finalizers": None}},
        _content_type="application/merge-patch+json")
    await kube.wait_for(lambda: system.cluster.get(names.PLURAL, "a", "team-a") is None, "group a gone")

    await kube.patch_pod_annotations("team-a", "a-0", {SELECTED: None, names.env_annotation(ENV): "all"})

    async def restored() -> bool:
        pod = await kube.pod("team-a", "a-0")
        ann = (pod or {})["metadata"].get("annotations") or {}
        return ann.get(names.env_annotation(ENV)) == ",".join(bound) and bool(ann.get(SELECTED))

    await kube.wait_for(restored, "the member's annotations put back though its group is gone")
    await system.restart_operator()
    await system.group("team-b", "b", 4, nodeSelector={"kubernetes.io/hostname": node})
    await system.member("team-b", "b-0", "b", bound=False)
    await refusal(system, "team-b", "b-0", "0/2 nodes are available")
    assert not visible_twice(system)


async def test_a_late_joiner_refused_by_the_member_check_is_not_listed_as_a_member(system: System) -> None:
    kube = system.kube
    await system.group("team-a", "g", 1)
    await system.member("team-a", "g-0", "g")
    await system.raw_pod("team-a", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": "team-a"},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{
            "name": "main", "image": "cuda", "resources": {"limits": {GPU: "4"}},
        }]},
    })
    await kube.patch_pod_annotations("team-a", "late", {names.POD_GROUP_ANNOTATION: "g"})
    await refusal(system, "team-a", "late", "did not pass admission")
    # An honest member that joins later is listed; the refused one never is.
    await system.member("team-a", "g-1", "g", bound=False)

    def listed() -> list[str]:
        return list(group_status(system, "team-a", "g").get("members") or [])

    await kube.wait_for(lambda: "g-1" in listed(), "g-1 listed")
    # The refused pod is decided again (and each refusal asks for a reconcile of g); a member joining after
    # that is listed by a reconcile that ran later still: the status then is the operator's settled view.
    await decided_again(system, "team-a", "late")
    await system.member("team-a", "g-2", "g")
    await kube.wait_for(lambda: "g-2" in listed(), "g-2 listed")
    assert listed() == ["g-0", "g-1", "g-2"]
    assert group_status(system, "team-a", "g")["memberCount"] == 3
    assert node_of(system, "team-a", "late") is None
    assert_safe(system)
