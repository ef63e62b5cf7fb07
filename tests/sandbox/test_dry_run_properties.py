"""Server-side dry run leaves no trace: any mix of real and dry-run writes leaves the store exactly as the
real writes alone would (same objects, same resourceVersions, same watch events), and a dry-run write
answers exactly as the real one would have."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import catalog, errors, store

names = st.sampled_from(["a", "b", "c"])
operations = st.lists(
    st.tuples(
        st.sampled_from(["create", "patch", "finalize", "delete", "delete-namespace"]),
        names,
        st.integers(1, 4),
        st.booleans(),  # dry run?
    ),
    max_size=20,
)
MERGE = "application/merge-patch+json"


def _fresh() -> tuple[store.ObjectStore, list[store.WatchEvent]]:
    objects = store.ObjectStore()
    events: list[store.WatchEvent] = []
    objects.listeners.append(events.append)
    for ns in ("default", "team"):
        objects.create(objects.catalog.lookup("namespaces"), None, {"metadata": {"name": ns}})
    return objects, events


def _apply(objects: store.ObjectStore, op: tuple[str, str, int, bool]) -> Any:
    kind, name, value, _ = op
    cms: catalog.ResourceType = objects.catalog.lookup("configmaps")
    try:
        if kind == "create":
            return _essence(objects.create(cms, "team", {"metadata": {"name": name}, "data": {"n": str(value)}}))
        if kind == "patch":
            return _essence(objects.patch(cms, "team", name, MERGE, {"data": {"n": str(value)}}))
        if kind == "finalize":
            return _essence(objects.patch(cms, "team", name, MERGE, {"metadata": {"finalizers": ["x/y"]}}))
        if kind == "delete":
            return _essence(objects.delete(cms, "team", name))
        return _essence(objects.delete(objects.catalog.lookup("namespaces"), None, "team"))
    except errors.ApiError as e:
        return ("error", e.code)


def _essence(obj: dict[str, Any]) -> tuple[Any, ...]:
    md = obj["metadata"]
    return (md["name"], md.get("resourceVersion"), md.get("generation"), bool(md.get("deletionTimestamp")),
            tuple(md.get("finalizers") or ()), obj.get("data"))


def _state(objects: store.ObjectStore) -> list[tuple[Any, ...]]:
    out = []
    for rtype in objects.catalog:
        for obj in objects.list_objects(rtype)[0]:
            out.append((rtype.plural, store.meta(obj).get("namespace"), *_essence(obj)))
    return sorted(out, key=repr)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_dry_run_writes_leave_no_trace(ops: list[tuple[str, str, int, bool]]) -> None:
    mixed, mixed_events = _fresh()
    real, real_events = _fresh()
    for i, op in enumerate(ops):
        dry = op[3]
        token = store.DRY_RUN.set(dry)
        try:
            answer = _apply(mixed, op)
        finally:
            store.DRY_RUN.reset(token)
        if dry:
            # What the real write would have answered (on a throwaway copy of the real history).
            probe, _ = _fresh()
            for earlier in [o for o in ops[:i] if not o[3]]:
                _apply(probe, earlier)
            expected = _apply(probe, op)
            assert _strip_rv(answer) == _strip_rv(expected)
        else:
            _apply(real, op)
        assert _state(mixed) == _state(real)
        assert mixed.resource_version == real.resource_version
    assert [(e.type, e.rv) for e in mixed_events] == [(e.type, e.rv) for e in real_events]


def _strip_rv(answer: Any) -> Any:
    # A dry-run answer carries the version the write would have had; the probe's history may differ
    # in how many versions its namespaces took, so compare everything else.
    if isinstance(answer, tuple) and answer and answer[0] != "error":
        return (answer[0], *answer[2:])
    return answer
