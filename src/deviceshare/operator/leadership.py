"""Which replica may schedule: Kopf peering, read the way Kopf reads it, as a gate for our own workers.

Kopf pauses its watch streams when a peer of higher or equal priority is alive, but our scheduling
workers run on their own queue and must stop too — two active schedulers could hand one device to two
groups. So the runtime asks this gate before every decision. With equal priorities every replica
stands down (Kopf's rule too): failing safe beats double allocation. When a replica becomes active it
rebuilds the ledger from the API before it decides anything, since it saw no events while standing by.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

logger = logging.getLogger("deviceshare.operator.leadership")

DEFAULT_LIFETIME = 60


def is_leader(
    peering_status: Mapping[str, Any], identity: str, priority: int, *, now: datetime.datetime | None = None
) -> bool:
    """Kopf's rule: we are active when our own record is alive and no other live peer has a priority >= ours."""
    now = now or datetime.datetime.now(datetime.UTC)
    own_alive = False
    for peer_id, info in peering_status.items():
        if not isinstance(info, Mapping):
            continue
        alive = _alive(info, now)
        if peer_id == identity:
            own_alive = alive
        elif alive and int(info.get("priority", 0)) >= priority:
            return False
    return own_alive


def _alive(info: Mapping[str, Any], now: datetime.datetime) -> bool:
    lastseen = info.get("lastseen")
    if not lastseen:
        return True
    try:
        seen = datetime.datetime.fromisoformat(str(lastseen).replace("Z", "+00:00"))
    except ValueError:
        return True  # unreadable: assume alive, i.e. stand down
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.UTC)
    lifetime = datetime.timedelta(seconds=int(info.get("lifetime", DEFAULT_LIFETIME)))
    return seen + lifetime > now


class Leadership:
    """Polls the peering object and flips an asyncio.Event the workers wait on."""

    def __init__(
        self,
        *,
        identity: str,
        priority: int,
        read_peering: Callable[[], Awaitable[Mapping[str, Any] | None]],
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        interval: float = 1.0,
    ) -> None:
        self.identity = identity
        self.priority = priority
        self._read = read_peering
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._interval = interval
        self.active = asyncio.Event()
        self.connected = False  # the last read of the peering object succeeded (for /readyz)

    async def run(self) -> None:
        while True:
            try:
                status = await self._read()
                leader = status is not None and is_leader(status, self.identity, self.priority)
                self.connected = True
            except Exception as e:  # cannot tell: stand down until we can
                logger.warning("cannot read the peering object: %s; standing by", e)
                leader = self.connected = False
            if leader and not self.active.is_set():
                logger.info("%s is now the active replica: rebuilding the ledger before scheduling", self.identity)
                try:
                    await self._on_elected()
                except Exception:
                    logger.exception("could not take over; standing by and trying again")
                else:
                    self.active.set()
            elif not leader and self.active.is_set():
                logger.warning("%s is no longer the active replica: scheduling paused", self.identity)
                self.active.clear()
                await self._on_deposed()
            await asyncio.sleep(self._interval)
