"""``schedulingStrategy: fgd`` end to end on the sandbox: groups are placed, bound, and packed so
that whole-GPU groups still find whole GPUs (observed only through the API)."""

from __future__ import annotations

import pytest

from deviceshare.sandbox import Sandbox
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube, selected
from tests.reliability import invariants

GPU = "nvidia.com/gpu"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 3, "gpus": 2}


async def _group(kube: Kube, name: str, count: int = 1, compute: str | None = None,
                 strategy: str = "fgd") -> tuple[str, list[str]]:
    share = {"share": {GPU: {"compute": compute}}} if compute else {}
    await kube.create_group("mix", name, {GPU: count}, schedulingStrategy=strategy, **share)
    await kube.create_pod("mix", name, name)
    pod = await kube.wait_bound("mix", name)
    return pod["spec"]["nodeName"], selected(pod)[GPU]


async def test_fgd_groups_are_bound_and_a_share_closes_a_half_used_gpu(cluster: Sandbox, kube: Kube) -> None:
    running = await start_operator(operator_config(cluster))
    try:
        half_node, half_gpus = await _group(kube, "half-a", compute="500m", strategy="binpack")
        await _group(kube, "w1")
        # A 0.5 share on a fresh GPU would leave a hole no whole-GPU group can use: fgd fills the half-used one.
        assert await _group(kube, "half-b", compute="500m") == (half_node, half_gpus)
        # ... so a two-GPU group still finds a node with two whole GPUs.
        _node, gpus = await _group(kube, "w2", count=2)
        assert len(gpus) == 2
        group = await kube.wait_group("mix", "w2", lambda g: g.get("status", {}).get("phase") == "Bound", "bound")
        assert group["status"]["allocatedDevices"] == {GPU: gpus}
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        await running.stop()

    # A restarted operator seeds its workload from the groups there and keeps placing fgd groups.
    second = await start_operator(operator_config(cluster))
    try:
        await kube.create_group("mix", "half-c", {GPU: 1}, schedulingStrategy="fgd", share={GPU: {"compute": "250m"}})
        await kube.create_pod("mix", "half-c", "half-c")
        await kube.wait_bound("mix", "half-c")
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))
    finally:
        await second.stop()
