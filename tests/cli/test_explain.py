"""`deviceshare explain POD` says, in plain words, what the operator recorded about a pod and what would help.

Each case is set up on a sandbox with the real operator, so the reasons are the ones it writes.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from deviceshare import cli
from deviceshare.api import names
from deviceshare.cli import explain
from deviceshare.sandbox import Sandbox
from tests import kubeconfigs
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube, scheduled_condition

GPU = "nvidia.com/gpu"


async def _explain(capsys: pytest.CaptureFixture[str], cluster: Sandbox, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, ["explain", "--kubeconfig", str(cluster.kubeconfig), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


async def _wait_unschedulable(kube: Kube, ns: str, name: str, saying: str = "") -> dict[str, Any]:
    """Until the pod is marked unschedulable (with ``saying`` in the message: the operator may first judge
    from a node it has not yet seen relabelled, and corrects the reason when the node event arrives)."""

    async def probe() -> dict[str, Any] | None:
        pod = await kube.pod(ns, name)
        cond = scheduled_condition(pod or {})
        message = (cond or {}).get("message") or ""
        return pod if cond and cond.get("status") == "False" and message and saying in message else None

    result: dict[str, Any] = await kube.wait_for(probe, f"{ns}/{name} to be marked unschedulable")
    return result


async def test_bound_pod(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "trainer", {GPU: 2})
    await kube.create_pod("ml", "trainer-0", "trainer")
    pod = await kube.wait_bound("ml", "trainer-0")
    group = await kube.wait_group("ml", "trainer", lambda g: (g.get("status") or {}).get("members"), "a member")
    rc, out, _ = await _explain(capsys, cluster, "trainer-0", "-n", "ml")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"Pod ml/trainer-0 is bound to node {pod['spec']['nodeName']}")
    devices = ",".join(group["status"]["allocatedDevices"][GPU])
    assert f"phase Bound, on node {pod['spec']['nodeName']}, devices {GPU}={devices}; members 1 (trainer-0)" in out
    assert "What would help" not in out and "NOT bound" not in out


async def test_unschedulable_pod_gets_the_scheduler_message_and_free_devices_per_node(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "small", {GPU: 3})
    await kube.create_pod("ml", "small-0", "small")
    small_node = (await kube.wait_bound("ml", "small-0"))["spec"]["nodeName"]
    await kube.create_group("ml", "huge", {GPU: 16})
    await kube.create_pod("ml", "huge-0", "huge")
    pod = await _wait_unschedulable(kube, "ml", "huge-0")
    message = scheduled_condition(pod)["message"]  # type: ignore[index]
    assert message == "0/4 nodes are available: 4 insufficient nvidia.com/gpu."

    rc, out, _ = await _explain(capsys, cluster, "huge-0", "-n", "ml")
    assert rc == 0
    assert "Pod ml/huge-0 is NOT bound to a node" in out
    assert f"Scheduler says (Unschedulable): {message}" in out
    assert "Latest FailedScheduling event" in out
    assert "Group ml/huge: phase Pending, not placed yet" in out
    hint = next(line for line in out.splitlines() if "on ONE node" in line)
    assert f"needs 16 {GPU}" in hint
    free = dict(re.findall(r"(gpu-node-\d) (\d+)/8", hint))
    assert free == {f"gpu-node-{i}": str(5 if f"gpu-node-{i}" == small_node else 8) for i in range(4)}
    assert "No shared node has 16 nvidia.com/gpu at all (the largest has 8)" in out


async def test_pod_whose_group_is_missing_lists_the_groups_in_its_namespace(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "trainer", {GPU: 1})
    await kube.create_group("ml", "tuner", {GPU: 1})
    await kube.create_group("other", "elsewhere", {GPU: 1})
    await kube.create_pod("ml", "lost-0", "trainr")
    await _wait_unschedulable(kube, "ml", "lost-0")
    rc, out, _ = await _explain(capsys, cluster, "lost-0", "-n", "ml")
    assert rc == 0
    assert 'SharedDeviceGroup "trainr" not found in namespace "ml"' in out
    assert "Group ml/trainr: not found." in out
    assert 'Group "trainr" does not exist in namespace "ml". Groups there: trainer, tuner.' in out
    assert "elsewhere" not in out


async def test_group_node_selector_and_max_members_hints(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.patch_node("gpu-node-3", {"metadata": {"labels": {"deviceshare.io/mode": None, "zone": "z1"}}})
    await kube.create_group("ml", "picky", {GPU: 1}, nodeSelector={"zone": "z1"})
    await kube.create_pod("ml", "picky-0", "picky")
    await kube.create_group("ml", "pair", {GPU: 1}, maxMembers=1)
    await kube.create_pod("ml", "pair-0", "pair")
    await kube.wait_bound("ml", "pair-0")
    await kube.create_pod("ml", "pair-1", "pair")
    await _wait_unschedulable(kube, "ml", "picky-0", "1 not in shared mode")
    await _wait_unschedulable(kube, "ml", "pair-1")

    rc, out, _ = await _explain(capsys, cluster, "picky-0", "-n", "ml")
    assert rc == 0
    assert "0/4 nodes are available: 3 node(s) didn't match group nodeSelector, 1 not in shared mode." in out
    assert "nodeSelector wants zone=z1; nodes with those labels: gpu-node-3 (in shared mode: none)" in out
    assert "kubectl label node NODE deviceshare.io/mode=shared" in out

    rc, out, _ = await _explain(capsys, cluster, "pair-1", "-n", "ml")
    assert rc == 0
    assert "its maxMembers is 1" in out
    assert "The group is full (maxMembers 1; other members: pair-0)" in out


async def test_pod_not_found_and_pod_without_group(
    cluster: Sandbox, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = await _explain(capsys, cluster, "ghost", "-n", "ml")
    assert rc == 1 and "pod ghost not found in namespace ml" in err
    await kube.create_pod("default", "plain", None)
    rc, out, _ = await _explain(capsys, cluster, "plain")  # namespace from the kubeconfig context
    assert rc == 0
    assert "does not join a SharedDeviceGroup" in out


async def test_a_share_that_does_not_fit_names_the_capacity_and_what_is_left(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every GPU of the 4 nodes is taken by one 60Gi share; a further 60Gi share fits nowhere.
    for i in range(32):
        await kube.create_group("ml", f"s{i}", {GPU: 1}, share={GPU: {"memory": "60Gi"}})
        await kube.create_pod("ml", f"s{i}-0", f"s{i}")
    await kube.wait_for(lambda: len([p for p in cluster.list("pods", "ml") if p["spec"].get("nodeName")]) == 32,
                        "32 shares placed")
    await kube.create_group("ml", "late", {GPU: 1}, share={GPU: {"memory": "60Gi", "compute": "100m"}})
    await kube.create_pod("ml", "late-0", "late")
    pod = await _wait_unschedulable(kube, "ml", "late-0")
    assert scheduled_condition(pod)["message"] == (  # type: ignore[index]
        "0/4 nodes are available: 4 insufficient nvidia.com/gpu memory.")
    rc, out, _ = await _explain(capsys, cluster, "late-0", "-n", "ml")
    assert rc == 0
    hint = next(line for line in out.splitlines() if "too little memory" in line)
    assert "a share of compute=100m,memory=60Gi on each of 1" in hint
    assert "gpu-node-0/0 compute=1,memory=20Gi" in hint


@pytest.mark.parametrize("sandbox_options", [{"nodes": 4, "gpus": 8, "gpu_memory_mib": None}])
async def test_nodes_without_declared_memory_are_told_how_to_declare_it(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "needs", {GPU: 1}, share={GPU: {"memory": "1Gi"}})
    await kube.create_pod("ml", "needs-0", "needs")
    await _wait_unschedulable(kube, "ml", "needs-0", "4 no declared device memory for nvidia.com/gpu")
    rc, out, _ = await _explain(capsys, cluster, "needs-0", "-n", "ml")
    assert rc == 0
    assert ("4 node(s) declare no device memory for nvidia.com/gpu: kubectl annotate node NODE "
            "deviceshare.io/device-memory='{\"nvidia.com/gpu\": \"80Gi\"}'") in out


@pytest.mark.parametrize(("message", "expected"), [
    ("0/4 nodes are available: 4 insufficient nvidia.com/gpu.", {"insufficient nvidia.com/gpu": 4}),
    ("0/12 nodes are available: 7 insufficient nvidia.com/gpu, 5 not in shared mode.",
     {"insufficient nvidia.com/gpu": 7, "not in shared mode": 5}),
    ("0/2 nodes are available: 2 node(s) had untolerated taint {gpu: }.",
     {"node(s) had untolerated taint {gpu: }": 2}),
    ("0/0 nodes are available: no nodes in the cluster.", {"no nodes in the cluster": 0}),
    ("0/5 nodes are available: 3 insufficient nvidia.com/gpu memory, 2 no declared device memory for nvidia.com/gpu.",
     {"insufficient nvidia.com/gpu memory": 3, "no declared device memory for nvidia.com/gpu": 2}),
    ('SharedDeviceGroup "x" not found in namespace "y"', {}),
])
def test_split_reasons(message: str, expected: dict[str, int]) -> None:
    assert explain.split_reasons(message) == expected


async def test_pods_that_skipped_the_webhook_get_the_operators_reason_and_no_contradiction(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "trainer", {GPU: 1})
    await kube.create_pod("ml", "trainer-0", "trainer", scheduler="default-scheduler")  # as if no webhook ran
    await kube.wait_group("ml", "trainer", lambda g: any(
        c.get("reason") == "PodsSkippedWebhook" for c in (g.get("status") or {}).get("conditions") or []),
        "the PodsSkippedWebhook condition")
    rc, out, _ = await _explain(capsys, cluster, "trainer-0", "-n", "ml")
    assert rc == 0
    assert "condition Scheduled=False (PodsSkippedWebhook)" in out
    assert "delete and recreate the pods" in out
    assert "recorded no reason yet" not in out


async def test_a_deleted_group_with_running_members_says_it_waits_for_them(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.create_group("ml", "gang", {GPU: 1})
    await kube.create_pod("ml", "gang-0", "gang")
    await kube.wait_bound("ml", "gang-0")
    await kube.delete_group("ml", "gang")
    await kube.wait_group("ml", "gang", lambda g: (g.get("status") or {}).get("phase") == "Releasing", "Releasing")
    rc, out, _ = await _explain(capsys, cluster, "gang-0", "-n", "ml")
    assert rc == 0
    assert "The group is being deleted, and keeps its devices until its member pods are gone (gang-0)" in out
    assert "kubectl delete pod -n ml gang-0" in out
    rc = await asyncio.to_thread(cli.main, ["inspect", "--kubeconfig", str(cluster.kubeconfig)])
    shown = capsys.readouterr().out
    assert rc == 0
    assert "ml/gang: Deleting: keeps its devices until its member pods are gone (gang-0)" in shown
    assert "ml/gang: Bound" not in shown


@pytest.mark.parametrize("sandbox_options", [{"nodes": 1, "gpus": 2}])
async def test_a_share_bigger_than_any_device_says_waiting_will_not_help_and_skips_unhealthy_devices(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    await kube.patch_node("gpu-node-0", {"metadata": {"annotations": {
        names.NODE_HEALTH_ANNOTATION: json.dumps({GPU: ["1"]})}}})
    await kube.create_group("ml", "huge", {GPU: 1}, share={GPU: {"memory": "99999999999999999999999999Ei"}})
    await kube.create_pod("ml", "huge-0", "huge")
    await _wait_unschedulable(kube, "ml", "huge-0", "insufficient nvidia.com/gpu memory")
    rc, out, _ = await _explain(capsys, cluster, "huge-0", "-n", "ml")
    assert rc == 0
    hint = next(line for line in out.splitlines() if "too little memory" in line)
    assert "left per healthy device that takes shares: gpu-node-0/0 free." in hint  # not the unhealthy GPU 1
    assert "No device has that much memory even when nobody shares it (the largest: 80Gi)" in hint
    assert "waiting will not help" in hint and "wait for a sharer" not in hint


async def test_a_gang_short_of_members_counts_them_as_the_group_does_now(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first member's condition was written when it alone existed; the group's condition is current."""
    await kube.create_group("ml", "gang", {GPU: 1}, minMembers=3)
    await kube.create_pod("ml", "gang-0", "gang")
    await _wait_unschedulable(kube, "ml", "gang-0", "1/3 member pods exist")
    await kube.create_pod("ml", "gang-1", "gang")
    await kube.wait_group("ml", "gang", lambda g: any(
        "2/3 member pods exist" in (c.get("message") or "") for c in (g.get("status") or {}).get("conditions") or []),
        "the group to count 2 of 3 members")
    rc, out, _ = await _explain(capsys, cluster, "gang-0", "-n", "ml")
    assert rc == 0
    assert "nothing is placed or held until 3 member pods exist; 2 do now, 1 more to create" in out, out
    assert "2 more to create" not in out


async def test_with_two_kubeconfig_files_the_first_current_context_gives_cluster_and_namespace(
    cluster: Sandbox, kube: Kube, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """KUBECONFIG=a:b, both setting a current context: kubectl (client-go) uses a's, for the cluster and for the
    namespace alike. b's context points at a server that does not answer, in another namespace."""
    monkeypatch.setenv("KUBECONFIG", kubeconfigs.first_of_two(cluster.kubeconfig, tmp_path, namespace="team-a"))
    await kube.create_pod("team-a", "plain", None)
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, ["explain", "plain"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert "team-a/plain" in out and "does not join a SharedDeviceGroup" in out
