"""Properties of the store under random writes: what list+watch clients (Kopf, informers) rely on."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import catalog, errors, selectors, store

names = st.sampled_from(["a", "b", "c"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), names, st.integers(1, 4)),
        st.tuples(st.just("patch-spec"), names, st.integers(1, 4)),
        st.tuples(st.just("patch-labels"), names, st.sampled_from(["x", "y"])),
        st.tuples(st.just("stale-update"), names, st.integers(1, 4)),
        st.tuples(st.just("finalize"), names, st.just(0)),
        st.tuples(st.just("unfinalize"), names, st.just(0)),
        st.tuples(st.just("delete"), names, st.just(0)),
    ),
    max_size=25,
)


def _fresh() -> tuple[store.ObjectStore, catalog.ResourceType]:
    objects = store.ObjectStore()
    objects.create(objects.catalog.lookup("namespaces"), None, {"metadata": {"name": "default"}})
    return objects, objects.catalog.lookup("configmaps")


def _apply(objects: store.ObjectStore, rtype: catalog.ResourceType, op: tuple[str, str, Any]) -> None:
    kind, name, value = op
    merge = "application/merge-patch+json"
    try:
        if kind == "create":
            objects.create(rtype, "default", {"metadata": {"name": name}, "data": {"n": str(value)}})
        elif kind == "patch-spec":
            objects.patch(rtype, "default", name, merge, {"data": {"n": str(value)}})
        elif kind == "patch-labels":
            objects.patch(rtype, "default", name, merge, {"metadata": {"labels": {"l": value}}})
        elif kind == "stale-update":
            current = objects.get(rtype, "default", name)
            current["metadata"]["resourceVersion"] = "1"
            objects.replace(rtype, "default", name, dict(current, data={"n": str(value)}))
        elif kind == "finalize":
            objects.patch(rtype, "default", name, merge, {"metadata": {"finalizers": ["keep"]}})
        elif kind == "unfinalize":
            objects.patch(rtype, "default", name, merge, {"metadata": {"finalizers": None}})
        else:
            objects.delete(rtype, "default", name)
    except errors.ApiError as e:
        assert e.code in (404, 409, 422), e.status()


@settings(max_examples=60, deadline=None)
@given(operations)
def test_replaying_the_watch_from_the_start_rebuilds_the_list(ops: list[tuple[str, str, Any]]) -> None:
    objects, rtype = _fresh()
    start = int(objects.resource_version)
    for op in ops:
        _apply(objects, rtype, op)
    _, events = objects.subscribe(rtype.key, start)
    state: dict[str, dict[str, Any]] = {}
    last = start
    for event in events:
        assert event.rv > last  # one monotonic counter, strictly increasing along the stream
        last = event.rv
        name = event.obj["metadata"]["name"]
        if event.type == "DELETED":
            state.pop(name)
        else:
            assert (event.type == "ADDED") == (name not in state)
            state[name] = event.obj
    items, list_rv = objects.list_objects(rtype, "default")
    assert {i["metadata"]["name"]: i for i in items} == state
    assert int(list_rv) >= last


@settings(max_examples=40, deadline=None)
@given(operations, operations)
def test_cached_list_json_always_matches_the_objects(first: list[Any], second: list[Any]) -> None:
    objects, rtype = _fresh()
    everything = (selectors.LabelSelector(), selectors.FieldSelector())
    for ops in (first, second):
        for op in ops:
            _apply(objects, rtype, op)
        encoded, _ = objects.list_encoded(rtype, "default", *everything)  # fills the cache, then rechecked
        assert [json.loads(e) for e in encoded] == objects.list_objects(rtype, "default")[0]


@settings(max_examples=60, deadline=None)
@given(operations)
def test_stale_writes_never_land_and_versions_match_their_events(ops: list[tuple[str, str, Any]]) -> None:
    objects, rtype = _fresh()
    for op in ops:
        before = {i["metadata"]["name"]: i for i in objects.list_objects(rtype, "default")[0]}
        _apply(objects, rtype, op)
        after = {i["metadata"]["name"]: i for i in objects.list_objects(rtype, "default")[0]}
        if op[0] == "stale-update":
            assert after == before
        for obj in after.values():
            assert int(obj["metadata"]["resourceVersion"]) <= int(objects.resource_version)
            assert obj["metadata"]["generation"] >= 1
