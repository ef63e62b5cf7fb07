"""Device selectors answer as kube-scheduler answers: the scenarios of kubernetes/kubernetes
staging/src/k8s.io/dynamic-resource-allocation/cel/compile_test.go (``testcases``), run through our engine.

Each row: the expression, the device (driver, attributes, capacity, allowMultipleAllocations as a ResourceSlice
publishes them) and what compile_test.go expects: a compile error containing, a match error containing, or the
match. Left out: ``expensive`` (cost limits are not modelled) and the NewExpressions-only rows (the scheduler
evaluates stored expressions, where every field and function of the release is available).
"""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.core import deviceselectors, dradevices

EX = "dra.example.com"
MATCH, NO_MATCH = True, False


def _device(driver: str = "", attributes: dict[str, Any] | None = None, capacity: dict[str, str] | None = None,
            shared: bool | None = None) -> dradevices.SliceDevice:
    raw: dict[str, Any] = {"name": "dev-0", "attributes": attributes or {},
                           "capacity": {k: {"value": v} for k, v in (capacity or {}).items()}}
    if shared is not None:
        raw["allowMultipleAllocations"] = shared
    return dradevices.parse_slice_device(driver, "pool", raw)


# name: (expression, device, expected: bool | ("compile", text) | ("match", text))
CASES: dict[str, tuple[str, dradevices.SliceDevice, Any]] = {
    "true": ("true", _device(), MATCH),
    "false": ("false", _device(), NO_MATCH),
    "syntax-error": ("?!", _device(), ("compile", "Syntax error")),
    "type-error": ("1", _device(), ("compile", "must evaluate to bool or the unknown type, not int")),
    "runtime-error-lookup-identifier": (
        'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))', _device(),
        ("match", "no such key: noSuchAttr")),
    "runtime-error-lookup-map": (
        'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))', _device(),
        ("match", "no such key: noSuchAttr")),
    "domain-check-negative": ('"no-such-domain" in device.attributes', _device(), NO_MATCH),
    "domain-check-positive": ('"dra.example.com" in device.attributes',
                              _device(attributes={f"{EX}/something": {"bool": True}}), MATCH),
    "empty-driver-name": ('device.driver == ""', _device(), MATCH),
    "real-driver-name": ('device.driver == "dra.example.com"', _device(EX), MATCH),
    "driver-name-qualifier": ('device.attributes["dra.example.com"].name',
                              _device(EX, {"name": {"bool": True}}), MATCH),
    "driver-name-qualifier-map-lookup": ('device.attributes["dra.example.com"]["name"]',
                                         _device(EX, {"name": {"bool": True}}), MATCH),
    "bind": ('cel.bind(dra, device.attributes["dra.example.com"], dra.name)',
             _device(EX, {"name": {"bool": True}}), MATCH),
    "qualified-attribute-name": ('device.attributes["other.example.com"].name',
                                 _device(EX, {"other.example.com/name": {"bool": True}}), MATCH),
    "bool": ('device.attributes["dra.example.com"].name', _device(EX, {"name": {"bool": True}}), MATCH),
    "int": ('device.attributes["dra.example.com"].name > 0', _device(EX, {"name": {"int": 1}}), MATCH),
    "string": ('device.attributes["dra.example.com"].name == "fish"', _device(EX, {"name": {"string": "fish"}}),
               MATCH),
    "macro-exists-on-int": ('device.attributes["dra.example.com"].name.exists(x, x > 0)',
                            _device(EX, {"name": {"int": 1}}), ("match", "")),
    "macro-exists-on-string": ('device.attributes["dra.example.com"].name.exists(x, x == "fish")',
                               _device(EX, {"name": {"string": "fish"}}), ("match", "")),
    "list-result-type-causes-match-error": (
        'device.attributes["dra.example.com"].names', _device(EX, {"names": {"strings": ["fish", "bird"]}}),
        ("match", "CEL result of type list could not be converted to bool")),
    "includes-function-can-evaluate": ('device.attributes["dra.example.com"].name.includes("fish")',
                                       _device(EX, {"name": {"strings": ["fish", "bird"]}}), MATCH),
    "list-of-bool": ('device.attributes["dra.example.com"].names.size() == 2',
                     _device(EX, {"names": {"bools": [True, False]}}), MATCH),
    "list-of-int": ('device.attributes["dra.example.com"].names.size() == 2',
                    _device(EX, {"names": {"ints": [1, 2]}}), MATCH),
    "list-of-semver": ('device.attributes["dra.example.com"].names.size() == 2',
                       _device(EX, {"names": {"versions": ["1.0.0", "2.0.0"]}}), MATCH),
    "macro-on-list-of-int": ('device.attributes["dra.example.com"].names.exists(x, x > 0)',
                             _device(EX, {"names": {"ints": [1, 2]}}), MATCH),
    "macro-on-list-of-string": ('device.attributes["dra.example.com"].names.all(x, x != "")',
                                _device(EX, {"names": {"strings": ["fish", "bird"]}}), MATCH),
    "macro-on-list-of-semver": ('device.attributes["dra.example.com"].names.all(x, x.isGreaterThan(semver("0.0.1")))',
                                _device(EX, {"names": {"versions": ["1.0.0", "2.0.0"]}}), MATCH),
    "includes-on-bool-scalar-negative": ('device.attributes["dra.example.com"].name.includes(true)',
                                         _device(EX, {"name": {"bool": False}}), NO_MATCH),
    "includes-on-int-scalar-positive": ('device.attributes["dra.example.com"].name.includes(1)',
                                        _device(EX, {"name": {"int": 1}}), MATCH),
    "includes-on-int-list-negative": ('device.attributes["dra.example.com"].name.includes(3)',
                                      _device(EX, {"name": {"ints": [1, 2]}}), NO_MATCH),
    "includes-on-string-scalar-negative": ('device.attributes["dra.example.com"].name.includes("bird")',
                                           _device(EX, {"name": {"string": "fish"}}), NO_MATCH),
    "includes-on-semver-scalar-positive": ('device.attributes["dra.example.com"].name.includes(semver("1.0.0"))',
                                           _device(EX, {"name": {"version": "1.0.0"}}), MATCH),
    "includes-on-semver-list-negative": ('device.attributes["dra.example.com"].name.includes(semver("3.0.0"))',
                                         _device(EX, {"name": {"versions": ["1.0.0", "2.0.0"]}}), NO_MATCH),
    "includes-on-very-long-list-runtime-error": (
        'device.attributes["dra.example.com"].name.includes("value-65")',
        _device(EX, {"name": {"strings": [f"value-{i}" for i in range(65)]}}),
        ("match", "'includes' function cannot be applied to lists longer than 64 values")),
    "in-operator-on-list": ('1 in device.attributes["dra.example.com"].names',
                            _device(EX, {"names": {"ints": [1, 2, 3]}}), MATCH),
    "version": ('device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))',
                _device(EX, {"name": {"version": "1.0.0"}}), MATCH),
    "version_v": ('device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && '
                  'isSemver("v1.0.0", true)', _device(EX, {"name": {"version": "1.0.0"}}), MATCH),
    "macro-exists-on-version": ('device.attributes["dra.example.com"].name.exists(x, x.isGreaterThan(semver("0.0.1")))',
                                _device(EX, {"name": {"version": "1.0.0"}}), ("match", "")),
    "quantity": ('device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
                 _device(EX, capacity={"name": "1Mi"}), MATCH),
    "check-positive": ('"name" in device.capacity["dra.example.com"] && '
                       'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
                       _device(EX, capacity={"name": "1Mi"}), MATCH),
    "check-negative": ('!("name" in device.capacity["dra.example.com"]) || '
                       'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))', _device(), MATCH),
    "all": ("""
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
""", _device(EX, {"bool": {"bool": True}, "int": {"int": 1}, "string": {"string": "fish"},
                  "version": {"version": "1.0.0"}}, {"quantity": "1Mi"}), MATCH),
    "many": ('device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b && '
             'device.attributes["dra.example.com"].c',
             _device(EX, {"a": {"bool": True}, "b": {"bool": True}, "c": {"bool": True}}), MATCH),
    "check_attribute_domains": ('device.attributes.exists_one(x, x == "dra.example.com")',
                                _device(EX, {"services": {"string": "some_example_value"}}), MATCH),
    "check_attribute_ids": ('device.attributes["dra.example.com"].exists_one(x, x == "services")',
                            _device(EX, {"services": {"string": "some_example_value"}}), MATCH),
    "split_attribute": ('device.attributes["dra.example.com"].services.split("example").size() >= 2',
                        _device(EX, {"services": {"string": "some_example_value"}}), MATCH),
    "regexp_attribute": ('device.attributes["dra.example.com"].services.matches("[^a]?sym")',
                         _device(EX, {"services": {"string": "asymetric"}}), MATCH),
    "check_capacity_domains": ('device.capacity.exists_one(x, x == "dra.example.com")',
                               _device(EX, capacity={"memory": "1Mi"}), MATCH),
    "check_capacity_ids": ('device.capacity["dra.example.com"].exists_one(x, x == "memory")',
                           _device(EX, capacity={"memory": "1Mi"}), MATCH),
    "allow_multiple_allocations": ("device.allowMultipleAllocations == true", _device(EX, shared=True), MATCH),
    "allow_multiple_allocations_default": ("device.allowMultipleAllocations == false", _device(EX), MATCH),
    "allow_multiple_allocations_false": ("device.allowMultipleAllocations == false", _device(EX, shared=False), MATCH),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_scenarios_of_kubernetes_compile_test(name: str) -> None:
    expression, device, expected = CASES[name]
    if isinstance(expected, tuple) and expected[0] == "compile":
        with pytest.raises(deviceselectors.SelectorError) as refused:
            deviceselectors.compile_selectors([expression])
        assert expected[1] in refused.value.detail
        return
    selectors = deviceselectors.compile_selectors([expression])
    if isinstance(expected, tuple):
        with pytest.raises(deviceselectors.SelectorRuntimeError) as failed:
            selectors.matches(device)
        assert expected[1] in failed.value.reason
        return
    assert selectors.matches(device) is expected
