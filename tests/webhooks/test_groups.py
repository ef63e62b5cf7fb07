"""The watch-backed group cache against a fake API: sync, changes, member counts, 410, errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from deviceshare.webhooks import admission, groups, sinks
from tests import waiting
from tests.webhooks import fakeapi
from tests.webhooks.fakeapi import GROUPS, PODS


@pytest.fixture
async def index(api_client: client.ApiClient) -> AsyncIterator[groups.GroupIndex]:
    idx = groups.GroupIndex()
    yield idx
    await idx.stop()


async def test_warming_until_both_lists_arrive(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer"))
    fake_api.lists_flowing.clear()  # the lists are held until the test lets them through
    assert index.group("ml", "trainer") is admission.WARMING
    index.start(api_client)
    assert await index.wait_synced(0.01) is False
    assert index.group("ml", "trainer") is admission.WARMING
    fake_api.lists_flowing.set()
    assert await index.wait_synced(waiting.HANG_GUARD) is True
    spec = index.group("ml", "trainer")
    assert spec is not admission.WARMING and spec is not None
    assert spec.resources == {"nvidia.com/gpu": 1}


async def test_follows_group_changes(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    index.start(api_client)
    await index.wait_synced(waiting.HANG_GUARD)
    assert index.group("ml", "trainer") is None
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer", {"amd.com/gpu": 2}))
    await fakeapi.until(lambda: index.group("ml", "trainer") is not None)
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer", {"amd.com/gpu": 2}, maxMembers=3))
    await fakeapi.until(lambda: getattr(index.group("ml", "trainer"), "max_members", 0) == 3)
    assert index.group("other", "trainer") is None
    deleting = fakeapi.group("ml", "trainer", {"amd.com/gpu": 2})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    fake_api.put(GROUPS, deleting)
    await fakeapi.until(lambda: index.group("ml", "trainer") is admission.DELETING)
    fake_api.delete(GROUPS, "ml", "trainer")
    await fakeapi.until(lambda: index.group("ml", "trainer") is None)


async def test_invalid_spec_is_treated_as_absent(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    fake_api.put(GROUPS, fakeapi.group("ml", "good"))
    fake_api.put(GROUPS, {**fakeapi.group("ml", "bad"), "spec": {"resources": {}}})
    index.start(api_client)
    await index.wait_synced(waiting.HANG_GUARD)
    assert index.group("ml", "good") is not None
    assert index.group("ml", "bad") is None


async def test_member_count_excludes_terminated_and_deleting(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    fake_api.put(PODS, fakeapi.member("ml", "a", "trainer", "Running"))
    fake_api.put(PODS, fakeapi.member("ml", "b", "trainer", "Succeeded"))
    fake_api.put(
        PODS, fakeapi.member("ml", "c", "trainer", "Pending", deletionTimestamp="2026-01-01T00:00:00Z")
    )
    fake_api.put(PODS, fakeapi.member("ml", "d", "other"))
    fake_api.put(PODS, fakeapi.member("dev", "e", "trainer"))
    fake_api.put(
        PODS, {"metadata": {"namespace": "ml", "name": "unlabelled"}, "status": {"phase": "Running"}}
    )
    index.start(api_client)
    await index.wait_synced(waiting.HANG_GUARD)
    assert index.member_count("ml", "trainer") == 1
    assert index.member_count("ml", "other") == 1
    assert index.member_count("dev", "trainer") == 1

    fake_api.put(PODS, fakeapi.member("ml", "f", "trainer"))
    await fakeapi.until(lambda: index.member_count("ml", "trainer") == 2)
    fake_api.put(PODS, fakeapi.member("ml", "a", "trainer", "Failed"))  # a terminates
    await fakeapi.until(lambda: index.member_count("ml", "trainer") == 1)
    fake_api.delete(PODS, "ml", "f")
    await fakeapi.until(lambda: index.member_count("ml", "trainer") == 0)
    fake_api.delete(PODS, "ml", "d")
    await fakeapi.until(lambda: index.member_count("ml", "other") == 0)


async def test_resumes_after_watch_ends_without_relisting(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    index.start(api_client)
    await index.wait_synced(waiting.HANG_GUARD)
    await fakeapi.until(lambda: fake_api.watch_count(GROUPS) == 1)
    fake_api.end_watches()
    fake_api.put(GROUPS, fakeapi.group("ml", "late"))  # happens while no watch is open
    await fakeapi.until(lambda: index.group("ml", "late") is not None)
    assert all(r.relists == 1 for r in index.reflectors)
    lists = [q for c, q in fake_api.requests if c == GROUPS and "watch" not in q]
    assert len(lists) == 1


async def test_relists_when_resource_version_expired(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    fake_api.put(GROUPS, fakeapi.group("ml", "old"))
    index.start(api_client)
    await index.wait_synced(waiting.HANG_GUARD)
    await fakeapi.until(lambda: fake_api.watch_count(GROUPS) == 1)
    fake_api.end_watches()
    # While disconnected: history is compacted, so the resumed watch gets 410 and must relist.
    fake_api.delete(GROUPS, "ml", "old")
    fake_api.put(GROUPS, fakeapi.group("ml", "new"))
    fake_api.compact()
    await fakeapi.until(lambda: index.group("ml", "new") is not None)
    assert index.group("ml", "old") is None
    assert index.reflectors[0].relists >= 2


async def test_retries_with_backoff_while_the_api_fails(
    fake_api: fakeapi.FakeApi, index: groups.GroupIndex, api_client: client.ApiClient
) -> None:
    fake_api.fail_next = 3
    fake_api.put(GROUPS, fakeapi.group("ml", "trainer"))
    index.start(api_client)
    assert await index.wait_synced(waiting.HANG_GUARD)
    assert index.group("ml", "trainer") is not None


async def test_lists_in_pages(fake_api: fakeapi.FakeApi, api_client: client.ApiClient) -> None:
    for i in range(7):
        fake_api.put(PODS, fakeapi.member("ml", f"p{i}", "trainer"))
    index = groups.GroupIndex()
    index.start(api_client, page_size=3)
    try:
        await index.wait_synced(waiting.HANG_GUARD)
        assert index.member_count("ml", "trainer") == 7
        pages = [q for c, q in fake_api.requests if c == PODS and "watch" not in q]
        assert [q.get("continue") for q in pages] == [None, "3", "6"]
    finally:
        await index.stop()


def test_a_relist_in_pages_replaces_the_caches_only_at_its_last_page() -> None:
    """Admissions meanwhile answer from the last whole list, never from half of the next one."""
    specs, members = sinks.Groups(), sinks.Members()
    specs.replace([fakeapi.group("ml", "old")], "5")
    members.replace([fakeapi.member("ml", "p0", "old")], "5")
    specs.begin()
    members.begin()
    specs.page([fakeapi.group("ml", "new")])
    members.page([fakeapi.member("ml", "p1", "new")])
    assert set(specs.specs) == {("ml", "old")} and members.counts == {("ml", "old"): 1}
    specs.end("9")
    members.end("9")
    assert set(specs.specs) == {("ml", "new")} and specs.seen == 9
    assert members.counts == {("ml", "new"): 1}
