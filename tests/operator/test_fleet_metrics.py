"""The on-call metrics, scraped from a real operator's /metrics over HTTP on the sandbox.

Bound and unschedulable groups give the leader, phase, reason, time-to-bound, fragmentation and rebuild
figures a user would read; the labels seen on the scrape are bounded (never a pod, group or uid); a
standby replica exports ``deviceshare_leader 0`` and nothing stale.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deviceshare.api import names
from deviceshare.core import fleetfragmentation
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator, operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"
NS = "ml"
# The label names CONTRACT §11 allows (plus the histogram's own `le`).
BOUNDED_LABELS = {"node", "resource", "reason", "phase", "result", "verb", "kind", "path", "le"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(operator: RunningOperator) -> tuple[str, Samples]:
    port = operator.memo.metrics_server.port
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
async def metered(cluster: Sandbox) -> AsyncIterator[RunningOperator]:
    running = await start_operator(operator_config(cluster, metrics_host="127.0.0.1", metrics_port=0))
    yield running
    await running.stop()


async def test_leader_phases_reasons_time_to_bound_and_fragmentation(metered: RunningOperator, kube: Kube) -> None:
    await kube.create_group(NS, "whole", {GPU: 1})
    await kube.create_group(NS, "half", {GPU: 1}, share={GPU: {"compute": "500m"}})
    await kube.create_group(NS, "huge", {GPU: 16})  # no node has 16 GPUs
    for group in ("whole", "half", "huge"):
        await kube.create_pod(NS, f"{group}-0", group)
    bound = [await kube.wait_bound(NS, f"{g}-0") for g in ("whole", "half")]
    await kube.wait_group(NS, "huge", lambda g: any(c.get("reason") == "Unschedulable"
                                                   for c in g.get("status", {}).get("conditions", [])),
                          "Unschedulable")  # fmt: skip

    async def settled() -> tuple[str, Samples] | None:
        got = await scrape(metered)
        return got if value(got[1], "deviceshare_unschedulable_groups", reason="devices") == 1 else None

    text, samples = await kube.wait_for(settled, "the unschedulable group counted")
    assert value(samples, "deviceshare_leader") == 1
    assert {p: value(samples, "deviceshare_groups", phase=p) for p in ("Pending", "Bound", "Releasing")} == {
        "Pending": 1, "Bound": 2, "Releasing": 0}
    assert sum(v for (n, _), v in samples.items() if n == "deviceshare_unschedulable_groups") == 1
    assert value(samples, "deviceshare_unschedulable_group_devices_max", resource=GPU) == 16
    assert value(samples, "deviceshare_group_time_to_bound_seconds_count") == 2
    assert value(samples, "deviceshare_rebuilds_total") == 1
    assert value(samples, "deviceshare_rebuild_objects", kind="nodes") == 4

    # The half-used GPU is idle compute a whole-GPU group cannot use: the gauge equals a full recomputation.
    ctx = metered.memo.runtime.ctx
    expected = fleetfragmentation.recompute(ctx.ledger.snapshot().nodes.values(), ctx.fgd.histogram.workload())
    fragmentation = value(samples, "deviceshare_fragmentation", resource=GPU)
    assert fragmentation is not None and fragmentation > 0
    assert math.isclose(fragmentation, expected[GPU], rel_tol=1e-9)

    # Bounded labels only, and none of this test's pod, group or uid values anywhere in the scrape.
    assert "_created" not in text
    names_seen = {key for _, labels in samples for key, _ in labels}
    assert names_seen <= BOUNDED_LABELS, names_seen - BOUNDED_LABELS
    secrets = {"whole", "half", "huge", "whole-0", "half-0", "huge-0", NS}
    secrets |= {p["metadata"]["uid"] for p in bound}
    assert not {v for _, labels in samples for _, v in labels} & secrets

    await kube.delete_group(NS, "huge")
    await kube.delete_pod(NS, "huge-0")

    async def cleared() -> bool:
        got = (await scrape(metered))[1]
        return value(got, "deviceshare_unschedulable_groups", reason="devices") == 0 and \
            value(got, "deviceshare_unschedulable_group_devices_max", resource=GPU) is None

    await kube.wait_for(cleared, "the deleted group no longer counted as unschedulable")


async def test_a_standby_says_it_is_no_leader_and_exports_nothing_stale(cluster: Sandbox, kube: Kube) -> None:
    await kube.ensure_namespace(names.DEFAULT_NAMESPACE)
    replicas = []
    try:
        for identity in ("replica-a", "replica-b"):
            replicas.append(await start_operator(operator_config(
                cluster, metrics_host="127.0.0.1", metrics_port=0, lease_name="deviceshare-operator",
                identity=identity, lease_duration=2.0, renew_deadline=1.5, retry_period=0.2,
            )))

        async def one_leads() -> list[Samples] | None:
            scraped = [(await scrape(r))[1] for r in replicas]
            leaders = [value(s, "deviceshare_leader") for s in scraped]
            return scraped if sorted(leaders) == [0, 1] else None  # type: ignore[type-var]

        scraped = await kube.wait_for(one_leads, "one replica leading")
        leader, standby = sorted(scraped, key=lambda s: -(value(s, "deviceshare_leader") or 0))
        assert value(leader, "deviceshare_groups", phase="Bound") == 0
        assert value(leader, "deviceshare_devices_free", node="gpu-node-0", resource=GPU) == 8
        stale: Any = [n for n, _ in standby if n.startswith(("deviceshare_groups", "deviceshare_devices_",
                                                             "deviceshare_fragmentation", "deviceshare_unsched"))]
        assert stale == []
    finally:
        for r in replicas:
            await r.stop()
