"""Watch semantics: resume from a resourceVersion, 410 Gone, bookmarks, timeoutSeconds, selectors."""

from __future__ import annotations

import asyncio

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.helpers import PODS, SDG, Http, pod, sdg

MERGE = "application/merge-patch+json"
HANG_GUARD = str(int(waiting.HANG_GUARD))  # a watch that outlives it ends, and the test fails


async def test_watch_without_version_lists_then_streams(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("old"))

    async def later() -> None:
        # Once the watch is open, so that "new" comes on the stream and not in the initial list.
        await waiting.until(lambda: sandbox.open_watches("shareddevicegroups"), "the watch open")
        await http.call("POST", SDG, sdg("new"))

    task = asyncio.create_task(later())
    events = await http.watch(SDG, {"timeoutSeconds": HANG_GUARD}, limit=2)
    await task
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "old"),
        ("ADDED", "new"),
    ]


async def test_watch_resumes_after_the_given_version(http: Http) -> None:
    _, created = await http.call("POST", SDG, sdg("g"))
    rv = created["metadata"]["resourceVersion"]
    await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 1}}, content_type=MERGE)
    await http.call("DELETE", f"{SDG}/g")
    events = await http.watch(SDG, {"resourceVersion": rv, "timeoutSeconds": "0.3"})
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert int(rv) < versions[0] < versions[1]


async def test_watch_from_a_compacted_version_is_410_gone_as_an_error_event(
    sandbox: Sandbox, http: Http
) -> None:
    _, created = await http.call("POST", SDG, sdg("g"))
    await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 1}}, content_type=MERGE)
    sandbox.compact()
    events = await http.watch(SDG, {"resourceVersion": created["metadata"]["resourceVersion"]})
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert "too old resource version" in status["message"]


async def test_history_beyond_its_limit_is_forgotten(tmp_path: object) -> None:
    async with Sandbox(nodes=1, watch_history=5, kubelet_delay=None) as small:
        first = small.create(sdg("g"))
        for n in range(10):
            small.patch("sdg", "g", {"spec": {"maxMembers": n + 1}}, "default")
        import aiohttp

        async with aiohttp.ClientSession() as session:
            http = Http(session, small.url)
            gone = await http.watch(SDG, {"resourceVersion": first["metadata"]["resourceVersion"]})
            recent = small.get("sdg", "g", "default")
            assert recent is not None
            ok = await http.watch(
                SDG,
                {
                    "resourceVersion": str(int(recent["metadata"]["resourceVersion"]) - 2),
                    "timeoutSeconds": "0.2",
                },
            )
    assert gone[0]["object"]["code"] == 410
    assert [e["type"] for e in ok] == ["MODIFIED", "MODIFIED"]


async def test_bookmarks_when_asked_and_timeout_ends_the_stream(sandbox: Sandbox, http: Http) -> None:
    sandbox.api.bookmark_interval = 0.05
    await http.call("POST", SDG, sdg("g"))
    events = await http.watch(
        SDG,
        {
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "0.3",
            "resourceVersion": sandbox.store.resource_version,
        },
    )
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[-1]["object"]["metadata"]["resourceVersion"] == sandbox.store.resource_version
    assert events[-1]["object"]["kind"] == "SharedDeviceGroup"
    plain = await http.watch(
        SDG, {"timeoutSeconds": "0.2", "resourceVersion": sandbox.store.resource_version}
    )
    assert plain == []


async def test_send_initial_events_ends_with_the_initial_events_end_bookmark(http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    events = await http.watch(
        SDG,
        {
            "sendInitialEvents": "true",
            "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan",
            "timeoutSeconds": "0.2",
        },
    )
    assert [e["type"] for e in events][:2] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_selector_watch_sees_objects_enter_and_leave(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", PODS, pod("p", metadata={"labels": {"team": "a"}}))
    rv = sandbox.store.resource_version
    await http.call("PATCH", f"{PODS}/p", {"metadata": {"labels": {"team": "b"}}}, content_type=MERGE)
    await http.call("PATCH", f"{PODS}/p", {"metadata": {"labels": {"team": "a"}}}, content_type=MERGE)
    events = await http.watch(
        PODS, {"resourceVersion": rv, "labelSelector": "team=a", "timeoutSeconds": "0.2"}
    )
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


async def test_watch_of_one_object_by_field_selector(sandbox: Sandbox, http: Http) -> None:
    rv = sandbox.store.resource_version
    await http.call("POST", SDG, sdg("a"))
    await http.call("POST", SDG, sdg("b"))
    events = await http.watch(
        SDG, {"resourceVersion": rv, "fieldSelector": "metadata.name=b", "timeoutSeconds": "0.2"}
    )
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]


async def test_dropped_watches_end_and_clients_resume_without_loss(sandbox: Sandbox, http: Http) -> None:
    rv = sandbox.store.resource_version

    async def drop_then_write() -> None:
        await waiting.until(lambda: sandbox.open_watches("shareddevicegroups"), "the watch open")
        assert sandbox.drop_watches() == 1
        sandbox.create(sdg("while-away"))

    task = asyncio.create_task(drop_then_write())
    first = await http.watch(SDG, {"resourceVersion": rv, "timeoutSeconds": HANG_GUARD})  # ends when dropped
    await task
    assert first == []
    resumed = await http.watch(SDG, {"resourceVersion": rv, "timeoutSeconds": "0.2"})
    assert [e["object"]["metadata"]["name"] for e in resumed] == ["while-away"]
