"""Which replica may schedule: leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Two active schedulers could hand one device to two groups, so exactly one replica may decide. The
rules are those of client-go's ``leaderelection`` (kube-scheduler, controller-runtime):

- A replica acquires the Lease only when it is free (no holder) or expired, and "expired" is judged by
  our own clock since we last saw the record change, never by comparing our clock with the holder's
  ``renewTime``: clocks of two machines need not agree.
- Every write carries the ``resourceVersion`` we read: of two replicas racing for a free Lease, the
  API accepts one and answers 409 to the other, which stays a candidate.
- The leader renews every retry period. One that has not renewed for ``renew_deadline`` (shorter than
  the lease duration) stops scheduling before any other replica can consider the Lease expired; one that
  sees another holder stops at once.
- A graceful stop releases the Lease (empty holder), so a successor takes over at once instead of
  waiting out the lease duration.

When elected, the runtime rebuilds its ledger from the API before it decides anything (it saw no
events while standing by); see ``Runtime._elected``. Renewals go on meanwhile, as client-go's do.

**Fencing.** :meth:`Leadership.remaining` is the fence every write of the operator passes
(``storage.Fence``): a replica that does not hold the Lease sends nothing, and a leader's write carries a
server-side deadline no later than its renew deadline counted from its last renewal. Another replica can
take the Lease only once it has seen no change for the lease duration, which is longer: by then every write
the old leader sent has landed or been given up by the server. (client-go has no such fence; its callers
rely on the lease timings alone.)
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from .storage import Conflict, Gone, Uncertain

logger = logging.getLogger(__name__)


class LeaseApi(Protocol):
    """The Lease calls the elector makes (``storage.ClusterApi`` implements them)."""

    async def get_lease(self, own_namespace: str, name: str) -> dict[str, Any]: ...
    async def create_lease(self, own_namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def replace_lease(self, own_namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def _micro_time(now: datetime.datetime) -> str:
    """metav1.MicroTime, the format of a Lease's acquireTime/renewTime."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaseElector:
    """One replica's view of the Lease: try to acquire or renew it, and release it.

    ``clock`` is monotonic seconds (expiry is measured on it); ``wall`` only stamps the record for
    humans and other tools reading it.
    """

    def __init__(
        self,
        api: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _wall_now,
    ) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_duration = lease_duration
        self._clock, self._wall = clock, wall
        self._observed: dict[str, Any] | None = None  # the spec we last saw (or wrote)
        self._observed_at = 0.0  # our clock when it (or its resourceVersion) last changed
        self._resource_version: str | None = None
        self.holder: str | None = None  # who holds it, as far as we know

    @property
    def is_leader(self) -> bool:
        return self.holder == self.identity

    def _observe(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        spec = dict(obj.get("spec") or {})
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        # Every write changes the resourceVersion, even one that leaves the record as it was (two
        # renewals within a clock tick), so it restarts the count too.
        if spec != self._observed or version != self._resource_version:
            self._observed, self._observed_at = spec, self._clock()
        self._resource_version = version
        self.holder = str(spec.get("holderIdentity") or "") or None
        return spec

    def _expired(self, spec: Mapping[str, Any]) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return self._observed_at + duration <= self._clock()

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``: True when we hold the Lease afterwards.

        A 409 (someone wrote first) is a lost race: False. Other API errors propagate.
        """
        now = _micro_time(self._wall())
        duration = max(1, round(self.lease_duration))
        try:
            obj = await self.api.get_lease(self.namespace, self.name)
        except Gone:
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
            }
            try:
                self._observe(await self.api.create_lease(self.namespace, body))
            except Conflict:  # another replica created it first
                return False
            return True
        spec = self._observe(obj)
        mine = self.holder == self.identity
        if self.holder is not None and not mine and not self._expired(spec):
            return False
        new = dict(spec, holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
        if not mine:
            new["acquireTime"] = now
            new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1  # client-go counts every taking
        return await self._write(obj, new) and self.is_leader

    async def release(self) -> bool:
        """Give the Lease up if we hold it (empty holder), so a successor need not wait for expiry."""
        if not self.is_leader or self._observed is None:
            return False
        now = _micro_time(self._wall())
        new = dict(self._observed, holderIdentity="", leaseDurationSeconds=1, renewTime=now)
        new.pop("acquireTime", None)
        return await self._write({"metadata": {"resourceVersion": self._resource_version}}, new)

    async def _write(self, obj: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
        meta = {"name": self.name, "namespace": self.namespace,
                "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": dict(spec)}
        try:
            self._observe(await self.api.replace_lease(self.namespace, self.name, body))
        except (Conflict, Gone):  # changed (or deleted) since we read it: lost this round
            self._observed = None  # re-read next time; a changed record restarts the expiry count
            return False
        except Uncertain:  # sent, the answer lost (a dead connection): read back whether it was applied
            return await self._read_back(spec)
        return True

    async def _read_back(self, spec: Mapping[str, Any]) -> bool:
        """Whether the write of ``spec`` whose answer was lost landed: the Lease shows it (our holder and our
        renewTime, which no other write carries). Read on a new connection (the lost one is closed, and those
        idle beside it too: http1.py)."""
        obj = await self.api.get_lease(self.namespace, self.name)
        seen = obj.get("spec") or {}
        landed = (seen.get("holderIdentity") == spec.get("holderIdentity")
                  and seen.get("renewTime") == spec.get("renewTime"))
        self._observe(obj)
        logger.info("the lease write's answer was lost; read back: %s", "landed" if landed else "not landed")
        return landed


class Leadership:
    """Runs the election, and is the fence every write of this replica passes (:meth:`remaining`).

    As client-go does it: renewals run from the moment of acquisition, concurrently with the take-over
    (``on_elected``: the settle and the rebuild, which may take longer than the lease duration); the renew
    deadline counts from the last successful renewal; a renewal round that sees another holder deposes at once.
    ``active`` is set once the take-over is done (scheduling runs) and cleared when leadership ends.
    """

    def __init__(
        self,
        elector: LeaseElector,
        *,
        renew_deadline: float,
        retry_period: float,
        on_elected: Callable[[], Coroutine[Any, Any, None]],
        on_deposed: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.elector = elector
        self.identity = elector.identity
        self.renew_deadline, self.retry_period = renew_deadline, retry_period
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self._clock = clock
        self.active = asyncio.Event()
        self.connected = False  # the last call to the API succeeded (for /readyz)
        self.terms = 0  # leadership terms begun (acquisitions)
        self._holding = False
        self._renewed_at = 0.0  # our clock just before the request of the last successful acquire or renew

    def remaining(self) -> float | None:
        """The fence (``storage.Fence``): how long a write sent now may take to land and still be ours to
        send. Counted from the last renewal, so it closes on time even if the renewal loop is stuck."""
        if not self._holding:
            return None
        left = self._renewed_at + self.renew_deadline - self._clock()
        return left if left > 0 else None

    async def _attempt(self, within: float) -> bool:
        try:
            ok = await asyncio.wait_for(self.elector.try_acquire_or_renew(), timeout=max(within, 0.001))
        except Exception as e:  # cannot tell: not the leader this round
            logger.warning("cannot acquire or renew the lease %s/%s: %s", self.elector.namespace,
                           self.elector.name, e or type(e).__name__)
            self.connected = False
            return False
        self.connected = True
        return ok

    async def run(self) -> None:
        try:
            while True:
                await self._acquire()
                await self._lead()
        finally:  # cancelled (a stop): nothing this replica sends from here on counts as the leader's
            self._holding = False
            self.active.clear()

    async def _lead(self) -> None:
        """One term: renew from the start, take over meanwhile; end it when the Lease is lost (or the take-over
        failed, releasing the Lease)."""
        loop = asyncio.get_running_loop()
        renewing = loop.create_task(self._renew(), name="lease renewal")
        taking_over = loop.create_task(self._on_elected(), name="take-over")
        try:
            await asyncio.wait({renewing, taking_over}, return_when=asyncio.FIRST_COMPLETED)
            if taking_over.done() and not taking_over.cancelled() and taking_over.exception() is not None:
                logger.error("could not take over; releasing the lease and trying again",
                             exc_info=taking_over.exception())
                self._holding = False
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)
                await self._release_quietly()
                await asyncio.sleep(self.retry_period)
                return
            if not renewing.done():
                self.active.set()
                await renewing
        finally:
            self._holding = False  # the fence closes before anything else happens
            self.active.clear()
            for task in (renewing, taking_over):
                task.cancel()
            await asyncio.gather(renewing, taking_over, return_exceptions=True)
        logger.warning("%s lost the lease: scheduling stopped", self.identity)
        await self._on_deposed()

    async def _acquire(self) -> None:
        while True:
            started = self._clock()
            if await self._attempt(self.retry_period):
                self._renewed_at, self._holding = started, True
                self.terms += 1
                break
            await asyncio.sleep(self.retry_period)
        logger.info("%s acquired the lease %s/%s: rebuilding the ledger before scheduling",
                    self.identity, self.elector.namespace, self.elector.name)

    async def _renew(self) -> None:
        """Return when leadership is lost: another holder seen, or no renewal for ``renew_deadline``."""
        while True:
            await asyncio.sleep(self.retry_period)
            started = self._clock()
            if await self._attempt(self._renewed_at + self.renew_deadline - started):
                self._renewed_at = started  # measured before the request: the lease runs at least from here
            elif self.elector.holder not in (None, self.identity):
                return  # someone else holds it now
            if self._clock() - self._renewed_at >= self.renew_deadline:
                return

    async def release(self, *, after: Callable[[], Awaitable[None]] | None = None) -> None:
        """On a graceful stop, after scheduling has stopped: hand the Lease over at once. ``after`` is awaited
        between closing the fence and releasing (writes already sent must have settled first)."""
        self._holding = False
        self.active.clear()
        if after is not None:
            await after()
        await self._release_quietly()

    async def _release_quietly(self) -> None:
        try:
            if await asyncio.wait_for(self.elector.release(), timeout=self.retry_period * 2):
                logger.info("%s released the lease", self.identity)
        except Exception as e:  # the lease then expires on its own
            logger.warning("could not release the lease: %s", e or type(e).__name__)
