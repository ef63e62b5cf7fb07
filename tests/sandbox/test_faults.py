"""Scripted failures for fault tests: injected errors look like the real API's, then go away."""

from __future__ import annotations

import time

import aiohttp

from deviceshare.sandbox import Sandbox
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
    import asyncio

    rv = sandbox.store.resource_version
    sandbox.stall_watches()
    watching = asyncio.create_task(http.watch(SDG, {"resourceVersion": rv, "timeoutSeconds": "5"}, limit=1))
    await asyncio.sleep(0.05)
    sandbox.create(sdg("g"))
    await asyncio.sleep(0.1)
    assert not watching.done()
    sandbox.resume_watches()
    events = await asyncio.wait_for(watching, 2)
    assert events[0]["object"]["metadata"]["name"] == "g"
