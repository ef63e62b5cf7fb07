"""Discovery documents: ``/version``, ``/api``, ``/apis``, per-group and per-version resource lists.

Clients find resources only through these: Kopf needs ``namespaces`` in ``/api/v1`` and the CRD
resource of ``apiextensions.k8s.io`` before it watches anything; kubectl maps ``sdg`` to a URL
through the short names here. Aggregated discovery (``apidiscovery.k8s.io/v2``) is not served:
clients fall back to these legacy documents when they get plain ``application/json``.
"""

from __future__ import annotations

from typing import Any

from deviceshare.sandbox import catalog, errors

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-deviceshare-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def core_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    refs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": refs, "preferredVersion": refs[0]}


def group_list(types: catalog.Catalog) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in sorted(types.groups().items())],
    }


def group(types: catalog.Catalog, name: str) -> dict[str, Any] | None:
    versions = types.groups().get(name)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def resource_list(types: catalog.Catalog, group_name: str, version: str) -> dict[str, Any] | None:
    resources: list[dict[str, Any]] = []
    for rtype in types:
        if rtype.group != group_name or rtype.version != version:
            continue
        entry: dict[str, Any] = {
            "name": rtype.plural,
            "singularName": rtype.singular,
            "namespaced": rtype.namespaced,
            "kind": rtype.kind,
            "verbs": list(rtype.verbs),
        }
        if rtype.short_names:
            entry["shortNames"] = list(rtype.short_names)
        if rtype.categories:
            entry["categories"] = list(rtype.categories)
        resources.append(entry)
        for sub in sorted(rtype.subresources):
            verbs = ["create"] if sub in ("binding", "eviction") else ["get", "patch", "update"]
            kind = {"binding": "Binding", "scale": "Scale", "eviction": "Eviction"}.get(sub, rtype.kind)
            sub_entry: dict[str, Any] = {
                "name": f"{rtype.plural}/{sub}",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            if sub == "scale":  # kubectl scale finds the Scale's group/version here
                sub_entry.update(group="autoscaling", version="v1")
            if sub == "eviction":  # kubectl drain reads which Eviction version to send here
                sub_entry.update(group="policy", version="v1")
            resources.append(sub_entry)
    if not resources:
        return None
    group_version = f"{group_name}/{version}" if group_name else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def root_paths(types: catalog.Catalog) -> dict[str, Any]:
    paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/livez", "/readyz"}
    for name, versions in types.groups().items():
        paths.add(f"/apis/{name}")
        paths.update(f"/apis/{name}/{v}" for v in versions)
    return {"paths": sorted(paths)}


def openapi_v3_root(types: catalog.Catalog) -> dict[str, Any]:
    """The OpenAPI v3 index: one document per group-version (kubectl reads it before applying)."""
    paths = {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1"}}
    for name, versions in types.groups().items():
        for version in versions:
            paths[f"apis/{name}/{version}"] = {"serverRelativeURL": f"/openapi/v3/apis/{name}/{version}"}
    return {"paths": paths}


def openapi_v3_group_version(types: catalog.Catalog, group_name: str, version: str) -> dict[str, Any] | None:
    """A minimal OpenAPI v3 document: the PATCH operations, each declaring the ``fieldValidation``
    query parameter, which tells kubectl to leave validation to the server (no schemas needed)."""
    paths: dict[str, Any] = {}
    for rtype in types:
        if rtype.group != group_name or rtype.version != version:
            continue
        prefix = f"/apis/{rtype.group}/{rtype.version}" if rtype.group else "/api/v1"
        scope = "/namespaces/{namespace}" if rtype.namespaced else ""
        gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
        params = [
            {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for n in ("fieldValidation", "dryRun", "fieldManager")
        ]
        paths[f"{prefix}{scope}/{rtype.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{rtype.kind}",
                "parameters": params,
                "responses": {},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
            },
        }
    if not paths:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (deviceshare sandbox)", "version": VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }


def document(types: catalog.Catalog, path: str) -> dict[str, Any] | None:
    """The discovery, version, health or OpenAPI document served at ``path`` (no trailing slash);
    None for a path of the resource API. A document path that names nothing served is a 404."""
    if path == "/":
        return root_paths(types)
    if path == "/version":
        return VERSION
    if path == "/api":
        return core_versions()
    if path == "/apis":
        return group_list(types)
    parts = path.strip("/").split("/")
    if parts[0] in ("healthz", "livez", "readyz"):
        return {"status": "ok"}
    found: dict[str, Any] | None = None
    if parts[0] == "openapi":
        if parts == ["openapi", "v3"]:
            return openapi_v3_root(types)
        if parts[:2] == ["openapi", "v3"] and len(parts) in (4, 5):
            group_name, version = ("", parts[3]) if parts[2] == "api" else (parts[3], parts[-1])
            found = openapi_v3_group_version(types, group_name, version)
        if found is None:
            raise errors.endpoint_not_found()
        return found
    if parts == ["api", "v1"]:
        found = resource_list(types, "", "v1")
    elif len(parts) == 2 and parts[0] == "apis":
        found = group(types, parts[1])
        if found is None:
            raise errors.endpoint_not_found()
    elif len(parts) == 3 and parts[0] == "apis":
        found = resource_list(types, parts[1], parts[2])
        if found is None:
            raise errors.endpoint_not_found()
    return found
