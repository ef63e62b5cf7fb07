"""Churn: groups and pods created, completed and deleted concurrently, the invariant checked all along.

The groups are a mix of whole-device groups and groups taking a share of their GPUs (CONTRACT §7).

The bounded form runs in ``make test`` until the churn has done what it is for (members deleted while bound,
of sharing groups too), however long that takes on the machine; the soak form (``make soak``, ``-m slow``)
runs the same workload for ``DEVICESHARE_SOAK_SECONDS`` (default 1800) and reports the operator's RSS and
asyncio task count over time, failing if either keeps growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
from collections.abc import Callable
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from deviceshare.api import names
from deviceshare.sandbox import errors
from tests.operator.conftest import operator_config
from tests.reliability import invariants, workload
from tests.reliability.conftest import Replica, Watchdog, kill, launch

NS = "churn"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 3, "gpus": 8}


@dataclasses.dataclass
class Tally:
    groups: int = 0
    pods: int = 0
    completed: int = 0
    bound_at_delete: int = 0
    deleted_groups: int = 0
    shared_bound: int = 0  # members of sharing groups bound when deleted


def delete_pod(cluster: Any, pod: str, tally: Tally) -> None:
    with contextlib.suppress(errors.ApiError):
        body = cluster.get("pods", pod, NS) or {}
        if body.get("spec", {}).get("nodeName"):
            tally.bound_at_delete += 1
            group = cluster.get(names.PLURAL, body["metadata"]["annotations"][names.POD_GROUP_ANNOTATION], NS)
            tally.shared_bound += bool(((group or {}).get("spec") or {}).get("share"))
        cluster.delete("pods", pod, NS)


async def actor(
    cluster: Any, index: int, going: Callable[[], bool], seed: int, tally: Tally, strategy: str | None = None,
    group_body: Callable[[random.Random, str, str], dict[str, Any]] = workload.mixed_group_body,
    member_body: Callable[[str, str, str], dict[str, Any]] = workload.pod_body,
) -> None:
    """One tenant: a group (``group_body``), a few members (``member_body``) that come and go, then the group goes;
    again and again."""
    rng = random.Random(seed * 1000 + index)
    round_ = 0
    while going():
        group = f"a{index}-r{round_}"
        round_ += 1
        body = group_body(rng, NS, group)
        if strategy is not None:
            body["spec"]["schedulingStrategy"] = strategy
        cluster.create(body)
        tally.groups += 1
        pods: list[str] = []
        for step in range(rng.randint(2, 6)):
            if not going():
                break
            action = rng.random()
            if action < 0.55 or not pods:
                pod = f"{group}-{step}"
                cluster.create(member_body(NS, pod, group))
                pods.append(pod)
                tally.pods += 1
            elif action < 0.8:
                pod = pods.pop(rng.randrange(len(pods)))
                with contextlib.suppress(errors.ApiError):
                    if (cluster.get("pods", pod, NS) or {}).get("spec", {}).get("nodeName"):
                        cluster.complete_pod(NS, pod)
                        tally.completed += 1
                delete_pod(cluster, pod, tally)
            else:
                delete_pod(cluster, pods.pop(rng.randrange(len(pods))), tally)
            await asyncio.sleep(rng.uniform(0.2, 1.2))  # the tenant's own pace: the workload, not a wait
        # Sometimes the group goes first and waits (Releasing) for its members; sometimes the reverse.
        if rng.random() < 0.5:
            cluster.delete(names.PLURAL, group, NS)
            for pod in pods:
                delete_pod(cluster, pod, tally)
        else:
            for pod in pods:
                delete_pod(cluster, pod, tally)
            cluster.delete(names.PLURAL, group, NS)
        tally.deleted_groups += 1


def expire_events(cluster: Any) -> None:
    """The API server drops events after an hour (--event-ttl); the sandbox keeps them, so churn drops them."""
    for event in cluster.list("events", NS):
        with contextlib.suppress(errors.ApiError):
            cluster.delete("events", event["metadata"]["name"], NS)


async def operator_footprint(replica: Replica) -> tuple[float, int]:
    """(process RSS in MiB, tasks in the operator's loop)."""

    async def count() -> int:
        return len(asyncio.all_tasks())

    tasks = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(count(), replica.loop))
    return psutil.Process().memory_info().rss / 2**20, tasks


def enough(tally: Tally) -> bool:
    """What the bounded churn is for: members deleted while bound (the release races), sharing ones among them."""
    return tally.bound_at_delete >= 30 and tally.shared_bound >= 5


# Writes whose answer lies (CONTRACT-level promise: no device given twice even so): every n-th of each kind lands
# and is then answered 504 Timeout, or its connection is dropped.
LIES = {
    "binding": ("POST", rf"/namespaces/{NS}/pods/[^/]+/binding$", 5),
    "group status": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/[^/]+/status$", 6),
    "finalizers": ("PATCH", rf"/namespaces/{NS}/{names.PLURAL}/[^/]+$", 4),
    "event": ("POST", rf"/namespaces/{NS}/events$", 7),
}


def lie_to(cluster: Any) -> dict[str, Any]:
    faults = {}
    for kind, (method, path, every) in LIES.items():
        faults[f"{kind}: 504"] = cluster.inject_fault(
            method, path, status=504, applied=True, times=None, every=every)
        faults[f"{kind}: dropped"] = cluster.inject_fault(
            method, path, drop=True, applied=True, times=None, every=every + 1)
    return faults


async def churn(
    cluster: Any, seconds: float | None, actors: int, seed: int, strategy: str | None = None, lies: bool = False
) -> tuple[list[str], Watchdog]:
    """Run the churn for ``seconds`` (the soak) or, with None, until :func:`enough`; its watchdog is asserted
    here, in the test, not in a fixture's teardown."""
    workload.ensure_namespace(cluster, NS)
    watchdog = Watchdog(cluster)
    watchdog.start()
    replica = await launch(operator_config(cluster))
    faults = lie_to(cluster) if lies else {}
    report: list[str] = []
    samples: list[tuple[float, float, int]] = []
    try:
        tally = Tally()
        loop = asyncio.get_running_loop()
        start = loop.time()
        stop = asyncio.Event()
        if seconds is not None:
            loop.call_later(seconds, stop.set)
        workers = [loop.create_task(actor(cluster, i, lambda: not stop.is_set(), seed, tally, strategy))
                   for i in range(actors)]
        if seconds is None:
            await workload.until(lambda: (enough(tally) and all(f.fired for f in faults.values()))
                                 or any(w.done() for w in workers), "enough churn (and every lie told)")
            stop.set()
        while not all(w.done() for w in workers):
            await asyncio.sleep(min(60.0, max(1.0, (seconds or 0) / 10)))  # the soak's sampling period
            expire_events(cluster)
            rss, tasks = await operator_footprint(replica)
            samples.append((loop.time() - start, rss, tasks))
            assert replica.alive, "the operator exited during churn"
        for w in workers:
            w.result()
        cluster.clear_faults()  # the quiet phase below checks what the lies left behind
        report += [f"lie {kind}: fired {fault.fired} times" for kind, fault in faults.items()]
        assert all(f.fired for f in faults.values()), f"a lie never fired: {report}"
        assert tally.bound_at_delete > 0, f"no member was ever bound: the churn tested nothing ({tally})"
        assert tally.shared_bound > 0, f"no member of a sharing group was ever bound ({tally})"

        # Quiet: everything deleted; every group must be released and gone, no finalizer left behind.
        try:
            await workload.until(lambda: not cluster.list(names.PLURAL, NS), "every group released and gone")
        except AssertionError:
            for g in cluster.list(names.PLURAL, NS):
                md = g["metadata"]
                members = [(p["metadata"]["name"], p["spec"].get("nodeName"), (p.get("status") or {}).get("phase"))
                           for p in cluster.list("pods", NS)
                           if (p["metadata"].get("annotations") or {}).get(names.POD_GROUP_ANNOTATION) == md["name"]]
                report.append(f"left: {md['name']} finalizers={md.get('finalizers')} "
                              f"deleting={bool(md.get('deletionTimestamp'))} status={g.get('status')} pods={members}")
            raise
        assert cluster.list("pods", NS) == []
        rss, tasks = await operator_footprint(replica)
        samples.append((loop.time() - start, rss, tasks))
        report.append(
            f"churn {loop.time() - start:.0f}s, {actors} actors: {tally.groups} groups, {tally.pods} pods, "
            f"{tally.bound_at_delete} bound when deleted ({tally.shared_bound} sharing), {tally.completed} completed, "
            f"{watchdog.checks} invariant checks, {len(watchdog.found)} violations"
        )
        report += [f"  t={t:7.1f}s  rss={r:7.1f} MiB  operator tasks={n}" for t, r, n in samples]

        # A fresh set after the churn still gets every device on one node: nothing leaked in the ledger.
        for node in range(3):
            cluster.create(workload.group_body(NS, f"after-{node}", {workload.GPU: 8}))
            cluster.create(workload.pod_body(NS, f"after-{node}", f"after-{node}"))
        await workload.until(lambda: len(workload.bound_pods(cluster, NS)) == 3, "the whole cluster placeable again")
        invariants.assert_no_double_allocation(invariants.from_sandbox(cluster))

        if len(samples) >= 4:  # soak: neither memory nor tasks keep growing after the warm-up
            warm = samples[len(samples) // 4]
            assert samples[-1][2] <= warm[2] * 2 + 50, f"operator tasks grow: {samples}"
            assert samples[-1][1] <= warm[1] * 1.5 + 64, f"RSS grows: {samples}"
    finally:
        await kill(replica)
        await watchdog.stop()
        report.append(f"watchdog: {watchdog.checks} checks, {len(watchdog.found)} violations")
        report += [f"  violation: {line}" for line in watchdog.found]
        if not any("rss=" in line for line in report):
            report += [f"  t={t:7.1f}s  rss={r:7.1f} MiB  operator tasks={n}" for t, r, n in samples]
        print("\n" + "\n".join(report))  # shown with -s (make soak), whatever the outcome
    assert not watchdog.found, "double allocation seen during churn:\n" + "\n".join(watchdog.found)
    return report, watchdog


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
async def test_churn_never_double_allocates(cluster: Any, seed: int) -> None:
    report, watchdog = await churn(cluster, seconds=None, actors=8, seed=seed)
    assert watchdog.checks > 50, report


async def test_churn_with_a_lying_api_never_double_allocates(cluster: Any) -> None:
    """Bindings, group status and finalizer writes and events that land but answer 504 or drop the connection."""
    report, watchdog = await churn(cluster, seconds=None, actors=8, seed=4, lies=True)
    assert watchdog.checks > 50, report


async def test_churn_with_fgd_never_double_allocates(cluster: Any) -> None:
    """Every group ``schedulingStrategy: fgd`` (whole, compute, memory and mixed shares): zero violations."""
    report, watchdog = await churn(cluster, seconds=None, actors=8, seed=3, strategy="fgd")
    assert watchdog.checks > 50, report


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the suite's 180 s limit is for the bounded tests
async def test_soak_churn(cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    seconds = float(os.environ.get("DEVICESHARE_SOAK_SECONDS", "1800"))
    with capsys.disabled():
        await churn(cluster, seconds=seconds, actors=12, seed=int(os.environ.get("SEED", "7")))
