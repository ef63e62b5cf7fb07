"""API faults under load: 409, 429 with Retry-After, 500, slow responses, dropped, stalled and expired watches,
and writes that land but whose answer lies (504 Timeout or a dropped connection after a binding, a group status,
a finalizer or an event landed).

Each fault is injected while member pods arrive; the operator must keep running, bind every pod (none lost)
within a bound well under Kopf's watch timeouts, and never show a device in two groups. Each scenario also
proves its fault fired as often as it was set to (a fault that never fires tests nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "faults"
GROUP_STATUS = rf"/namespaces/{NS}/{names.PLURAL}/[^/]+/status$"
BINDING = rf"/namespaces/{NS}/pods/[^/]+/binding$"
PODS_WATCH = r"^/api/v1/pods$"


Proof = Callable[[], bool]  # did the fault fire (and do what it was for)?


def fired(*faults: Any) -> Proof:
    return lambda: all(f.fired == f.times for f in faults)


async def conflicts(cluster: Any) -> Proof:
    return fired(cluster.inject_fault("PATCH", GROUP_STATUS, status=409, times=3))


async def throttled(cluster: Any) -> Proof:
    return fired(cluster.inject_fault("POST", BINDING, status=429, retry_after=1, times=2))


async def server_errors(cluster: Any) -> Proof:
    return fired(
        cluster.inject_fault("POST", BINDING, status=500, times=2),
        cluster.inject_fault("PATCH", GROUP_STATUS, status=500, times=2),
    )


async def slow_responses(cluster: Any) -> Proof:
    fault = cluster.inject_fault(None, rf"/namespaces/{NS}/", delay=0.3, times=None)
    return lambda: fault.fired >= 15  # the finalizer, status and binding writes of the placements at least


def lie(target: str, **answer: Any) -> Callable[[Any], Awaitable[Proof]]:
    """The write lands, then its answer is lost (``status=504``) or its connection dropped (``drop=True``)."""
    method, path = LIED_ABOUT[target]

    async def inject(cluster: Any) -> Proof:
        return fired(cluster.inject_fault(method, path, applied=True, times=2, **answer))

    return inject


async def dropped_watches(cluster: Any) -> Proof:
    closed = []
    for _ in range(3):
        closed.append(cluster.drop_watches())
        await asyncio.sleep(0.1)  # deliberate: the watches reopen between drops (the proof counts them)
    # Every drop closed the operator's watches (nodes, groups, pods, quotas): each time they had come back.
    return lambda: all(n >= 4 for n in closed)


async def stalled_watch(cluster: Any) -> Proof:
    # The re-established pod watch hangs for 3 s before it answers.
    fault = cluster.inject_fault("GET", PODS_WATCH, delay=3.0, times=1)
    closed = cluster.drop_watches()
    return lambda: closed > 0 and fault.fired == 1


async def failing_rewatch(cluster: Any) -> Proof:
    fault = cluster.inject_fault("GET", PODS_WATCH, status=500, times=3)
    closed = cluster.drop_watches()
    return lambda: closed > 0 and fault.fired == 3


async def gone_410(cluster: Any) -> Proof:
    # Resuming from the last resourceVersion now gets 410 Gone: the watcher must list again.
    before = cluster.api.watches_gone
    cluster.compact()
    closed = cluster.drop_watches()
    return lambda: closed > 0 and cluster.api.watches_gone > before


LIED_ABOUT = {
    "binding": ("POST", BINDING),
    "status": ("PATCH", GROUP_STATUS),
    "finalizers": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/[^/]+$"),
    "events": ("POST", rf"/namespaces/{NS}/events$"),
}

FAULTS: dict[str, Callable[[Any], Awaitable[Proof]]] = {
    "409-conflict": conflicts,
    "429-retry-after": throttled,
    "500-internal": server_errors,
    "slow-responses": slow_responses,
    "dropped-watches": dropped_watches,
    "stalled-watch": stalled_watch,
    "500-on-rewatch": failing_rewatch,
    "410-gone": gone_410,
    **{f"504-after-{target}-landed": lie(target, status=504) for target in LIED_ABOUT},
    **{f"dropped-after-{target}-landed": lie(target, drop=True) for target in LIED_ABOUT},
}


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 4}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_the_operator_recovers_from_api_faults_and_loses_no_pod(
    cluster: Any, watchdog: Watchdog, fault: str
) -> None:
    workload.ensure_namespace(cluster, NS)
    running = await launch(operator_config(cluster))
    try:
        cluster.create(workload.group_body(NS, "warm"))
        cluster.create(workload.pod_body(NS, "warm-0", "warm"))
        await workload.until(lambda: workload.bound_pods(cluster, NS), "the operator warmed up")

        proof = await FAULTS[fault](cluster)
        for g in range(3):
            cluster.create(workload.group_body(NS, f"g{g}", {workload.GPU: 2}))
            for p in range(2):
                cluster.create(workload.pod_body(NS, f"g{g}-{p}", f"g{g}"))
        # All 7 pods bound well within Kopf's watch timeouts (300 s server, 330 s client).
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 7, "every pod bound", 20)
        await workload.until(proof, f"the fault {fault} fired, every time it was set to")
        assert running.alive, "the operator exited"
        for g in range(3):
            pods = [cluster.get("pods", f"g{g}-{p}", NS) for p in range(2)]
            assert pods[0]["spec"]["nodeName"] == pods[1]["spec"]["nodeName"]
            assert (pods[0]["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION]
                    == pods[1]["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION])
    finally:
        cluster.clear_faults()
        await kill(running)
