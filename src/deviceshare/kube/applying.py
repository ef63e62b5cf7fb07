"""Apply YAML objects through the API with server-side apply, as ``kubectl apply --server-side`` does.

Used by the demo and the end-to-end tests to put ``examples/*.yaml`` on a cluster: the resource
(plural, namespaced or not) of each ``apiVersion``/``kind`` comes from the API's discovery
endpoints, so CRDs work as soon as the API serves them. Each object is sent whole as an apply patch
(``PATCH`` with ``application/apply-patch+yaml``, field manager ``deviceshare``, ``force=true``): the API
server creates it if it is missing, makes every field the file names ours again (a field changed live is set
back), removes a field we applied before and the file no longer names, keeps the fields others own (the
webhook's env, the operator's finalizer and annotations) and merges lists by their keys rather than replacing
them whole. Re-applying an unchanged file changes nothing. A client-side two-way merge from kubectl's
``last-applied-configuration`` (what this did before) could do neither of the first two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml
from kubernetes_asyncio import client

from deviceshare.kube import rest

APPLY_PATCH = "application/apply-patch+yaml"  # a JSON body is YAML too
FIELD_MANAGER = "deviceshare"


class ApplyError(Exception):
    """The API refused an object (the message names it and carries the API's reason)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def collection_path(self, namespace: str | None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        return f"{base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{base}/{self.plural}"


class Applier:
    """Applies objects over one ApiClient, remembering what discovery said per apiVersion."""

    def __init__(self, api_client: client.ApiClient, *, default_namespace: str = "default") -> None:
        self._api = api_client
        self._discovered: dict[str, dict[str, Resource]] = {}  # apiVersion -> kind -> Resource
        self.default_namespace = default_namespace

    async def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        try:
            return await rest.call(self._api, method, path, body, content_type=content_type)
        except rest.ApiError as e:
            raise ApplyError(e.message, status=e.status) from e

    async def resource(self, api_version: str, kind: str) -> Resource:
        """The resource serving ``kind``; a fresh discovery is tried before giving up (new CRDs)."""
        for attempt in range(2):
            kinds = self._discovered.get(api_version)
            if kinds is None or attempt:
                path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
                try:
                    listing = await self._request("GET", path)
                except ApplyError as e:
                    if e.status != 404:
                        raise
                    listing = {"resources": []}
                kinds = {
                    r["kind"]: Resource(api_version, r["kind"], r["name"], bool(r.get("namespaced")))
                    for r in listing.get("resources") or []
                    if "/" not in r["name"]  # subresources are listed as plural/sub
                }
                self._discovered[api_version] = kinds
            if kind in kinds:
                return kinds[kind]
        raise ApplyError(f"the API serves no {kind} in {api_version} (is its CRD installed?)", status=404)

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not api_version or not kind or not name:
            raise ApplyError("an object needs apiVersion, kind and metadata.name")
        resource = await self.resource(str(api_version), str(kind))
        namespace = (meta.get("namespace") or self.default_namespace) if resource.namespaced else None
        body = {k: v for k, v in obj.items() if k != "status"}
        body["metadata"] = {**meta, **({"namespace": namespace} if namespace else {})}
        body["metadata"].pop("resourceVersion", None)  # an apply configuration is not a conditional write
        what = f"{kind} {namespace + '/' if namespace else ''}{name}"
        path = (f"{resource.collection_path(namespace)}/{quote(str(name), safe='')}"
                f"?fieldManager={FIELD_MANAGER}&force=true")
        try:
            applied: dict[str, Any] = await self._request("PATCH", path, body, APPLY_PATCH)
        except ApplyError as e:
            raise ApplyError(f"{what}: {e}", status=e.status) from e
        return applied

    async def apply_file(self, path: str | Path) -> list[dict[str, Any]]:
        return [await self.apply(obj) for obj in load(path)]


def load(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a YAML file, in order; ``kind: List`` is flattened, empty documents skipped."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if not isinstance(doc, dict):
            continue
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            out.extend(item for item in doc.get("items") or [] if isinstance(item, dict))
        else:
            out.append(doc)
    return out


async def apply(api_client: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply ``obj`` (created if missing); returns the object as the API stored it."""
    return await Applier(api_client).apply(obj)


async def apply_file(api_client: client.ApiClient, path: str | Path) -> list[dict[str, Any]]:
    """Apply every object in a YAML file, in file order (namespaces and CRDs first, as written)."""
    return await Applier(api_client).apply_file(path)


async def apply_files(api_client: client.ApiClient, paths: list[str | Path]) -> list[dict[str, Any]]:
    """Several files with one discovery cache, one after the other."""
    applier = Applier(api_client)
    results: list[dict[str, Any]] = []
    for path in paths:
        results += await applier.apply_file(path)
    return results
