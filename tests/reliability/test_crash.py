"""Kill the operator at each step of a placement, restart it, and find nothing leaked, half-bound or doubled.

The write order (scheduler.py) is: reserve in memory, group status, binding (which carries the pod's
device annotations: one write, so there is no step between annotating and binding to die in). Each
step's request is held in flight by the sandbox; the operator is killed (every task cancelled at once,
no cleanup) while it is held, then the request is let through and lands, as one sent by a dying
process does; the test waits for its answer. A fresh operator then rebuilds from the API and must
finish the job on the same node, where groups sharing GPUs (CONTRACT §7) then fill what the victim left.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Replica, Watchdog, kill, launch

NS = "crash"
# step -> (method, path of the request held open when the operator dies)
STEPS = {
    "after-reserve": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/victim/status$"),
    "after-status-write": ("POST", rf"/namespaces/{NS}/pods/victim-0/binding$"),
    "after-binding": ("POST", rf"/namespaces/{NS}/events$"),
}


async def kill_while_held(first: Replica, fault: Any, step: str) -> None:
    """Kill ``first`` while the request of ``step`` is held, then let it land: the interleaving is certain."""
    await workload.until(lambda: fault.fired, f"the operator to reach {step}")
    await kill(first)
    assert fault.answered == [], "the held request was answered before the kill"
    fault.release()
    await workload.until(lambda: fault.answered, "the dead operator's last request answered")


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4}


def node_of(cluster: Any, pod: str) -> str | None:
    node: str | None = ((cluster.get("pods", pod, NS) or {}).get("spec") or {}).get("nodeName")
    return node


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_crash_at_each_step_leaves_no_leak_and_no_double(
    cluster: Any, watchdog: Watchdog, step: str
) -> None:
    workload.ensure_namespace(cluster, NS)
    method, path = STEPS[step]
    fault = cluster.inject_fault(method, path, hold=True)
    cluster.create(workload.group_body(NS, "victim", {workload.GPU: 2}))
    cluster.create(workload.pod_body(NS, "victim-0", "victim"))

    first = await launch(operator_config(cluster))
    await kill_while_held(first, fault, step)
    watchdog.check()

    # Meanwhile more demand arrives: two groups sharing the node's other 2 GPUs (600m + 400m of each)
    # fit beside the victim; a whole 1-GPU group then does not.
    cluster.create(workload.group_body(NS, "rival", {workload.GPU: 2}, share={workload.GPU: {"compute": "600m"}}))
    cluster.create(workload.pod_body(NS, "rival-0", "rival"))
    cluster.create(workload.group_body(NS, "partner", {workload.GPU: 2}, share={workload.GPU: {"compute": "400m"}}))
    cluster.create(workload.pod_body(NS, "partner-0", "partner"))
    second = await launch(operator_config(cluster))
    try:
        cluster.create(workload.pod_body(NS, "victim-1", "victim"))
        for pod in ("victim-0", "victim-1", "rival-0", "partner-0"):
            await workload.until(lambda: node_of(cluster, pod), f"{pod} bound")  # noqa: B023 - awaited at once
        cluster.create(workload.group_body(NS, "third", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "third-0", "third"))
        await workload.until(
            lambda: any(
                c.get("reason") == "Unschedulable"
                for c in (cluster.get("pods", "third-0", NS) or {}).get("status", {}).get("conditions") or []
            ),
            "third-0 refused: the node is full",
        )
        await workload.until(
            lambda: not invariants.half_bound(invariants.from_sandbox(cluster)), "members and group statuses agree"
        )
        snap = invariants.from_sandbox(cluster)
        invariants.assert_no_double_allocation(snap)
        held = list(invariants.held_devices(snap))
        assert len(held) == 4, held  # victim's 2, rival's and partner's same 2: nothing leaked to a ghost claim
        shared = [cluster.get(names.PLURAL, g, NS)["status"]["allocatedDevices"] for g in ("rival", "partner")]
        assert shared[0] == shared[1], shared
        assert (cluster.get(names.PLURAL, "third", NS).get("status") or {}).get("allocatedDevices") is None

        # Deleting everything returns every device: no claim outlives its group.
        for pod in ("victim-0", "victim-1", "rival-0", "partner-0", "third-0"):
            cluster.delete("pods", pod, NS)
        for group in ("victim", "rival", "partner", "third"):
            cluster.delete(names.PLURAL, group, NS)
        await workload.until(lambda: not cluster.list(names.PLURAL, NS), "groups released and gone")
    finally:
        await kill(second)


async def test_a_dead_leaders_late_status_write_is_given_up_and_never_shows_a_device_twice(
    cluster: Any, watchdog: Watchdog
) -> None:
    """The status write of a killed leader reaches the API server after its successor has given the devices away.

    A request sent just before the process died can reach the API server later (slow etcd, a proxy's
    retry). Its resourceVersion precondition is on the victim group only, so it does not see that the
    successor, which rebuilt before the write landed, has placed another group on the same devices. What
    stops it is the fence (issue 20): the write carries the time left of its leader's renew deadline as
    its server-side ``timeout``, and a successor can only take the Lease after that. The write is held
    until the successor has bound its rival (the server gives it up at its deadline meanwhile, as
    kube-apiserver does), so the order is certain, not hoped for.

    (A single replica without election has no such fence: its late writes are bounded by the request
    timeout alone; docs/reliability.md says so and the manifests run two replicas.)
    """
    workload.ensure_namespace(cluster, NS)
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)
    watchdog.interval = 0.002
    elected = {"lease_name": "deviceshare-operator", "lease_duration": 2.0, "renew_deadline": 1.5,
               "retry_period": 0.25}
    cluster.create(workload.group_body(NS, "victim", {workload.GPU: 2}))
    first = await launch(operator_config(cluster, identity="first", **elected))
    await workload.until(
        lambda: (cluster.get(names.PLURAL, "victim", NS).get("status") or {}).get("phase") == "Pending",
        "the victim's status written as Pending",
    )
    late = cluster.inject_fault("PATCH", STEPS["after-reserve"][1], hold=True)
    cluster.create(workload.pod_body(NS, "victim-0", "victim"))
    await workload.until(lambda: late.fired, "the victim's status write in flight")
    await kill(first)
    cluster.delete("pods", "victim-0", NS)  # nobody waits for the victim any more

    cluster.create(workload.group_body(NS, "rival", {workload.GPU: 4}))
    cluster.create(workload.pod_body(NS, "rival-0", "rival"))
    second = await launch(operator_config(cluster, identity="second", **elected))
    try:
        await workload.until(lambda: workload.bound_pods(cluster, NS), "rival-0 bound on the whole node")
        late.release()  # the dead leader's write would reach the server now, had it not been given up
        await workload.until(lambda: late.answered, "the late write answered")
        # Had it been applied, the victim would claim two of the rival's devices: the watchdog (every
        # 2 ms, and once more now) would have seen it. It was given up at its deadline, which ended before
        # the successor could take the Lease.
        watchdog.check()
        assert late.answered == [504] and late.given_up == 1
        assert not (cluster.get(names.PLURAL, "victim", NS).get("status") or {}).get("allocatedDevices")
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        await kill(second)


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_crash_at_each_step_keeps_a_share_held(cluster: Any, watchdog: Watchdog, step: str) -> None:
    """The same crash for a sharing group: the restarted operator must still count the victim's share."""
    workload.ensure_namespace(cluster, NS)
    method, path = STEPS[step]
    fault = cluster.inject_fault(method, path, hold=True)
    share = {workload.GPU: {"compute": "600m"}}
    cluster.create(workload.group_body(NS, "victim", {workload.GPU: 1}, share=share))
    cluster.create(workload.pod_body(NS, "victim-0", "victim"))

    first = await launch(operator_config(cluster))
    await kill_while_held(first, fault, step)
    watchdog.check()

    # The rest of the node goes whole to a rival; a 500m share then fits nowhere (600m + 500m > 1).
    cluster.create(workload.group_body(NS, "rival", {workload.GPU: 3}))
    cluster.create(workload.pod_body(NS, "rival-0", "rival"))
    second = await launch(operator_config(cluster))
    try:
        for pod in ("victim-0", "rival-0"):
            await workload.until(lambda: node_of(cluster, pod), f"{pod} bound")  # noqa: B023 - awaited at once
        cluster.create(workload.group_body(NS, "third", {workload.GPU: 1}, share={workload.GPU: {"compute": "500m"}}))
        cluster.create(workload.pod_body(NS, "third-0", "third"))

        def refused() -> str | None:
            for c in (cluster.get("pods", "third-0", NS) or {}).get("status", {}).get("conditions") or []:
                if c.get("reason") == "Unschedulable":
                    return str(c.get("message"))
            return None

        message = await workload.until(refused, "third-0 refused: no device has 500m left")
        assert message == "0/1 nodes are available: 1 insufficient nvidia.com/gpu compute."
        await workload.until(
            lambda: not invariants.half_bound(invariants.from_sandbox(cluster)), "members and group statuses agree"
        )
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        await kill(second)
