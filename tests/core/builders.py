"""Small builders of Node and Pod bodies and NodeInfo records for the core tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.core import inventory

GPU = "nvidia.com/gpu"
SHARED = {"deviceshare.io/mode": "shared"}


def node_body(
    name: str = "n1",
    *,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    ready: str | None = "True",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocatable": dict(
            allocatable if allocatable is not None else {"cpu": "8", "memory": "32Gi", GPU: "4"}
        )
    }
    if ready is not None:
        status["conditions"] = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready},
        ]
    spec: dict[str, Any] = {"taints": list(taints)}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(SHARED if labels is None else labels),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": status,
    }


def node(
    name: str = "n1",
    *,
    gpus: int | Sequence[str] = 4,
    labels: Mapping[str, str] | None = None,
    shared: bool = True,
    ready: bool = True,
    unschedulable: bool = False,
    taints: Sequence[inventory.Taint] = (),
    cpu_milli: int = 8000,
    memory_bytes: int = 32 << 30,
    extra: Mapping[str, Sequence[str]] | None = None,
    problems: Sequence[str] = (),
    device_memory: Mapping[str, int] | None = None,
    device_tiles: Mapping[str, int] | None = None,
) -> inventory.NodeInfo:
    ids = tuple(str(i) for i in range(gpus)) if isinstance(gpus, int) else tuple(gpus)
    devices = {GPU: ids} if ids else {}
    devices.update({r: tuple(v) for r, v in (extra or {}).items()})
    base = dict(SHARED) if shared else {}
    return inventory.NodeInfo(
        name=name,
        labels={**base, **(labels or {})},
        shared=shared,
        ready=ready,
        unschedulable=unschedulable,
        taints=tuple(taints),
        devices=devices,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        problems=tuple(problems),
        device_memory=dict(device_memory or {}),
        device_tiles=dict(device_tiles or {}),
    )


def pod_body(
    containers: Sequence[Mapping[str, Any]] = (),
    *,
    init: Sequence[Mapping[str, Any]] = (),
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": list(containers), "initContainers": list(init), **spec},
    }


def container(
    cpu: str | None = None, memory: str | None = None, *, limits: bool = False, restart: str | None = None
) -> dict[str, Any]:
    quantities = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    body: dict[str, Any] = {"name": "c", "resources": {"limits" if limits else "requests": quantities}}
    if restart:
        body["restartPolicy"] = restart
    return body
