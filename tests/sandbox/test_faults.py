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
