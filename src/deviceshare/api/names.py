"""Every name that users, manifests and GitOps pipelines rely on (CONTRACT §1–5), in one place."""

from collections.abc import Mapping
from typing import Final

GROUP: Final = "deviceshare.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "SharedDeviceGroup"
PLURAL: Final = "shareddevicegroups"
SINGULAR: Final = "shareddevicegroup"
SHORT_NAME: Final = "sdg"
CATEGORY: Final = "deviceshare"

# Nodes
NODE_MODE_LABEL: Final = "deviceshare.io/mode"
NODE_MODE_SHARED: Final = "shared"
NODE_DEVICES_ANNOTATION: Final = "deviceshare.io/devices"
# Shared nodes carry this taint (value "true", effect NoExecute) so that only group members, which the
# webhook gives the toleration, run there; the admission policy keeps the toleration from other pods.
SHARED_NODE_TAINT: Final = "deviceshare.io/shared"
SHARED_NODE_TAINT_VALUE: Final = "true"
SHARED_NODE_TAINT_EFFECT: Final = "NoExecute"
# A namespace with this label set to "true" may tolerate the taint without being a member.
NAMESPACE_EXEMPT_LABEL: Final = "deviceshare.io/exempt"
# Device capacity for sharing (CONTRACT §7): JSON resource -> quantity / integer per device.
NODE_DEVICE_MEMORY_ANNOTATION: Final = "deviceshare.io/device-memory"
NODE_DEVICE_TILES_ANNOTATION: Final = "deviceshare.io/device-tiles"
# What the vendors' feature discovery publishes: MiB per NVIDIA GPU; Intel tiles summed over the node.
NVIDIA_GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"
INTEL_TILES_LABEL: Final = "gpu.intel.com/tiles"
INTEL_RESOURCE_PREFIX: Final = "gpu.intel.com/"
# What a node agent publishes (CONTRACT §9): JSON resource -> {device -> {"numa": n, "links": {other: link}}};
# JSON resource -> unhealthy device IDs; "ready" when an MPS control daemon serves the node's GPUs.
NODE_TOPOLOGY_ANNOTATION: Final = "deviceshare.io/device-topology"
NODE_HEALTH_ANNOTATION: Final = "deviceshare.io/device-health"
NODE_MPS_ANNOTATION: Final = "deviceshare.io/mps"
NODE_MPS_READY: Final = "ready"
# How a node's container runtime takes devices (CONTRACT §12): "cdi" or "env"; unlabelled nodes follow the
# operator's --handover.
NODE_HANDOVER_LABEL: Final = "deviceshare.io/handover"

# Pods
POD_GROUP_ANNOTATION: Final = "deviceshare.io/device-group"
POD_GROUP_LABEL: Final = "deviceshare.io/group"
POD_SELECTED_DEVICES_ANNOTATION: Final = "deviceshare.io/selected-devices"
POD_ENV_ANNOTATION_PREFIX: Final = "deviceshare.io/env."
# The annotation NVIDIA's container toolkit NRI plugin reads per container (CONTRACT §12): CDI device names.
CDI_ANNOTATION_DOMAIN: Final = "nvidia.cdi.k8s.io"
CDI_CONTAINER_ANNOTATION_PREFIX: Final = f"{CDI_ANNOTATION_DOMAIN}/container."
# Status of a sharing group: resource -> "<device-id>.<tile>" (CONTRACT §7).
STATUS_ALLOCATED_TILES: Final = "allocatedTiles"

# The finalizer that holds a group's deletion until no member runs on its devices; a DRA group's
# ResourceClaim carries it too, so the allocation lives as long as the group holds its devices (CONTRACT §13).
GROUP_FINALIZER: Final = "deviceshare.io/release-devices"

# DRA groups (CONTRACT §13): the group's ResourceClaim is `<group>-devices`, its one request `devices`, and a
# member pod names it `deviceshare` in spec.resourceClaims and each container's resources.claims.
DRA_API_GROUP: Final = "resource.k8s.io"
DRA_API_VERSION: Final = f"{DRA_API_GROUP}/v1"
CLAIM_SUFFIX: Final = "-devices"
CLAIM_REQUEST_NAME: Final = "devices"
POD_CLAIM_NAME: Final = "deviceshare"

# Phases and conditions
PHASE_PENDING: Final = "Pending"
PHASE_BOUND: Final = "Bound"
PHASE_RELEASING: Final = "Releasing"
CONDITION_SCHEDULED: Final = "Scheduled"
CONDITION_NODE_LOST: Final = "NodeLost"
CONDITION_CONFLICT: Final = "DeviceConflict"
CONDITION_DEVICE_UNHEALTHY: Final = "DeviceUnhealthy"

# Operator environment
DEFAULT_SCHEDULER_NAME: Final = "deviceshare-scheduler"
ENV_SCHEDULER_NAME: Final = "DEVICESHARE_SCHEDULER_NAME"
ENV_NAMESPACE: Final = "DEVICESHARE_NAMESPACE"
DEFAULT_NAMESPACE: Final = "deviceshare-system"
METRICS_PREFIX: Final = "deviceshare_"


def env_annotation(env_name: str) -> str:
    """The pod annotation the downward API reads for one visibility env var."""
    return f"{POD_ENV_ANNOTATION_PREFIX}{env_name}"


def env_from_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The visibility env vars a pod's annotations carry: ``{"NVIDIA_VISIBLE_DEVICES": "0,1"}``."""
    n = len(POD_ENV_ANNOTATION_PREFIX)
    return {k[n:]: v for k, v in annotations.items() if k.startswith(POD_ENV_ANNOTATION_PREFIX)}


def key_text(key: tuple[str, str]) -> str:
    """``namespace/name``, the way kubectl and our messages name a namespaced object."""
    return f"{key[0]}/{key[1]}"


def env_field_path(env_name: str) -> str:
    """The downward-API fieldPath that resolves to :func:`env_annotation`."""
    return f"metadata.annotations['{env_annotation(env_name)}']"


def claim_name(group: str) -> str:
    """The ResourceClaim of a DRA group: ``<group>-devices``. A group's name is a DNS-1123 label (at most 63,
    the CRD says so), so the claim's name (a DNS subdomain, at most 253) always fits."""
    return f"{group}{CLAIM_SUFFIX}"
