"""Server-side apply through the sandbox's HTTP API, answered as kube-apiserver answers it.

Each test is what an applier (Helm 4, ``kubectl apply --server-side``, Flux) sees: the object created
when absent, ``managedFields`` per manager and operation, a 409 that names the field and the other
manager (and changes nothing), ``force`` taking the field over, a dropped field removed unless another
manager still owns it, lists merged by their keys, ``dryRun=All``.
"""

from __future__ import annotations

from typing import Any

import yaml

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import Http, sdg

APPLY = "application/apply-patch+yaml"
CM = "/api/v1/namespaces/default/configmaps"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
SDG_PATH = "/apis/deviceshare.io/v1alpha1/namespaces/default/shareddevicegroups"


async def apply(http: Http, path: str, body: dict[str, Any], manager: str, **params: str) -> tuple[int, Any]:
    """A YAML apply body, as kubectl sends it."""
    async with http.session.patch(http.base + path, data=yaml.safe_dump(body),
                                  params={"fieldManager": manager, **params},
                                  headers={"Content-Type": APPLY}) as r:
        return r.status, await r.json()


def configmap(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
            "data": data}


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


async def test_apply_creates_then_merges_and_a_repeat_changes_nothing(http: Http) -> None:
    status, created = await apply(http, f"{CM}/cfg", configmap(a="1"), "deploy-tool")
    assert status == 201, created
    assert created["data"] == {"a": "1"}
    [entry] = created["metadata"]["managedFields"]
    assert {k: entry[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": "deploy-tool", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1"}
    assert entry["fieldsV1"] == {"f:data": {"f:a": {}}}
    status, again = await apply(http, f"{CM}/cfg", configmap(a="1"), "deploy-tool")
    assert status == 200
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_apply_needs_a_field_manager_and_only_apply_takes_force(http: Http) -> None:
    async with http.session.patch(http.base + f"{CM}/cfg", data="{}", headers={"Content-Type": APPLY}) as r:
        body = await r.json()
    assert r.status == 422
    assert body["message"] == ('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                               "is required for apply patch")
    status, body = await http.call("PATCH", f"{CM}/cfg", {"data": {}}, content_type="application/merge-patch+json",
                                   params={"force": "true"})
    assert status == 422 and "force: Forbidden: may not be specified for non-apply patch" in body["message"]


async def test_a_conflict_names_field_and_manager_changes_nothing_and_force_takes_over(http: Http) -> None:
    await apply(http, f"{CM}/cfg", configmap(a="1", b="1"), "gitops")
    status, edited = await http.call("PATCH", f"{CM}/cfg", {"data": {"a": "2"}},
                                     content_type="application/merge-patch+json",
                                     params={"fieldManager": "kubectl-edit"})
    assert status == 200
    assert managers(edited)[("kubectl-edit", "Update")] == {"f:data": {"f:a": {}}}
    assert managers(edited)[("gitops", "Apply")] == {"f:data": {"f:b": {}}}  # a is no longer gitops's
    status, refused = await apply(http, f"{CM}/cfg", configmap(a="1", b="1"), "gitops")
    assert status == 409 and refused["reason"] == "Conflict"
    assert refused["message"] == 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.a'
    assert refused["details"]["causes"] == [
        {"type": "FieldManagerConflict", "message": 'conflict with "kubectl-edit" using v1', "field": ".data.a"}]
    status, unchanged = await http.call("GET", f"{CM}/cfg")
    assert unchanged == edited
    status, forced = await apply(http, f"{CM}/cfg", configmap(a="1", b="1"), "gitops", force="true")
    assert status == 200 and forced["data"] == {"a": "1", "b": "1"}
    assert set(managers(forced)) == {("gitops", "Apply")}  # the editor owned nothing else


async def test_a_dropped_field_goes_unless_another_manager_owns_it(http: Http) -> None:
    await apply(http, f"{CM}/cfg", configmap(a="1", shared="s", mine="m"), "first")
    await apply(http, f"{CM}/cfg", configmap(shared="s", theirs="t"), "second")  # same value: co-owned
    _, dropped = await apply(http, f"{CM}/cfg", configmap(a="1"), "first")
    assert dropped["data"] == {"a": "1", "shared": "s", "theirs": "t"}
    _, left = await apply(http, f"{CM}/cfg", configmap(theirs="t"), "second")
    assert left["data"] == {"a": "1", "theirs": "t"}


def deployment(*containers: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "d"}},
        "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": list(containers)}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"},
            "spec": spec}


def names_and_images(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["name"], c["image"]) for c in obj["spec"]["template"]["spec"]["containers"]]


async def test_built_in_lists_merge_by_their_keys_and_atomic_lists_conflict(http: Http) -> None:
    await apply(http, f"{DEPLOY}/d", deployment({"name": "app", "image": "app:1", "args": ["--a"]}), "team")
    _, both = await apply(http, f"{DEPLOY}/d", deployment({"name": "proxy", "image": "proxy:1"}), "mesh")
    assert names_and_images(both) == [("app", "app:1"), ("proxy", "proxy:1")]
    _, upgraded = await apply(http, f"{DEPLOY}/d", deployment({"name": "app", "image": "app:2", "args": ["--a"]}),
                              "team")
    assert names_and_images(upgraded) == [("app", "app:2"), ("proxy", "proxy:1")]
    status, refused = await apply(http, f"{DEPLOY}/d", deployment({"name": "app", "image": "app:2", "args": ["--b"]}),
                                  "mesh")
    assert status == 409, refused
    assert refused["details"]["causes"][0]["field"] == '.spec.template.spec.containers[name="app"].args'
    _, removed = await apply(http, f"{DEPLOY}/d", deployment(), "team")
    assert names_and_images(removed) == [("proxy", "proxy:1")]


async def test_custom_resource_conditions_merge_by_type_through_the_status_subresource(
    sandbox: Sandbox, http: Http
) -> None:
    sandbox.create(sdg("g"))

    def status_of(*types: str) -> dict[str, Any]:
        return {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
                "metadata": {"name": "g", "namespace": "default"},
                "status": {"conditions": [{"type": t, "status": "True", "reason": t} for t in types]}}

    status, first = await apply(http, f"{SDG_PATH}/g/status", status_of("Scheduled"), "operator")
    assert status == 200, first
    _, both = await apply(http, f"{SDG_PATH}/g/status", status_of("Audited"), "auditor")
    assert [c["type"] for c in both["status"]["conditions"]] == ["Scheduled", "Audited"]
    assert both["metadata"]["managedFields"][0]["subresource"] == "status"
    _, dropped = await apply(http, f"{SDG_PATH}/g/status", status_of(), "operator")
    assert [c["type"] for c in dropped["status"]["conditions"]] == ["Audited"]
    assert dropped["spec"] == sandbox.get("sdg", "g", "default")["spec"]  # a status apply leaves the spec


async def test_dry_run_apply_answers_as_if_stored_and_stores_nothing(sandbox: Sandbox, http: Http) -> None:
    status, answered = await apply(http, f"{CM}/cfg", configmap(a="1"), "ci", dryRun="All")
    assert status == 201 and answered["data"] == {"a": "1"}
    assert sandbox.get("configmaps", "cfg", "default") is None
    await apply(http, f"{CM}/cfg", configmap(a="1"), "ci")
    before = sandbox.get("configmaps", "cfg", "default")
    status, answered = await apply(http, f"{CM}/cfg", configmap(a="2"), "ci", dryRun="All")
    assert status == 200 and answered["data"] == {"a": "2"}
    assert sandbox.get("configmaps", "cfg", "default") == before


async def test_a_stale_resource_version_in_the_configuration_is_a_conflict(http: Http) -> None:
    _, created = await apply(http, f"{CM}/cfg", configmap(a="1"), "ci")
    await apply(http, f"{CM}/cfg", configmap(a="2"), "ci")
    stale = configmap(a="3")
    stale["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    status, refused = await apply(http, f"{CM}/cfg", stale, "ci")
    assert status == 409 and "the object has been modified" in refused["message"]


async def test_creates_and_updates_are_owned_by_their_writer(http: Http) -> None:
    status, created = await http.call("POST", CM, configmap(a="1"), params={"fieldManager": "kubectl-create"})
    assert status == 201
    assert managers(created) == {("kubectl-create", "Update"): {"f:data": {".": {}, "f:a": {}}}}
    status, updated = await http.call("PATCH", f"{CM}/cfg", {"data": {"b": "2"}},
                                      content_type="application/merge-patch+json",
                                      headers={"User-Agent": "kopf/1.45 (linux)"})
    assert managers(updated)[("kopf", "Update")] == {"f:data": {"f:b": {}}}


async def test_an_object_nobody_owns_yet_is_first_owned_before_first_apply(sandbox: Sandbox, http: Http) -> None:
    sandbox.create(configmap(a="1"))  # written in-process: no managedFields, like an object from before SSA
    status, refused = await apply(http, f"{CM}/cfg", configmap(a="2"), "gitops")
    assert status == 409
    assert refused["message"].endswith('conflict with "before-first-apply" using v1: .data.a')
