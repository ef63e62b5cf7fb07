"""Kill the operator (as by SIGKILL) in the middle of a burst of sharing groups: nothing is lost or doubled.

The successor rebuilds the ledger from the API, reading each sharing group's share back from its spec
and its devices from its status; it must then place exactly what still fits, no more (CONTRACT §7).
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "burst"
GROUPS = 10  # 250m each: four fit on each of the node's 2 GPUs, so 8 are placed and 2 wait


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 2}


def bound(cluster: Any) -> list[dict[str, Any]]:
    return workload.bound_pods(cluster, NS)


@pytest.mark.parametrize("strategy", ["binpack", "fgd"])
async def test_a_kill_mid_burst_loses_no_share_and_doubles_none(
    cluster: Any, watchdog: Watchdog, strategy: str
) -> None:
    """Also with ``schedulingStrategy: fgd``: its choice is reserved and rebuilt like any other."""
    workload.ensure_namespace(cluster, NS)
    # Every binding is held, so the kill lands with placements decided, persisted and in flight.
    held = cluster.inject_fault("POST", rf"/namespaces/{NS}/pods/[^/]+/binding$", hold=True, times=None)
    first = await launch(operator_config(cluster))
    for i in range(GROUPS):
        cluster.create(workload.group_body(NS, f"g{i}", {workload.GPU: 1}, share={workload.GPU: {"compute": "250m"}},
                                           schedulingStrategy=strategy))
        cluster.create(workload.pod_body(NS, f"g{i}-0", f"g{i}"))
    await workload.until(lambda: held.fired >= 3, "bindings of the burst in flight")
    await kill(first)
    in_flight = held.fired
    assert bound(cluster) == [] and held.answered == []  # nothing landed before the kill
    cluster.clear_faults()  # the dead operator's bindings land now
    await workload.until(lambda: len(held.answered) == in_flight, "the dead operator's last bindings answered")
    assert set(held.answered) == {201}
    # At least those: a binding the dead operator wrote to its connection just before the kill may still be on
    # the wire, unread by the sandbox when the kill returned (one core, a busy server), and lands too, unheld, as
    # it would on a real cluster. The successor must cope with any of them.
    assert len(bound(cluster)) >= in_flight
    watchdog.check()

    second = await launch(operator_config(cluster))
    try:
        await workload.until(lambda: len(bound(cluster)) == 8, "8 of the 10 groups placed after the restart")
        snap = invariants.from_sandbox(cluster)
        invariants.assert_no_double_allocation(snap)
        await workload.until(lambda: not invariants.half_bound(invariants.from_sandbox(cluster)),
                             "members and group statuses agree")
        per_device: dict[str, int] = {}
        for pod in bound(cluster):
            for device in invariants.pod_devices(pod)[workload.GPU]:
                per_device[device] = per_device.get(device, 0) + 1
        assert per_device == {"0": 4, "1": 4}
        # The successor has decided all ten: the two it could not place wait in its queue, parked.
        await workload.until(lambda: second.runtime.queue.parked == 2, "the two left over parked as unschedulable")
        assert len(bound(cluster)) == 8, "more compute handed out than the 2 GPUs have"
        waiting = [p["metadata"]["name"] for p in cluster.list("pods", NS) if not p["spec"].get("nodeName")]
        assert len(waiting) == 2
        await workload.until(
            lambda: any("insufficient nvidia.com/gpu compute" in (c.get("message") or "")
                        for c in (cluster.get("pods", waiting[0], NS) or {}).get("status", {}).get("conditions") or []),
            "a waiting group told why",
        )
        # Releasing one share lets exactly one waiting group in.
        victim = bound(cluster)[0]["metadata"]["name"]
        cluster.delete("pods", victim, NS)
        cluster.delete(names.PLURAL, victim.rsplit("-", 1)[0], NS)
        await workload.until(lambda: sum(1 for p in cluster.list("pods", NS) if p["spec"].get("nodeName")) == 8,
                             "a waiting group placed in the released share")
    finally:
        await kill(second)


async def test_an_overcommitted_device_found_at_start_is_reported_and_takes_nobody(cluster: Any) -> None:
    """Statuses over a device's memory (written by hand, or the node's declared memory shrank) are shown as
    they are: both groups keep their claim, each is told why, and no third sharer is put on the device."""
    workload.ensure_namespace(cluster, NS)
    for name, memory in (("a", "50Gi"), ("b", "40Gi")):
        cluster.create(workload.group_body(NS, name, {workload.GPU: 1}, share={workload.GPU: {"memory": memory}}))
        cluster.patch(names.PLURAL, name, {"status": {"phase": "Bound", "nodeName": "gpu-node-0",
                                                      "allocatedDevices": {workload.GPU: ["0"]}}},
                      NS, subresource="status")
    replica = await launch(operator_config(cluster))
    try:
        def told(group: str) -> list[str]:
            return [e["message"] for e in cluster.list("events", NS)
                    if e["involvedObject"]["name"] == group and e["reason"] == "DeviceConflict"]

        for group in ("a", "b"):
            messages = await workload.until(lambda g=group: [m for m in told(g) if "more than" in m],  # type: ignore[misc]
                                            f"{group} told about the over-commitment")
            assert f"{workload.GPU} 0 on node gpu-node-0: memory 90Gi given out, more than the device's 80Gi" \
                in messages[0]
        cluster.create(workload.group_body(NS, "c", {workload.GPU: 1}, share={workload.GPU: {"compute": "100m"}}))
        cluster.create(workload.pod_body(NS, "c-0", "c"))
        pod = await workload.until(lambda: (cluster.get("pods", "c-0", NS) or {}).get("spec", {}).get("nodeName")
                                   and cluster.get("pods", "c-0", NS), "c-0 placed elsewhere")
        assert invariants.pod_devices(pod) != {workload.GPU: ["0"]} or pod["spec"]["nodeName"] != "gpu-node-0"
        for name in ("a", "b"):  # nothing was resolved behind the users' backs
            assert cluster.get(names.PLURAL, name, NS)["status"]["allocatedDevices"] == {workload.GPU: ["0"]}
    finally:
        await kill(replica)
