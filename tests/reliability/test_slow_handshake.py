"""The fence's time left travels with a write as the server's ``timeout``, taken when the request is sent: after
TCP and TLS. A TLS handshake that takes longer than the fence has left (an overloaded apiserver, a load balancer in
a handshake storm) used to send the write late, still carrying the time left before connecting: it reached the
server after this replica's leadership could have ended, and was applied.

The sandbox serves HTTPS through its front (``sandbox/front.py``), which answers each ClientHello only after
``handshake_delay``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.kube import connecting
from deviceshare.operator import storage
from deviceshare.sandbox import Sandbox
from tests.reliability import workload
from tests.sandbox.tls import make_ca_and_server

NS = "slow"
KEY = (NS, "g")


class ClosingFence:
    """A leader's fence with ``left`` seconds to its renew deadline (e.g. 9 s of a 10 s deadline gone)."""

    def __init__(self, left: float) -> None:
        self.closes = time.monotonic() + left

    def remaining(self) -> float | None:
        left = self.closes - time.monotonic()
        return left if left > 0 else None


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Sandbox]:
    ca_pem, context = make_ca_and_server(tmp_path / "tls", [])
    async with Sandbox(nodes=1, gpus=2, tls=(ca_pem, context), kubeconfig_path=tmp_path / "kubeconfig") as sandbox:
        workload.ensure_namespace(sandbox, NS)
        sandbox.create(workload.group_body(NS, "g", {workload.GPU: 1}))
        yield sandbox


def status_writes(box: Sandbox) -> list[Any]:
    return [r for r in box.api if str(r.method.value) == "PATCH" and r.url.path.endswith("/status")]


async def claim(api: storage.ClusterApi, box: Sandbox) -> Any:
    group = box.get(names.PLURAL, "g", NS)
    assert group is not None
    return await api.patch_group_status(KEY, {"phase": "Pending"}, uid=group["metadata"]["uid"],
                                        resource_version=group["metadata"]["resourceVersion"])


async def test_with_a_handshake_slower_than_the_fence_has_left_the_write_is_not_sent(box: Sandbox) -> None:
    assert box.front is not None
    box.front.handshake_delay = 1.5
    api = storage.ClusterApi(await connecting.api_client(str(box.kubeconfig)))
    try:
        api.fence = ClosingFence(1.0)  # open when the write starts, closed by the time TLS is done
        with pytest.raises(storage.Fenced):
            await claim(api, box)
        assert box.front.slow_handshakes == 1, "no handshake was slowed: the fault did not fire"
        assert status_writes(box) == [], "a write reached the server after the fence closed"
    finally:
        await api.close()


async def test_a_write_carries_the_time_left_when_it_is_sent_not_before_connecting(box: Sandbox) -> None:
    assert box.front is not None
    box.front.handshake_delay = 0.5
    api = storage.ClusterApi(await connecting.api_client(str(box.kubeconfig)))
    try:
        api.fence = ClosingFence(5.0)
        await claim(api, box)
        assert box.front.slow_handshakes == 1
        [sent] = status_writes(box)
        carried = int(sent.params["timeout"].removesuffix("ms"))
        assert carried <= 4500, f"the write carried {carried} ms: the time left before the handshake"
    finally:
        await api.close()


async def test_a_burst_of_requests_on_no_connection_makes_a_few_at_a_time(
    box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An apiserver that restarts meets every client's new connections at once (a handshake storm): http1 makes
    at most ``MAX_CONNECTING`` at a time, the other requests wait for one of them (or for their own timeout)."""
    from deviceshare.kube import http1, rest

    assert box.front is not None
    box.front.handshake_delay = 0.2
    monkeypatch.setattr(http1, "MAX_CONNECTING", 3)
    api = await connecting.api_client(str(box.kubeconfig))
    conns = http1.Connections.for_client(api)
    assert conns is not None
    try:
        path = f"/apis/{names.API_VERSION}/namespaces/{NS}/{names.PLURAL}/g"
        answers = await asyncio.gather(*(rest.call(api, "GET", path, timeout=30, connections=conns)
                                         for _ in range(12)))
        assert all(a["metadata"]["name"] == "g" for a in answers)
        assert box.front.slow_handshakes >= 3, "no handshake was slowed: the fault did not fire"
        assert box.front.most_handshaking <= 3, f"{box.front.most_handshaking} handshakes at once"
    finally:
        await conns.close()
        await api.close()
