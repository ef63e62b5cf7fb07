"""Core API semantics as a client sees them: versions, conflicts, errors, generation, subresources."""

from __future__ import annotations

import pytest

from deviceshare.sandbox import Sandbox
from tests.sandbox.helpers import PODS, SDG, Http, pod, sdg


async def test_every_object_and_list_carries_a_growing_resource_version(http: Http) -> None:
    _, first = await http.call("POST", SDG, sdg("a"))
    _, second = await http.call("POST", SDG, sdg("b"))
    _, listing = await http.call("GET", SDG)
    versions = [int(first["metadata"]["resourceVersion"]), int(second["metadata"]["resourceVersion"])]
    assert versions[0] < versions[1] <= int(listing["metadata"]["resourceVersion"])
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    assert first["metadata"]["creationTimestamp"].endswith("Z")
    assert listing["kind"] == "SharedDeviceGroupList"
    assert [i["metadata"]["name"] for i in listing["items"]] == ["a", "b"]


async def test_update_with_a_stale_resource_version_is_a_409_conflict(http: Http) -> None:
    _, created = await http.call("POST", SDG, sdg("g"))
    stale = created["metadata"]["resourceVersion"]
    status, _ = await http.call(
        "PATCH", f"{SDG}/g", {"spec": {"maxMembers": 3}}, content_type="application/merge-patch+json"
    )
    assert status == 200
    body = dict(created, spec={"resources": {"nvidia.com/gpu": 2}})
    status, error = await http.call("PUT", f"{SDG}/g", body)
    assert status == 409
    assert error["kind"] == "Status" and error["reason"] == "Conflict" and error["code"] == 409
    assert "the object has been modified" in error["message"]
    status, error = await http.call(
        "PATCH",
        f"{SDG}/g",
        {"metadata": {"resourceVersion": stale}, "spec": {}},
        content_type="application/merge-patch+json",
    )
    assert (status, error["reason"]) == (409, "Conflict")


async def test_update_with_the_current_resource_version_succeeds(http: Http) -> None:
    _, created = await http.call("POST", SDG, sdg("g"))
    body = dict(created, spec={"resources": {"nvidia.com/gpu": 2}})
    status, updated = await http.call("PUT", f"{SDG}/g", body)
    assert status == 200
    assert updated["spec"]["resources"] == {"nvidia.com/gpu": 2}
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


async def test_create_existing_is_409_already_exists_and_missing_is_404(http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    status, error = await http.call("POST", SDG, sdg("g"))
    assert (status, error["reason"]) == (409, "AlreadyExists")
    assert error["message"] == 'shareddevicegroups.deviceshare.io "g" already exists'
    for method in ("GET", "DELETE", "PUT", "PATCH"):
        body = sdg("nope") if method == "PUT" else ({} if method == "PATCH" else None)
        status, error = await http.call(
            method, f"{SDG}/nope", body, content_type="application/merge-patch+json"
        )
        assert (status, error["reason"], error["details"]["name"]) == (404, "NotFound", "nope"), method


async def test_create_in_a_missing_namespace_is_404(http: Http) -> None:
    status, error = await http.call(
        "POST", "/api/v1/namespaces/ghost/pods", pod("p", metadata={"namespace": "ghost"})
    )
    assert status == 404
    assert error["message"] == 'namespaces "ghost" not found'


async def test_generation_moves_on_spec_changes_only(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", SDG, sdg("g"))
    merge = "application/merge-patch+json"
    _, after_meta = await http.call(
        "PATCH", f"{SDG}/g", {"metadata": {"labels": {"x": "y"}}}, content_type=merge
    )
    _, after_status = await http.call(
        "PATCH", f"{SDG}/g/status", {"status": {"phase": "Pending"}}, content_type=merge
    )
    _, after_spec = await http.call("PATCH", f"{SDG}/g", {"spec": {"maxMembers": 2}}, content_type=merge)
    assert [o["metadata"]["generation"] for o in (after_meta, after_status, after_spec)] == [1, 1, 2]


async def test_status_subresource_splits_writes(http: Http) -> None:
    merge = "application/merge-patch+json"
    _, created = await http.call("POST", SDG, dict(sdg("g"), status={"phase": "Bound"}))
    assert "status" not in created  # status on create is dropped when the CRD has the subresource
    _, main = await http.call(
        "PATCH", f"{SDG}/g", {"spec": {"maxMembers": 5}, "status": {"phase": "Bound"}}, content_type=merge
    )
    assert main["spec"]["maxMembers"] == 5 and "status" not in main
    _, sub = await http.call(
        "PATCH",
        f"{SDG}/g/status",
        {"spec": {"maxMembers": 9}, "status": {"phase": "Bound"}},
        content_type=merge,
    )
    assert sub["spec"]["maxMembers"] == 5 and sub["status"] == {"phase": "Bound"}
    status, _ = await http.call("GET", f"{SDG}/g/status")
    assert status == 200


async def test_noop_write_keeps_the_version(http: Http) -> None:
    _, created = await http.call("POST", SDG, sdg("g"))
    _, same = await http.call(
        "PATCH",
        f"{SDG}/g",
        {"spec": {"resources": {"nvidia.com/gpu": 1}}},
        content_type="application/merge-patch+json",
    )
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_finalizers_hold_deletion_until_removed(sandbox: Sandbox, http: Http) -> None:
    body = sdg("g")
    body["metadata"]["finalizers"] = ["deviceshare.io/devices"]
    await http.call("POST", SDG, body)
    status, marked = await http.call("DELETE", f"{SDG}/g")
    assert status == 200 and marked["metadata"]["deletionTimestamp"]
    assert sandbox.get("sdg", "g", "default") is not None
    status, error = await http.call(
        "PATCH",
        f"{SDG}/g",
        {"metadata": {"finalizers": ["a", "b"]}},
        content_type="application/merge-patch+json",
    )
    assert status == 422 and "no new finalizers" in error["message"]
    await http.call(
        "PATCH", f"{SDG}/g", {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
    )
    assert sandbox.get("sdg", "g", "default") is None


async def test_pod_spec_is_immutable_except_images(http: Http) -> None:
    await http.call("POST", PODS, pod("p"))
    status, error = await http.call(
        "PATCH",
        f"{PODS}/p",
        {"spec": {"nodeName": "gpu-node-0"}},
        content_type="application/merge-patch+json",
    )
    assert status == 422 and "pod updates may not change fields" in error["message"]
    patch = {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}
    status, updated = await http.call(
        "PATCH", f"{PODS}/p", patch, content_type="application/strategic-merge-patch+json"
    )
    assert status == 200 and updated["spec"]["containers"][0]["image"] == "busybox:2"


async def test_deleting_a_namespace_deletes_its_objects(sandbox: Sandbox, http: Http) -> None:
    await http.call("POST", "/api/v1/namespaces", {"metadata": {"name": "team"}})
    await http.call("POST", "/api/v1/namespaces/team/pods", pod("p", metadata={"namespace": "team"}))
    await http.call("DELETE", "/api/v1/namespaces/team")
    assert sandbox.get("pods", "p", "team") is None
    assert sandbox.get("namespaces", "team") is None


async def test_generate_name_gives_a_unique_name(http: Http) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    _, one = await http.call("POST", PODS, body)
    _, two = await http.call("POST", PODS, body)
    assert one["metadata"]["name"].startswith("worker-")
    assert one["metadata"]["name"] != two["metadata"]["name"]


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/api", "APIVersions"),
        ("/apis", "APIGroupList"),
        ("/api/v1", "APIResourceList"),
        ("/apis/deviceshare.io", "APIGroup"),
        ("/apis/deviceshare.io/v1alpha1", "APIResourceList"),
    ],
)
async def test_discovery_documents(http: Http, path: str, kind: str) -> None:
    status, body = await http.call("GET", path)
    assert (status, body["kind"]) == (200, kind)


async def test_discovery_lists_what_kopf_needs(http: Http) -> None:
    _, core = await http.call("GET", "/api/v1")
    names = {r["name"] for r in core["resources"]}
    assert {"namespaces", "pods", "pods/status", "pods/binding", "nodes", "events"} <= names
    _, ext = await http.call("GET", "/apis/apiextensions.k8s.io/v1")
    assert "customresourcedefinitions" in {r["name"] for r in ext["resources"]}
    _, ours = await http.call("GET", "/apis/deviceshare.io/v1alpha1")
    sdgs = next(r for r in ours["resources"] if r["name"] == "shareddevicegroups")
    assert sdgs["shortNames"] == ["sdg"] and sdgs["namespaced"] is True
    assert "shareddevicegroups/status" in {r["name"] for r in ours["resources"]}


async def test_unknown_endpoint_is_a_404_status(http: Http) -> None:
    status, body = await http.call("GET", "/apis/nothing.example/v1/things")
    assert (status, body["kind"], body["code"]) == (404, "Status", 404)


async def test_a_crd_applied_later_becomes_served(sandbox: Sandbox, http: Http) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}
                            },
                        }
                    },
                }
            ],
        },
    }
    status, _ = await http.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert status == 201
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 3},
    }
    status, created = await http.call("POST", "/apis/example.com/v1/widgets", widget)
    assert status == 201 and created["spec"] == {"size": 3}
    await http.call("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    status, _ = await http.call("GET", "/apis/example.com/v1/widgets")
    assert status == 404


async def test_dependents_are_garbage_collected_with_their_owner(sandbox: Sandbox, http: Http) -> None:
    _, owner = await http.call("POST", SDG, sdg("g"))
    ref = {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "name": "g",
        "uid": owner["metadata"]["uid"],
    }
    await http.call("POST", PODS, pod("owned", metadata={"ownerReferences": [ref]}))
    await http.call("POST", PODS, pod("free"))
    await http.call("DELETE", f"{SDG}/g")
    assert [p["metadata"]["name"] for p in sandbox.list("pods", "default")] == ["free"]


async def test_orphan_propagation_keeps_dependents(sandbox: Sandbox, http: Http) -> None:
    _, owner = await http.call("POST", SDG, sdg("g"))
    ref = {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "name": "g",
        "uid": owner["metadata"]["uid"],
    }
    await http.call("POST", PODS, pod("owned", metadata={"ownerReferences": [ref]}))
    await http.call("DELETE", f"{SDG}/g", {"kind": "DeleteOptions", "propagationPolicy": "Orphan"})
    assert sandbox.get("pods", "owned", "default") is not None


async def test_delete_collection_with_a_selector(sandbox: Sandbox, http: Http) -> None:
    for name, team in (("a", "x"), ("b", "y"), ("c", "x")):
        await http.call("POST", PODS, pod(name, metadata={"labels": {"team": team}}))
    status, deleted = await http.call("DELETE", PODS, params={"labelSelector": "team=x"})
    assert status == 200 and [p["metadata"]["name"] for p in deleted["items"]] == ["a", "c"]
    assert [p["metadata"]["name"] for p in sandbox.list("pods", "default")] == ["b"]


async def test_namespaced_objects_are_written_under_their_namespace_only(http: Http) -> None:
    status, _ = await http.call("POST", "/api/v1/pods", pod("p"))
    assert status == 405
    status, listing = await http.call("GET", "/api/v1/pods")
    assert status == 200 and listing["kind"] == "PodList"
