"""CEL device selectors on devices shaped as NVIDIA's DRA driver publishes them, with the selectors real
users write (each names its source), the errors kube-apiserver and kube-scheduler report, and the cache that
keeps thousands of alike GPUs at one evaluation."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.core import deviceselectors, dradevices
from deviceshare.core.deviceselectors import SelectorError, SelectorRuntimeError, compile_selectors

NV = "gpu.nvidia.com"


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


def test_one_string_is_not_a_list_of_expressions() -> None:
    with pytest.raises(TypeError):
        compile_selectors("device.driver == 'x'")  # type: ignore[arg-type]
