"""A list's body decoded item by item gives exactly what decoding it whole gives, whatever its items' strings hold
(braces, ``},{``, ``"items":[``, escapes), in either order of its fields, compact or not."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.kube import listbodies

# Strings that would mislead a splitter that does not know where strings are.
TRICKY = st.sampled_from(["{", "}", "},{", "}]", '"items":[', '\\"', "[{", "\\", '{"metadata":', "é", "\n"])
TEXT = st.lists(st.one_of(TRICKY, st.text(max_size=5)), max_size=4).map("".join)
VALUES: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=12,
)
ITEM = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": TEXT})},
    optional={"spec": st.dictionaries(TEXT, VALUES, max_size=3),
              "status": st.lists(st.dictionaries(TEXT, VALUES, max_size=2), max_size=3)},
)
# Most items open with "metadata" (as kube-apiserver writes them); some with another key.
ITEMS = st.lists(st.one_of(ITEM, ITEM.map(lambda i: {"kind": "Pod", **i})), max_size=6)


def _decoded(body: bytes) -> tuple[list[Any], dict[str, Any]]:
    found = listbodies.ListBody(body)
    items = list(found.items())
    return items, found.head


@settings(max_examples=300, deadline=None)
@given(ITEMS, TEXT, st.booleans())
def test_each_item_is_decoded_as_the_whole_body_decodes_it(items: list[Any], version: str, sorted_keys: bool) -> None:
    meta = {"resourceVersion": version, "continue": version}
    # A built-in kind's list has its metadata first; a custom resource's its keys sorted (metadata last).
    doc = ({"apiVersion": "v1", "items": items, "kind": "PodList", "metadata": meta} if sorted_keys
           else {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})
    body = orjson.dumps(doc)
    got, head = _decoded(body)
    assert got == items
    assert head == {k: v for k, v in doc.items() if k != "items"}


@settings(max_examples=50, deadline=None)
@given(ITEMS)
def test_an_indented_body_is_decoded_whole_with_the_same_result(items: list[Any]) -> None:
    doc = {"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": items}
    got, head = _decoded(json.dumps(doc, indent=2).encode())
    assert got == items and head == {"kind": "PodList", "metadata": {"resourceVersion": "7"}}


def test_an_item_whose_strings_unbalance_the_braces_is_found_by_its_strings() -> None:
    items = [{"metadata": {"name": f"p{i}"}, "spec": {"args": ["{" * i, "},{" * i]}} for i in range(5)]
    body = orjson.dumps({"metadata": {"resourceVersion": "3"}, "items": items})
    assert _decoded(body) == (items, {"metadata": {"resourceVersion": "3"}})


def test_the_metadata_of_a_list_is_there_before_its_items_when_it_is_written_first() -> None:
    body = orjson.dumps({"metadata": {"continue": "next"}, "items": [{"metadata": {}}]})
    found = listbodies.ListBody(body)
    assert found.head == {"metadata": {"continue": "next"}}  # the next page can be asked for at once
    assert list(found.items()) == [{"metadata": {}}]
