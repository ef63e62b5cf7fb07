"""The groups' gate (operator/groupfeed.py) against random histories: whatever Kopf's stream delivered before a
rebuild, during it and after, the term ends up with the groups the API has, as a watch resumed from the rebuild's
list would have left it. The apply here is the intake's rule (``Intake.on_group``): a version we hold, or an older
one, changes nothing; a deletion removes only the uid it names."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.context import Context
from deviceshare.operator.groupfeed import GroupFeed
from deviceshare.operator.runtime import Runtime

NAMES = ("a", "b", "c")


def history(ops: list[tuple[str, int]]) -> list[tuple[str, dict[str, Any]]]:
    """(event type, body) per API write, resourceVersions 1, 2, ...: create, change or delete one of NAMES."""
    live: dict[str, str] = {}
    events: list[tuple[str, dict[str, Any]]] = []
    for name, kind in ops:
        rv = str(len(events) + 1)
        if name not in live:
            live[name] = f"{name}-{rv}"
            events.append(("ADDED", _body(name, live[name], rv)))
        elif kind == 0:
            events.append(("DELETED", _body(name, live.pop(name), rv)))
        else:
            events.append(("MODIFIED", _body(name, live[name], rv)))
    return events


def _body(name: str, uid: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": rv}}


def state_at(events: list[tuple[str, dict[str, Any]]], rv: int) -> dict[str, tuple[str, int]]:
    held: dict[str, tuple[str, int]] = {}
    for kind, body in events[:rv]:
        meta = body["metadata"]
        if kind == "DELETED":
            held.pop(meta["name"], None)
        else:
            held[meta["name"]] = (meta["uid"], int(meta["resourceVersion"]))
    return held


class Intake:
    def __init__(self) -> None:
        self.groups: dict[str, tuple[str, int]] = {}

    def on_group(self, kind: str | None, body: Any) -> None:
        meta = body["metadata"]
        name, uid, rv = meta["name"], meta["uid"], int(meta["resourceVersion"])
        have = self.groups.get(name)
        if kind == "DELETED":
            if have is not None and have[0] == uid:
                del self.groups[name]
            return
        if have is not None and have[0] == uid and have[1] >= rv:
            return
        self.groups[name] = (uid, rv)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 2)), min_size=1, max_size=30),
    st.data(),
)
def test_a_term_sees_the_groups_the_api_has_whatever_came_around_its_rebuild(
    ops: list[tuple[str, int]], data: st.DataObject
) -> None:
    events = history(ops)
    n = len(events)
    before = data.draw(st.integers(0, n), "delivered before the rebuild")  # applied to nothing: no term
    listed = data.draw(st.integers(before, n), "the rebuild's list")  # taken after the hold began
    during = data.draw(st.integers(before, n), "delivered while the rebuild ran")
    relisted = data.draw(st.booleans(), "Kopf re-lists once the term is open")
    intake = Intake()
    feed = GroupFeed(intake.on_group)
    for kind, body in events[:before]:
        feed.event(kind, body)
    assert intake.groups == {}, "a replica with no term applied an event"
    feed.hold()
    for kind, body in events[before:during]:
        feed.event(kind, body)
    intake.groups = state_at(events, listed)  # the rebuild adopts its list
    feed.open(str(listed))
    for kind, body in events[during:]:
        feed.event(kind, body)
    if relisted:  # Kopf's re-list: every live object again, no event type (deletions come from the audit)
        for _, body in [(k, b) for k, b in events if k != "DELETED"]:
            name = body["metadata"]["name"]
            if state_at(events, n).get(name, ("",))[0] == body["metadata"]["uid"]:
                feed.event(None, body)
    assert intake.groups == state_at(events, n)
    feed.close()
    feed.event("ADDED", _body("late", "late-1", str(n + 1)))
    assert "late" not in intake.groups and feed.state == "off"


class ListsFail:
    """An API whose lists fail: the rebuild of a take-over cannot finish."""

    request_timeout = 30.0

    async def list_nodes(self, transform: Any = None) -> Any:
        raise RuntimeError("the API server is down")

    list_groups = list_pods = list_nodes


async def test_a_failed_take_over_keeps_no_group_event_while_standing_by() -> None:
    runtime = Runtime(Context(OperatorConfig(metrics_port=None, election_settle=0.0), api=ListsFail()))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await runtime._elected()  # the leadership then releases the Lease and stands by (no term was started)
    runtime.intake.groups.event("ADDED", _body("a", "a-1", "1"))
    assert (runtime.intake.groups.state, runtime.intake.groups.holding) == ("off", 0)
