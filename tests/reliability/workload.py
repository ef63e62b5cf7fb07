"""Object bodies and waits shared by the reliability scenarios (written straight into the sandbox store)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.api import names
from tests import waiting

GPU = "nvidia.com/gpu"


def group_body(ns: str, name: str, resources: Mapping[str, int] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"resources": dict(resources or {GPU: 1}), **spec},
    }


# Shares of one GPU (the sandbox's GPUs declare 80 GiB): compute only, memory only, and both.
SHARES: tuple[dict[str, str], ...] = ({"compute": "250m"}, {"memory": "20Gi"}, {"compute": "500m", "memory": "40Gi"})


def mixed_group_body(
    rng: random.Random, ns: str, name: str, whole: tuple[int, ...] = (1, 1, 2, 3, 4)
) -> dict[str, Any]:
    """A whole-device group or (two times in five) a group taking a share of one or two GPUs."""
    if rng.random() < 0.4:
        return group_body(ns, name, {GPU: rng.choice((1, 1, 2))}, share={GPU: dict(rng.choice(SHARES))})
    return group_body(ns, name, {GPU: rng.choice(whole)})


def pod_body(ns: str, name: str, group: str, *, cpu: str = "10m") -> dict[str, Any]:
    """A member pod as the webhook would have left it (scheduler name and group label set)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {names.POD_GROUP_ANNOTATION: group},
            "labels": {names.POD_GROUP_LABEL: group},
        },
        "spec": {
            "schedulerName": names.DEFAULT_SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


DRA_CLASS = "gpu.nvidia.com"  # the sandbox's DRA driver's DeviceClass


def dra_group_body(rng: random.Random, ns: str, name: str) -> dict[str, Any]:
    """A group on Dynamic Resource Allocation (CONTRACT §13): 1 to 3 devices of the class, a strategy drawn."""
    body = on_dra(group_body(ns, name, {GPU: rng.choice((1, 1, 2, 3))}))
    body["spec"]["schedulingStrategy"] = rng.choice(("binpack", "spread", "fgd"))
    return body


def on_dra(group: dict[str, Any]) -> dict[str, Any]:
    """The same group with ``spec.claim`` for its whole GPUs instead of ``spec.resources`` (CONTRACT §13)."""
    count = group["spec"].pop("resources")[GPU]
    group["spec"]["claim"] = {"deviceClassName": DRA_CLASS, "count": count}
    return group


def wired_to_claim(pod: dict[str, Any]) -> dict[str, Any]:
    """A DRA group's member as the webhook leaves one: the group's claim in ``spec.resourceClaims`` and the
    container's ``resources.claims``."""
    group = pod["metadata"]["annotations"][names.POD_GROUP_ANNOTATION]
    pod["spec"]["resourceClaims"] = [{"name": names.POD_CLAIM_NAME, "resourceClaimName": names.claim_name(group)}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": names.POD_CLAIM_NAME}]
    return pod


def dra_pod_body(ns: str, name: str, group: str) -> dict[str, Any]:
    return wired_to_claim(pod_body(ns, name, group))


def ensure_namespace(cluster: Any, ns: str) -> None:
    if cluster.get("namespaces", ns) is None:
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})


def failed_scheduling(cluster: Any, ns: str, pod: str) -> int:
    """How many times the scheduler has said why ``pod`` waits (repeats are counted on one Event)."""
    return sum(int(e.get("count") or 1) for e in cluster.list("events", ns)
               if e["involvedObject"]["name"] == pod and e["reason"] == "FailedScheduling")


def bound_pods(cluster: Any, ns: str | None = None) -> list[dict[str, Any]]:
    return [p for p in cluster.list("pods", ns) if (p.get("spec") or {}).get("nodeName")]


async def until(
    probe: Callable[[], Any], what: str, timeout: float = waiting.HANG_GUARD, interval: float = waiting.POLL
) -> Any:
    """Poll a synchronous probe (reading the sandbox store) until it returns something truthy."""
    return await waiting.until(probe, what, timeout=timeout, interval=interval)
