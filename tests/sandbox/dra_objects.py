"""Builders of ``resource.k8s.io/v1`` objects for the DRA tests."""

from __future__ import annotations

import uuid
from typing import Any

RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RESOURCE}/namespaces/default/resourceclaims"
SLICES = f"{RESOURCE}/resourceslices"
CLASSES = f"{RESOURCE}/deviceclasses"
MERGE = "application/merge-patch+json"


def claim(name: str = "group-devices", *, count: int | None = 1, **exactly: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", **exactly}
    if count is not None:
        request["count"] = count
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "devices", "exactly": request}]}},
    }


def allocation(node: str, *devices: str, request: str = "devices", **result: Any) -> dict[str, Any]:
    """What a scheduler writes: one result per device of ``node``'s pool, and a node selector on its name."""
    return {
        "devices": {"results": [{"request": request, "driver": "gpu.nvidia.com", "pool": node, "device": d, **result}
                                for d in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }


def consumer(name: str, uid: str | None = None) -> dict[str, Any]:
    return {"resource": "pods", "name": name, "uid": uid or str(uuid.uuid4())}


def resource_slice(node: str, *devices: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": list(devices) or [{"name": "gpu-0"}],
    }
    body.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-slice"}, "spec": {k: v for k, v in body.items() if v is not None}}


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}
