"""Every device handed out exactly once when the whole cluster's demand is there before the operator starts.

After the Kubernetes DRA integration test "uses all devices": N nodes x 100 devices, one single-device
group (and one pod) per device, all created first; then the operator starts and must bind every pod
with no device ID in two groups.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import kill, launch

DEVICES = 100
# The bounded form (make test) uses one node; the soak form four.
SIZES = [pytest.param(1, id="1x100"), pytest.param(4, id="4x100", marks=pytest.mark.slow)]


@pytest.fixture
def sandbox_options(request: pytest.FixtureRequest) -> dict[str, object]:
    return {"nodes": request.param, "gpus": DEVICES}


@pytest.mark.parametrize("sandbox_options", SIZES, indirect=True)
async def test_every_device_is_used_once_when_demand_equals_capacity(
    cluster: Any, sandbox_options: dict[str, Any]
) -> None:
    workload.ensure_namespace(cluster, "dra")
    nodes = int(sandbox_options["nodes"])
    total = nodes * DEVICES
    for i in range(total):
        cluster.create(workload.group_body("dra", f"claim-{i}"))
        cluster.create(workload.pod_body("dra", f"pod-{i}", f"claim-{i}"))

    running = await launch(operator_config(cluster))
    try:
        await workload.until(lambda: len(workload.bound_pods(cluster, "dra")) == total, f"{total} pods bound", 120)
        # One more group cannot fit anywhere: it must stay pending, not squeeze onto a held device.
        cluster.create(workload.group_body("dra", "overflow"))
        cluster.create(workload.pod_body("dra", "overflow", "overflow"))
        await workload.until(
            lambda: any(
                c.get("reason") == "Unschedulable"
                for c in (cluster.get("pods", "overflow", "dra") or {}).get("status", {}).get("conditions") or []
            ),
            "the overflow pod refused",
        )
        snap = invariants.from_sandbox(cluster)
        invariants.assert_no_double_allocation(snap)
        assert invariants.half_bound(snap) == []
        held = list(invariants.held_devices(snap))
        assert len(held) == total
        assert {(n, d) for n, _, d in held} == {
            (f"gpu-node-{n}", str(d)) for n in range(nodes) for d in range(DEVICES)
        }
    finally:
        await kill(running)
