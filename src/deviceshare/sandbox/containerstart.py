"""What a container on a sandbox node starts with: its env, and the devices NVIDIA's container toolkit gives it.

The env: literal values and the downward-API fields the kubelet resolves when the container starts.

The devices (CONTRACT §12), asked by the sandbox's kubelet when a container starts. Two kinds of node, by the label
``deviceshare.io/handover`` (the sandbox's nodes are configured as their label says; unlabelled ones are env):

- ``cdi``: a node whose toolkit runs its NRI plugin (GPU Operator >= 25.10). At CreateContainer the plugin
  (NVIDIA/nvidia-container-toolkit ``cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go``) reads the
  pod annotation ``nvidia.cdi.k8s.io/container.<name>``, else ``nvidia.cdi.k8s.io/pod``, else
  ``nvidia.cdi.k8s.io`` (containerd/nri ``pkg/plugin.GetEffectiveAnnotation``), splits it on commas and has the
  runtime inject those CDI devices. A name the node's CDI spec lacks fails the container:
  ``unresolvable CDI devices <names>`` (tags.cncf.io/container-device-interface ``pkg/cdi/cache.go``
  InjectDevices). The container's own ``NVIDIA_VISIBLE_DEVICES`` selects nothing: NVIDIA-generated CDI specs set
  it to ``void``, and a hardened toolkit (``accept-nvidia-visible-devices-envvar-when-unprivileged = false``)
  ignores it from unprivileged containers.
- ``env``: the legacy runtime with that setting true (its default): the devices are the ones the container's
  resolved ``NVIDIA_VISIBLE_DEVICES`` lists (``internal/config/image/cuda_image.go``; unset, empty or ``void``:
  none; ``all``: every GPU of the node).

The node's CDI spec names its devices as the node does (CONTRACT §2): kind = the resource name
(``nvidia.com/gpu``), one device per ID, plus ``all`` (what ``nvidia-ctk cdi generate`` writes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.core import inventory

_ANNOTATION_PATH = re.compile(r"^metadata\.annotations\['(.+)'\]$")
_LABEL_PATH = re.compile(r"^metadata\.labels\['(.+)'\]$")

_NVIDIA_ENV = "NVIDIA_VISIBLE_DEVICES"


class Unresolvable(Exception):
    """CreateContainer fails: the container asked for CDI devices the node's spec does not have."""

    def __init__(self, devices: tuple[str, ...]) -> None:
        super().__init__(f"CDI device injection failed: unresolvable CDI devices {', '.join(devices)}")
        self.devices = devices


def node_handover(node: Mapping[str, Any]) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return "cdi" if labels.get(names.NODE_HANDOVER_LABEL) == "cdi" else "env"


def node_cdi_devices(node: Mapping[str, Any]) -> frozenset[str]:
    """The fully qualified CDI names the node's spec holds: ``<resource>=<id>`` and ``<resource>=all``."""
    info = inventory.node_from_object(node)
    return frozenset(f"{resource}={i}" for resource, ids in info.devices.items() for i in (*ids, "all"))


def effective_annotation(annotations: Mapping[str, str], container: str) -> str | None:
    """containerd/nri's GetEffectiveAnnotation for the plugin's domain: per container, then pod, then bare."""
    domain = names.CDI_ANNOTATION_DOMAIN
    for key in (f"{domain}/container.{container}", f"{domain}/pod", domain):
        if key in annotations:
            return annotations[key]
    return None


def devices_for(
    pod: Mapping[str, Any], container: str, env: Mapping[str, str], node: Mapping[str, Any]
) -> tuple[str, ...]:
    """The CDI names of the devices the container gets (``nvidia.com/gpu=0``); raises :class:`Unresolvable`."""
    known = node_cdi_devices(node)
    if node_handover(node) == "cdi":
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        value = effective_annotation(annotations, container)
        asked = tuple(d for d in (value or "").split(",") if d)
        missing = tuple(d for d in asked if d not in known)
        if missing:
            raise Unresolvable(missing)
        return asked
    listed = [d.strip() for d in env.get(_NVIDIA_ENV, "").split(",") if d.strip()]
    if not listed or "void" in listed or "none" in listed:
        return ()
    gpu = names.NVIDIA_GPU_RESOURCE
    if "all" in listed:
        return (f"{gpu}=all",)
    return tuple(f"{gpu}={d}" for d in listed if f"{gpu}={d}" in known)


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The env a container starts with: literal values and the downward-API fields the kubelet resolves.

    A ``fieldRef`` to an annotation or label that is absent resolves to ``""``, as the kubelet does.
    Entries from ConfigMaps/Secrets (which the sandbox does not model) are left out.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = str(entry.get("name"))
        if "value" in entry or "valueFrom" not in entry:
            env[name] = str(entry.get("value", ""))
            continue
        path = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path is None:
            continue
        annotation, label = _ANNOTATION_PATH.match(path), _LABEL_PATH.match(path)
        if annotation:
            env[name] = str((meta.get("annotations") or {}).get(annotation.group(1), ""))
        elif label:
            env[name] = str((meta.get("labels") or {}).get(label.group(1), ""))
        elif path in ("metadata.name", "metadata.namespace", "metadata.uid"):
            env[name] = str(meta.get(path.split(".", 1)[1], ""))
        elif path == "spec.nodeName":
            env[name] = str(spec.get("nodeName", ""))
    return env
