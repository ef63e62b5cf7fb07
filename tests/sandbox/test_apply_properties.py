"""Properties server-side apply must keep for every configuration, checked on random ones.

Driven through the pure steps (``applying.applied`` / ``managedfields.track_update``) that the API
server runs for each apply and update, on a Deployment: a map (labels), a list merged by key
(containers) with an atomic list inside (args), and a scalar (replicas).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import applying, catalog, errors, strategies
from deviceshare.sandbox import fieldsets as fs
from deviceshare.sandbox import managedfields as mf

DEPLOYMENTS = catalog.Catalog().lookup("deployments")
SHAPE = applying.shape_of(DEPLOYMENTS)

_labels = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["1", "2"]), max_size=4)
_container = st.fixed_dictionaries(
    {"name": st.sampled_from(["app", "proxy", "log"]), "image": st.sampled_from(["x:1", "x:2"])},
    optional={"args": st.lists(st.sampled_from(["-v", "-q"]), max_size=2)},
)
_containers = st.lists(_container, max_size=3, unique_by=lambda c: c["name"])


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["replicas"] = draw(st.integers(0, 3))
    containers = draw(_containers)
    if containers:
        spec["template"] = {"spec": {"containers": containers}}
    config: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    labels = draw(_labels)
    if labels:
        config["metadata"]["labels"] = labels
    if spec:
        config["spec"] = spec
    return config


def run(live: dict[str, Any] | None, config: dict[str, Any], manager: str, force: bool = False) -> dict[str, Any]:
    opts = applying.Options(manager, force)
    if live is None:
        obj = applying.created(DEPLOYMENTS, config, opts)
        strategies.meta(obj).update(namespace="default", resourceVersion="1", uid="u")
        return obj
    return applying.applied(DEPLOYMENTS, live, config, opts, None)


def content(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without managedFields and resourceVersion."""
    out = copy.deepcopy(obj)
    for key in ("managedFields", "resourceVersion"):
        out["metadata"].pop(key, None)
    return out


@settings(deadline=None, max_examples=150)
@given(configs(), configs())
def test_applying_the_same_configuration_twice_changes_nothing(first: dict[str, Any], config: dict[str, Any]) -> None:
    live = run(run(None, first, "a"), config, "a", force=True)
    assert run(live, config, "a") == live


@settings(deadline=None, max_examples=150)
@given(configs(), configs())
def test_an_applier_that_owns_alone_ends_with_exactly_its_configuration(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    live = run(run(None, before, "a"), after, "a")
    assert strategies.meta(live).get("labels", {}) == after["metadata"].get("labels", {})
    assert live.get("spec", {}).get("replicas") == after.get("spec", {}).get("replicas")
    got = live.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    wanted = after.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    assert sorted(got, key=lambda c: c["name"]) == sorted(wanted, key=lambda c: c["name"])


@settings(deadline=None, max_examples=150)
@given(configs(), configs(), configs())
def test_a_dropped_field_survives_exactly_when_another_applier_still_owns_it(
    mine: dict[str, Any], theirs: dict[str, Any], later: dict[str, Any]
) -> None:
    live = run(run(None, mine, "a"), theirs, "b", force=True)
    live = run(live, later, "a", force=True)
    labels = strategies.meta(live).get("labels", {})
    owned = {**theirs["metadata"].get("labels", {}), **later["metadata"].get("labels", {})}
    assert set(labels) == set(owned)  # a's dropped labels are gone unless b applies them too


@settings(deadline=None, max_examples=150)
@given(configs(), st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sampled_from(["3", "4"]), min_size=1),
       configs())
def test_a_conflict_changes_nothing_and_names_every_field_it_refuses(
    config: dict[str, Any], edited: dict[str, str], retry: dict[str, Any]
) -> None:
    live = run(None, config, "gitops")
    new = copy.deepcopy(live)
    new["metadata"].setdefault("labels", {}).update(edited)
    mf.track_update(SHAPE, live, new, "kubectl-label", "apps/v1", has_status=True)  # someone relabels
    snapshot = copy.deepcopy(new)
    wanted = retry["metadata"].get("labels", {})
    clashes = {k for k, v in wanted.items() if k in edited and v != edited[k]}
    try:
        result = run(new, retry, "gitops")
    except errors.ApiError as e:
        assert e.code == 409
        assert new == snapshot
        fields = {c["field"] for c in e.details["causes"]}
        assert {f".metadata.labels.{k}" for k in clashes} <= fields
        assert all(c["message"] == 'conflict with "kubectl-label" using apps/v1' for c in e.details["causes"]
                   if c["field"].startswith(".metadata.labels"))
    else:
        assert not clashes
        assert result["metadata"].get("labels", {}).items() >= wanted.items()


@settings(deadline=None, max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), configs()), min_size=1, max_size=5))
def test_managers_own_only_fields_the_object_has(steps: list[tuple[str, dict[str, Any]]]) -> None:
    live: dict[str, Any] | None = None
    for manager, config in steps:
        live = run(live, config, manager, force=True)
    assert live is not None
    present = fs.ensure_named(fs.fieldset(content(live), SHAPE), SHAPE)
    for entry in mf.decode(live["metadata"].get("managedFields")).values():
        assert entry.paths <= present, (entry.manager, entry.paths - present)


def test_fields_v1_round_trips() -> None:
    paths = {("f:metadata", "f:labels", "f:a"), ("f:spec", 'k:{"name":"c"}'), ("f:spec", 'k:{"name":"c"}', "f:image")}
    trie = fs.to_fields_v1(paths)
    assert trie == {"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {'k:{"name":"c"}': {".": {}, "f:image": {}}}}
    assert fs.from_fields_v1(trie) == paths


@pytest.mark.parametrize(("path", "printed"), [
    (("f:spec", "f:replicas"), ".spec.replicas"),
    (("f:spec", 'k:{"containerPort":80,"protocol":"TCP"}', "f:name"), '.spec[containerPort=80,protocol="TCP"].name'),
    (("f:metadata", "f:finalizers", 'v:"x"'), '.metadata.finalizers[="x"]'),
])
def test_paths_print_as_structured_merge_diff_prints_them(path: fs.Path, printed: str) -> None:
    assert fs.path_string(path) == printed


@settings(deadline=None, max_examples=150)
@given(configs(), st.booleans())
def test_a_create_records_what_comparing_with_nothing_records(config: dict[str, Any], status: bool) -> None:
    """The one-walk path for creates gives the set the general compare gives."""
    obj = copy.deepcopy(config)
    if status:
        obj["status"] = {"replicas": 1}
    skip = mf.ignored(True, None)
    assert mf.created_fields_v1(obj, SHAPE, skip) == fs.to_fields_v1(
        fs.without(fs.compare({}, obj, SHAPE).changed, skip))
