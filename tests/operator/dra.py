"""Test helpers for groups on Dynamic Resource Allocation (CONTRACT §13), through the API as a user sees it.

The operator makes each group's ResourceClaim ``<group>-devices``; the webhook's wiring is not what these tests are
about, so :func:`create_member` makes a pod wired to the claim as the webhook wires one (``spec.resourceClaims`` and
each container's ``resources.claims``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from tests.operator.kube import Kube

GROUP, VERSION = "resource.k8s.io", "v1"
CLASS = "gpu.nvidia.com"
DRIVER = "gpu.nvidia.com"


async def create_dra_group(
    kube: Kube, ns: str, name: str, count: int = 1, *, selectors: Sequence[str] = (), **spec: Any,
) -> dict[str, Any]:
    """A group with ``spec.claim`` (the operator makes its ResourceClaim)."""
    await kube.ensure_namespace(ns)
    body = {
        "apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": ns},
        "spec": {"claim": {"deviceClassName": CLASS, "count": count, "selectors": list(selectors)}, **spec},
    }
    group: dict[str, Any] = await kube._json(kube.custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body, _preload_content=False))
    return group


async def create_member(
    kube: Kube, ns: str, name: str, group: str, *, priority_class: str | None = None, cpu: str = "100m",
    claim: str | None = None, scheduler: str = names.DEFAULT_SCHEDULER_NAME,
) -> dict[str, Any]:
    """A member pod wired to the group's claim, as the webhook does it."""
    await kube.ensure_namespace(ns)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "resourceClaims": [{"name": names.POD_CLAIM_NAME, "resourceClaimName": claim or names.claim_name(group)}],
        "containers": [{"name": "main", "image": "busybox", "resources": {
            "requests": {"cpu": cpu, "memory": "64Mi"}, "claims": [{"name": names.POD_CLAIM_NAME}]}}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": ns, "annotations": {names.POD_GROUP_ANNOTATION: group},
        "labels": {names.POD_GROUP_LABEL: group}}, "spec": spec}
    data: dict[str, Any] = await kube._json(kube.core.create_namespaced_pod(ns, body, _preload_content=False))
    return data


async def claim(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = await kube._json(kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, ns, "resourceclaims", name, _preload_content=False))
    except k8s.ApiException as e:
        if e.status == 404:
            return None
        raise
    return data


async def claims(kube: Kube) -> list[dict[str, Any]]:
    data = await kube._json(kube.custom.list_cluster_custom_object(
        GROUP, VERSION, "resourceclaims", _preload_content=False))
    return list(data.get("items") or [])


async def slices(kube: Kube) -> list[dict[str, Any]]:
    data = await kube._json(kube.custom.list_cluster_custom_object(
        GROUP, VERSION, "resourceslices", _preload_content=False))
    return list(data.get("items") or [])


def allocated(claim_body: Mapping[str, Any] | None) -> list[str]:
    """``<pool>/<device>`` of each result of the claim's allocation, sorted."""
    allocation = ((claim_body or {}).get("status") or {}).get("allocation") or {}
    return sorted(f"{r['pool']}/{r['device']}" for r in (allocation.get("devices") or {}).get("results") or [])


def reserved(claim_body: Mapping[str, Any] | None) -> list[str]:
    return sorted(r["name"] for r in ((claim_body or {}).get("status") or {}).get("reservedFor") or [])


async def uuid_selector(kube: Kube, device: str) -> str:
    """A claim selector that matches the one device ``<pool>/<device>`` (the sandbox driver's pool is its node), by
    the ``uuid`` attribute its slice publishes."""
    node, _, name = device.partition("/")
    uuid = next(d["attributes"]["uuid"]["string"] for s in await slices(kube)
                if s["spec"]["nodeName"] == node for d in s["spec"]["devices"] if d["name"] == name)
    return f"device.attributes['{DRIVER}'].uuid == '{uuid}'"


async def allocate_foreign(kube: Kube, ns: str, name: str, pool: str, devices: Sequence[str]) -> None:
    """A claim allocated by someone else (kube-scheduler), as its DRA plugin writes it."""
    await kube.ensure_namespace(ns)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": CLASS,
                                                                        "count": len(devices)}}]}},
    }
    made = await kube._json(kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, "resourceclaims", body, _preload_content=False))
    made["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": pool, "device": d} for d in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [pool]}]}]},
    }}
    await kube._json(kube.custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, ns, "resourceclaims", name, made, _preload_content=False))


async def taint_device(kube: Kube, node: str, device: str, effect: str = "NoSchedule") -> None:
    """A DRA device taint on the node's slice (as an admin or the driver would set it)."""
    for s in await slices(kube):
        if s["spec"].get("nodeName") != node:
            continue
        for d in s["spec"]["devices"]:
            if d["name"] == device:
                d["taints"] = [{"key": "example.com/broken", "value": "true", "effect": effect}]
        await kube._json(kube.custom.replace_cluster_custom_object(
            GROUP, VERSION, "resourceslices", s["metadata"]["name"], s, _preload_content=False))
