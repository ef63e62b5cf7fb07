"""Waiting for what a test needs, never for "long enough" (issue 21).

A test waits for an event: a condition on API state, a counter, a watch event. When the state can only
be read (no event to await), :func:`until` polls it. Its timeout is a hang guard, not a performance
limit: generous enough that a machine shared with a CPU hog, or pinned to one core, never trips it, so
a test that fails here has hung, not merely run slowly. Performance limits live in ``make bench``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

HANG_GUARD = 60.0  # seconds; pytest-timeout (pyproject.toml) ends a whole test at 180 s
POLL = 0.02  # seconds between two reads of the state: the pause of a poll, not a guess at a duration


async def until(
    probe: Callable[[], Any], what: str, *, timeout: float = HANG_GUARD, interval: float = POLL
) -> Any:
    """Poll ``probe`` (sync or async) until it returns something truthy, and return that; fail naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)  # the poll's pause (see POLL)
