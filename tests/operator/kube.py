"""A small test client over kubernetes_asyncio: create, read, delete, and wait for a condition."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import connecting
from tests import waiting


class Kube:
    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    @classmethod
    @asynccontextmanager
    async def connect(cls, kubeconfig: str) -> AsyncIterator[Kube]:
        api = await connecting.api_client(kubeconfig)
        try:
            yield cls(api)
        finally:
            await api.close()

    async def _json(self, coro: Any) -> Any:
        resp = await coro
        try:
            body = await resp.read()
        finally:
            resp.release()
        if resp.status >= 400:  # without preloading, kubernetes_asyncio does not raise by itself
            raise k8s.ApiException(status=resp.status, reason=body.decode(errors="replace"))
        return json.loads(body)

    # -- objects -------------------------------------------------------------------------------

    async def ensure_namespace(self, ns: str) -> None:
        try:
            await self.core.create_namespace({"metadata": {"name": ns}})
        except k8s.ApiException as e:
            if e.status != 409:
                raise

    async def create_group(
        self, ns: str, name: str, resources: Mapping[str, int] | None = None, **spec: Any
    ) -> dict[str, Any]:
        await self.ensure_namespace(ns)
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"resources": dict(resources or {"nvidia.com/gpu": 1}), **spec},
        }
        data: dict[str, Any] = await self._json(
            self.custom.create_namespaced_custom_object(
                names.GROUP, names.VERSION, ns, names.PLURAL, body, _preload_content=False
            )
        )
        return data

    async def create_pod(
        self,
        ns: str,
        name: str,
        group: str | None,
        *,
        scheduler: str = names.DEFAULT_SCHEDULER_NAME,
        cpu: str = "100m",
        memory: str = "128Mi",
        node_selector: Mapping[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        priority_class: str | None = None,
        preemption_policy: str | None = None,
    ) -> dict[str, Any]:
        await self.ensure_namespace(ns)
        annotations = {names.POD_GROUP_ANNOTATION: group} if group else {}
        labels = {names.POD_GROUP_LABEL: group} if group else {}
        spec: dict[str, Any] = {
            "schedulerName": scheduler,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
            ],
        }
        if node_selector:
            spec["nodeSelector"] = dict(node_selector)
        if tolerations:
            spec["tolerations"] = tolerations
        if priority_class:
            spec["priorityClassName"] = priority_class
        if preemption_policy:
            spec["preemptionPolicy"] = preemption_policy
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "annotations": annotations, "labels": labels},
                "spec": spec}
        data: dict[str, Any] = await self._json(
            self.core.create_namespaced_pod(ns, body, _preload_content=False)
        )
        return data

    async def create_priority_class(self, name: str, value: int, **extra: Any) -> None:
        """A PriorityClass (scheduling.k8s.io/v1): the API server's Priority admission sets ``spec.priority``
        on pods that name it."""
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, **extra}
        await self._json(self.custom.create_cluster_custom_object(
            "scheduling.k8s.io", "v1", "priorityclasses", body, _preload_content=False
        ))

    async def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = await self._json(self.core.read_namespaced_pod(name, ns, _preload_content=False))
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise
        return data

    async def group(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = await self._json(
                self.custom.get_namespaced_custom_object(
                    names.GROUP, names.VERSION, ns, names.PLURAL, name, _preload_content=False
                )
            )
        except k8s.ApiException as e:
            if e.status == 404:
                return None
            raise
        return data

    async def groups(self) -> list[dict[str, Any]]:
        data = await self._json(
            self.custom.list_cluster_custom_object(names.GROUP, names.VERSION, names.PLURAL, _preload_content=False)
        )
        return list(data["items"])

    async def pods(self) -> list[dict[str, Any]]:
        data = await self._json(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return list(data["items"])

    async def events(self, ns: str, involved: str) -> list[dict[str, Any]]:
        data = await self._json(
            self.core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={involved}", _preload_content=False
            )
        )
        return list(data["items"])

    async def delete_pod(self, ns: str, name: str) -> None:
        try:
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0, _preload_content=False)
        except k8s.ApiException as e:
            if e.status != 404:
                raise

    async def delete_group(self, ns: str, name: str) -> None:
        await self.custom.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, ns, names.PLURAL, name, _preload_content=False
        )

    async def patch_node(self, name: str, body: Mapping[str, Any]) -> None:
        await self.core.patch_node(name, body, _content_type="application/merge-patch+json", _preload_content=False)

    async def delete_node(self, name: str) -> None:
        await self.core.delete_node(name, _preload_content=False)

    async def patch_pod_annotations(self, ns: str, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.core.patch_namespaced_pod(
            name, ns, {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json", _preload_content=False,
        )

    # -- waiting -------------------------------------------------------------------------------

    async def wait_for(
        self, probe: Callable[[], Any], what: str, *, timeout: float = waiting.HANG_GUARD
    ) -> Any:
        """Poll ``probe`` (sync or async) until it returns something truthy; fail naming ``what``."""
        return await waiting.until(probe, what, timeout=timeout)

    async def wait_bound(self, ns: str, name: str, timeout: float = waiting.HANG_GUARD) -> dict[str, Any]:
        async def bound() -> dict[str, Any] | None:
            pod = await self.pod(ns, name)
            return pod if pod and pod.get("spec", {}).get("nodeName") else None

        result: dict[str, Any] = await self.wait_for(bound, f"pod {ns}/{name} to be bound", timeout=timeout)
        return result

    async def wait_group(
        self, ns: str, name: str, predicate: Callable[[dict[str, Any]], bool], what: str,
        timeout: float = waiting.HANG_GUARD,
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            g = await self.group(ns, name)
            return g if g is not None and predicate(g) else None

        result: dict[str, Any] = await self.wait_for(probe, f"group {ns}/{name}: {what}", timeout=timeout)
        return result


def selected(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(names.POD_SELECTED_DEVICES_ANNOTATION)
    return {r: ids.split(",") for r, ids in json.loads(raw).items()} if raw else {}


def scheduled_condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None
