"""Every async test here runs on asyncio's own loop and on uvloop (what the operator runs on where it is
installed): their transports differ (uvloop's are no ``asyncio.Transport`` subclasses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import uvloop


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
