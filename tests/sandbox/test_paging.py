"""Lists in pages (``limit`` / ``continue``): every object exactly once, at the first page's resourceVersion, and
a forgotten token answered 410 Gone, as kube-apiserver does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import Sandbox, paging
from tests.sandbox.helpers import Http

NS = "paged"


def configmap(name: str, team: str = "a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS,
                                                                  "labels": {"team": team}}}


async def pages(http: Http, limit: int, **params: str) -> tuple[list[list[str]], list[str]]:
    """The names on each page, and each page's resourceVersion."""
    names: list[list[str]] = []
    versions: list[str] = []
    token = None
    while True:
        query = {"limit": str(limit), **params, **({"continue": token} if token else {})}
        status, body = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps", params=query)
        assert status == 200, body
        names.append([i["metadata"]["name"] for i in body["items"]])
        versions.append(body["metadata"]["resourceVersion"])
        token = body["metadata"].get("continue")
        if not token:
            return names, versions


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(0, 40), limit=st.integers(1, 12))
async def test_pages_hold_every_object_once_in_order(sandbox: Sandbox, http: Http, count: int, limit: int) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}) if not sandbox.get(
        "namespaces", NS) else None
    for cm in sandbox.list("configmaps", NS):
        sandbox.delete("configmaps", cm["metadata"]["name"], NS)
    for i in range(count):
        sandbox.create(configmap(f"cm-{i:03d}"))
    got, versions = await pages(http, limit)
    assert [n for page in got for n in page] == [f"cm-{i:03d}" for i in range(count)]
    assert all(len(page) <= limit for page in got) and len(set(versions)) == 1


async def test_changes_while_paging_are_left_to_the_watch_and_selectors_fill_pages(
    sandbox: Sandbox, http: Http
) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(10):
        sandbox.create(configmap(f"cm-{i}", team="a" if i % 2 else "b"))
    status, first = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps", params={"limit": "4"})
    assert status == 200 and [i["metadata"]["name"] for i in first["items"]] == ["cm-0", "cm-1", "cm-2", "cm-3"]
    sandbox.delete("configmaps", "cm-5", NS)  # after the first page: not in a later one
    sandbox.create(configmap("cm-50"))  # created after the first page: the watch from its version shows it
    status, rest = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps",
                                   params={"limit": "100", "continue": first["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in rest["items"]] == ["cm-4", "cm-6", "cm-7", "cm-8", "cm-9"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    got, _ = await pages(http, 2, labelSelector="team=a")
    assert got == [["cm-1", "cm-3"], ["cm-50", "cm-7"], ["cm-9"]]  # a selector does not leave pages short


async def test_a_forgotten_token_is_410_gone_and_a_malformed_one_400(sandbox: Sandbox, http: Http) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(3):
        sandbox.create(configmap(f"cm-{i}"))
    _, first = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps", params={"limit": "1"})
    token = first["metadata"]["continue"]
    for _ in range(paging.KEPT):  # later lists push its snapshot out
        await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps", params={"limit": "1"})
    status, body = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps",
                                   params={"limit": "1", "continue": token})
    assert (status, body["reason"]) == (410, "Expired")
    status, _ = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps",
                                params={"limit": "1", "continue": "not-a-token"})
    assert status == 400


@pytest.mark.parametrize("limit", ["0", ""])
async def test_no_limit_is_the_whole_list(sandbox: Sandbox, http: Http, limit: str) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for i in range(3):
        sandbox.create(configmap(f"cm-{i}"))
    status, body = await http.call("GET", f"/api/v1/namespaces/{NS}/configmaps", params={"limit": limit})
    assert status == 200 and len(body["items"]) == 3 and "continue" not in body["metadata"]
