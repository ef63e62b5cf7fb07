"""The simulated nodes' Node objects: what the operator reads on a real GPU node.

The ``deviceshare.io/mode: shared`` label, ``nvidia.com/gpu`` (or another resource) in capacity/allocatable,
CPU/memory, a Ready condition (set with ``ready``), taints and cordoning, and the ``nodeInfo`` a kubelet reports.
``kubelet.py`` runs the pods bound to them; ``Sandbox.add_node`` creates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.api import names
from deviceshare.sandbox import store

KUBELET_VERSION = "v1.32.0-sandbox"


def node(
    name: str,
    *,
    gpus: int,
    resource: str = "nvidia.com/gpu",
    cpu: str = "64",
    memory: str = "512Gi",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        resources[resource] = str(gpus)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        names.NODE_MODE_LABEL: names.NODE_MODE_SHARED,
    }
    all_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "kubelet is posting ready status" if ready else "simulated NotReady",
                    "lastHeartbeatTime": store.now(),
                    "lastTransitionTime": store.now(),
                }
            ],
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "deviceshare sandbox",
                "kernelVersion": "6.0.0-sandbox",
                "containerRuntimeVersion": "sandbox://0",
                "bootID": f"boot-{name}",
                "machineID": f"machine-{name}",
                "systemUUID": f"uuid-{name}",
            },
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def ready(obj: Mapping[str, Any]) -> bool:
    """The node's Ready condition is True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions") or []
    )
