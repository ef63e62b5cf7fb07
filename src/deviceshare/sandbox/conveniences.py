"""The ``Sandbox`` conveniences tests and the demo call: ``create``, ``get``, ``list``, ``patch``, ``delete``,
``bind``, ``add_node``, ``complete_pod``... They write through the same store as the HTTP API, so watchers see
them; they skip admission webhooks (except ``create_admitted``), which only HTTP writes go through.
A mixin of :class:`~deviceshare.sandbox.cluster.Sandbox`, whose store, admission and kubelet they act on.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from deviceshare.api import names
from deviceshare.sandbox import admission, catalog, errors, kubelet, nodes, patches, store

INTEL_RESOURCE = "gpu.intel.com/i915"
# What a shared node carries in a cluster that keeps non-members off it (docs/security.md).
SHARED_NODE_TAINT = {
    "key": names.SHARED_NODE_TAINT,
    "value": names.SHARED_NODE_TAINT_VALUE,
    "effect": names.SHARED_NODE_TAINT_EFFECT,
}


def load_manifests(path: Path) -> list[dict[str, Any]]:
    files = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
    return [doc for file in files for doc in yaml.safe_load_all(file.read_text()) if isinstance(doc, dict)]


class Conveniences:
    store: store.ObjectStore
    admission: admission.Admission
    kubelet: kubelet.Kubelet | None
    # What ``add_node`` gives a node unless told otherwise (``Sandbox``'s arguments).
    resource: str
    gpus: int
    gpu_memory_mib: int | None
    node_cpu: str
    node_memory: str
    node_labels: dict[str, str]
    shared_taint: bool

    def _rtype_of(self, obj: Mapping[str, Any]) -> catalog.ResourceType:
        group = obj.get("apiVersion", "v1").rpartition("/")[0]
        for rtype in self.store.catalog:
            if rtype.kind == obj.get("kind") and rtype.group == group:
                return rtype
        raise errors.ApiError(404, "NotFound", f"no resource for {obj.get('apiVersion')} {obj.get('kind')}")

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        rtype = self._rtype_of(obj)
        return self.store.create(rtype, store.meta(obj).get("namespace"), obj)

    async def create_admitted(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create as an HTTP client would: through the mutating admission webhooks first."""
        rtype = self._rtype_of(obj)
        namespace = store.meta(obj).get("namespace") or ("default" if rtype.namespaced else None)
        admitted = await self.admission.admit_create(rtype, namespace, copy.deepcopy(dict(obj)))
        await self.admission.validate(rtype, namespace, "CREATE", admitted)
        return self.store.create(rtype, namespace, admitted)

    def apply_manifests(self, path: Path) -> list[dict[str, Any]]:
        return [self.create(doc) for doc in load_manifests(path)]

    def get(self, kind_or_plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.store.get(self.store.rtype(kind_or_plural), namespace, name)
        except errors.ApiError as e:
            if e.code == 404:
                return None
            raise

    def list(
        self,
        plural: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        from deviceshare.sandbox import selectors

        rtype = self.store.rtype(plural)
        items, _ = self.store.list_objects(
            rtype, namespace, selectors.parse_labels(label_selector), selectors.parse_fields(field_selector)
        )
        return items

    def patch(
        self,
        kind_or_plural: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        content_type: str = patches.MERGE,
    ) -> dict[str, Any]:
        rtype = self.store.rtype(kind_or_plural)
        return self.store.patch(rtype, namespace, name, content_type, patch, subresource)

    def delete(self, kind_or_plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.store.delete(self.store.rtype(kind_or_plural), namespace, name)

    def bind(self, namespace: str, name: str, node_name: str) -> None:
        self.store.bind(namespace, name, {"target": {"kind": "Node", "name": node_name}})

    def add_node(
        self,
        name: str,
        *,
        gpus: int | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        unschedulable: bool = False,
        ready: bool = True,
        cpu: str | None = None,
        memory: str | None = None,
        resource: str | None = None,
    ) -> dict[str, Any]:
        if self.shared_taint and taints is None:
            taints = [SHARED_NODE_TAINT]
        resource = resource or self.resource
        declared: dict[str, str] = {}
        if resource == names.NVIDIA_GPU_RESOURCE and self.gpu_memory_mib is not None:
            declared[names.NVIDIA_GPU_MEMORY_LABEL] = str(self.gpu_memory_mib)
        body = nodes.node(
            name,
            gpus=self.gpus if gpus is None else gpus,
            resource=resource,
            cpu=cpu or self.node_cpu,
            memory=memory or self.node_memory,
            labels={**declared, **self.node_labels, **(labels or {})},
            annotations=annotations,
            taints=taints,
            unschedulable=unschedulable,
            ready=ready,
        )
        status = body.pop("status")
        self.create(body)
        return self.store.write_status(
            self.store.rtype("nodes"), None, name, lambda n: n.update(status=status)
        )

    def add_intel_node(self, name: str, *, cards: int = 2, tiles_per_card: int = 2) -> dict[str, Any]:
        """A node with Intel data-center GPUs split in tiles, labelled as Intel's feature discovery does
        (``gpu.intel.com/tiles`` counts the node's tiles, all cards together)."""
        return self.add_node(
            name, gpus=cards, resource=INTEL_RESOURCE,
            labels={names.INTEL_TILES_LABEL: str(cards * tiles_per_card), "gpu.intel.com/cards": str(cards)},
        )

    def complete_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> dict[str, Any]:
        sim = self.kubelet or kubelet.Kubelet(self.store, 0)
        return sim.complete(namespace, name, phase)
