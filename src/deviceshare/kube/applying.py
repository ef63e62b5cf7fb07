"""Create-or-update arbitrary manifests through the API, the way ``kubectl apply`` finds where they go.

The resource path of a kind is looked up in API discovery (``/api/v1``, ``/apis/GROUP/VERSION``) once
per group-version, so CRD-defined kinds work as soon as they are served. An object that exists is
merge-patched with the manifest (not a three-way apply: enough for the demo and tests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

_MERGE_PATCH = "application/merge-patch+json"


class ApplyError(RuntimeError):
    """The API refused a manifest; the message names the object and the API's reason."""


async def _call(api: client.ApiClient, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, Any]:
    try:
        resp = await api.call_api(
            path, method, header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
        )
    except client.ApiException as e:
        return int(e.status), e.body
    try:
        data = await resp.read()
    finally:
        resp.release()
    return int(resp.status), json.loads(data) if data else None


async def _resource(api: client.ApiClient, api_version: str, kind: str,
                    cache: dict[str, list[dict[str, Any]]]) -> tuple[str, bool]:
    """(plural, namespaced) of ``kind`` from discovery."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if api_version not in cache:
        status, data = await _call(api, "GET", base)
        if status != 200 or not isinstance(data, dict):
            raise ApplyError(f"{api_version} is not served by this cluster (discovery answered {status})")
        cache[api_version] = list(data.get("resources") or [])
    for r in cache[api_version]:
        if r.get("kind") == kind and "/" not in r.get("name", ""):
            return str(r["name"]), bool(r.get("namespaced"))
    raise ApplyError(f"kind {kind} is not served under {api_version}")


async def apply(api: client.ApiClient, obj: Mapping[str, Any],
                _cache: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Create ``obj``, or merge-patch it if it exists. Returns the object as the API stored it."""
    cache = _cache if _cache is not None else {}
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not api_version or not kind or not name:
        raise ApplyError(f"a manifest needs apiVersion, kind and metadata.name: {dict(obj)!r:.200}")
    plural, namespaced = await _resource(api, api_version, kind, cache)
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced:
        base += f"/namespaces/{meta.get('namespace') or 'default'}"  # kubectl's default namespace
    namespace = str(meta.get("namespace") or "default")
    what = f"{kind} {namespace}/{name}" if namespaced else f"{kind} {name}"
    status, data = await _call(api, "POST", f"{base}/{plural}", dict(obj))
    if status == 409:
        status, data = await _call(api, "PATCH", f"{base}/{plural}/{name}", dict(obj), _MERGE_PATCH)
    if status >= 400 or not isinstance(data, dict):
        message = data.get("message") if isinstance(data, dict) else data
        raise ApplyError(f"{what}: {status} {message}")
    return data


async def apply_file(api: client.ApiClient, path: str | Path) -> list[dict[str, Any]]:
    """Apply every document of a YAML file, in order."""
    cache: dict[str, list[dict[str, Any]]] = {}
    text = await asyncio.to_thread(Path(path).read_text)
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    return [await apply(api, d, cache) for d in docs]
