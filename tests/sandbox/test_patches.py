"""The three patch dialects, table-driven, plus properties that must hold for any input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.sandbox import errors, patches

POD = {
    "spec": {
        "containers": [
            {"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "b", "image": "y"},
        ]
    },
    "metadata": {"finalizers": ["one"]},
}


@pytest.mark.parametrize(
    ("patch", "expected_containers"),
    [
        (
            {"spec": {"containers": [{"name": "b", "image": "z"}]}},
            [("a", "x", ["A=1", "B=2"]), ("b", "z", [])],
        ),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "a", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}
                    ]
                }
            },
            [("a", "x", ["A=1", "B=3", "C=4"]), ("b", "y", [])],
        ),
        (
            {"spec": {"containers": [{"name": "a", "env": [{"name": "A", "$patch": "delete"}]}]}},
            [("a", "x", ["B=2"]), ("b", "y", [])],
        ),
        (
            {"spec": {"containers": [{"name": "c", "image": "new"}]}},
            [("a", "x", ["A=1", "B=2"]), ("b", "y", []), ("c", "new", [])],
        ),
        (
            {
                "spec": {
                    "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                    "containers": [{"name": "b", "image": "q"}],
                }
            },
            [("a", "x", ["A=1", "B=2"]), ("b", "q", [])],
        ),
        ({"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}, [("a", "x", ["A=1", "B=2"])]),
    ],
)
def test_strategic_merge_merges_containers_and_env_by_name(patch: Any, expected_containers: Any) -> None:
    result = patches.apply(patches.STRATEGIC, POD, patch, custom=False)
    got = [
        (c["name"], c["image"], [f"{e['name']}={e['value']}" for e in c.get("env", [])])
        for c in result["spec"]["containers"]
    ]
    assert got == expected_containers
    assert all("$" not in key for c in result["spec"]["containers"] for key in c)


def test_strategic_merge_unions_finalizers_and_deletes_from_primitive_lists() -> None:
    added = patches.apply(patches.STRATEGIC, POD, {"metadata": {"finalizers": ["two"]}}, custom=False)
    assert added["metadata"]["finalizers"] == ["one", "two"]
    removed = patches.apply(
        patches.STRATEGIC, added, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["one"]}}, custom=False
    )
    assert removed["metadata"]["finalizers"] == ["two"]


def test_merge_patch_replaces_lists_whole() -> None:
    result = patches.apply(
        patches.MERGE, POD, {"spec": {"containers": [{"name": "z", "image": "i"}]}}, custom=True
    )
    assert result["spec"]["containers"] == [{"name": "z", "image": "i"}]


def test_json_patch_and_its_errors() -> None:
    result = patches.apply(
        patches.JSON, POD, [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}], custom=True
    )
    assert result["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(errors.ApiError) as failed:
        patches.apply(patches.JSON, POD, [{"op": "remove", "path": "/nope"}], custom=True)
    assert failed.value.code == 422


def test_custom_resources_refuse_strategic_merge_like_the_real_api() -> None:
    with pytest.raises(errors.ApiError) as failed:
        patches.apply(patches.STRATEGIC, {}, {}, custom=True)
    assert failed.value.code == 415


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=4)


@given(json_objects, json_objects)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = patches.merge_patch(target, patch)
    assert patches.merge_patch(once, patch) == once


@given(json_objects, json_objects)
def test_merge_patch_leaves_no_nulls_from_the_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    result = patches.merge_patch(target, patch)
    for key, value in patch.items():
        if value is None:
            assert key not in result
