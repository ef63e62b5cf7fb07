"""Apply YAML objects through the API the way client-side ``kubectl apply`` does.

Used by the demo and the end-to-end tests to put ``examples/*.yaml`` on a cluster: the resource
(plural, namespaced or not) of each ``apiVersion``/``kind`` comes from the API's discovery
endpoints, so CRDs work as soon as the API serves them. A new object is created with kubectl's
``last-applied-configuration`` annotation; an existing one (409) gets the JSON merge patch from
that annotation to the file, so only what the file changed since the last apply is sent: fields
others set (the webhook's env, the operator's annotations) are kept, a field removed from the file
is removed, and re-applying an unchanged file is a no-op.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from deviceshare.kube import rest

MERGE_PATCH = "application/merge-patch+json"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # kubectl's, so both tools agree


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
        body["metadata"].pop("resourceVersion", None)
        applied = json.dumps(_without_last_applied(body), sort_keys=True, separators=(",", ":"))
        body["metadata"]["annotations"] = {**(meta.get("annotations") or {}), LAST_APPLIED: applied}
        what = f"{kind} {namespace + '/' if namespace else ''}{name}"
        path = resource.collection_path(namespace)
        try:
            created: dict[str, Any] = await self._request("POST", path, body)
            return created
        except ApplyError as e:
            if e.status != 409:
                raise ApplyError(f"{what}: {e}", status=e.status) from e
        try:
            live: dict[str, Any] = await self._request("GET", f"{path}/{name}")
            previous = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
            # Without a previous apply, everything in the file is "changed" (kubectl does the same).
            patch = merge_patch(json.loads(previous) if previous else {}, _without_last_applied(body))
            if previous != applied:
                patch.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = applied
            if not patch:
                return live
            patched: dict[str, Any] = await self._request("PATCH", f"{path}/{name}", patch, MERGE_PATCH)
        except ApplyError as e:
            raise ApplyError(f"{what}: {e}", status=e.status) from e
        return patched

    async def apply_file(self, path: str | Path) -> list[dict[str, Any]]:
        return [await self.apply(obj) for obj in load(path)]


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``before`` into ``after`` (empty when they are equal)."""
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            nested = merge_patch(old, value)
            if nested:
                patch[key] = nested
        elif key not in before or _canonical(old) != _canonical(value):
            patch[key] = value
    return patch


def _canonical(value: Any) -> str:
    # JSON's equality, not Python's (True == 1 in Python, not in JSON).
    return json.dumps(value, sort_keys=True)


def _without_last_applied(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {**obj, "metadata": meta}


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
    """Create ``obj``, or merge-patch it if it exists; returns the object as the API stored it."""
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
