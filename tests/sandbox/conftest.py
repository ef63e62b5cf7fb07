"""Fixtures of the sandbox tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import Http


@pytest.fixture
async def http(sandbox: Sandbox) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, sandbox.url)
