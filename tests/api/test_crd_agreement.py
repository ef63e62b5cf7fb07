"""The CRD and the pydantic models say the same thing, field by field.

The API server enforces the CRD's schema; the operator and webhook parse with the models. If the
two drift, the API server accepts what the operator then cannot read (or the other way round).
Both are reduced to the same canonical form: type, enum, bounds, defaults, required fields, and
for maps the value schema and the key rule (pattern and length, which the CRD can only state in
a CEL rule).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceshare.api import models, names

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "shareddevicegroups.yaml"
COMPARED = (
    "type",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "pattern",
    "format",
)
# Formats that only say how wide an integer is on the wire; Python ints have no width.
WIDTH_FORMATS = {"int32", "int64"}
KEY_RULE = re.compile(r"self\.all\(k, (?:size\(k\) <= (\d+) && )?k\.matches\('([^']*)'\)\)")


def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def version_schema() -> dict[str, Any]:
    (version,) = crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def canonical_crd(node: dict[str, Any], *, defaults: bool) -> dict[str, Any]:
    out: dict[str, Any] = {k: node[k] for k in COMPARED if k in node}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = "int-or-string"
    if out.get("format") in WIDTH_FORMATS:
        del out["format"]
    if defaults and "default" in node:
        out["default"] = node["default"]
    if node.get("required"):
        out["required"] = sorted(node["required"])
    if "properties" in node:
        out["properties"] = {k: canonical_crd(v, defaults=defaults) for k, v in node["properties"].items()}
    if "additionalProperties" in node:
        out["values"] = canonical_crd(node["additionalProperties"], defaults=defaults)
    if "items" in node:
        out["items"] = canonical_crd(node["items"], defaults=defaults)
    for rule in node.get("x-kubernetes-validations", ()):
        match = KEY_RULE.fullmatch(rule["rule"])
        if match:
            out["keys"] = {
                "pattern": match.group(2),
                **({"maxLength": int(match.group(1))} if match.group(1) else {}),
            }
    return out


def canonical_model(node: dict[str, Any], defs: dict[str, Any], *, defaults: bool) -> dict[str, Any]:
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    if "anyOf" in node:  # Optional[X]: absent on the wire, never null
        inner = [n for n in node["anyOf"] if n.get("type") != "null"]
        if sorted(n.get("type") for n in inner) == ["integer", "string"]:
            # int | str: a quantity, x-kubernetes-int-or-string in the CRD (bounds on the int side,
            # pattern on the string side, as JSON schema applies each to its own type)
            merged = {k: v for n in inner for k, v in n.items() if k != "type"}
            inner = [{**merged, "type": "int-or-string"}]
        (single,) = inner
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, **single}
        if "$ref" in node:  # Optional[a model]: the model's schema
            return canonical_model(node, defs, defaults=defaults)
    out: dict[str, Any] = {k: node[k] for k in COMPARED if k in node}
    if defaults and node.get("default") is not None:  # default None: an optional field, absent on the wire
        out["default"] = node["default"]
    if node.get("required"):
        out["required"] = sorted(node["required"])
    if "properties" in node:
        out["properties"] = {
            k: canonical_model(v, defs, defaults=defaults) for k, v in node["properties"].items()
        }
    if isinstance(node.get("additionalProperties"), dict):
        out["values"] = canonical_model(node["additionalProperties"], defs, defaults=defaults)
    if "patternProperties" in node:
        ((pattern, values),) = node["patternProperties"].items()
        out["values"] = canonical_model(values, defs, defaults=defaults)
        out["keys"] = {"pattern": pattern, **node.get("propertyNames", {})}
    if "items" in node:
        out["items"] = canonical_model(node["items"], defs, defaults=defaults)
    return out


def model_schema(
    model: type[models.GroupSpec] | type[models.GroupStatus], *, defaults: bool
) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    return canonical_model(schema, schema.get("$defs", {}), defaults=defaults)


def test_spec_agrees_with_the_crd() -> None:
    # Spec defaults matter both ways: the API server fills them in, the model assumes them.
    assert model_schema(models.GroupSpec, defaults=True) == canonical_crd(
        version_schema()["properties"]["spec"], defaults=True
    )


def test_status_agrees_with_the_crd() -> None:
    # Status is written by the operator only; model defaults are how it reads an absent field and
    # the CRD defaults none (a CRD default would have to appear in the model, compared below).
    crd_status = version_schema()["properties"]["status"]
    assert model_schema(models.GroupStatus, defaults=False) == canonical_crd(crd_status, defaults=False)
    assert not [k for k, v in crd_status["properties"].items() if "default" in v]


def test_the_comparison_notices_a_drift() -> None:
    drifted = copy.deepcopy(version_schema()["properties"]["spec"])
    drifted["properties"]["resources"]["additionalProperties"]["maximum"] = 65
    assert model_schema(models.GroupSpec, defaults=True) != canonical_crd(drifted, defaults=True)
    drifted = copy.deepcopy(version_schema()["properties"]["spec"])
    drifted["properties"]["resources"]["x-kubernetes-validations"][0]["rule"] = (
        "self.all(k, k.matches('^x$'))"
    )
    assert model_schema(models.GroupSpec, defaults=True) != canonical_crd(drifted, defaults=True)


def test_names_and_printer_columns() -> None:
    body = crd()
    assert body["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    spec = body["spec"]
    assert (spec["group"], spec["scope"]) == (names.GROUP, "Namespaced")
    assert spec["names"] == {
        "kind": names.KIND,
        "listKind": f"{names.KIND}List",
        "plural": names.PLURAL,
        "singular": names.SINGULAR,
        "shortNames": [names.SHORT_NAME],
        "categories": [names.CATEGORY],
    }
    (version,) = spec["versions"]
    assert version["name"] == names.VERSION and version["subresources"] == {"status": {}}
    status_fields = {f.alias for f in models.GroupStatus.model_fields.values()}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Node", "Devices", "Share", "Claim", "Members", "Age"]
    for path in columns.values():
        if path.startswith(".status."):
            assert path.removeprefix(".status.") in status_fields
    # `kubectl get sdg` shows a DRA group's DeviceClass, a field the spec model has
    assert columns["Claim"] == ".spec.claim.deviceClassName"
    assert models.DeviceClaim.model_fields["device_class_name"].alias == "deviceClassName"


@pytest.mark.parametrize(
    ("spec", "valid"),
    [
        ({"resources": {"nvidia.com/gpu": 2}}, True),
        ({"resources": {"nvidia.com/gpu": 2}, "nodeSelector": {"k": "v" * 63}}, True),
        ({"resources": {"nvidia.com/gpu": 2}, "nodeSelector": {"k": "v" * 64}}, False),
        ({"resources": {"nvidia.com/gpu": 2}, "nodeSelector": {f"k{i}": "v" for i in range(65)}}, False),
        ({"resources": {f"x.io/{'r' * 250}": 1}}, False),
        ({"resources": {}}, False),
        ({"resources": {"gpu": 1}}, False),
        ({"resources": {"nvidia.com/gpu": 65}}, False),
        ({"resources": {"nvidia.com/gpu": 1}, "schedulingStrategy": "random"}, False),
        ({"resources": {"nvidia.com/gpu": 1}, "schedulingStrategy": "fgd"}, True),
        ({"resources": {"nvidia.com/gpu": 1}, "maxMembers": 10_001}, False),
        ({"resources": {"nvidia.com/gpu": 1}, "minMembers": 10_001}, False),
        ({"resources": {"nvidia.com/gpu": 1}, "minMembers": -1}, False),
    ],
)
def test_the_model_accepts_what_the_crd_accepts(spec: dict[str, Any], valid: bool) -> None:
    """Both validators on the same inputs: the CRD's schema (jsonschema) plus its CEL key rule."""
    import celpy
    import jsonschema
    from pydantic import ValidationError

    crd_spec = version_schema()["properties"]["spec"]
    schema_ok = jsonschema.Draft7Validator(crd_spec).is_valid(spec)
    env = celpy.Environment()
    (rule,) = crd_spec["properties"]["resources"]["x-kubernetes-validations"]
    program = env.program(env.compile(rule["rule"]))
    cel_ok = bool(program.evaluate({"self": celpy.json_to_cel(spec.get("resources", {}))}))
    try:
        models.GroupSpec.model_validate(spec)
        model_ok = True
    except ValidationError:
        model_ok = False
    assert (schema_ok and cel_ok) is valid
    assert model_ok is valid


GPU_SPEC = {"resources": {"nvidia.com/gpu": 1}}
SHARES: list[tuple[Any, bool]] = [
    ({"compute": "460m", "memory": "12Gi"}, True),
    ({"compute": "0.5"}, True),
    ({"compute": ".25"}, True),
    ({"compute": "1"}, True),
    ({"compute": 1}, True),
    ({"compute": "1000m"}, True),
    ({"compute": "1m"}, True),
    ({"memory": "12288Mi"}, True),
    ({"memory": "1.5Gi"}, True),
    ({"memory": 12884901888}, True),
    ({"memory": "16G"}, True),
    ({"compute": 0.5}, False),  # a YAML float: neither integer nor string
    ({"compute": "0"}, False),
    ({"compute": "0m"}, False),
    ({"compute": "0.000"}, False),
    ({"compute": "1001m"}, False),
    ({"compute": "1.5"}, False),
    ({"compute": 2}, False),
    ({"compute": 0}, False),
    ({"compute": "0.4567"}, False),  # finer than a thousandth
    ({"compute": "-500m"}, False),
    ({"memory": "0Gi"}, False),
    ({"memory": 0}, False),
    ({"memory": "12GB"}, False),
    ({"memory": "500m"}, False),
    ({"memory": "-1Gi"}, False),
    ({}, False),
    ({"tiles": 1}, True),
    ({"tiles": 0}, False),
    ({"tiles": 65}, False),
    ({"tiles": 1, "memory": "1Gi"}, False),
    ({"tiles": 1, "compute": "500m"}, False),
    ({"cores": 1}, None),  # unknown field: the API server prunes it (then nothing is left), pydantic forbids
]


def crd_accepts(spec: dict[str, Any]) -> bool:
    """The sandbox's evaluation of the CRD: structural schema, int-or-string, every CEL rule."""
    from deviceshare.sandbox import schema

    root = version_schema()
    body = schema.prune_and_default(root, {"apiVersion": names.API_VERSION, "kind": names.KIND,
                                           "metadata": {"name": "g", "namespace": "ml"}, "spec": spec})
    return schema.check(root, body, None) == []


def model_accepts(spec: dict[str, Any]) -> bool:
    from pydantic import ValidationError

    try:
        models.GroupSpec.model_validate(spec)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("entry", "valid"), SHARES)
def test_share_entries_agree(entry: dict[str, Any], valid: bool | None) -> None:
    spec = {**GPU_SPEC, "share": {"nvidia.com/gpu": entry}}
    assert crd_accepts(spec) is bool(valid)  # an unknown field is pruned, leaving an empty entry
    assert model_accepts(spec) is bool(valid)


@pytest.mark.parametrize(
    ("spec", "valid"),
    [
        ({**GPU_SPEC, "share": {"nvidia.com/gpu": {"compute": "250m"}}}, True),
        ({**GPU_SPEC, "share": {}}, True),
        ({**GPU_SPEC, "share": {"amd.com/gpu": {"compute": "250m"}}}, False),  # not in resources
        (
            {"resources": {"nvidia.com/gpu": 2, "gpu.intel.com/i915": 1},
             "share": {"gpu.intel.com/i915": {"tiles": 1}}},
            True,
        ),
        ({**GPU_SPEC, "share": {"nvidia.com/gpu": "half"}}, False),
    ],
)
def test_share_keys_agree(spec: dict[str, Any], valid: bool) -> None:
    assert crd_accepts(spec) is valid
    assert model_accepts(spec) is valid


def test_share_quantities_parse() -> None:
    share = models.GroupSpec.model_validate(
        {**GPU_SPEC, "share": {"nvidia.com/gpu": {"compute": "0.46", "memory": "12288Mi"}}}
    ).shares["nvidia.com/gpu"]
    assert (share.compute_milli, share.memory_bytes) == (460, 12 << 30)
    assert share.describe() == "compute=0.46,memory=12288Mi"


@pytest.mark.parametrize("stamp", ["2026-11-22T09:00:00Z", "2026-11-22T09:00:00.123456+00:00"])
def test_condition_time_is_rfc3339(stamp: str) -> None:
    from pydantic import ValidationError

    assert models.Condition(type="Scheduled", status="True", last_transition_time=stamp).last_transition_time
    with pytest.raises(ValidationError, match="RFC 3339"):
        models.Condition(type="Scheduled", status="True", last_transition_time="yesterday")


@pytest.mark.parametrize(
    ("spec", "valid"),
    [
        ({**GPU_SPEC, "minMembers": 3}, True),
        ({**GPU_SPEC, "minMembers": 3, "maxMembers": 3}, True),
        ({**GPU_SPEC, "minMembers": 3, "maxMembers": 0}, True),  # maxMembers 0: unlimited
        ({**GPU_SPEC, "minMembers": 4, "maxMembers": 3}, False),
        ({**GPU_SPEC, "minMembers": 0, "maxMembers": 3}, True),  # no gang
    ],
)
def test_gang_bounds_agree(spec: dict[str, Any], valid: bool) -> None:
    """minMembers against maxMembers is a CEL rule in the CRD and a model validator: the same answers."""
    assert crd_accepts(spec) is valid
    assert model_accepts(spec) is valid


CLAIM = {"deviceClassName": "gpu.nvidia.com", "count": 2}
H100 = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"


@pytest.mark.parametrize(
    ("spec", "valid"),
    [
        ({"claim": CLAIM}, True),
        ({"claim": {"deviceClassName": "gpu.nvidia.com"}}, True),  # count defaults to 1, as in a claim
        ({"claim": {**CLAIM, "selectors": [H100]}}, True),
        ({"claim": {**CLAIM, "count": 32}}, True),
        ({"claim": {**CLAIM, "count": 33}}, False),  # more than one allocation's results
        ({"claim": {**CLAIM, "count": 0}}, False),
        ({"claim": {"count": 1}}, False),  # no class
        ({"claim": {**CLAIM, "deviceClassName": "GPU"}}, False),  # not a DNS subdomain
        ({"claim": {**CLAIM, "deviceClassName": "g" * 254}}, False),
        ({"claim": {**CLAIM, "selectors": [""]}}, False),
        ({"claim": {**CLAIM, "selectors": ["x" * (10 * 1024 + 1)]}}, False),
        ({"claim": {**CLAIM, "resourceClaimName": "mine"}}, None),  # unknown: pruned by the API, forbidden here
        ({}, False),  # neither
        ({"resources": {"nvidia.com/gpu": 1}, "claim": CLAIM}, False),  # both
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "24Gi"}}}}, True),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": 25769803776}}}}, True),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"gpu.nvidia.com/cores": "500m"}}}}, True),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {}}}}, False),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "0"}}}}, False),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "24GB"}}}}, False),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"1memory": "1Gi"}}}}, False),
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"m" * 33: "1Gi"}}}}, False),
        ({"claim": CLAIM, "share": {"amd.com": {"capacity": {"memory": "24Gi"}}}}, False),  # not the class
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"memory": "24Gi"}}}, False),  # MPS share on a claim
        ({"claim": CLAIM, "share": {"gpu.nvidia.com": {"capacity": {"memory": "1Gi"}, "compute": "1"}}}, False),
        ({"resources": {"nvidia.com/gpu": 1}, "share": {"nvidia.com/gpu": {"capacity": {"memory": "1Gi"}}}}, False),
    ],
)
def test_claim_specs_agree(spec: dict[str, Any], valid: bool | None) -> None:
    """A DRA group's spec (CONTRACT §13): the CRD (schema and every CEL rule) and the model answer alike
    (None: an unknown field, which the API server prunes and the model forbids)."""
    assert crd_accepts(spec) is (valid is not False)
    assert model_accepts(spec) is (valid is True)


def test_requested_treats_both_kinds_alike() -> None:
    dra = models.GroupSpec.model_validate({"claim": CLAIM})
    plain = models.GroupSpec.model_validate({"resources": {"nvidia.com/gpu": 2, "amd.com/gpu": 1}})
    assert (dra.is_dra, dra.requested, dra.resources) == (True, {"gpu.nvidia.com": 2}, {})
    assert (plain.is_dra, plain.requested) == (False, {"amd.com/gpu": 1, "nvidia.com/gpu": 2})
    assert dra.to_k8s() == {"claim": {"deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": []},
                            "share": {}, "nodeSelector": {}, "schedulingStrategy": "binpack",
                            "maxMembers": 0, "minMembers": 0, "resources": {}}
    assert names.claim_name("trainer") == "trainer-devices"
