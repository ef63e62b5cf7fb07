"""The webhook configurations: valid for Kubernetes, what the base ships, and calling the webhook when they should."""

from __future__ import annotations

import base64
from typing import Any

import celpy
import kubernetes_validate
import pytest

from deviceshare.api import names
from deviceshare.webhooks import configuration

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    "kwargs",
    [{"service_name": "deviceshare-webhook"}, {"url": "https://127.0.0.1:8443"}],
    ids=["service", "url"],
)
def test_validates_against_the_kubernetes_schema(kwargs: dict[str, Any]) -> None:
    body = configuration.build(ca_bundle=CA, **kwargs)
    kubernetes_validate.validate(body, "1.32.0", strict=True)


def test_safety_settings() -> None:
    hook, _ = configuration.build(ca_bundle=CA, service_name="wh", service_namespace="gpu-ops")["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] <= 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["rules"][0]["operations"] == ["CREATE"]
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn"
    assert set(expr["values"]) == {"kube-system", "gpu-ops"}
    assert hook["clientConfig"]["service"] == {
        "name": "wh",
        "namespace": "gpu-ops",
        "path": "/mutate-pods",
        "port": 443,
    }
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA


def test_url_form_points_at_the_mutate_path() -> None:
    pods, groups = configuration.build(ca_bundle="Q0E=", url="https://127.0.0.1:9443/")["webhooks"]
    assert pods["clientConfig"] == {"caBundle": "Q0E=", "url": "https://127.0.0.1:9443/mutate-pods"}
    assert groups["clientConfig"] == {"caBundle": "Q0E=", "url": "https://127.0.0.1:9443/mutate-groups"}


@pytest.mark.parametrize(
    "kwargs", [{}, {"service_name": "a", "url": "https://x"}, {"service_name": "a", "timeout_seconds": 10}]
)
def test_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        configuration.build(ca_bundle=CA, **kwargs)


@pytest.mark.parametrize("build", [configuration.build, configuration.build_group_validation])
def test_a_misspelt_setting_is_refused_by_name(build: Any) -> None:
    with pytest.raises(TypeError, match="timeout_second"):
        build(ca_bundle=CA, service_name="wh", timeout_second=10)


@pytest.mark.parametrize(
    ("metadata", "matches"),
    [
        ({"name": "p"}, False),
        ({"name": "p", "annotations": {"other": "x"}}, False),
        ({"name": "p", "annotations": {names.POD_GROUP_ANNOTATION: "trainer"}}, True),
        ({"name": "p", "annotations": {names.POD_GROUP_ANNOTATION: ""}}, True),  # the webhook denies it
    ],
)
def test_match_condition_selects_opted_in_pods(metadata: dict[str, Any], matches: bool) -> None:
    hook, _ = configuration.build(ca_bundle=CA, service_name="wh")["webhooks"]
    (condition,) = hook["matchConditions"]
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))
    result = program.evaluate({"object": celpy.json_to_cel({"metadata": metadata, "spec": {}})})
    assert bool(result) is matches


@pytest.mark.parametrize(("build", "file"), [
    (configuration.build, "mutating-webhook.yaml"), (configuration.build_group_validation, "validating-webhook.yaml"),
])
def test_each_configuration_is_valid_and_is_what_the_base_ships(build: Any, file: str) -> None:
    """What the demo and the tests install (built here) is what the chart renders into manifests/base."""
    from pathlib import Path

    import yaml

    built = build(ca_bundle=CA, service_name="deviceshare-webhook")
    kubernetes_validate.validate(built, "1.32.0", strict=True)
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests" / "base" / file).read_text())
    for hook in built["webhooks"]:
        del hook["clientConfig"]["caBundle"]  # an overlay adds it
    assert shipped["webhooks"] == built["webhooks"]


def test_the_finalizer_webhook_ignores_its_own_failures_and_sees_group_creations_only() -> None:
    _, hook = configuration.build(ca_bundle=CA, service_name="wh")["webhooks"]
    # The operator adds the finalizer where it is missing: an outage must never block a group's creation.
    assert (hook["failurePolicy"], hook["sideEffects"]) == ("Ignore", "None")
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [names.GROUP], "apiVersions": [names.VERSION],
                              "resources": [names.PLURAL], "scope": "Namespaced"}]
    assert hook["clientConfig"]["service"]["path"] == "/mutate-groups"


@pytest.mark.parametrize(("finalizers", "called"), [
    (None, True), ([], True), (["example.com/x"], True), ([names.GROUP_FINALIZER], False),
    (["example.com/x", names.GROUP_FINALIZER], False),
])
def test_the_finalizer_webhook_is_called_only_for_groups_that_lack_it(
    finalizers: list[str] | None, called: bool
) -> None:
    _, hook = configuration.build(ca_bundle=CA, service_name="wh")["webhooks"]
    (condition,) = hook["matchConditions"]
    metadata: dict[str, Any] = {"name": "g"} if finalizers is None else {"name": "g", "finalizers": finalizers}
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))
    assert bool(program.evaluate({"object": celpy.json_to_cel({"metadata": metadata, "spec": {}})})) is called


@pytest.mark.parametrize(("operation", "spec_changed", "called"), [
    ("CREATE", True, True), ("UPDATE", True, True), ("UPDATE", False, False)])
def test_the_group_budget_webhook_sees_creations_and_spec_changes_only(
    operation: str, spec_changed: bool, called: bool
) -> None:
    (hook,) = configuration.build_group_validation(ca_bundle=CA, url="https://127.0.0.1:8443")["webhooks"]
    old = {"spec": {"resources": {"nvidia.com/gpu": 1}}, "metadata": {"finalizers": []}}
    new = {"spec": {"resources": {"nvidia.com/gpu": 2 if spec_changed else 1}},
           "metadata": {"finalizers": ["deviceshare.io/release-devices"]}}
    env = celpy.Environment()
    (condition,) = hook["matchConditions"]
    program = env.program(env.compile(condition["expression"]))
    activation = {"request": celpy.json_to_cel({"operation": operation}),
                  "object": celpy.json_to_cel(new),
                  "oldObject": celpy.json_to_cel(old if operation == "UPDATE" else None)}
    assert bool(program.evaluate(activation)) is called
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:8443/validate-groups"
