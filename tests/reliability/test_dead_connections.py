"""Every connection the operator holds goes silently dead (a control-plane node gone, a load balancer's flow lost:
no FIN, no RST), and the leader neither loses its Lease nor stops scheduling.

The sandbox's front (``sandbox/front.py``) keeps each connection open and forwards nothing, either way. The
operator's Lease renewal, its writes and its watches each find out by their own timeouts (timings scaled down
here: a 6 s renew deadline, 1.5 s of watch silence) and go on over new connections, from where they were.
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "dead"
LEASE = "deviceshare-operator"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 4, "front": True}


def bound(cluster: Any) -> set[str]:
    return {p["metadata"]["name"] for p in workload.bound_pods(cluster, NS)}


def lease_spec(cluster: Any) -> dict[str, Any]:
    return dict((cluster.get("leases", LEASE, names.DEFAULT_NAMESPACE) or {}).get("spec") or {})


async def test_with_every_connection_silently_dead_the_leader_keeps_its_lease_and_binds_a_new_pod(
    cluster: Any, watchdog: Watchdog
) -> None:
    workload.ensure_namespace(cluster, NS)
    workload.ensure_namespace(cluster, names.DEFAULT_NAMESPACE)
    leader = await launch(operator_config(
        cluster, lease_name=LEASE, identity="replica-a", lease_duration=9.0, renew_deadline=6.0, retry_period=0.5,
        watch_idle_timeout=1.5,
    ))
    try:
        await workload.until(lambda: leader.runtime is not None and leader.runtime.scheduling, "the leader schedules")
        cluster.create(workload.group_body(NS, "before", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "before-0", "before"))
        await workload.until(lambda: bound(cluster) == {"before-0"}, "the first pod bound")
        api = leader.runtime.ctx.api
        lease_pool, write_pool = api._lease_connections, api._connections

        holed = cluster.front.black_hole()
        assert holed >= 3, f"only {holed} connections to black-hole: the Lease's, the writes' and the watches'"
        cluster.create(workload.group_body(NS, "after", {workload.GPU: 1}))
        cluster.create(workload.pod_body(NS, "after-0", "after"))
        await workload.until(lambda: "after-0" in bound(cluster), "the new pod bound", timeout=60)

        assert cluster.front.swallowed > 0, "nothing was sent into the black hole: the fault did not fire"
        assert lease_pool.silent >= 1, "no Lease request met a dead connection: the fault missed the renewals"
        assert leader.runtime.leadership.terms == 1, "the leader lost its Lease and was elected again"
        spec = lease_spec(cluster)
        assert spec.get("holderIdentity") == "replica-a" and spec.get("leaseTransitions", 0) == 0
        assert leader.runtime.scheduling
        assert write_pool is not None and write_pool.opened >= 2, "the writes went on over a new connection"
    finally:
        await kill(leader)
