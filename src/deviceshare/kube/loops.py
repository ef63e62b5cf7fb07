"""Which event loop our long-running processes use: uvloop's where installed (less overhead per
request and per socket event; ``docs/benchmarks.md`` measures it), else asyncio's default."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or ``None`` (asyncio's default loop) where uvloop is not installed."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
