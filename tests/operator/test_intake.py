"""The intake on its own: watch events and lists in, state and queues out, with deletions nobody announced.

A fake API answers the audit's reads; the queues are the real ones. End to end, the same rules are exercised
by tests/reliability/test_release.py (a watch that relists or hangs).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.kube import watching
from deviceshare.operator import state as state_
from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.context import Context
from deviceshare.operator.intake import Feed, Intake
from deviceshare.operator.queueing import ReconcileQueue, SchedulingQueue
from tests import waiting

OURS = names.DEFAULT_SCHEDULER_NAME


def pod(
    name: str, version: int, *, uid: str | None = None, group: str = "g", node: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": uid or f"uid-{name}", "resourceVersion": str(version),
                     "annotations": {names.POD_GROUP_ANNOTATION: group}},
        "spec": {"schedulerName": OURS, "nodeName": node, "containers": [{"name": "main"}]},
        "status": {"phase": "Running" if node else "Pending"},
    }


def group(name: str, version: int, *, uid: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": uid or f"uid-{name}", "resourceVersion": str(version),
                     "generation": 1},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
    }


class FakeApi:
    """What the audit reads: the lists, then each held object the list lacks, one by one."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        self.listed_pods: list[dict[str, Any]] | None = None  # a list older than the objects (None: all)

    async def list_pods(self, transform: Any = None) -> watching.Listing:
        items = list(self.pods.values()) if self.listed_pods is None else self.listed_pods
        return watching.Listing([transform(b) for b in items] if transform else items, "1")

    async def list_groups(self, transform: Any = None) -> watching.Listing:
        items = list(self.groups.values())
        return watching.Listing([transform(b) for b in items] if transform else items, "1")

    async def get_pod(self, key: tuple[str, str]) -> dict[str, Any] | None:
        return self.pods.get(key)

    async def read_group_if_exists(self, key: tuple[str, str]) -> state_.GroupRecord | None:
        body = self.groups.get(key)
        return None if body is None else state_.group_record(body)


class Rig:
    def __init__(self, **config: Any) -> None:
        self.api = FakeApi()
        self.ctx = Context(OperatorConfig(**config), api=self.api)  # type: ignore[arg-type]
        self.pods: SchedulingQueue[tuple[str, str]] = SchedulingQueue()
        self.groups = ReconcileQueue(debounce=0.0, allocations=lambda: self.ctx.ledger.allocations())
        self.intake = Intake(self.ctx, self.pods, self.groups,
                             is_ours=lambda p: p.scheduler_name == OURS and not p.node_name and not p.deleting)

    async def due_groups(self) -> set[tuple[str, str]]:
        return await asyncio.wait_for(self.groups.batch(), waiting.HANG_GUARD)


async def test_a_pending_pod_of_ours_is_queued_and_its_group_reconciled_and_a_bound_one_is_not_queued() -> None:
    rig = Rig()
    rig.intake.on_group("ADDED", group("g", 1))
    rig.intake.on_pod("ADDED", pod("p", 2))
    rig.intake.on_pod("ADDED", pod("q", 3, node="n1"))
    assert await asyncio.wait_for(rig.pods.get(), waiting.HANG_GUARD) == ("ml", "p")
    assert len(rig.pods) == 1
    assert await rig.due_groups() == {("ml", "g")}
    assert set(rig.ctx.state.pods) == {("ml", "p"), ("ml", "q")}


async def test_a_deletion_of_an_earlier_object_of_the_same_name_is_ignored() -> None:
    rig = Rig()
    rig.intake.on_pod("ADDED", pod("p", 5, uid="new"))
    rig.intake.on_pod("DELETED", pod("p", 4, uid="old"))
    assert rig.ctx.state.pods[("ml", "p")].uid == "new"
    rig.intake.on_pod("DELETED", pod("p", 6, uid="new"))
    assert ("ml", "p") not in rig.ctx.state.pods


async def test_audit_forgets_only_what_the_api_no_longer_has() -> None:
    rig = Rig()
    for body in (pod("kept", 1), pod("deleted", 2), pod("replaced", 3)):
        rig.intake.on_pod("ADDED", body)
    rig.intake.on_group("ADDED", group("g", 4))
    rig.intake.on_group("ADDED", group("gone", 5))
    rig.api.pods = {("ml", "kept"): pod("kept", 1), ("ml", "replaced"): pod("replaced", 9, uid="another")}
    rig.api.listed_pods = []  # a list that lacks even "kept": absence alone proves nothing
    rig.api.groups = {("ml", "g"): group("g", 4)}
    assert await rig.intake.audit() == 3
    assert set(rig.ctx.state.pods) == {("ml", "kept")}
    assert set(rig.ctx.state.groups) == {("ml", "g")}
    assert rig.ctx.metrics.missed_deletions.labels("pod")._value.get() == 2
    assert rig.ctx.metrics.missed_deletions.labels("group")._value.get() == 1
    assert ("ml", "gone") in await rig.due_groups()  # its devices, if any, are the reconciler's to release


@pytest.mark.parametrize(("held_version", "forgotten"), [(5, True), (15, False)])
async def test_a_list_lacking_an_object_we_hold_forgets_it_only_if_we_saw_it_before_the_list(
    held_version: int, forgotten: bool,
) -> None:
    rig = Rig()
    rig.intake.on_pod("ADDED", pod("p", held_version))

    feed = Feed(rig.ctx, "pod", lambda: rig.ctx.state.pods, rig.intake.on_pod, rig.intake.pod_gone)
    feed.replace([pod("other", 8)], resource_version="10")  # a list made at version 10
    assert (("ml", "p") not in rig.ctx.state.pods) is forgotten
    assert ("ml", "other") in rig.ctx.state.pods


async def test_a_relist_in_pages_applies_each_page_as_it_comes_and_forgets_only_at_its_end() -> None:
    """150,000 pods are never held as bodies at once: each page becomes records before the next is read; what the
    whole list lacks is known only once its last page is in."""
    rig = Rig()
    rig.intake.on_pod("ADDED", pod("gone", 3))
    rig.intake.on_pod("ADDED", pod("same", 4))
    feed = Feed(rig.ctx, "pod", lambda: rig.ctx.state.pods, rig.intake.on_pod, rig.intake.pod_gone)
    assert isinstance(feed, watching.PagedSink)
    feed.begin()
    feed.page([pod("a", 8), pod("same", 4)])
    assert {("ml", "a"), ("ml", "gone")} <= set(rig.ctx.state.pods)  # the page is in; nothing forgotten yet
    feed.page([pod("b", 9)])
    feed.end("10")
    assert set(rig.ctx.state.pods) == {("ml", "a"), ("ml", "same"), ("ml", "b")}
    assert rig.ctx.metrics.missed_deletions.labels("pod")._value.get() == 1


async def test_kopf_relisting_the_groups_over_and_over_does_not_put_off_the_audit_of_pods() -> None:
    """With --groups-through-kopf, each Kopf re-list wakes an audit of the groups alone; a watch that keeps failing
    (Kopf re-lists after every failure) must not starve the audit that finds a pod's missed deletion."""
    rig = Rig(audit_interval=2.5)  # longer than the settle after each re-list (1 s)
    rig.intake.on_pod("ADDED", pod("deleted", 2))  # its DELETED never came; the API has no such pod
    rig.api.groups = {("ml", "g"): group("g", 4)}
    rig.intake.groups.hold()
    rig.intake.groups.open("1")  # a term: the gate is open
    audits: list[bool] = []
    audit = rig.intake.audit

    async def recorded(*, pods: bool = True) -> int:
        audits.append(pods)
        return await audit(pods=pods)

    rig.intake.audit = recorded  # type: ignore[method-assign]

    async def relisting() -> None:  # Kopf's watch failing and listing the groups again, every 50 ms
        while True:
            rig.intake.groups.event(None, group("g", 4))
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(relisting()), asyncio.create_task(rig.intake.audit_loop())]
    try:
        await waiting.until(lambda: ("ml", "deleted") not in rig.ctx.state.pods,
                            "the audit of pods forgets the pod the API no longer has", timeout=20)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert False in audits, "no re-list woke an audit of the groups alone: the fault did not fire"
