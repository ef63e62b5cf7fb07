"""The cheap ResourceSlice device reader (``core/dradevices.parse_slice_device``) reads every device as the checking
reader did (``dradevices_reference.py``, the code of commit eae091e): the same typed values (an ``int`` stays an
int, a ``bool`` a bool, a version a :class:`Version`, a capacity an exact quantity), the same refusals with the same
messages, whatever the device; and its caches neither keep a refusal nor let one shape pass for another."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.core import dradevices_reference

from deviceshare.core import dradevices
from deviceshare.core.dravalues import Quantity, Version

DRIVER = "gpu.nvidia.com"

# Names: plain and qualified ones, and each way a name is wrong (not a C identifier, too long, a bad domain,
# two slashes, an empty part).
NAMES = ["productName", "index", "uuid", "memory", "gpu.nvidia.com/productName", "numa.example.com/node",
         "a-b", "x" * 33, "x" * 32, "Bad_Domain!/a", "a/b/c", "/a", "a/", "", "_ok", "9lives", "UPPER.example.com/x"]
STRINGS = ["", "gpu", "NVIDIA H100 80GB HBM3", "x" * 64, "x" * 65, "GPU-4f2a", "ü" * 64, "ü" * 65]
VERSIONS = ["580.95.5", "1.0.0-rc.1+build.7", "1.0.0-alpha.01", "1.0", "v1.2.3", "01.2.3", "1.2.3+", "x" * 65,
            "1.2.3-" + "a" * 58, "1.2.3-" + "a" * 59, "9.0.0"]
QUANTITIES: list[Any] = ["80Gi", "81920Mi", "1.5G", "500m", "1e3", "1E-3", "0.1n", "+1k", "-2Ki", "80 Gi", " 1",
                         "", "1e1001", "1e1000", ".5", "5.", "1.2.3", 80, -1, 0, True, None, 1.5, ["1"]]

scalars = st.one_of(
    st.sampled_from(STRINGS).map(lambda v: {"string": v}),
    st.one_of(st.integers(-2**70, 2**70), st.booleans()).map(lambda v: {"int": v}),
    st.one_of(st.booleans(), st.integers(0, 1)).map(lambda v: {"bool": v}),
    st.sampled_from(VERSIONS).map(lambda v: {"version": v}),
    st.sampled_from([None, 1.5, [], {}, "1"]).flatmap(
        lambda v: st.sampled_from(["string", "int", "bool", "version"]).map(lambda k: {k: v})),
)
attribute = st.one_of(
    scalars,
    st.tuples(st.sampled_from(["bools", "ints", "strings", "versions"]),
              st.lists(st.sampled_from([True, 1, "gpu", "1.0.0", "x" * 65, None]), max_size=3)).map(
        lambda kv: {kv[0]: kv[1]}),
    st.tuples(scalars, scalars).map(lambda ab: {**ab[0], **ab[1]}),  # two values set (or one, twice)
    scalars.map(lambda a: {**a, "extra": 1}),  # an unknown field beside the value
    st.sampled_from([{}, None, "gpu", 1, ["string"]]),
)
policy = st.fixed_dictionaries({}, optional={
    "default": st.sampled_from(QUANTITIES),
    "validValues": st.one_of(st.lists(st.sampled_from(QUANTITIES[:6]), max_size=3), st.just("1Gi")),
    "validRange": st.one_of(st.none(), st.just("1Gi"), st.fixed_dictionaries(
        {}, optional={"min": st.sampled_from(QUANTITIES[:8]), "max": st.sampled_from(QUANTITIES[:8]),
                      "step": st.sampled_from(QUANTITIES[:8])})),
})
capacity = st.one_of(
    st.sampled_from(QUANTITIES).map(lambda q: {"value": q}),
    st.tuples(st.sampled_from(QUANTITIES), policy).map(lambda qp: {"value": qp[0], "requestPolicy": qp[1]}),
    st.sampled_from([{}, None, "80Gi", {"value": "80Gi", "requestPolicy": None}, {"value": "1Gi", "other": 1}]),
)
taint = st.one_of(
    st.fixed_dictionaries({"key": st.sampled_from(["example.com/xid", "", None]),
                           "effect": st.sampled_from(["NoSchedule", "NoExecute", "None", "Sometimes", None])},
                          optional={"value": st.sampled_from(["79", 3]),
                                    "timeAdded": st.sampled_from(["2026-11-27T10:00:00Z", 5])}),
    st.sampled_from(["NoSchedule", None]),
)


def _fields(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.dictionaries(st.sampled_from(NAMES), values, max_size=6),
                     st.sampled_from([None, [], "x", {}]))


device = st.fixed_dictionaries(
    {"name": st.sampled_from(["gpu-0", "gpu-7", "", None, 3])},
    optional={
        "attributes": _fields(attribute), "capacity": _fields(capacity),
        "allowMultipleAllocations": st.sampled_from([True, False, None, "true", 1]),
        "taints": st.one_of(st.lists(taint, max_size=2), st.sampled_from([None, "NoSchedule", {}])),
        "nodeName": st.sampled_from(["node-a", "", None, 5]), "bindsToNode": st.sampled_from([True, False, "yes"]),
    },
)


def _read(read: Any, driver: str, raw: Any) -> tuple[str, str]:
    """What a reader makes of ``raw``: its device (repr: types and build metadata included, so ``1`` is not
    ``True`` and ``1.0.0+a`` not ``1.0.0+b``), or its refusal's type and message."""
    try:
        return "device", repr(read(driver, "pool", raw))
    except (ValueError, TypeError) as e:
        return type(e).__name__, str(e)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(device, st.sampled_from([DRIVER, "d.example.com", "Bad!", ""]))
def test_the_fast_reader_reads_any_device_as_the_reference_does(raw: dict[str, Any], driver: str) -> None:
    # Through JSON too where it can be (fresh strings, as the API client decodes them), and twice: the second
    # read comes from the caches the first one filled.
    decoded = json.loads(json.dumps(raw))
    expected = _read(dradevices_reference.parse_slice_device, driver, raw)
    assert _read(dradevices.parse_slice_device, driver, decoded) == expected
    assert _read(dradevices.parse_slice_device, driver, raw) == expected


VALID_NAMES = [n for n in NAMES if dradevices._checked_name(n, DRIVER) is not None]
# Devices that are nearly all well formed, so that a value the checking reader refuses is not hidden behind an
# earlier refusal: each value on its own, at the edges (64 and 65 characters, versions with pre-release and build,
# true where an int is due).
alike = st.fixed_dictionaries({
    "name": st.sampled_from(["gpu-0", "gpu-1"]),
    "attributes": st.dictionaries(st.sampled_from(VALID_NAMES), scalars, max_size=4),
    "capacity": st.dictionaries(st.sampled_from(VALID_NAMES), st.sampled_from(QUANTITIES).map(lambda q: {"value": q}),
                                max_size=2),
})


@settings(max_examples=1000, deadline=None)
@given(alike)
def test_the_fast_reader_reads_nearly_valid_devices_as_the_reference_does(raw: dict[str, Any]) -> None:
    expected = _read(dradevices_reference.parse_slice_device, DRIVER, raw)
    assert _read(dradevices.parse_slice_device, DRIVER, json.loads(json.dumps(raw))) == expected


def _one(attributes: dict[str, Any] | None = None, capacity: dict[str, Any] | None = None,
         **extra: Any) -> dradevices.SliceDevice:
    raw: dict[str, Any] = {"name": "gpu-0", **extra}
    if attributes is not None:
        raw["attributes"] = attributes
    if capacity is not None:
        raw["capacity"] = capacity
    return dradevices.parse_slice_device(DRIVER, "pool", raw)


def test_an_attribute_with_two_values_is_refused_even_after_its_alike_with_one_was_read() -> None:
    assert _one({"index": {"int": 1}}).attribute("index") == 1
    with pytest.raises(ValueError, match=r"attributes\['index'\]: exactly one of .* found \['int', 'string'\]"):
        _one({"index": {"int": 1, "string": "1"}})
    with pytest.raises(ValueError, match=r"attributes\['mig'\]: exactly one of .* found \['bool', 'bools'\]"):
        _one({"mig": {"bool": True, "bools": [True]}})


def test_true_is_no_int_and_one_no_bool_whatever_was_read_before() -> None:
    index, mig = _one({"index": {"int": 1}, "mig": {"bool": True}}).attributes.values()
    assert (type(index), type(mig)) == (int, bool)
    with pytest.raises(ValueError, match=r"attributes\['index'\]\.int: must be an integer, not True"):
        _one({"index": {"int": True}})
    with pytest.raises(ValueError, match=r"attributes\['mig'\]\.bool: must be true or false, not 1"):
        _one({"mig": {"bool": 1}})


@pytest.mark.parametrize("text,version", [
    ("580.95.5", Version(580, 95, 5)),
    ("1.0.0-rc.1+build.7", Version(1, 0, 0, ("rc", 1), ("build", "7"))),
    ("1.2.3-alpha.beta", Version(1, 2, 3, ("alpha", "beta"))),
])
def test_version_attributes_read_as_semantic_versions(text: str, version: Version) -> None:
    for _ in range(2):  # the second from the cache
        read = _one({"v": {"version": text}}).attribute("v")
        assert isinstance(read, Version) and str(read) == str(version) and read == version


@pytest.mark.parametrize("text,problem", [
    ("1.0", "'1.0' is not a semantic version"), ("v1.2.3", "'v1.2.3' is not a semantic version"),
    ("1.0.0-01", "pre-release number '01' has a leading zero"), ("1" * 65, "longer than 64 characters"),
])
def test_a_bad_version_is_refused_each_time(text: str, problem: str) -> None:
    for _ in range(2):  # a refusal is not cached as a value
        with pytest.raises(ValueError, match=rf"attributes\['v'\]\.version: .*{problem}"):
            _one({"v": {"version": text}})


@pytest.mark.parametrize("text,exact", [
    ("80Gi", 80 * 2**30), ("1.5G", 1_500_000_000), ("500m", Quantity.parse("0.5").value), ("1e3", 1000),
    ("0.1n", Quantity.parse("1n").value),  # finer than a nano rounds up, as ParseQuantity does
])
def test_capacities_read_as_exact_quantities(text: str, exact: Any) -> None:
    for _ in range(2):
        cap = _one(capacity={"memory": {"value": text}}).capacity["gpu.nvidia.com/memory"]
        assert cap.value.value == exact and cap.value.text == text and cap.request_policy is None


def test_a_bad_quantity_is_refused_each_time() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match=r"capacity\['memory'\]\.value: '80 Gi' is not a quantity"):
            _one(capacity={"memory": {"value": "80 Gi"}})


def test_a_huge_slice_reads_whole_and_alike_devices_share_their_names_and_values() -> None:
    # 2,000 devices as the API client decodes them (one string per occurrence): the cluster's alike GPUs hold one
    # copy of each attribute name, model string and capacity, not one per device.
    body = {"spec": {"driver": DRIVER, "pool": {"name": "node-a"}, "devices": [
        {"name": f"gpu-{i}", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                                            "uuid": {"string": f"GPU-{i:08d}"},
                                            "driverVersion": {"version": "580.95.5"}, "index": {"int": i}},
         "capacity": {"memory": {"value": "80Gi"}}} for i in range(2000)]}}
    devices = dradevices.slice_devices(json.loads(json.dumps(body)))
    assert [d.name for d in devices] == [f"gpu-{i}" for i in range(2000)]
    assert devices[1999].attributes == {"gpu.nvidia.com/productName": "NVIDIA H100 80GB HBM3",
                                        "gpu.nvidia.com/uuid": "GPU-00001999",
                                        "gpu.nvidia.com/driverVersion": Version(580, 95, 5),
                                        "gpu.nvidia.com/index": 1999}
    first, last = devices[0], devices[-1]
    assert all(a is b for a, b in zip(first.attributes, last.attributes, strict=True))  # the names
    assert first.attribute("productName") is last.attribute("productName")
    assert first.attribute("driverVersion") is last.attribute("driverVersion")
    assert first.capacity["gpu.nvidia.com/memory"] is last.capacity["gpu.nvidia.com/memory"]
