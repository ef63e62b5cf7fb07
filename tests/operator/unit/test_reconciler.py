"""GroupReconciler against an in-memory API: statuses it writes, devices it lets go, and in which order.

The rule under every test: the API stops showing a claim before the ledger gives its devices to anyone else,
and no device is freed while a member pod still runs on it.
"""

from __future__ import annotations

from deviceshare.api import names
from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import Harness, node

G = ("ns", "g")


async def placed(h: Harness, *pods: str, running: bool = True) -> None:
    """Group ``g`` placed by the scheduler with ``pods`` bound (and, as their watch events say, running)."""
    h.see(h.api.add_group("g"))
    for pod in pods:
        h.see(h.api.add_pod(pod, "g"))
        assert (await h.scheduler.schedule(("ns", pod))).result is Result.BOUND
        if running:
            h.see(h.api.pod_now(("ns", pod), phase="Running"))
    h.see(await h.api.get_group(G))
    h.api.writes.clear()


def conditions(h: Harness) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in h.api.groups[G]["status"]["conditions"]}


async def test_a_placed_group_needs_no_second_status_write() -> None:
    """The placement already listed its members the way the reconciler does (statuses.member_names)."""
    h = Harness(node("n1"))
    await placed(h, "a")
    assert await h.reconciler.reconcile(G) is False
    assert h.api.writes == []


async def test_a_new_member_is_listed_in_the_status() -> None:
    h = Harness(node("n1"))
    await placed(h, "a")
    h.see(h.api.add_pod("b", "g"))
    await h.reconciler.reconcile(G)
    assert [w.verb for w in h.api.writes] == ["status"]
    assert h.api.groups[G]["status"]["members"] == ["a", "b"]
    assert h.api.groups[G]["status"]["memberCount"] == 2


async def test_a_group_whose_node_is_lost_is_released_once_nothing_runs_there() -> None:
    h = Harness(node("n1"))
    await placed(h, "a")
    h.see(h.api.pod_now(("ns", "a"), phase="Succeeded"))
    h.ctx.ledger.remove_node("n1")
    # The status must say Pending before the ledger lets the devices go.
    held: list[bool] = []
    h.api.before_write = lambda w: held.append(h.ctx.ledger.allocation(G) is not None)

    assert await h.reconciler.reconcile(G) is True

    assert h.ctx.ledger.allocation(G) is None
    # The release itself: one status write, made while the ledger still held the devices, that says why.
    release = h.api.writes[0]
    assert release.verb == "status" and held[0] is True
    body = release.body
    assert (body["phase"], body["nodeName"], body["allocatedDevices"]) == ("Pending", None, None)
    by_type = {c["type"]: c for c in body["conditions"]}
    assert (by_type[names.CONDITION_NODE_LOST]["status"], by_type[names.CONDITION_SCHEDULED]["reason"]) == (
        "True", "NodeLost",
    )
    assert by_type[names.CONDITION_NODE_LOST]["message"].startswith(
        "node n1 no longer exists; no member was running there"
    )
    status = h.api.groups[G]["status"]
    assert status["phase"] == "Pending" and "nodeName" not in status and "allocatedDevices" not in status
    # ...and the reason stays on the group until it is placed again (no second write wiping it).
    assert [w.verb for w in h.api.writes] == ["status"]
    assert conditions(h)[names.CONDITION_NODE_LOST]["status"] == "True"
    assert conditions(h)[names.CONDITION_SCHEDULED]["reason"] == "NodeLost"
    assert ("g", "NodeLost", "node n1 no longer exists; devices released, the group will be placed again") \
        in await h.events()


async def test_a_lost_node_keeps_the_devices_while_a_member_still_runs_there() -> None:
    h = Harness(node("n1"))
    await placed(h, "a")
    h.ctx.ledger.upsert_node(node("n1", ready=False))

    assert await h.reconciler.reconcile(G) is False

    assert h.ctx.ledger.allocation(G) is not None
    assert h.api.groups[G]["status"]["phase"] == "Bound"
    assert conditions(h)[names.CONDITION_NODE_LOST]["message"] == (
        "node n1 is not Ready; devices stay held while a member still runs there"
    )
    assert any(reason == "NodeLost" for _, reason, _ in await h.events())


async def test_a_deleting_group_loses_its_finalizer_only_after_its_devices_are_released() -> None:
    h = Harness(node("n1"))
    await placed(h, "a")
    h.see(h.api.delete_group(G))

    # A member still runs on the devices: Releasing, devices and finalizer kept.
    assert await h.reconciler.reconcile(G) is False
    assert [w.verb for w in h.api.writes] == ["status"]
    assert h.api.groups[G]["status"]["phase"] == "Releasing"
    assert h.api.groups[G]["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
    assert h.ctx.ledger.allocation(G) is not None
    h.see(await h.api.get_group(G))

    # The member finishes: the finalizer goes (the API then deletes the group), and only then the claim.
    h.see(h.api.pod_now(("ns", "a"), phase="Succeeded"))
    held: list[bool] = []
    h.api.before_write = lambda w: held.append(h.ctx.ledger.allocation(G) is not None)
    assert await h.reconciler.reconcile(G) is True

    assert [w.verb for w in h.api.writes] == ["status", "finalizers"]
    assert held == [True]
    assert G not in h.api.groups
    assert h.ctx.ledger.allocation(G) is None
    assert any(reason == "Released" for _, reason, _ in await h.events())


async def test_a_live_group_gets_our_finalizer() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", finalizers=["someone.else/keep"]))
    h.see(h.api.add_pod("p", "g"))  # pending: the placement will write the first status
    await h.reconciler.reconcile(G)
    assert [w.verb for w in h.api.writes] == ["finalizers"]
    assert h.api.groups[G]["metadata"]["finalizers"] == ["someone.else/keep", names.GROUP_FINALIZER]
    assert h.ctx.state.groups[G].finalizers == ("someone.else/keep", names.GROUP_FINALIZER)  # written through


async def test_edited_device_annotations_of_a_member_are_put_back() -> None:
    h = Harness(node("n1"))
    await placed(h, "a")
    body = h.api.pods[("ns", "a")]
    body["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] = '{"nvidia.com/gpu":"1"}'
    h.see(h.api.pod_now(("ns", "a")))

    await h.reconciler.reconcile(G)

    assert [(w.verb, w.key) for w in h.api.writes] == [("annotate", ("ns", "a"))]
    assert body["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] == '{"nvidia.com/gpu":"0"}'
