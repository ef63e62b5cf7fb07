"""SharedDeviceGroup events from Kopf into the intake, gated by the leadership term.

Kopf watches the groups (``handlers.py``, one ``on.event`` handler) for the whole life of the process, leader or
not; our own reflectors watch nodes and pods only for a term (``intake.Intake.watch``). The gate makes Kopf's
stream behave as those term-bound watches do:

- **off** (no term: a standby, a deposed leader, a replica stopping): an event changes nothing. A non-leader
  acts on nothing; the next term's rebuild lists the groups anew.
- **held** (from the start of a term's rebuild until its state is adopted): events are kept in arrival order,
  not applied, since the state they would change is about to be replaced.
- **open** (the term schedules): events go to ``Intake.on_group``. Opening first replays the held events, then
  passes on only what is newer than the rebuild's list of groups (``since``), for the whole term: anything at or
  before it is in the list already (Kopf's per-object workers deliver in order per object, not across objects),
  so the term sees what a watch resumed from the list's resourceVersion would have shown.

Kopf lists at start and again after its watch expired (410 Gone) or failed; listed objects come with no event
type, and a deletion between its last watch and that list is never delivered. So a listed object, while the gate
is open, wakes the intake's audit of groups (:meth:`GroupFeed.relisted`): it reads the groups we hold that a
fresh list lacks, one by one, and forgets those the API no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

Apply = Callable[[str | None, Mapping[str, Any]], None]


class GroupFeed:
    """``event`` is what Kopf's handler calls; ``hold`` / ``open`` / ``close`` are the term's (``runtime.py``)."""

    def __init__(self, apply: Apply) -> None:
        self._apply = apply
        self._held: list[tuple[str | None, Mapping[str, Any]]] | None = None
        self._open = False
        self._since: int | None = None
        self.delivered = 0  # events applied (the tests' evidence that groups come this way)
        self._listed = asyncio.Event()  # Kopf (re)listed while the gate was open

    @property
    def state(self) -> str:
        return "open" if self._open else "held" if self._held is not None else "off"

    @property
    def holding(self) -> int:
        """How many events are held (during a rebuild)."""
        return len(self._held or ())

    def event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if self._open:
            self._deliver(event_type, body)
        elif self._held is not None:
            self._held.append((event_type, body))

    def hold(self) -> None:
        """A rebuild begins: keep what comes until :meth:`open`."""
        self._open, self._held = False, []

    def open(self, since: str | None) -> None:
        """The rebuild's state is adopted (its groups listed at ``since``): replay what was held, then go live."""
        held, self._held = self._held or [], None
        self._since = _version(since)
        self._open = True
        for event_type, body in held:
            self._deliver(event_type, body)
        if held:
            logger.debug("%d group events during the rebuild replayed", len(held))

    async def relisted(self, within: float, settle: float = 1.0) -> bool:
        """Wait up to ``within`` seconds for Kopf to list the groups again, then ``settle`` for the rest of its
        list; True if it did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listed.wait(), within)
        if not self._listed.is_set():
            return False
        await asyncio.sleep(settle)
        self._listed.clear()
        return True

    def close(self) -> None:
        """The term ends: nothing more is applied or kept."""
        self._open, self._held, self._since = False, None, None
        self._listed.clear()

    def _deliver(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type is None:  # from a list of Kopf's
            self._listed.set()
        if self._since is not None:
            version = _version((body.get("metadata") or {}).get("resourceVersion"))
            if version is not None and version <= self._since:
                return  # in the rebuild's list already (or older than it)
        self.delivered += 1
        self._apply(event_type, body)


def _version(text: object) -> int | None:
    """A resourceVersion as a number where it is one (etcd's and the sandbox's are); None: not comparable."""
    try:
        return int(str(text))
    except ValueError:
        return None
