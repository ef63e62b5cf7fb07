"""``deviceshare.kube.applying`` applies objects server-side: what the file names is made so again, what others
own is kept, and re-applying an unchanged file writes nothing. Against the sandbox, which serves server-side apply
with managedFields as kube-apiserver does (``sandbox/applying.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.kube import applying, connecting
from deviceshare.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Sandbox, applying.Applier]]:
    async with Sandbox(nodes=0, kubeconfig_path=tmp_path / "kubeconfig") as sandbox:
        api = await connecting.api_client(str(sandbox.kubeconfig))
        try:
            yield sandbox, applying.Applier(api)
        finally:
            await api.close()


def configmap(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
            "data": dict(data)}


async def test_a_field_changed_live_is_set_back_and_others_fields_are_kept(
    cluster: tuple[Sandbox, applying.Applier],
) -> None:
    sandbox, applier = cluster
    await applier.apply(configmap(a="1", b="2"))
    # Someone edits a field the file names, and adds one of their own (kubectl edit: a merge patch).
    sandbox.patch("configmaps", "cfg", {"data": {"a": "changed", "theirs": "x"}}, "default")
    applied = await applier.apply(configmap(a="1", b="2"))
    assert applied["data"] == {"a": "1", "b": "2", "theirs": "x"}
    assert sandbox.get("configmaps", "cfg", "default")["data"] == {"a": "1", "b": "2", "theirs": "x"}


async def test_a_field_dropped_from_the_file_is_removed_and_an_unchanged_file_writes_nothing(
    cluster: tuple[Sandbox, applying.Applier],
) -> None:
    _, applier = cluster
    await applier.apply(configmap(a="1", b="2"))
    second = await applier.apply(configmap(a="1"))
    assert second["data"] == {"a": "1"}
    again = await applier.apply(configmap(a="1"))
    assert again["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]
    managers = {m["manager"] for m in again["metadata"]["managedFields"]}
    assert managers == {applying.FIELD_MANAGER}


async def test_an_example_applies_and_reapplies(cluster: tuple[Sandbox, applying.Applier]) -> None:
    _, applier = cluster
    example = ROOT / "examples" / "trainer-evaluator.yaml"
    first = await applier.apply_file(example)
    assert [o["kind"] for o in first][:2] == ["Namespace", "SharedDeviceGroup"]
    # (The sandbox's Namespace, made with no managedFields, is adopted once at the second apply: see its
    # "before-first-apply" manager in sandbox/managedfields.py.)
    again = await applier.apply_file(example)
    third = await applier.apply_file(example)
    def versions(objects: list[dict[str, Any]]) -> list[str]:
        return [o["metadata"]["resourceVersion"] for o in objects]

    assert versions(again) == versions(third) and versions(first[1:]) == versions(again[1:])


def test_load_keeps_file_order_and_flattens_lists(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text("---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n"
                    "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n"
                    "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n")
    assert [o["metadata"]["name"] for o in applying.load(path)] == ["a", "b", "c"]
    kinds = [o["kind"] for o in applying.load(ROOT / "examples" / "trainer-evaluator.yaml")]
    assert kinds[:2] == ["Namespace", "SharedDeviceGroup"]
