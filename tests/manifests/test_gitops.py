"""The GitOps examples (examples/gitops/) are what Flux and Argo CD accept, and point at this chart.

Each object is checked against the CRD schema of the project that serves it (vendored in
``gitops_schemas/``, with where each came from), strictly: an unknown field is an error, as
``kubectl apply`` (``fieldValidation=Strict``) would make it. The chart values they set pass the chart's
``values.schema.json``, and the paths they name exist here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.manifests import kube_objects

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).parent / "gitops_schemas"
EXAMPLES = ROOT / "examples" / "gitops"
VALUES_SCHEMA = json.loads((ROOT / "charts" / "deviceshare" / "values.schema.json").read_text())


def _strict(node: Any) -> Any:
    """A structural schema as JSON Schema where unknown fields fail (what Strict field validation does)."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _schemas() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in SCHEMAS.glob("*.json"):
        doc = json.loads(path.read_text())
        source = doc["source"]
        schema = _strict(doc["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's
        found[(f"{source['group']}/{source['version']}", source["kind"])] = schema
    return found


SCHEMA_BY_KIND = _schemas()


def _objects() -> list[dict[str, Any]]:
    return [o for path in sorted(EXAMPLES.glob("*.yaml")) for o in kube_objects.load_file(path)]


def test_the_examples_cover_flux_and_argo_cd() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in _objects()}
    assert kinds == set(SCHEMA_BY_KIND) == {
        ("source.toolkit.fluxcd.io/v1", "GitRepository"),
        ("helm.toolkit.fluxcd.io/v2", "HelmRelease"),
        ("argoproj.io/v1alpha1", "Application"),
    }


@pytest.mark.parametrize("obj", _objects(), ids=kube_objects.ref)
def test_each_object_is_valid_for_its_project(obj: dict[str, Any]) -> None:
    assert obj["metadata"].get("namespace"), "all three kinds are namespaced"
    jsonschema.validate(obj, SCHEMA_BY_KIND[(obj["apiVersion"], obj["kind"])])


def test_a_typo_is_caught() -> None:
    (release,) = [o for o in _objects() if o["kind"] == "HelmRelease"]
    broken = copy.deepcopy(release)
    broken["spec"]["chart"]["spec"]["sourceRefs"] = broken["spec"]["chart"]["spec"].pop("sourceRef")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA_BY_KIND[("helm.toolkit.fluxcd.io/v2", "HelmRelease")])


def test_flux_installs_this_chart_from_its_source_with_valid_values() -> None:
    objects = _objects()
    (release,) = [o for o in objects if o["kind"] == "HelmRelease"]
    (source,) = [o for o in objects if o["kind"] == "GitRepository"]
    chart = release["spec"]["chart"]["spec"]
    assert chart["sourceRef"] == {"kind": "GitRepository", "name": source["metadata"]["name"],
                                  "namespace": source["metadata"]["namespace"]}
    assert (ROOT / chart["chart"] / "Chart.yaml").is_file()
    kept = [line[2:].strip("/") for line in source["spec"]["ignore"].splitlines() if line.startswith("!/")]
    assert kept == ["charts"]  # the chart alone: it carries copies of the CRD, rules and dashboards
    jsonschema.validate(release["spec"]["values"], VALUES_SCHEMA)
    assert release["spec"]["targetNamespace"] == "deviceshare-system"


def test_argo_cd_applies_this_chart_server_side_with_valid_values() -> None:
    (app,) = [o for o in _objects() if o["kind"] == "Application"]
    assert (ROOT / app["spec"]["source"]["path"] / "Chart.yaml").is_file()
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    values = app["spec"]["source"]["helm"]["valuesObject"]
    jsonschema.validate(values, VALUES_SCHEMA)
    assert values["webhook"]["certificates"] != "self-signed"  # helm template cannot keep that certificate
    assert app["spec"]["destination"]["namespace"] == "deviceshare-system"
