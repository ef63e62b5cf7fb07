"""CEL device selectors on devices shaped as NVIDIA's DRA driver publishes them, with the selectors real
users write (each names its source), the errors kube-apiserver and kube-scheduler report, and the cache that
keeps thousands of alike GPUs at one evaluation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.core import deviceselectors, dradevices
from deviceshare.core.deviceselectors import SelectorError, SelectorRuntimeError, compile_selectors

NV = "gpu.nvidia.com"
compile_selectors(["true"])  # celpy raises the recursion limit on first use: not inside hypothesis


def nvidia_gpu(node: str, minor: int, product: str = "NVIDIA H100 80GB HBM3", memory: str = "80Gi",
               architecture: str = "Hopper", cc: str = "9.0.0", driver_version: str = "580.95.5",
               kind: str = "gpu", extra: dict[str, Any] | None = None) -> dradevices.SliceDevice:
    """A device as NVIDIA/k8s-dra-driver-gpu's gpu-kubelet-plugin publishes a full GPU (deviceinfo.go): type,
    uuid, productName, brand, architecture (strings), cudaComputeCapability, driverVersion, cudaDriverVersion
    (versions); capacity memory."""
    return dradevices.parse_slice_device(NV, node, {
        "name": f"gpu-{minor}" if kind == "gpu" else f"gpu-{minor}-mig-1g10gb-0",
        "attributes": {
            "type": {"string": kind}, "uuid": {"string": f"GPU-{node}-{minor}"},
            "productName": {"string": product}, "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture}, "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": driver_version}, "cudaDriverVersion": {"version": "13.0.0"},
            **(extra or {}),
        },
        "capacity": {"memory": {"value": memory}},
    })


H100 = nvidia_gpu("node-a", 0)
A100_40 = nvidia_gpu("node-b", 1, "NVIDIA A100-SXM4-40GB", "40Gi", "Ampere", "8.0.0", "550.54.15")
L4 = nvidia_gpu("node-c", 0, "NVIDIA L4", "24Gi", "Ada Lovelace", "8.9.0")
MIG = nvidia_gpu("node-a", 1, kind="mig", memory="10Gi")
EXAMPLE = dradevices.parse_slice_device("gpu.dra-example-driver.sigs.k8s.io", "node-x", {
    # kubernetes-sigs/dra-example-driver's gpu profile: model, driverVersion; capacity memory
    "name": "gpu-0", "attributes": {"model": {"string": "LATEST-GPU-MODEL"}, "driverVersion": {"version": "1.0.0"}},
    "capacity": {"memory": {"value": "80Gi"}}})

# (source, expression, {device: expected})
REAL_SELECTORS: list[tuple[str, str, dict[dradevices.SliceDevice, bool]]] = [
    ("NVIDIA/k8s-dra-driver-gpu deployments/helm DeviceClass gpu.nvidia.com",
     "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
     {H100: True, A100_40: True, MIG: False, EXAMPLE: False}),
    ("NVIDIA/k8s-dra-driver-gpu deployments/helm DeviceClass mig.nvidia.com",
     "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
     {H100: False, MIG: True, EXAMPLE: False}),
    ("kubernetes-sigs/dra-example-driver demo/examples/cel-selector/cel-selector.yaml (1st selector)",
     "device.attributes['gpu.dra-example-driver.sigs.k8s.io'].model == 'LATEST-GPU-MODEL'", {EXAMPLE: True}),
    ("kubernetes-sigs/dra-example-driver demo/examples/cel-selector/cel-selector.yaml (2nd selector)",
     "device.capacity['gpu.dra-example-driver.sigs.k8s.io'].memory.compareTo(quantity('4Gi')) >= 0",
     {EXAMPLE: True}),
    ("deviceshare CONTRACT §13 example selector",
     "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')", {H100: True, A100_40: False}),
    ("GKE DRA docs: request only A100s",
     "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
     {H100: False, A100_40: True, L4: False}),
    ("GKE DRA docs: more than 40 GiB of memory",
     "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0",
     {H100: True, A100_40: False, L4: False}),
    ("k8s.io/api/resource/v1 types.go CELDeviceSelector: cel.bind over one domain",
     "cel.bind(nv, device.attributes['gpu.nvidia.com'], nv.type == 'gpu' && nv.architecture == 'Hopper')",
     {H100: True, A100_40: False}),
    ("a driver version floor (semver attribute)",
     "device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('560.0.0')) >= 0",
     {H100: True, A100_40: False}),
    ("compute capability 8.x or newer",
     "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.0.0')) || "
     "device.attributes['gpu.nvidia.com'].cudaComputeCapability.major() >= 9",
     {H100: True, A100_40: False, L4: True}),
    ("a product list with `in`",
     "device.attributes['gpu.nvidia.com'].productName in ['NVIDIA L4', 'NVIDIA A100-SXM4-40GB']",
     {H100: False, A100_40: True, L4: True}),
    ("a portable selector guarded by `in` on the domain map",
     "'gpu.nvidia.com' in device.attributes && device.attributes['gpu.nvidia.com'].brand == 'Nvidia'",
     {H100: True, EXAMPLE: False}),
]


@pytest.mark.parametrize("source,expression,expected", REAL_SELECTORS, ids=[r[0] for r in REAL_SELECTORS])
def test_real_selectors_answer_as_the_scheduler_would(
    source: str, expression: str, expected: dict[dradevices.SliceDevice, bool]
) -> None:
    selectors = compile_selectors([expression])
    assert {device.id: selectors.matches(device) for device in expected} == {d.id: v for d, v in expected.items()}


def test_a_missing_attribute_is_an_error_not_a_silent_false() -> None:
    # A device of another driver has no 'gpu.nvidia.com' domain: an empty map, then `no such key`, as cel-go.
    selectors = compile_selectors(["device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"])
    with pytest.raises(SelectorRuntimeError) as failed:
        selectors.matches(EXAMPLE)
    assert failed.value.reason == "no such key: productName"
    assert "selector #0" in str(failed.value) and EXAMPLE.id in str(failed.value)
    # ... which a class selector checking the driver first avoids: the first false ends the check.
    guarded = compile_selectors(["device.driver == 'gpu.nvidia.com'"]) + selectors
    assert guarded.matches(EXAMPLE) is False
    assert guarded.matches(H100) is True


def test_an_error_on_both_sides_of_and_reports_the_missing_key() -> None:
    selectors = compile_selectors(["cel.bind(nv, device.attributes['gpu.nvidia.com'], nv.type == 'gpu' && nv.x)"])
    with pytest.raises(SelectorRuntimeError) as failed:
        selectors.matches(EXAMPLE)
    assert failed.value.reason == "no such key: type"
    # an error on one side of && is absorbed by a false on the other, in either order (cel-go's commutative &&)
    assert compile_selectors(["device.attributes['x'].y == 1 && false"]).matches(H100) is False
    assert compile_selectors(["false && device.attributes['x'].y == 1"]).matches(H100) is False
    assert compile_selectors(["device.attributes['x'].y == 1 || true"]).matches(H100) is True


def test_comparing_a_string_attribute_with_an_int_is_false_not_an_error() -> None:
    # cel-go's heterogeneous equality: a dyn attribute compared with another type is unequal
    assert compile_selectors(["device.attributes['gpu.nvidia.com'].productName == 1"]).matches(H100) is False
    with pytest.raises(SelectorRuntimeError, match="no such overload"):
        compile_selectors(["device.attributes['gpu.nvidia.com'].productName > 1"]).matches(H100)


@pytest.mark.parametrize("expression,problem", [
    ("device.driverName == 'gpu.nvidia.com'", "undefined field 'driverName'"),
    ("devices.driver == 'x'", "undeclared reference to 'devices'"),
    ("device.attributes['gpu.nvidia.com'].productName.beginsWith('NVIDIA')", "undeclared reference to 'beginsWith'"),
    ("device.driver == 1", "found no matching overload for '_==_' applied to '(string, int)'"),
    ("device.driver", "must evaluate to bool or the unknown type, not string"),
    ("quantity(10) > 0", "found no matching overload for 'quantity' applied to '(int)'"),
    ("device.capacity['gpu.nvidia.com'].memory > quantity('1Gi')",
     "found no matching overload for '_>_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'"),
    ("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H'", "Syntax error"),
    ("", "the expression is empty"),
    ("(" * 3000 + "true" + ")" * 3000, "nested too deeply"),
    # Kubernetes' base environment has these; this engine refuses them instead of answering differently
    ("device.attributes['gpu.nvidia.com'].all(k, v, v != '')", "found no matching overload for 'all'"),
    ("sets.contains([1, 2], [1])", "undeclared reference to 'sets'"),
])
def test_what_the_api_server_refuses_is_refused_with_its_reason(expression: str, problem: str) -> None:
    with pytest.raises(SelectorError) as refused:
        compile_selectors([expression])
    assert problem in refused.value.detail
    assert refused.value.detail.startswith("compilation failed: ERROR: <input>:")
    assert refused.value.expression == expression


def test_the_error_points_at_the_offending_field() -> None:
    with pytest.raises(SelectorError) as refused:
        compile_selectors(["device.attributes['x'].y && device.flavour == 'z'"])
    assert refused.value.detail.splitlines() == [
        "compilation failed: ERROR: <input>:1:35: undefined field 'flavour'",
        " | device.attributes['x'].y && device.flavour == 'z'",
        " | ..................................^",
    ]
    with pytest.raises(SelectorError) as refused:
        compile_selectors(["device.driver  == 1"])
    assert refused.value.detail.splitlines()[0] == (
        "compilation failed: ERROR: <input>:1:16: found no matching overload for '_==_' applied to '(string, int)'")


def test_alike_devices_cost_one_evaluation_and_different_ones_their_own() -> None:
    expression = ("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H') && "
                  "device.driver != 'cache-test'")
    selectors = compile_selectors([expression])
    program = selectors.programs[0]
    fleet = [nvidia_gpu(f"node-{n}", m) for n in range(50) for m in range(8)]  # 400 H100s, each its own uuid
    assert all(selectors.matches(d) for d in fleet)
    assert program.evaluations == 1  # the uuid differs, but this expression never reads it
    assert selectors.matches(A100_40) is False
    assert program.evaluations == 2


def test_true_and_one_are_not_the_same_answer_to_the_cache() -> None:
    selectors = compile_selectors(["device.attributes['gpu.nvidia.com'].flag == true"])
    as_bool = nvidia_gpu("n", 0, extra={"flag": {"bool": True}})
    as_int = nvidia_gpu("n", 1, extra={"flag": {"int": 1}})
    assert selectors.matches(as_bool) is True
    assert selectors.matches(as_int) is False


def test_an_expression_reading_the_whole_device_is_evaluated_per_device() -> None:
    selectors = compile_selectors(["device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid') && size(device) > 0"])
    assert selectors.programs[0].reads is None
    assert selectors.matches(H100) and selectors.matches(A100_40)


def test_compiling_is_cached_per_expression() -> None:
    a = compile_selectors(["device.driver == 'gpu.nvidia.com'"])
    b = compile_selectors(["device.driver == 'gpu.nvidia.com'"])
    assert a.programs[0] is b.programs[0]


def test_no_selectors_match_every_device() -> None:
    assert deviceselectors.NO_SELECTORS.matches(EXAMPLE) is True
    assert compile_selectors([]).matches(H100) is True


def test_a_device_class_and_a_request_as_the_api_holds_them() -> None:
    device_class = {"spec": {"selectors": [{"cel": {"expression": REAL_SELECTORS[0][1]}}]}}
    request = {"name": "devices", "exactly": {"deviceClassName": NV, "count": 2, "selectors": [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"}}]}}
    selectors = (deviceselectors.compile_api_selectors(device_class["spec"]["selectors"])
                 + deviceselectors.compile_api_selectors(request["exactly"].get("selectors")))
    assert [selectors.matches(d) for d in (H100, A100_40, MIG, EXAMPLE)] == [True, False, False, False]
    assert deviceselectors.compile_api_selectors(None).matches(EXAMPLE) is True
    with pytest.raises(SelectorError, match=r"selectors\[1\]\.cel\.expression: Required value"):
        deviceselectors.compile_api_selectors([{"cel": {"expression": "true"}}, {"cel": {}}])


def test_one_string_is_not_a_list_of_expressions() -> None:
    with pytest.raises(TypeError):
        compile_selectors("device.driver == 'x'")  # type: ignore[arg-type]


LANGUAGE_DEVICE = dradevices.parse_slice_device(NV, "n", {"name": "g", "attributes": {
    "p": {"string": "NVIDIA H100"}, "i": {"int": 3}, "v": {"version": "1.2.3"}, "l": {"ints": [3, 1, 2]}},
    "capacity": {"memory": {"value": "80Gi"}}})


@pytest.mark.parametrize("expression", [
    # cel-go's cross-type numeric comparisons and heterogeneous equality (celpy alone refuses int vs uint/double)
    "d.i == 3u", "d.i == 3.0", "d.i < 3.5", "d.i != 'three'",
    # values celpy computes come back as plain Python values: still strings, lists, ints
    "'x' + d.p == 'xNVIDIA H100'", "d.p.split(' ')[1] == 'H100'", "[1, 2].map(x, x * 2)[1] == 4",
    "type(d.i) == int", "type(d.p) != int", "duration('1s') < duration('2s')", "dyn(d.i) == 3",
    "matches(d.p, '^NV')", "size(d.p) == 11", "d.p.size() == 11", "string(d.i) == '3'", "int('3') == d.i",
    # ext strings, k8s lists and regex libraries
    "d.p.lowerAscii() == 'nvidia h100'", "d.p.upperAscii() == 'NVIDIA H100'", "d.p.substring(0, 6) == 'NVIDIA'",
    "d.p.indexOf('H') == 7", "d.p.lastIndexOf('1') == 8", "d.p.charAt(0) == 'N'",
    "d.p.replace('H', 'A') == 'NVIDIA A100'",
    "' x '.trim() == 'x'", "['a', 'b'].join('-') == 'a-b'", "'abc'.reverse() == 'cba'", "d.p.find('H[0-9]+') == 'H100'",
    "d.p.findAll('[0-9]').size() == 3", "d.l.max() == 3 && d.l.min() == 1 && d.l.sum() == 6 && !d.l.isSorted()",
    "d.l.indexOf(1) == 1", "3 in d.l", "d.l.includes(2)",
    # quantity and semver
    "m.asInteger() == 85899345920", "m.add(quantity('1Gi')).isGreaterThan(quantity('80Gi'))", "m == quantity('80Gi')",
    "m.sub(1).isLessThan(quantity('80Gi'))", "m.sign() == 1", "quantity('1.5Gi').isInteger()",
    "!quantity('0.5').isInteger()",
    "isQuantity('1,5') == false", "m.asApproximateFloat() > 8.5e10", "m.mul(2).compareTo(quantity('160Gi')) == 0",
    "d.v == semver('1.2.3')", "d.v.minor() == 2 && d.v.patch() == 3", "d.v.isLessThan(semver('1.10.0'))",
    "semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))", "isSemver('v1.0') == false", "isSemver('v1.0', true)",
])
def test_the_language_as_kubernetes_cel_has_it(expression: str) -> None:
    memory = "device.capacity['gpu.nvidia.com'].memory"
    full = expression.replace("d.", "device.attributes['gpu.nvidia.com'].").replace("m.", f"{memory}.").replace(
        "m ==", f"{memory} ==")
    assert compile_selectors([full]).matches(LANGUAGE_DEVICE) is True, full


def test_the_optional_field_syntax_is_not_supported_yet() -> None:
    # Kubernetes' CEL has optional types (`.?field`, orValue); cel-python 0.5 cannot parse them. A selector using
    # them is refused with a syntax error rather than run differently.
    with pytest.raises(SelectorError, match="Syntax error"):
        compile_selectors(["device.attributes['gpu.nvidia.com'].?uuid.orValue('') != ''"])


_CACHED_EXPRESSIONS = [
    "device.attributes['gpu.nvidia.com'].x == 1",
    "device.attributes['gpu.nvidia.com'].x == true || device.attributes['gpu.nvidia.com'].y.startsWith('a')",
    "has(device.attributes['gpu.nvidia.com'].x) && "
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Gi')) > 0",
    "cel.bind(a, device.attributes['gpu.nvidia.com'], 'x' in a && a.x != 0)",
    "device.attributes.exists(d, d == 'other.example.com') || device.allowMultipleAllocations",
    "device.attributes['other.example.com'].z.isGreaterThan(semver('1.0.0'))",
]
_VALUES = st.one_of(st.booleans(), st.integers(-2, 2), st.sampled_from(["a", "b", "ab", ""]),
                    st.sampled_from([{"version": "1.0.0"}, {"version": "2.0.0"}]))


def _attribute(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return {"bool": value} if isinstance(value, bool) else {"int": value} if isinstance(value, int) else \
        {"string": value}


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["x", "y", "other.example.com/z"]), _VALUES, max_size=3),
       st.sampled_from([None, "512Mi", "2Gi"]), st.booleans())
def test_a_cached_verdict_is_the_verdict_of_a_fresh_evaluation(
    attributes: dict[str, Any], memory: str | None, shared: bool
) -> None:
    """The cache keys on what an expression reads: whatever devices came before, the answer for this one is the
    answer of evaluating it from scratch (the same bool, or the same run-time error)."""
    device = dradevices.parse_slice_device(NV, "pool", {
        "name": "d", "attributes": {k: _attribute(v) for k, v in attributes.items()},
        "capacity": {"memory": {"value": memory}} if memory else {}, "allowMultipleAllocations": shared})
    for expression in _CACHED_EXPRESSIONS:
        program = compile_selectors([expression]).programs[0]
        assert program.verdict(device) == program._evaluate(device), expression


@pytest.mark.timeout(20, method="thread")  # a hang guard: the tenant's string must not cost minutes
def test_a_tenants_huge_quantity_is_a_runtime_error_not_a_hang() -> None:
    assert compile_selectors(["isQuantity('1e999999999')"]).matches(H100) is False
    assert compile_selectors(["isQuantity('" + "1" * 9000 + "x')"]).matches(H100) is False
    with pytest.raises(SelectorRuntimeError, match="exponent out of range"):
        compile_selectors(["quantity('1e999999999').sign() == 1"]).matches(H100)
