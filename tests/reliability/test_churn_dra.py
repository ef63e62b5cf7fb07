"""Churn with groups on Dynamic Resource Allocation (CONTRACT §13): DRA groups and their members created,
completed and deleted concurrently, claim status writes that land but answer 504 or drop the connection, and the
operator killed and restarted midway; a watchdog reads the sandbox store every tick.

The invariant, always: no device is in two claims' allocations (a claim kube-scheduler allocated included), and
no device in two groups' ``allocatedDevices``. The operator makes the claims; the pods are wired to them as the
webhook wires them (``tests/operator/dra.py`` does the same through the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import errors
from tests.operator.conftest import operator_config
from tests.reliability import workload
from tests.reliability.conftest import kill, launch

NS = "churn-dra"
CLASS = DRIVER = "gpu.nvidia.com"
FOREIGN = ("gpu-node-0", "gpu-0")  # kube-scheduler's, for the whole run


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 4, "dra": True}


def violations(cluster: Any) -> list[str]:
    found: list[str] = []
    allocated: dict[str, str] = {}
    for claim in cluster.list("resourceclaims"):
        md = claim["metadata"]
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            device = f"{r['pool']}/{r['device']}"
            if device in allocated:
                found.append(f"{device} in the allocations of {allocated[device]} and {md['namespace']}/{md['name']}")
            allocated[device] = f"{md['namespace']}/{md['name']}"
    held: dict[str, str] = {}
    for group in cluster.list(names.PLURAL):
        for device in ((group.get("status") or {}).get("allocatedDevices") or {}).get(CLASS, []):
            if device in held:
                found.append(f"{device} held by groups {held[device]} and {group['metadata']['name']}")
            if device == "/".join(FOREIGN):
                found.append(f"{device}, kube-scheduler's, held by group {group['metadata']['name']}")
            held[device] = group["metadata"]["name"]
    return found


@dataclasses.dataclass
class Tally:
    groups: int = 0
    bound_at_delete: int = 0
    checks: int = 0
    found: list[str] = dataclasses.field(default_factory=list)


def make_group(cluster: Any, rng: random.Random, name: str) -> None:
    count = rng.choice((1, 1, 2, 3))
    cluster.create({
        "apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": NS},
        "spec": {"claim": {"deviceClassName": CLASS, "count": count},
                 "schedulingStrategy": rng.choice(("binpack", "spread", "fgd"))},
    })


def member(name: str, group: str) -> dict[str, Any]:
    body = workload.pod_body(NS, name, group)
    body["spec"]["resourceClaims"] = [{"name": names.POD_CLAIM_NAME, "resourceClaimName": names.claim_name(group)}]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": names.POD_CLAIM_NAME}]
    return body


def delete_pod(cluster: Any, pod: str, tally: Tally) -> None:
    with contextlib.suppress(errors.ApiError):
        if (cluster.get("pods", pod, NS) or {}).get("spec", {}).get("nodeName"):
            tally.bound_at_delete += 1
        cluster.delete("pods", pod, NS)


async def actor(cluster: Any, index: int, going: Any, tally: Tally) -> None:
    rng = random.Random(1000 + index)
    round_ = 0
    while going():
        group = f"d{index}-r{round_}"
        round_ += 1
        make_group(cluster, rng, group)
        tally.groups += 1
        pods: list[str] = []
        for step in range(rng.randint(2, 5)):
            if rng.random() < 0.6 or not pods:
                pods.append(f"{group}-{step}")
                cluster.create(member(pods[-1], group))
            else:
                delete_pod(cluster, pods.pop(rng.randrange(len(pods))), tally)
            await asyncio.sleep(rng.uniform(0.1, 0.6))  # the tenant's own pace
        if rng.random() < 0.5:
            cluster.delete(names.PLURAL, group, NS)
        for pod in pods:
            delete_pod(cluster, pod, tally)
        with contextlib.suppress(errors.ApiError):
            cluster.delete(names.PLURAL, group, NS)


async def watch(cluster: Any, tally: Tally) -> None:
    while True:
        tally.checks += 1
        tally.found += [line for line in violations(cluster) if line not in tally.found]
        await asyncio.sleep(0.02)  # the watchdog's sampling period


async def test_dra_churn_with_lies_and_a_restart_never_allocates_a_device_twice(cluster: Any) -> None:
    workload.ensure_namespace(cluster, NS)
    workload.ensure_namespace(cluster, "other")
    cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "theirs", "namespace": "other"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
    })
    status = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": FOREIGN[0], "device": FOREIGN[1]}]}}}
    cluster.store.write_status(cluster.store.catalog.lookup("resourceclaims"), "other", "theirs",
                               lambda c: c.__setitem__("status", status))
    assert (cluster.get("resourceclaims", "theirs", "other") or {}).get("status") == status
    path = rf"/namespaces/{NS}/resourceclaims/[^/]+/status$"
    lies = [cluster.inject_fault("PATCH", path, status=504, applied=True, times=None, every=3),
            cluster.inject_fault("PATCH", path, drop=True, applied=True, times=None, every=4)]
    tally = Tally()
    checker = asyncio.get_running_loop().create_task(watch(cluster, tally))
    replica = await launch(operator_config(cluster))
    stop = asyncio.Event()
    actors = [asyncio.get_running_loop().create_task(actor(cluster, i, lambda: not stop.is_set(), tally))
              for i in range(4)]
    try:
        await workload.until(lambda: tally.bound_at_delete >= 8 or any(a.done() for a in actors), "churn, then a kill")
        await kill(replica)
        replica = await launch(operator_config(cluster))
        await workload.until(lambda: (tally.bound_at_delete >= 20 and all(f.fired for f in lies))
                             or any(a.done() for a in actors), "churn after the restart, every lie told")
        stop.set()
        for a in actors:
            await a
        cluster.clear_faults()
        assert all(f.fired for f in lies), [f.fired for f in lies]
        await workload.until(lambda: not cluster.list(names.PLURAL, NS), "every group released and gone")
        # Nothing leaked: kube-scheduler's claim is all that is allocated once the claims are gone.
        await workload.until(lambda: all(c["metadata"]["namespace"] != NS for c in cluster.list("resourceclaims")),
                             "the groups' claims gone with them")
    finally:
        stop.set()
        checker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await checker
        await kill(replica)
    tally.found += [line for line in violations(cluster) if line not in tally.found]
    assert tally.checks > 50 and tally.bound_at_delete >= 20, tally
    assert not tally.found, "a device allocated twice:\n" + "\n".join(tally.found)
