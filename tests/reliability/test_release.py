"""Devices go back only once the API no longer shows them held: a deleted group and its successor never overlap.

A deleted group keeps its claim in ``status.allocatedDevices`` until the object is gone (our finalizer
removed). If the operator frees the devices in its ledger first, another group can be placed on them
while the API still shows the old claim; a restart in that window rebuilds both claims and reports a
conflict on two healthy groups.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "release"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 2}


async def test_a_deleted_groups_devices_are_not_reused_while_the_api_still_shows_them(cluster: Any) -> None:
    workload.ensure_namespace(cluster, NS)
    watchdog = Watchdog(cluster, interval=0.005)  # asserted in the test itself
    watchdog.start()
    running = await launch(operator_config(cluster))
    try:
        cluster.create(workload.group_body(NS, "old", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "old-0", "old"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "old-0 bound")
        await workload.until(
            lambda: names.GROUP_FINALIZER in (cluster.get(names.PLURAL, "old", NS)["metadata"].get("finalizers") or []),
            "the finalizer on the old group",
        )
        # The finalizer removal is held in flight; the successor is waiting for the node's two devices.
        fault = cluster.inject_fault("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/old$", hold=True)
        cluster.create(workload.group_body(NS, "new", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "new-0", "new"))
        await workload.until(lambda: workload.failed_scheduling(cluster, NS, "new-0"), "new-0 told it waits")
        cluster.delete("pods", "old-0", NS)
        cluster.delete(names.PLURAL, "old", NS)
        await workload.until(lambda: fault.fired, "the finalizer removal in flight")
        # While it is held, the successor is decided again (the periodic retry of waiting pods) and must
        # still wait: the API shows the old claim. Had the devices been freed first, it would be bound now.
        tried = workload.failed_scheduling(cluster, NS, "new-0")
        await workload.until(lambda: workload.failed_scheduling(cluster, NS, "new-0") > tried,
                             "new-0 decided again while the finalizer removal is in flight")
        assert not workload.bound_pods(cluster, NS) and fault.answered == []
        fault.release()
        await workload.until(lambda: cluster.get(names.PLURAL, "old", NS) is None, "the old group gone")
        await workload.until(lambda: workload.bound_pods(cluster, NS), "new-0 bound after the old group went")
    finally:
        await kill(running)
        await watchdog.stop()
    assert not watchdog.found, "double allocation:\n" + "\n".join(watchdog.found)


async def test_a_group_deleted_during_its_placement_is_no_error(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster))
    try:
        fault = cluster.inject_fault("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/gone/status$", hold=True)
        cluster.create(workload.group_body(NS, "gone", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "gone-0", "gone"))
        await workload.until(lambda: fault.fired, "the placement's status write in flight")
        # An admin force-deletes the group (finalizers cleared) while the write is in flight.
        cluster.patch(names.PLURAL, "gone", {"metadata": {"finalizers": None}}, NS)
        cluster.delete(names.PLURAL, "gone", NS)
        fault.release()
        await workload.until(lambda: fault.answered, "the status write answered")
        assert fault.answered == [404]  # it reached a group already gone
        await workload.until(
            lambda: "not found" in str(
                ((cluster.get("pods", "gone-0", NS) or {}).get("status") or {}).get("conditions")),
            "the pod told that its group is gone",
        )
        assert running.alive
        assert not cluster.get(names.PLURAL, "gone", NS)
    finally:
        await kill(running)
    errors_logged = [r.getMessage() for r in caplog.records
                     if r.name.startswith("deviceshare") and r.levelname == "ERROR"]
    assert errors_logged == []


def has_finalizer(cluster: Any, group: str) -> bool:
    metadata = (cluster.get(names.PLURAL, group, NS) or {}).get("metadata", {})
    return names.GROUP_FINALIZER in (metadata.get("finalizers") or [])


async def test_a_pod_deletion_lost_in_a_watch_relist_does_not_hold_the_devices(cluster: Any) -> None:
    """Kopf re-lists after a watch answers 410 Gone, and a list never reports what was deleted in between.

    The group's member is deleted while the watches are stalled, then history is compacted: the operator
    never sees a DELETED event for the pod. Its pod reflector's relist must tell (the list lacks the pod),
    and the deleted group be released instead of waiting on a pod that no longer exists.
    """
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster, member_recheck=500))  # the relist alone must do
    try:
        cluster.create(workload.group_body(NS, "ghost", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "ghost-0", "ghost"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "ghost-0 bound")
        await workload.until(
            lambda: has_finalizer(cluster, "ghost"),
            "the finalizer on the group",
        )
        cluster.stall_watches()
        cluster.delete("pods", "ghost-0", NS)
        cluster.compact()  # the watch resumes at a version the API no longer has: 410, list again
        cluster.drop_watches()
        cluster.resume_watches()
        cluster.delete(names.PLURAL, "ghost", NS)
        await workload.until(lambda: cluster.get(names.PLURAL, "ghost", NS) is None, "the group released and gone")
        # And the devices are free again: a group wanting both is placed.
        cluster.create(workload.group_body(NS, "next", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "next-0", "next"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "next-0 bound")
    finally:
        await kill(running)


async def test_a_group_force_deleted_during_a_watch_relist_gives_its_devices_back(cluster: Any) -> None:
    """An admin clears the finalizer and deletes the group (and its pod) while the watches are down, and
    the history is compacted: no DELETED event ever comes. The reflectors' relists must find both gone."""
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster, member_recheck=500))
    try:
        await place_and_settle(cluster, "forced")
        cluster.stall_watches()
        cluster.delete("pods", "forced-0", NS)
        cluster.patch(names.PLURAL, "forced", {"metadata": {"finalizers": None}}, NS)
        cluster.delete(names.PLURAL, "forced", NS)
        cluster.compact()
        cluster.drop_watches()
        cluster.resume_watches()
        cluster.create(workload.group_body(NS, "next", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "next-0", "next"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "next-0 bound on the freed devices")
        missed = running.memo.runtime.ctx.metrics.missed_deletions
        assert missed.labels("group")._value.get() == 1
        assert missed.labels("pod")._value.get() == 1
    finally:
        await kill(running)


async def test_the_audit_finds_a_group_deleted_while_its_watch_hangs(cluster: Any) -> None:
    """The group watch re-connects and hangs (no events, no error, no relist); the group is force-deleted.
    Nothing waits on it (its member is gone and seen gone), so only the periodic audit can tell."""
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster, audit_interval=0.5))
    try:
        await place_and_settle(cluster, "hidden")
        hung = cluster.inject_fault("GET", rf"^/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}$", hold=True)
        cluster.drop_watches()
        await workload.until(lambda: hung.fired and cluster.open_watches("pods"),
                             "the group watch back but hanging, the pod watch live")
        cluster.delete("pods", "hidden-0", NS)
        cluster.patch(names.PLURAL, "hidden", {"metadata": {"finalizers": None}}, NS)
        cluster.delete(names.PLURAL, "hidden", NS)
        cluster.create(workload.group_body(NS, "next", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "next-0", "next"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "next-0 bound on the freed devices")
        assert running.memo.runtime.ctx.metrics.missed_deletions.labels("group")._value.get() == 1
    finally:
        cluster.clear_faults()
        await kill(running)


async def place_and_settle(cluster: Any, group: str) -> None:
    """``group`` with one bound member ``<group>-0`` on 2 GPUs, and the operator's own writes all done."""
    cluster.create(workload.group_body(NS, group, {workload.GPU: 2}))
    cluster.create(workload.pod_body(NS, f"{group}-0", group))
    await workload.until(lambda: workload.bound_pods(cluster, NS), f"{group}-0 bound")
    await workload.until(
        lambda: has_finalizer(cluster, group)
        and (cluster.get(names.PLURAL, group, NS).get("status") or {}).get("members") == [f"{group}-0"],
        "the finalizer and a Bound status on the group",
    )

    def reasons(name: str) -> set[str]:
        return {e["reason"] for e in cluster.list("events", NS) if e["involvedObject"]["name"] == name}

    # The placement's last write: the pod's Scheduled event.
    await workload.until(lambda: "Scheduled" in reasons(f"{group}-0"), "the Scheduled event")


async def test_a_member_is_read_again_while_the_pod_watch_hangs(cluster: Any) -> None:
    """The pod watch re-connects but hangs (no events, no error, for longer than the test), while the group
    watch works: the group is deleted, its member too, and only reading the member again tells."""
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster, member_recheck=0.5))
    try:
        cluster.create(workload.group_body(NS, "hung", {workload.GPU: 2}))
        cluster.create(workload.pod_body(NS, "hung-0", "hung"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "hung-0 bound")
        await workload.until(lambda: has_finalizer(cluster, "hung"), "the finalizer on the group")
        hung = cluster.inject_fault("GET", r"^/api/v1/pods$", hold=True)
        cluster.drop_watches()
        await workload.until(lambda: hung.fired and cluster.open_watches(names.PLURAL),
                             "the pod watch back but hanging, the group watch live")
        cluster.delete("pods", "hung-0", NS)
        cluster.delete(names.PLURAL, "hung", NS)
        await workload.until(lambda: cluster.get(names.PLURAL, "hung", NS) is None, "the group released and gone")
        assert running.memo.runtime.ctx.metrics.missed_deletions.labels("pod")._value.get() == 1
    finally:
        cluster.clear_faults()
        await kill(running)
