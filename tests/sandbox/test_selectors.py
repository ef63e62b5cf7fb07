"""Label and field selectors with the real grammar, over HTTP and as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.sandbox import Sandbox, errors, selectors
from tests.sandbox.helpers import PODS, Http, pod

LABELS = {"app": "web", "tier": "gpu", "env": "prod"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("app!=web", False),
        ("tier in (gpu, cpu)", True),
        ("tier in (cpu)", False),
        ("tier notin (cpu)", True),
        ("tier notin (gpu)", False),
        ("env", True),
        ("missing", False),
        ("!missing", True),
        ("!env", False),
        ("app=web,tier in (gpu),!missing", True),
        ("app=web,env=dev", False),
        ("missing!=x", True),
        ("", True),
    ],
)
def test_label_selector_grammar(selector: str, matches: bool) -> None:
    assert selectors.parse_labels(selector).matches(LABELS) is matches


@pytest.mark.parametrize("bad", ["app in gpu", "a=b=c", "!a=b", "(x)"])
def test_malformed_label_selectors_are_400(bad: str) -> None:
    with pytest.raises(errors.ApiError) as failed:
        selectors.parse_labels(bad)
    assert failed.value.code == 400


label_keys = st.sampled_from(["a", "b", "c"])
label_values = st.sampled_from(["x", "y", "z"])


@given(st.dictionaries(label_keys, label_values), label_keys, label_values)
def test_equality_and_inequality_are_complements(labels: dict[str, str], key: str, value: str) -> None:
    eq = selectors.parse_labels(f"{key}={value}").matches(labels)
    ne = selectors.parse_labels(f"{key}!={value}").matches(labels)
    assert eq != ne
    assert eq == (labels.get(key) == value)


@given(st.dictionaries(label_keys, label_values), label_keys, st.sets(label_values, min_size=1))
def test_in_and_notin_are_complements(labels: dict[str, str], key: str, values: set[str]) -> None:
    listed = ",".join(sorted(values))
    assert selectors.parse_labels(f"{key} in ({listed})").matches(labels) != selectors.parse_labels(
        f"{key} notin ({listed})"
    ).matches(labels)


def test_label_selector_objects_of_webhooks() -> None:
    selector = selectors.from_object(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu"]},
                {"key": "x", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches(LABELS)
    assert not selector.matches({"app": "web"})


async def test_field_and_label_selectors_over_http(sandbox: Sandbox, http: Http) -> None:
    for name, node, scheduler, labels in [
        ("a", "gpu-node-0", "deviceshare-scheduler", {"app": "web"}),
        ("b", "gpu-node-1", "default-scheduler", {"app": "db"}),
        ("c", None, "deviceshare-scheduler", {}),
    ]:
        await http.call("POST", PODS, pod(name, schedulerName=scheduler, metadata={"labels": labels}))
        if node:
            sandbox.bind("default", name, node)

    async def names(**params: str) -> list[str]:
        status, body = await http.call("GET", PODS, params=params)
        assert status == 200, body
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names(fieldSelector="spec.nodeName=gpu-node-0") == ["a"]
    assert await names(fieldSelector="spec.nodeName=") == ["c"]
    assert await names(fieldSelector="spec.schedulerName=deviceshare-scheduler,spec.nodeName!=") == ["a"]
    assert await names(fieldSelector="metadata.name=b") == ["b"]
    assert await names(fieldSelector="metadata.namespace=default,status.phase!=Succeeded") == ["a", "b", "c"]
    sandbox.complete_pod("default", "b")
    assert await names(fieldSelector="status.phase=Succeeded") == ["b"]
    assert await names(labelSelector="app in (web,db)") == ["a", "b"]
    assert await names(labelSelector="!app") == ["c"]
    status, error = await http.call("GET", PODS, params={"fieldSelector": "spec.image=x"})
    assert status == 400 and error["message"] == "field label not supported: spec.image"
