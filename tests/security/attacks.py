"""What the attack tests share: tenant namespaces, pod bodies, writes that must be refused.

Every write goes through the API with a real client, as ``kubectl`` would send it; a refusal is read
back from the API's ``Status`` body (code and message), which is what the attacker would see.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from tests import waiting
from tests.operator.kube import Kube

TENANT_NAMESPACES = ("team-a", "team-b")
EXEMPT_NAMESPACE = "gpu-system"
GPU = "nvidia.com/gpu"
ENV_VISIBLE = names.env_annotation("NVIDIA_VISIBLE_DEVICES")


@dataclasses.dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str


async def refused(write: Awaitable[Any]) -> Refusal:
    """The API's refusal of ``write``; fails the test if the write went through."""
    try:
        await write
    except k8s.ApiException as e:
        body = _status_body(e)
        return Refusal(int(e.status or 0), str(body.get("reason", "")), str(body.get("message", e.reason)))
    raise AssertionError("the API accepted a write it must refuse")


def _status_body(e: k8s.ApiException) -> dict[str, Any]:
    for text in (e.body, e.reason):
        try:
            body = json.loads(text or "")
        except (TypeError, ValueError):
            continue
        if isinstance(body, dict):
            return body
    return {}


def pod(
    ns: str,
    name: str,
    *,
    group: str | None = None,
    scheduler: str | None = None,
    annotations: Mapping[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    node_name: str | None = None,
    env: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod body as a tenant would write it."""
    all_annotations = dict(annotations or {})
    if group is not None:
        all_annotations[names.POD_GROUP_ANNOTATION] = group
    container: dict[str, Any] = {"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if limits:
        container["resources"]["limits"] = dict(limits)
    spec: dict[str, Any] = {"containers": [container]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": all_annotations}, "spec": spec}


async def create_pod(kube: Kube, body: Mapping[str, Any]) -> dict[str, Any]:
    ns = body["metadata"]["namespace"]
    created: dict[str, Any] = await kube._json(kube.core.create_namespaced_pod(ns, body, _preload_content=False))
    return created


async def annotate(kube: Kube, ns: str, name: str, annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """``kubectl annotate --overwrite`` (``None`` removes the key): a merge patch of the pod."""
    patched: dict[str, Any] = await kube._json(kube.core.patch_namespaced_pod(
        name, ns, {"metadata": {"annotations": dict(annotations)}},
        _content_type="application/merge-patch+json", _preload_content=False))
    return patched


async def bind(kube: Kube, ns: str, name: str, node: str, annotations: Mapping[str, str] | None = None) -> Any:
    """A ``pods/binding`` create, optionally carrying annotations for the pod (as the operator's do)."""
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "annotations": dict(annotations or {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return await kube._json(kube.core.create_namespaced_pod_binding(name, ns, body, _preload_content=False))


async def add_ephemeral_container(kube: Kube, ns: str, name: str) -> Any:
    """``kubectl debug -it POD --image=busybox``: a patch of the ``ephemeralcontainers`` subresource."""
    patch = {"spec": {"ephemeralContainers": [
        {"name": "debugger", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    return await kube._json(kube.core.patch_namespaced_pod_ephemeralcontainers(
        name, ns, patch, _content_type="application/strategic-merge-patch+json", _preload_content=False))


async def group(kube: Kube, ns: str, name: str, gpus: int = 1) -> dict[str, Any]:
    body = {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": {"name": name, "namespace": ns},
            "spec": {"resources": {GPU: gpus}}}
    created: dict[str, Any] = await kube._json(kube.custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body, _preload_content=False))
    return created


async def member(kube: Kube, ns: str, group_name: str, pod_name: str) -> dict[str, Any]:
    """A member pod created through the webhook and bound by the operator, as the API shows it."""
    await create_pod(kube, pod(ns, pod_name, group=group_name))
    return await kube.wait_bound(ns, pod_name)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = waiting.HANG_GUARD) -> None:
    await waiting.until(condition, what, timeout=timeout_s)
