"""Scripted failures for fault tests: injected errors look like the real API's, then go away."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.sandbox.helpers import SDG, Http, sdg

MERGE = "application/merge-patch+json"


async def test_injected_conflict_hits_the_next_matching_request_only(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    fault = sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", status=409, times=1)
    status, error = await http.call("GET", f"{SDG}/g")
    assert status == 200  # other verbs are untouched
    status, error = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 1}}, content_type=MERGE)
    assert (status, error["kind"], error["reason"]) == (409, "Status", "Conflict")
    status, _ = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 1}}, content_type=MERGE)
    assert status == 200 and fault.fired == 1


async def test_throttling_carries_retry_after(sandbox: Sandbox) -> None:
    sandbox.inject_fault(None, r"/api/v1/nodes", status=429, retry_after=3, times=2)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.get(f"{sandbox.url}/api/v1/nodes") as response:
                assert response.status == 429 and response.headers["Retry-After"] == "3"
                body = await response.json()
                assert body["details"]["retryAfterSeconds"] == 3
        async with session.get(f"{sandbox.url}/api/v1/nodes") as response:
            assert response.status == 200


async def test_delay_without_status_slows_then_serves(sandbox: Sandbox, http: Http) -> None:
    sandbox.inject_fault("GET", r"/api/v1/nodes$", delay=0.2)
    started = time.monotonic()
    status, _ = await http.call("GET", "/api/v1/nodes")
    assert status == 200 and time.monotonic() - started >= 0.2
    sandbox.inject_fault("GET", r"/api/v1/nodes$", status=500, times=None)
    sandbox.clear_faults()
    status, _ = await http.call("GET", "/api/v1/nodes")
    assert status == 200


async def test_kmock_reactions_take_precedence(sandbox: Sandbox, http: Http) -> None:
    sandbox.api["get /version"] << {"major": "9", "minor": "99"}
    status, body = await http.call("GET", "/version")
    assert (status, body) == (200, {"major": "9", "minor": "99"})
    status, _ = await http.call("GET", "/api/v1/nodes")
    assert status == 200


async def test_stalled_watches_deliver_nothing_until_resumed(sandbox: Sandbox, http: Http) -> None:
    rv = sandbox.store.resource_version
    sandbox.stall_watches()
    watching = asyncio.create_task(http.watch(SDG, {"resourceVersion": rv, "timeoutSeconds": "60"}, limit=1))
    await waiting.until(lambda: sandbox.open_watches("shareddevicegroups"), "the watch open")
    sandbox.create(sdg("g"))
    # The stream has taken the event off its queue: it now holds it, waiting for the watches to flow.
    (sub,) = sandbox.store.subscriptions(sandbox.store.rtype("shareddevicegroups").key)
    await waiting.until(sub.queue.empty, "the stream to take the event")
    assert not watching.done()
    sandbox.resume_watches()
    events = await watching
    assert events[0]["object"]["metadata"]["name"] == "g"


async def test_a_held_request_waits_until_released_and_its_answer_is_recorded(sandbox: Sandbox, http: Http) -> None:
    fault = sandbox.inject_fault("POST", r"/shareddevicegroups$", hold=True)
    creating = asyncio.create_task(http.call("POST", SDG, sdg("held")))
    await waiting.until(lambda: fault.fired, "the request to arrive")
    assert sandbox.get("sdg", "held", "default") is None and fault.answered == []  # in flight, not stored
    fault.release()
    status, _ = await creating
    assert status == 201 and fault.answered == [201]
    assert sandbox.get("sdg", "held", "default") is not None
    # A held request that is then refused says so too; clear_faults() lets held requests through.
    refused = sandbox.inject_fault("POST", r"/shareddevicegroups$", status=409, hold=True)
    creating = asyncio.create_task(http.call("POST", SDG, sdg("again")))
    await waiting.until(lambda: refused.fired, "the second request to arrive")
    sandbox.clear_faults()
    status, _ = await creating
    assert status == 409 and refused.answered == [409]


async def test_a_write_applied_then_answered_504_has_landed(sandbox: Sandbox, http: Http) -> None:
    """kube-apiserver under load: the write is carried out, its answer says Timeout."""
    await http.call("POST", SDG, sdg("g"))
    fault = sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", status=504, applied=True)
    status, error = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 3}}, content_type=MERGE)
    assert (status, error["reason"]) == (504, "Timeout") and fault.fired == 1
    _, group = await http.call("GET", f"{SDG}/g")
    assert group["spec"]["maxMembers"] == 3


async def test_a_dropped_connection_after_the_write_leaves_it_landed(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    fault = sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", applied=True, drop=True)
    try:
        await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 4}}, content_type=MERGE)
    except aiohttp.ClientError:
        pass
    else:
        raise AssertionError("the connection was not dropped")
    _, group = await http.call("GET", f"{SDG}/g")
    assert group["spec"]["maxMembers"] == 4 and fault.fired == 1


async def test_a_dropped_connection_before_the_write_leaves_nothing(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    fault = sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", drop=True)
    try:
        await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 5}}, content_type=MERGE)
    except aiohttp.ClientError:
        pass
    else:
        raise AssertionError("the connection was not dropped")
    _, group = await http.call("GET", f"{SDG}/g")
    assert group["spec"].get("maxMembers") != 5 and fault.fired == 1


async def test_a_write_held_past_its_timeout_is_given_up_and_not_applied(sandbox: Sandbox, http: Http) -> None:
    """``?timeout=`` bounds a write as kube-apiserver's handlers do: past it, 504 and nothing stored."""
    await http.call("POST", SDG, sdg("g"))
    sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", delay=0.3)
    status, error = await http.call(
        "PATCH", f"{SDG}/g", {"spec": {"maxMembers": 6}}, content_type=MERGE, params={"timeout": "100ms"}
    )
    assert (status, error["reason"]) == (504, "Timeout")
    assert "request did not complete within requested timeout" in error["message"]
    _, group = await http.call("GET", f"{SDG}/g")
    assert group["spec"].get("maxMembers") != 6
    # Within its timeout the same delayed write lands.
    sandbox.inject_fault("PATCH", r"/shareddevicegroups/g$", delay=0.1)
    status, _ = await http.call(
        "PATCH", f"{SDG}/g", {"spec": {"maxMembers": 6}}, content_type=MERGE, params={"timeout": "2s"}
    )
    assert status == 200


async def test_every_nth_matching_request_fires(sandbox: Sandbox, http: Http) -> None:
    fault = sandbox.inject_fault("GET", r"/api/v1/nodes$", status=500, times=None, every=3)
    answers = [(await http.call("GET", "/api/v1/nodes"))[0] for _ in range(6)]
    assert answers == [200, 200, 500, 200, 200, 500] and (fault.seen, fault.fired) == (6, 2)
