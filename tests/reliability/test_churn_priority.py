"""Churn with priorities, gangs and disruption budgets (CONTRACT §8): preemptions under way all along, the
invariant checked every tick.

Tenants create groups of random priority (three PriorityClasses), some of them gangs (``minMembers`` 2 or 3,
their members created together), some protected by a PodDisruptionBudget; pods come and go. A cluster kept
nearly full makes higher-priority groups preempt lower ones. The watchdog must see no device held by two
groups at any moment; at the end everything is released, and the preemptions and gang starts that the
scenario is about must have happened (else it tested nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import errors
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import Watchdog, kill, launch

NS = "churn-prio"
CLASSES = {"low": 10, "mid": 100, "high": 1000}


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 8}


def member(group: str, pod: str, level: str, ns: str = NS) -> dict[str, Any]:
    body = workload.pod_body(ns, pod, group)
    # What the API server's Priority admission writes from the class (the store is written directly here).
    body["spec"].update(priorityClassName=level, priority=CLASSES[level], preemptionPolicy="PreemptLowerPriority")
    return body


def delete(cluster: Any, kind: str, name: str, ns: str = NS) -> None:
    with contextlib.suppress(errors.ApiError):
        cluster.delete(kind, name, ns)


async def tenant(
    cluster: Any, index: int, going: Callable[[], bool], rng: random.Random, gangs: dict[str, int], *,
    dra: bool = False, ns: str = NS,
) -> None:
    """Groups of a random priority, gang or not, budget or not; with ``dra`` on DRA (``spec.claim``)."""
    round_ = 0
    while going():
        group, round_ = f"t{index}-r{round_}", round_ + 1
        level = rng.choice(list(CLASSES))
        gang = rng.choice((0, 0, 2, 3))
        body = workload.group_body(ns, group, {workload.GPU: rng.choice((1, 2, 2, 4))})
        body = workload.on_dra(body) if dra else body
        if gang:
            body["spec"]["minMembers"] = gang
            gangs[group] = gang
        cluster.create(body)
        if rng.random() < 0.3:
            cluster.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                            "metadata": {"name": group, "namespace": ns},
                            "spec": {"minAvailable": 1, "selector": {"matchLabels": {names.POD_GROUP_LABEL: group}}}})
        pods = [f"{group}-{i}" for i in range(max(gang, 1))]
        for pod in pods:
            body = member(group, pod, level, ns)
            cluster.create(workload.wired_to_claim(body) if dra else body)
        await asyncio.sleep(rng.uniform(0.5, 1.5))  # the workload's own pace: the group runs a while
        for pod in pods:
            delete(cluster, "pods", pod, ns)
        delete(cluster, names.PLURAL, group, ns)
        delete(cluster, "poddisruptionbudgets", group, ns)


def preemptions(replica: Any) -> float:
    registry = replica.runtime.ctx.metrics.registry
    return sum(registry.get_sample_value("deviceshare_preemptions_total", {"result": r}) or 0
               for r in ("evicted", "refused", "failed"))


def started_gangs(cluster: Any, gangs: dict[str, int], ns: str = NS) -> list[str]:
    scheduled = {e["involvedObject"]["name"] for e in cluster.list("events", ns) if e.get("reason") == "Scheduled"}
    return [g for g, n in gangs.items() if all(f"{g}-{i}" in scheduled for i in range(n))]


@pytest.mark.parametrize("soak", [False, pytest.param(True, marks=[pytest.mark.slow, pytest.mark.timeout(7200)])])
async def test_churn_with_priorities_gangs_and_budgets_never_double_allocates(cluster: Any, soak: bool) -> None:
    """The bounded form in ``make test`` runs until preemptions and gang starts have happened (3 of each), however
    long that takes on the machine; ``make soak`` runs it for ``DEVICESHARE_SOAK_SECONDS`` (default 1800)."""
    workload.ensure_namespace(cluster, NS)
    for name, value in CLASSES.items():
        cluster.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                        "value": value})
    watchdog = Watchdog(cluster)
    watchdog.start()
    replica = await launch(operator_config(cluster))
    try:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        rng = random.Random(22)
        gangs: dict[str, int] = {}
        tenants = [loop.create_task(tenant(cluster, i, lambda: not stop.is_set(), random.Random(rng.random()), gangs))
                   for i in range(8)]
        if soak:
            await asyncio.sleep(float(os.environ.get("DEVICESHARE_SOAK_SECONDS", "1800")))  # the soak's length
        else:
            await workload.until(lambda: (preemptions(replica) >= 3 and len(started_gangs(cluster, gangs)) >= 3)
                                 or any(t.done() for t in tenants), "3 preemptions and 3 gang starts")
        stop.set()
        await asyncio.gather(*tenants)
        preempted, started = preemptions(replica), started_gangs(cluster, gangs)
        assert preempted > 0, "no preemption happened: the churn tested nothing of it"
        assert started, f"no gang ever started (of {len(gangs)}): the churn tested nothing of it"
        await workload.until(lambda: not cluster.list(names.PLURAL, NS), "every group released and gone")
        assert cluster.list("pods", NS) == []
    finally:
        await kill(replica)
        await watchdog.stop()
    print(f"\nchurn with priorities: {watchdog.checks} invariant checks, {len(watchdog.found)} violations, "
          f"{preempted:.0f} preemptions, {len(started)}/{len(gangs)} gangs started")
    assert not watchdog.found, "double allocation seen during churn:\n" + "\n".join(watchdog.found)
    assert watchdog.checks > 50
