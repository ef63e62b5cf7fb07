"""One pod's path through a scheduling cycle: the core decides and returns, it never calls back into the operator;
the operator's records (``state.py``) are read once per decision and changed in one step per phase end; every
member of a gang is our member before its Binding is sent, and one never sent a Binding is not.

The first test follows the calls with ``sys.setprofile`` (what ``docs/architecture.md`` counts, "The path of one
pod"); it failed on the code before issue 34: the core called the operator 6 to 9 times a cycle (the ledger's
node listeners, ``joining``'s running-member callback, a priority generator the core drained) and ``state.py``
was entered 6 to 10 times.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import pytest

from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import GPU, Harness, Write, node

SRC = "/src/deviceshare/"


def _module(frame: FrameType | None) -> str | None:
    name = frame.f_code.co_filename if frame is not None else ""
    return name[name.index(SRC) + len(SRC):].removesuffix(".py") if SRC in name else None


async def _followed(run: Callable[[], Awaitable[Any]]) -> tuple[Any, list[str], list[str]]:
    """``run()``'s result, the core's calls into the operator, and each entry into ``state.py`` from outside."""
    climbs: list[str] = []
    entries: list[str] = []

    def inside_state(frame: FrameType | None) -> bool:
        while frame is not None:
            if _module(frame) == "operator/state":
                return True
            frame = frame.f_back
        return False

    def profile(frame: FrameType, event: str, _: object) -> None:
        if event != "call":
            return
        callee, caller = _module(frame), _module(frame.f_back)
        if callee is None or caller is None or callee == caller:
            return
        if caller.startswith("core/") and callee.startswith("operator/"):
            climbs.append(f"{caller} -> {callee}.{frame.f_code.co_name}")
        if callee == "operator/state" and not inside_state(frame.f_back):
            entries.append(f"{caller} -> state.{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        result = await run()
    finally:
        sys.setprofile(None)
    return result, climbs, entries


def _new_group(h: Harness) -> None:
    h.see(h.api.add_group("g", resources={GPU: 1}))
    h.see(h.api.add_pod("p", "g"))


def _gang(h: Harness) -> None:
    h.see(h.api.add_group("g", resources={GPU: 1}, minMembers=2))
    h.see(h.api.add_pod("p", "g"))
    h.see(h.api.add_pod("q", "g"))


def _limited(h: Harness) -> None:
    h.see(h.api.add_group("g", resources={GPU: 1}, maxMembers=3))


def _member(h: Harness) -> None:
    h.see(h.api.add_group("g", resources={GPU: 1}))


@pytest.mark.parametrize(("setup", "later_member", "state_entries"), [
    pytest.param(_new_group, False, 3, id="the first pod of a new group: one read, two applies"),
    pytest.param(_gang, False, 4, id="a gang of two: its members counted once more before anything is written"),
    pytest.param(_member, True, 2, id="a later member: the write-ahead and the apply"),
    pytest.param(_limited, True, 3, id="a later member of a group with maxMembers: its running members read"),
])
async def test_a_cycle_never_climbs_from_the_core_back_into_the_operator(
    setup: Callable[[Harness], None], later_member: bool, state_entries: int
) -> None:
    h = Harness(node("n1"), node("n2"))
    h.scheduler.preemptor.groups_by_node()  # the victim index follows the ledger, as once anything was preempted
    setup(h)
    if later_member:
        h.see(h.api.add_pod("p0", "g"))
        assert (await h.scheduler.schedule(("ns", "p0"))).result is Result.BOUND
        h.see(h.api.add_pod("p", "g"))

    outcome, climbs, entries = await _followed(lambda: h.scheduler.schedule(("ns", "p")))

    assert outcome.result is Result.BOUND
    assert climbs == []
    assert len(entries) == state_entries, entries


async def test_the_post_filter_never_climbs_either() -> None:
    """A higher-priority group that fits nowhere: preemption decides on the core's victim index and the
    operator carries it out (nominate, evict); the core still calls nothing of the operator's."""
    h = Harness(node("n1", 2))
    h.scheduler.preemptor.groups_by_node()
    h.see(h.api.add_group("low", resources={GPU: 2}))
    h.see(h.api.add_pod("low-0", "low", priority=10))
    assert (await h.scheduler.schedule(("ns", "low-0"))).result is Result.BOUND
    h.see(h.api.pod_now(("ns", "low-0"), phase="Running"))
    h.see(h.api.add_group("urgent", resources={GPU: 2}))
    h.see(h.api.add_pod("urgent-0", "urgent", priority=1000))

    outcome, climbs, entries = await _followed(lambda: h.scheduler.schedule(("ns", "urgent-0")))

    assert outcome.result is Result.UNSCHEDULABLE and "preempting ns/low" in outcome.message
    assert climbs == []
    assert h.api.groups[("ns", "urgent")]["status"]["nominatedNodeName"] == "n1"
    assert h.ctx.state.groups[("ns", "urgent")].status.nominated_node_name == "n1"  # the answer kept, once applied
    # Beside the cycle's one read and two applies, only the preemptor reads: the victims' members and priorities.
    assert [e for e in entries if not e.startswith("operator/preempting")] == [
        "operator/scheduler -> state.view",
        "operator/cyclechanges -> state.apply",
        "operator/cyclechanges -> state.apply",
    ]


async def test_every_gang_member_is_ours_before_its_binding_is_sent_and_the_claim_is_committed() -> None:
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", resources={GPU: 1}, minMembers=3))
    for name in ("p", "q", "r"):
        h.see(h.api.add_pod(name, "g"))
    seen: list[tuple[str, str | None, bool]] = []

    def before(write: Write) -> None:
        if write.verb == "bind":
            allocation = h.ctx.ledger.allocation(("ns", "g"))
            committed = allocation is not None and allocation.state.name == "COMMITTED"
            seen.append((write.key[1], h.ctx.state.pods[write.key].member_of, committed))

    h.api.before_write = before
    outcome = await h.scheduler.schedule(("ns", "p"))

    assert outcome.result is Result.BOUND and set(outcome.also_bound) == {("ns", "q"), ("ns", "r")}
    assert seen == [("p", "g", True), ("q", "g", True), ("r", "g", True)]
    assert all(h.ctx.state.pods[("ns", n)].node_name == "n1" for n in ("p", "q", "r"))
    assert [(name, reason) for name, reason, _ in await h.events()] == [
        ("p", "Scheduled"), ("q", "Scheduled"), ("r", "Scheduled"),
    ]


async def test_a_binding_that_fails_unforeseen_keeps_that_member_and_forgets_the_ones_never_sent() -> None:
    """The second Binding raises an error nobody foresaw: it may have landed (that pod stays our member); the
    third was never sent (not ours); the first is bound and assumed."""
    h = Harness(node("n1"))
    h.see(h.api.add_group("g", resources={GPU: 1}, minMembers=3))
    for name in ("p", "q", "r"):
        h.see(h.api.add_pod(name, "g"))
    binds: list[str] = []

    def before(write: Write) -> None:
        if write.verb == "bind":
            binds.append(write.key[1])
            if write.key[1] == "q":
                raise RuntimeError("an answer nobody could read")

    h.api.before_write = before
    with pytest.raises(RuntimeError):
        await h.scheduler.schedule(("ns", "p"))

    assert binds == ["p", "q"]  # the fault fired, on the second Binding, and no third was sent
    pods = h.ctx.state.pods
    assert (pods[("ns", "p")].node_name, pods[("ns", "p")].member_of) == ("n1", "g")
    assert (pods[("ns", "q")].node_name, pods[("ns", "q")].member_of) == (None, "g")
    assert (pods[("ns", "r")].node_name, pods[("ns", "r")].member_of) == (None, None)
    allocation = h.ctx.ledger.allocation(("ns", "g"))
    assert allocation is not None and allocation.state.name == "COMMITTED"  # the claim landed: it stays
