"""Why a node was rejected, in kube-scheduler's words.

These strings end up in ``FailedScheduling`` events and in ``PodScheduled`` conditions
(CONTRACT §3), counted per reason: ``0/12 nodes are available: 7 insufficient nvidia.com/gpu,
5 not in shared mode.`` Users grep for them, so they live in one place.
"""

from __future__ import annotations

from typing import Final

NOT_SHARED: Final = "not in shared mode"
UNSCHEDULABLE: Final = "node(s) were unschedulable"
NOT_READY: Final = "node(s) not ready"
NODE_AFFINITY: Final = "node(s) didn't match Pod's node affinity/selector"
GROUP_SELECTOR: Final = "node(s) didn't match group nodeSelector"
INVALID_INVENTORY: Final = "node(s) had invalid device inventory"
NODE_NOT_FOUND: Final = "node(s) were not found"
NO_NODES: Final = "no nodes in the cluster"
# A compute/memory share with the operator's --mps: the node has no MPS control daemon ready (CONTRACT §9).
NO_MPS: Final = "node(s) had no MPS control daemon ready"


def untolerated_taint(key: str, value: str) -> str:
    """kube-scheduler's TaintToleration wording, e.g. ``{node.kubernetes.io/unschedulable: }``."""
    return f"node(s) had untolerated taint {{{key}: {value}}}"


def insufficient(resource: str) -> str:
    """A device resource, ``cpu`` or ``memory`` the node has too little of."""
    return f"insufficient {resource}"


INSUFFICIENT_CPU: Final = insufficient("cpu")
INSUFFICIENT_MEMORY: Final = insufficient("memory")


def no_declared(resource: str, what: str) -> str:
    """A sharing group asks for device memory (or tiles) the node declares none of."""
    return f"no declared device {what} for {resource}"


# A DRA group (CONTRACT §13): a node short of devices of its DeviceClass, told apart (core/drareasons.py).
def no_class_device(device_class: str) -> str:
    return f"node(s) had no device of DeviceClass {device_class}"


def no_selected_device(device_class: str) -> str:
    return f"node(s) had no {device_class} device the claim's selectors match"


def no_selected_victim_device(device_class: str) -> str:
    """Preemption: evicting lower-priority groups would free enough devices, but too few the selectors match."""
    return (f"node(s) where evicting lower-priority groups frees too few {device_class} devices the claim's "
            "selectors match")


def withheld_devices(device_class: str) -> str:
    return f"node(s) had {device_class} devices tainted or allocated by another ResourceClaim"
