"""Refresh-on-miss against a fake API: version order against the watch, and how often the API is asked.

Each race is built explicitly (watch events held back, a GET held open or answering an older state)
and the order in which the API sent things is asserted from the fake API's log, so a test that
passed without its race having happened would fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from deviceshare.webhooks import groups, misses
from tests.webhooks import fakeapi
from tests.webhooks.fakeapi import GROUPS

GUARD = 60.0  # bounds a wait that would otherwise hang; no test depends on how fast anything is


class Clock:
    """A clock the test moves by hand: the rate limit's interval passes when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def index(
    fake_api: fakeapi.FakeApi, api_client: client.ApiClient, clock: Clock
) -> AsyncIterator[groups.GroupIndex]:
    idx = groups.GroupIndex(misses.MissLimiter(interval_s=5.0, capacity=64, clock=clock))
    yield idx
    await idx.stop()


async def started(index: groups.GroupIndex, fake_api: fakeapi.FakeApi, api_client: client.ApiClient) -> None:
    index.start(api_client)
    assert await index.wait_synced(GUARD)
    await fakeapi.until(lambda: fake_api.watch_count(GROUPS) == 1)  # events from here on go to the log


def max_members(index: groups.GroupIndex, name: str) -> int | None:
    spec = index.group("ml", name)
    return getattr(spec, "max_members", None) if spec is not None else None


async def test_a_stale_get_after_a_delete_does_not_bring_the_group_back(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    before = fake_api.put(GROUPS, fakeapi.group("ml", "g"))
    await started(index, fake_api, api_client)
    assert index.group("ml", "g") is not None
    fake_api.delete(GROUPS, "ml", "g")
    await fakeapi.until(lambda: index.group("ml", "g") is None)  # the DELETED event is applied
    fake_api.stale_gets[("ml", "g")] = before  # a lagging read still sees the group

    await index.refresh("ml", "g", GUARD)

    rv = int(before["metadata"]["resourceVersion"])
    assert fake_api.log == [("watch", "DELETED", rv + 1), ("get", "g", rv)]
    assert fake_api.group_gets() == 1
    assert index.group("ml", "g") is None


async def test_a_get_that_raced_a_delete_is_dropped(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    await started(index, fake_api, api_client)
    fake_api.hold_watches()
    created = fake_api.put(GROUPS, fakeapi.group("ml", "g"))
    rv = int(created["metadata"]["resourceVersion"])
    fake_api.get_gate = asyncio.Event()
    lookup = asyncio.create_task(index.refresh("ml", "g", GUARD))
    await fake_api.get_read.wait()  # the GET has read the group as it was at rv...
    fake_api.delete(GROUPS, "ml", "g")  # ...then it is deleted, and the watch delivers both events
    fake_api.release_watches()
    await fakeapi.until(lambda: index.reflectors[0].resource_version == str(rv + 1))
    fake_api.get_gate.set()  # only now does the GET's answer arrive
    await lookup

    assert fake_api.log == [("watch", "ADDED", rv), ("watch", "DELETED", rv + 1), ("get", "g", rv)]
    assert index.group("ml", "g") is None


async def test_a_get_older_than_the_cache_does_not_roll_the_group_back(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    old = fake_api.put(GROUPS, fakeapi.group("ml", "g", maxMembers=2))
    await started(index, fake_api, api_client)
    fake_api.put(GROUPS, fakeapi.group("ml", "g", maxMembers=3))
    await fakeapi.until(lambda: max_members(index, "g") == 3)
    fake_api.stale_gets[("ml", "g")] = old

    await index.refresh("ml", "g", GUARD)

    rv = int(old["metadata"]["resourceVersion"])
    assert fake_api.log == [("watch", "MODIFIED", rv + 1), ("get", "g", rv)]
    assert max_members(index, "g") == 3


async def test_a_get_ahead_of_the_watch_is_kept_and_older_watch_events_do_not_roll_it_back(
    fake_api: fakeapi.FakeApi,
    index: groups.GroupIndex,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await started(index, fake_api, api_client)
    fake_api.hold_watches()  # the watch lags behind two writes
    created = fake_api.put(GROUPS, fakeapi.group("ml", "g", maxMembers=2))
    fake_api.put(GROUPS, fakeapi.group("ml", "g", maxMembers=3))
    rv = int(created["metadata"]["resourceVersion"])

    await index.refresh("ml", "g", GUARD)  # a pod's miss: the GET reads the newest state
    assert max_members(index, "g") == 3

    seen_after_each_event: list[int | None] = []
    apply = index._groups.apply  # the group watch's sink: record what each event leaves in the cache

    def recording(event_type: str, obj: dict[str, object]) -> None:
        apply(event_type, obj)
        seen_after_each_event.append(max_members(index, "g"))

    monkeypatch.setattr(index._groups, "apply", recording)
    fake_api.release_watches()
    await fakeapi.until(lambda: len(seen_after_each_event) == 2)

    assert fake_api.log == [("get", "g", rv + 1), ("watch", "ADDED", rv), ("watch", "MODIFIED", rv + 1)]
    assert seen_after_each_event == [3, 3]  # the older ADDED did not bring maxMembers=2 back
    fake_api.put(GROUPS, fakeapi.group("ml", "g", maxMembers=4))  # and later changes still apply
    await fakeapi.until(lambda: max_members(index, "g") == 4)


async def test_a_missing_name_is_asked_once_per_interval(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient, clock: Clock
) -> None:
    await started(index, fake_api, api_client)
    fake_api.get_gate = asyncio.Event()
    crowd = [asyncio.create_task(index.refresh("ml", "ghost", GUARD)) for _ in range(20)]
    await fake_api.get_read.wait()
    fake_api.get_gate.set()
    await asyncio.gather(*crowd)
    assert fake_api.group_gets() == 1  # twenty concurrent misses shared one GET

    for _ in range(5):
        await index.refresh("ml", "ghost", GUARD)
    assert fake_api.group_gets() == 1  # and later misses within the interval ask nothing
    await index.refresh("other", "ghost", GUARD)
    assert fake_api.group_gets() == 2  # the same name in another namespace is another group

    clock.now += 5.0
    await index.refresh("ml", "ghost", GUARD)
    assert fake_api.group_gets() == 3


async def test_thousands_of_missing_names_cost_a_bounded_number_of_lookups_and_of_memory(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient, clock: Clock
) -> None:
    await started(index, fake_api, api_client)
    for i in range(2000):
        await index.refresh("ml", f"ghost-{i}", GUARD)
    assert fake_api.group_gets() == index.misses.capacity == 64
    assert len(index.misses) == 64
    assert index.misses.refused == 2000 - 64

    clock.now += 5.0  # the interval passes: names can be asked again, still within the bound
    for i in range(2000, 2100):
        await index.refresh("ml", f"ghost-{i}", GUARD)
    assert fake_api.group_gets() == 128
    assert len(index.misses) == 64


async def test_a_group_created_after_a_miss_is_found_once_the_interval_passes(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient, clock: Clock
) -> None:
    await started(index, fake_api, api_client)
    fake_api.hold_watches()  # the watch lags: only a lookup can find the group
    await index.refresh("ml", "late", GUARD)
    fake_api.put(GROUPS, fakeapi.group("ml", "late"))
    await index.refresh("ml", "late", GUARD)
    assert index.group("ml", "late") is None  # asked within the interval: the miss stands
    clock.now += 5.0
    await index.refresh("ml", "late", GUARD)
    assert index.group("ml", "late") is not None
    assert fake_api.group_gets() == 2


def test_the_limiter_forgets_names_in_the_order_it_asked_them() -> None:
    clock = Clock()
    limiter = misses.MissLimiter(interval_s=5.0, capacity=3, clock=clock)
    assert [limiter.admit(("ml", n)) for n in "abc"] == [True, True, True]
    assert limiter.admit(("ml", "d")) is False  # full: refused, not remembered
    clock.now += 2.0
    assert limiter.admit(("ml", "a")) is False
    clock.now += 3.0  # a, b, c were asked 5 s ago
    assert limiter.admit(("ml", "d")) is True
    assert limiter.admit(("ml", "a")) is True
    assert len(limiter) == 2
    assert limiter.refused == 2
