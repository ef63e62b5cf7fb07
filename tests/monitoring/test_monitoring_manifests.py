"""monitoring/manifests: what `kubectl apply -k monitoring/manifests` sends is valid, and carries exactly the
shipped rules and dashboards. The ConfigMap is checked against the Kubernetes schemas; the Prometheus
Operator's kinds (whose CRDs are not ours) structurally, every field this project uses spelled out, so a
typo in one is a failure here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from monitoring import objects
from tests.manifests import kube_objects

ROOT = Path(__file__).resolve().parents[2]
_SECRET_KEY = {"type": "object", "additionalProperties": False, "required": ["name", "key"],
               "properties": {"name": {"type": "string"}, "key": {"type": "string"}}}  # fmt: skip
_RULE = {
    "type": "object", "additionalProperties": False, "required": ["alert", "expr"],
    "properties": {"alert": {"type": "string"}, "expr": {"type": "string"}, "for": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
}  # fmt: skip
SPECS: dict[str, dict[str, Any]] = {
    "PrometheusRule": {
        "type": "object", "additionalProperties": False, "required": ["groups"],
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "rules"],
            "properties": {"name": {"type": "string"}, "rules": {"type": "array", "items": _RULE}}}}},
    },
    "PodMonitor": {
        "type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": {"type": "object", "additionalProperties": False,
                         "properties": {"matchLabels": {"type": "object"}}},
            "podMetricsEndpoints": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["port"],
                "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"}, "interval": {"type": "string"},
                    "scheme": {"enum": ["http", "https"]},
                    "tlsConfig": {"type": "object", "additionalProperties": False, "properties": {
                        "ca": {"type": "object", "additionalProperties": False,
                               "properties": {"secret": _SECRET_KEY}},
                        "serverName": {"type": "string"}}},
                    "relabelings": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"targetLabel": {"type": "string"}, "replacement": {"type": "string"}}}},
                }}},
        },
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def rendered() -> list[kube_objects.KubeObject]:
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed: cannot render the kustomization (install kubectl >= 1.27)")
    return kube_objects.render(ROOT / "monitoring" / "manifests")


def validate(obj: kube_objects.KubeObject) -> None:
    if obj["kind"] == "ConfigMap":
        kube_objects.validate_core(obj)
        return
    assert obj["apiVersion"] == "monitoring.coreos.com/v1", kube_objects.ref(obj)
    assert obj["metadata"]["namespace"] == "deviceshare-system", kube_objects.ref(obj)
    jsonschema.validate(obj["spec"], SPECS[obj["kind"]])


def test_every_object_is_valid(rendered: list[kube_objects.KubeObject]) -> None:
    assert sorted(o["kind"] for o in rendered) == ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule"]
    for obj in rendered:
        validate(obj)


@pytest.mark.parametrize(("kind", "mutate"), [
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(targetPort="http")),
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(scheme="tcp")),
    ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].update(fro="5m")),
    ("ConfigMap", lambda o: o.update(data={"x": 1})),
])
def test_validation_catches_broken_objects(rendered: list[kube_objects.KubeObject], kind: str, mutate: Any) -> None:
    broken = copy.deepcopy(next(o for o in rendered if o["kind"] == kind))
    mutate(broken)
    with pytest.raises(Exception, match=r".") as caught:
        validate(broken)
    assert caught.type.__name__ == "ValidationError"


def test_the_objects_carry_the_shipped_rules_and_dashboards(rendered: list[kube_objects.KubeObject]) -> None:
    rule = next(o for o in rendered if o["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((ROOT / "monitoring" / "alerts.yaml").read_text())
    board = next(o for o in rendered if o["kind"] == "ConfigMap")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["deviceshare-fleet.json"]) == json.loads(
        (ROOT / "monitoring" / "dashboards" / "fleet.json").read_text())
    assert objects.DASHBOARDS.keys() == board["data"].keys()
