"""The Lease elector's state machine against a fake API with the API server's resourceVersion rules.

Time is the event loop's, faked by looptime: a test that waits out a 15 s lease runs in milliseconds,
and "when" is exact. The end-to-end scenarios with two operators are in tests/reliability/test_failover.py.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from deviceshare.operator import leadership
from deviceshare.operator.storage import Conflict, Gone

NS, NAME = "deviceshare-system", "deviceshare-operator"
WALL = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)


class FakeLeases:
    """One Lease, with the API server's optimistic concurrency: a PUT with a stale resourceVersion is a 409."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.refuse_writes = False  # a partition: every write fails (not a 409)
        self.conflicts = 0  # writes refused with a 409: the proof that a race happened

    def _stored(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.obj = copy.deepcopy(dict(body))
        self.obj["metadata"] = dict(self.obj["metadata"], resourceVersion=str(self.version))
        return copy.deepcopy(self.obj)

    async def get_lease(self, own_namespace: str, name: str) -> dict[str, Any]:
        found = copy.deepcopy(self.obj)
        await asyncio.sleep(0)  # the answer's way back: a concurrent candidate may read the same record meanwhile
        if found is None:
            raise Gone("404")
        return found

    async def create_lease(self, own_namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.refuse_writes:
            raise ConnectionError("unreachable")
        if self.obj is not None:
            self.conflicts += 1
            raise Conflict("409 AlreadyExists")
        return self._stored(body)

    async def replace_lease(self, own_namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.refuse_writes:
            raise ConnectionError("unreachable")
        if self.obj is None:
            raise Gone("404")
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise Conflict("409 the object has been modified")
        return self._stored(body)

    def overwrite(self, **spec: Any) -> None:
        """Someone else writes the Lease (another holder, or a human with kubectl)."""
        assert self.obj is not None
        self._stored(dict(self.obj, spec=dict(self.obj["spec"], **spec)))

    @property
    def spec(self) -> dict[str, Any]:
        assert self.obj is not None
        return dict(self.obj["spec"])


def now() -> float:
    return asyncio.get_running_loop().time()


def elector(api: FakeLeases, identity: str, duration: float = 15.0) -> leadership.LeaseElector:
    return leadership.LeaseElector(api, namespace=NS, name=NAME, identity=identity, lease_duration=duration,
                                   clock=now, wall=lambda: WALL)


@pytest.mark.looptime
async def test_the_first_replica_creates_the_lease_and_renews_it() -> None:
    api = FakeLeases()
    a = elector(api, "a")
    assert await a.try_acquire_or_renew()
    assert api.spec == {"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": "2026-11-23T12:00:00.000000Z",
                        "renewTime": "2026-11-23T12:00:00.000000Z", "leaseTransitions": 0}
    version = api.version
    assert await a.try_acquire_or_renew()  # a renewal keeps acquireTime and the transition count
    assert api.version == version + 1 and api.spec["leaseTransitions"] == 0 and a.is_leader


@pytest.mark.looptime
async def test_a_standby_takes_an_unrenewed_lease_only_after_it_saw_it_unchanged_for_the_duration() -> None:
    api = FakeLeases()
    a, b = elector(api, "a"), elector(api, "b")
    assert await a.try_acquire_or_renew()
    await asyncio.sleep(100)  # looptime: long past renewTime; b still counts from when *it* first saw the record
    assert not await b.try_acquire_or_renew()
    assert b.holder == "a"
    await asyncio.sleep(14.9)  # looptime: fake time
    assert not await b.try_acquire_or_renew()
    await asyncio.sleep(0.1)  # looptime: fake time
    assert await b.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "b" and api.spec["leaseTransitions"] == 1


@pytest.mark.looptime
async def test_every_renewal_restarts_the_standbys_count() -> None:
    api = FakeLeases()
    a, b = elector(api, "a"), elector(api, "b")
    assert await a.try_acquire_or_renew()
    for _ in range(10):
        assert not await b.try_acquire_or_renew()
        await asyncio.sleep(10)  # looptime: fake time
        assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()


@pytest.mark.looptime
async def test_two_candidates_racing_for_an_expired_lease_one_gets_409_and_stays_standby() -> None:
    api = FakeLeases()
    a, b, c = elector(api, "a"), elector(api, "b"), elector(api, "c")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew() and not await c.try_acquire_or_renew()
    await asyncio.sleep(15)  # looptime: fake time
    results = await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())
    assert sorted(results) == [False, True]
    assert api.conflicts == 1  # both read the expired record, and the API refused the second write
    assert api.spec["holderIdentity"] == ("b" if results[0] else "c")
    # and two replicas creating the Lease at once: the API server refuses the second create
    fresh = FakeLeases()
    results = await asyncio.gather(elector(fresh, "x").try_acquire_or_renew(),
                                   elector(fresh, "y").try_acquire_or_renew())
    assert sorted(results) == [False, True]
    assert fresh.conflicts == 1


@pytest.mark.looptime
async def test_release_frees_the_lease_for_a_successor_at_once() -> None:
    api = FakeLeases()
    a, b = elector(api, "a"), elector(api, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert await a.release()
    assert api.spec["holderIdentity"] == "" and not a.is_leader
    assert await b.try_acquire_or_renew()  # no waiting: the Lease is free
    assert not await a.release()  # not ours any more: nothing written
    assert api.spec["holderIdentity"] == "b"


def run(api: FakeLeases, identity: str, log: list[tuple[float, str]]) -> leadership.Leadership:
    async def elected() -> None:
        log.append((now(), f"{identity} elected"))

    async def deposed() -> None:
        log.append((now(), f"{identity} deposed"))

    return leadership.Leadership(elector(api, identity), renew_deadline=10, retry_period=2,
                                 on_elected=elected, on_deposed=deposed, clock=now)


@pytest.mark.looptime
async def test_a_leader_that_cannot_renew_stops_within_its_renew_deadline_before_the_lease_expires() -> None:
    api, log = FakeLeases(), []
    leader = run(api, "a", log)
    task = asyncio.create_task(leader.run())
    try:
        await asyncio.sleep(5)  # looptime: fake time
        assert leader.active.is_set() and log == [(0, "a elected")]
        api.refuse_writes = True
        last_renewal = 4.0  # every 2 s; the one at 4 s was the last to land
        while leader.active.is_set():
            await asyncio.sleep(0.5)  # looptime: fake time
        deposed_at = log[-1][0]
        assert log[-1][1] == "a deposed"
        assert deposed_at - last_renewal <= 10  # the renew deadline
        assert deposed_at < last_renewal + 15  # before any other replica may take the Lease
        assert not leader.connected
    finally:
        task.cancel()


@pytest.mark.looptime
async def test_a_leader_that_sees_another_holder_stops_at_its_next_renewal() -> None:
    api, log = FakeLeases(), []
    leader = run(api, "a", log)
    task = asyncio.create_task(leader.run())
    try:
        await asyncio.sleep(5)  # looptime: fake time
        api.overwrite(holderIdentity="intruder")
        while leader.active.is_set():
            await asyncio.sleep(0.1)  # looptime: fake time
        assert log == [(0, "a elected"), (6, "a deposed")]
        # The intruder never renews: 15 s after "a" saw the change, it takes the Lease back.
        while not leader.active.is_set():
            await asyncio.sleep(0.1)  # looptime: fake time
        assert log[-1] == (22, "a elected") and api.spec["leaseTransitions"] == 1
    finally:
        task.cancel()


@pytest.mark.looptime
async def test_a_failed_takeover_releases_the_lease_and_tries_again() -> None:
    api, attempts = FakeLeases(), []

    async def elected() -> None:
        attempts.append(now())
        if len(attempts) == 1:
            raise RuntimeError("the rebuild failed")

    async def deposed() -> None: ...

    leader = leadership.Leadership(elector(api, "a"), renew_deadline=10, retry_period=2,
                                   on_elected=elected, on_deposed=deposed, clock=now)
    task = asyncio.create_task(leader.run())
    try:
        await asyncio.sleep(3)  # looptime: fake time
        assert attempts == [0, 2] and leader.active.is_set()
    finally:
        task.cancel()


@pytest.mark.parametrize(("retry", "renew", "lease"), [(2, 10, 10), (2, 15, 10), (0, 1, 2), (3, 2, 15)])
def test_election_timings_that_could_overlap_two_leaders_are_refused(retry: float, renew: float, lease: float) -> None:
    from deviceshare.errors import ConfigError
    from deviceshare.operator.config import OperatorConfig

    with pytest.raises(ConfigError, match="renew-deadline"):
        OperatorConfig.from_env({}, retry_period=retry, renew_deadline=renew, lease_duration=lease)
