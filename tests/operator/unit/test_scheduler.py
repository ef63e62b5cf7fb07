"""PodScheduler against an in-memory API: what it writes, in which order, and what it undoes when a write fails.

No sandbox and no Kopf: a failure here names the scheduler. The end-to-end scenarios are in the folder above.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest

from deviceshare.api import names
from deviceshare.core import ledger as ledgers
from deviceshare.operator import storage
from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import GPU, Harness, node


def scheduled_condition(h: Harness, key: tuple[str, str]) -> dict[str, str]:
    conditions = h.api.groups[key]["status"]["conditions"]
    return next(c for c in conditions if c["type"] == names.CONDITION_SCHEDULED)


async def test_the_first_pod_of_a_new_group_is_placed_and_bound_with_exactly_one_pod_write() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", resources={GPU: 2}))
    h.see(h.api.add_pod("p", "g"))

    outcome = await h.scheduler.schedule(("ns", "p"))

    assert (outcome.result, outcome.node) == (Result.BOUND, "n1")
    # Finalizer before the claim, the claim before the binding, the binding carrying the annotations.
    assert [(w.verb, w.key) for w in h.api.writes] == [
        ("finalizers", ("ns", "g")), ("status", ("ns", "g")), ("bind", ("ns", "p")),
    ]
    pod = h.api.pods[("ns", "p")]
    assert pod["spec"]["nodeName"] == "n1"
    assert json.loads(pod["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]) == {GPU: "0,1"}
    assert pod["metadata"]["annotations"][names.env_annotation("NVIDIA_VISIBLE_DEVICES")] == "0,1"
    status = h.api.groups[("ns", "g")]["status"]
    assert {k: status[k] for k in ("phase", "nodeName", "allocatedDevices", "members", "memberCount")} == {
        "phase": "Bound", "nodeName": "n1", "allocatedDevices": {GPU: ["0", "1"]}, "members": ["p"],
        "memberCount": 1,
    }
    assert h.api.groups[("ns", "g")]["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
    allocation = h.ctx.ledger.allocation(("ns", "g"))
    assert allocation is not None and allocation.state is ledgers.AllocationState.COMMITTED
    # One event, the pod's: the group's placement is in its status (Scheduled=True, reason Bound).
    assert [(name, reason) for name, reason, _ in await h.events()] == [("p", "Scheduled")]
    assert scheduled_condition(h, ("ns", "g"))["reason"] == "Bound"


async def test_a_group_created_with_its_finalizer_costs_one_status_write_one_binding_and_one_event() -> None:
    """The webhook sets the finalizer in the group's CREATE: the operator then adds none (3 writes in all)."""
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", finalizers=[names.GROUP_FINALIZER]))
    h.see(h.api.add_pod("p", "g"))

    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND
    assert [(w.verb, w.key) for w in h.api.writes] == [("status", ("ns", "g")), ("bind", ("ns", "p"))]
    assert [(name, reason) for name, reason, _ in await h.events()] == [("p", "Scheduled")]


@pytest.mark.parametrize("seed", range(5))
async def test_api_writes_per_bound_pod(seed: int) -> None:
    """One write per pod (the Binding); per group one finalizer and one status write, whatever the order."""
    rng = random.Random(seed)
    h = Harness(node("n1", 8), node("n2", 8))
    sizes = {f"g{i}": rng.randint(1, 6) for i in range(rng.randint(1, 5))}
    for name in sizes:
        h.see(h.api.add_group(name))
    pods = [(f"{g}-{i}", g) for g, n in sizes.items() for i in range(n)]
    rng.shuffle(pods)
    for pod, group in pods:
        h.see(h.api.add_pod(pod, group))

    for pod, _ in pods:
        assert (await h.scheduler.schedule(("ns", pod))).result is Result.BOUND

    pod_writes = h.api.writes_to("pod")
    assert len(pod_writes) == len(pods) and {w.verb for w in pod_writes} == {"bind"}
    assert sorted((w.key[1], w.verb) for w in h.api.writes_to("group")) == sorted(
        (g, verb) for g in sizes for verb in ("finalizers", "status")
    )
    # All members of a group share its node and devices.
    for group in sizes:
        members = [h.api.pods[("ns", p)] for p, g in pods if g == group]
        assert len({(m["spec"]["nodeName"], m["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION])
                    for m in members}) == 1


async def test_a_group_that_already_carries_the_finalizer_costs_one_status_write() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", finalizers=[names.GROUP_FINALIZER]))
    h.see(h.api.add_pod("p", "g"))
    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND
    assert [w.verb for w in h.api.writes] == ["status", "bind"]


@pytest.mark.parametrize(
    ("error", "result", "says"),
    [
        pytest.param(storage.Invalid("bind pod ns/p to n1: 403 forbidden by policy"), Result.REFUSED,
                     "the API server refused the binding to n1: bind pod ns/p to n1: 403 forbidden by policy",
                     id="403 refused"),
        pytest.param(storage.Conflict("bind pod ns/p to n1: 409 already bound"), Result.SKIPPED,
                     "bind pod ns/p to n1: 409 already bound", id="409 not ours"),
    ],
)
async def test_a_failed_binding_of_the_first_member_rolls_back_status_then_ledger(
    error: Exception, result: Result, says: str
) -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g"))
    h.see(h.api.add_pod("p", "g"))
    h.api.fail_bind = error
    # The status must say Pending again before the ledger gives the devices away.
    held_when_rolled_back: list[bool] = []
    h.api.before_write = lambda w: held_when_rolled_back.append(h.ctx.ledger.allocation(("ns", "g")) is not None)

    outcome = await h.scheduler.schedule(("ns", "p"))

    assert (outcome.result, outcome.message) == (result, says)
    assert h.ctx.ledger.allocation(("ns", "g")) is None
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "status"]
    assert held_when_rolled_back[-1] is True
    status = h.api.groups[("ns", "g")]["status"]
    assert status["phase"] == "Pending" and "nodeName" not in status and "allocatedDevices" not in status
    assert scheduled_condition(h, ("ns", "g"))["reason"] == "RolledBack"
    assert "nodeName" not in h.api.pods[("ns", "p")]["spec"]
    # The pod is not assumed bound: the next cycle places the group again.
    h.api.before_write = None
    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND


async def test_a_failed_binding_of_a_later_member_keeps_the_group_placed() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g"))
    h.see(h.api.add_pod("a", "g"))
    h.see(h.api.add_pod("b", "g"))
    assert (await h.scheduler.schedule(("ns", "a"))).result is Result.BOUND
    h.see(h.api.pod_now(("ns", "a"), phase="Running"))
    h.api.fail_bind = storage.Invalid("403")

    outcome = await h.scheduler.schedule(("ns", "b"))

    assert outcome.result is Result.REFUSED
    assert h.ctx.ledger.allocation(("ns", "g")) is not None
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]  # nothing rolled back


async def test_a_throttled_binding_is_retried_after_its_delay_and_the_group_stays_placed() -> None:
    """A 429 was certainly not applied: no rollback (two writes) and no new placement (two more) follow; the
    next cycle binds the pod where its group already is."""
    h = Harness(node("n1"))
    h.see(h.api.add_group("g"))
    h.see(h.api.add_pod("p", "g"))
    h.api.fail_bind = storage.RetryLater("bind pod ns/p to n1: 429 too many requests", delay=3.0)

    outcome = await h.scheduler.schedule(("ns", "p"))

    assert (outcome.result, outcome.retry_after) == (Result.RETRY, 3.0)
    allocation = h.ctx.ledger.allocation(("ns", "g"))
    assert allocation is not None and allocation.node == "n1"
    assert h.api.groups[("ns", "g")]["status"]["phase"] == "Bound"
    assert h.ctx.state.pods[("ns", "p")].member_of is None  # the write-ahead membership is undone
    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND
    assert [w.verb for w in h.api.writes] == ["finalizers", "status", "bind"]


async def test_a_status_changed_by_someone_else_is_read_again_and_the_placement_written_over_it() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", finalizers=[names.GROUP_FINALIZER]))
    h.see(h.api.add_pod("p", "g"))
    h.api.groups[("ns", "g")]["metadata"]["resourceVersion"] = "999"  # a write we have not seen

    outcome = await h.scheduler.schedule(("ns", "p"))

    assert outcome.result is Result.BOUND
    assert [w.verb for w in h.api.writes] == ["status", "bind"]  # the stale write never landed
    assert h.api.groups[("ns", "g")]["status"]["phase"] == "Bound"


async def test_a_group_known_only_to_the_api_is_read_once_and_placed() -> None:
    """The pod's event came before its group's: the scheduler asks the API instead of refusing the pod."""
    h = Harness(node("n1"))
    h.api.add_group("g")
    h.see(h.api.add_pod("p", "g"))
    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND
    assert h.ctx.state.groups[("ns", "g")].status.phase == "Bound"


@pytest.mark.parametrize(
    ("prepare", "says"),
    [
        pytest.param(lambda h: None, 'SharedDeviceGroup "g" not found in namespace "ns"', id="missing"),
        pytest.param(lambda h: (h.api.add_group("g"), h.see(h.api.delete_group(("ns", "g")))),
                     'SharedDeviceGroup "g" is being deleted', id="deleting"),
        pytest.param(lambda h: h.see(h.api.add_group("g", maxMembers=0, schedulingStrategy="nope")),
                     'SharedDeviceGroup "g" has an invalid spec: spec.schedulingStrategy: Input should be',
                     id="invalid"),
    ],
)
async def test_a_pod_the_joining_rules_refuse_costs_no_write(prepare: Callable[[Harness], object], says: str) -> None:
    h = Harness(node("n1"))
    prepare(h)
    h.see(h.api.add_pod("p", "g"))
    outcome = await h.scheduler.schedule(("ns", "p"))
    assert outcome.result is Result.UNSCHEDULABLE and outcome.message.startswith(says)
    assert h.api.writes == []


async def test_a_full_group_refuses_the_next_member_and_a_place_freed_lets_it_in() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", maxMembers=1))
    h.see(h.api.add_pod("a", "g"))
    h.see(h.api.add_pod("b", "g"))
    assert (await h.scheduler.schedule(("ns", "a"))).result is Result.BOUND

    refused = await h.scheduler.schedule(("ns", "b"))
    assert (refused.result, refused.message) == (
        Result.UNSCHEDULABLE, 'SharedDeviceGroup "g" already has 1 running member(s), its maxMembers is 1',
    )
    h.see(h.api.pod_now(("ns", "a"), phase="Succeeded"))
    assert (await h.scheduler.schedule(("ns", "b"))).result is Result.BOUND


async def test_a_pod_not_annotated_or_badly_annotated_is_told_why() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_pod("plain", None))
    h.see(h.api.add_pod("sneaky", "../shareddevicegroups?watch=true"))
    plain = await h.scheduler.schedule(("ns", "plain"))
    sneaky = await h.scheduler.schedule(("ns", "sneaky"))
    assert plain.result is Result.UNSCHEDULABLE and "has no deviceshare.io/device-group annotation" in plain.message
    assert sneaky.result is Result.UNSCHEDULABLE and "is not a valid group name" in sneaky.message
    assert h.api.writes == []
