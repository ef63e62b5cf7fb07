"""Quantities and semantic versions compare as Kubernetes compares them (apimachinery resource.Quantity, blang
semver v4 as the CEL semver library uses it)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.core import deviceselectors, dradevices
from deviceshare.core.dravalues import Quantity, Version

deviceselectors.compile_selectors(["true"])  # celpy raises the recursion limit on first use: not inside hypothesis


@pytest.mark.parametrize("text,value", [
    ("80Gi", 80 * 2**30), ("1.5G", 1_500_000_000), ("200k", 200_000), ("500m", Fraction(1, 2)), ("1e3", 1000),
    ("1E3", 1000), ("1e-3", Fraction(1, 1000)), ("+1", 1), ("-1Ki", -1024), (".5", Fraction(1, 2)), ("1.", 1),
    ("1E", 10**18), ("0.1n", Fraction(1, 10**9)),  # finer than a nano rounds up, as ParseQuantity
])
def test_quantities_parse_as_kubernetes_parses_them(text: str, value: Fraction) -> None:
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize("text", ["200K", "Three", "Mi", "1,3G", " 1Gi", "1Gi ", "", "1e", "1.2.3", "0x10"])
def test_what_parse_quantity_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        Quantity.parse(text)


def test_the_upstream_quantity_examples() -> None:
    # k8s.io/apiserver/pkg/cel/library/quantity.go's documented examples
    assert Quantity.parse("200M").compare(Quantity.parse("0.2G")) == 0
    assert Quantity.parse("50M").compare(Quantity.parse("50Mi")) == -1
    assert Quantity.parse("50Mi").compare(Quantity.parse("50M")) == 1
    assert Quantity.parse("9999999999999999999999999999999999999G").as_int64() is None
    assert Quantity.parse("50k").as_int64() == 50000


@pytest.mark.parametrize("low,high", [
    ("1.0.0-alpha", "1.0.0-alpha.1"), ("1.0.0-alpha.1", "1.0.0-alpha.beta"), ("1.0.0-alpha.beta", "1.0.0-beta"),
    ("1.0.0-beta", "1.0.0-beta.2"), ("1.0.0-beta.2", "1.0.0-beta.11"), ("1.0.0-beta.11", "1.0.0-rc.1"),
    ("1.0.0-rc.1", "1.0.0"), ("1.9.0", "1.10.0"), ("1.10.0", "1.11.0"), ("0.9.99", "1.0.0"),
])
def test_semver_precedence_of_semver_org(low: str, high: str) -> None:
    assert Version.parse(low).compare(Version.parse(high)) == -1
    assert Version.parse(high).compare(Version.parse(low)) == 1


def test_semver_parsing_is_strict_and_build_metadata_does_not_count() -> None:
    for bad in ("1.0", "v1.0.0", "01.0.0", "1.0.0-01", "1.0.0-", "1.0.0+", "1.0.0-a..b"):
        with pytest.raises(ValueError):
            Version.parse(bad)
    assert Version.parse("1.0.0+build.1") == Version.parse("1.0.0+other")
    assert str(Version.parse("1.2.3-rc.1+b.5")) == "1.2.3-rc.1+b.5"
    assert Version.parse_normalized("v01.2") == Version(1, 2, 0)
    with pytest.raises(ValueError):
        Version.parse_normalized("1.2-rc")


_SUFFIXES = ["", "k", "M", "G", "T", "m", "u", "n", "Ki", "Mi", "Gi", "Ti", "e3", "E-2"]
_FACTORS = [Fraction(1), Fraction(10**3), Fraction(10**6), Fraction(10**9), Fraction(10**12), Fraction(1, 10**3),
            Fraction(1, 10**6), Fraction(1, 10**9), Fraction(2**10), Fraction(2**20), Fraction(2**30),
            Fraction(2**40), Fraction(10**3), Fraction(1, 100)]
quantities = st.tuples(st.integers(-(10**6), 10**6), st.integers(0, 999), st.integers(0, len(_SUFFIXES) - 1))


def _text(q: tuple[int, int, int]) -> str:
    whole, frac, suffix = q
    return f"{whole}.{frac:03d}{_SUFFIXES[suffix]}"


def _exact(q: tuple[int, int, int]) -> Fraction:
    whole, frac, suffix = q
    magnitude = (abs(whole) + Fraction(frac, 1000)) * _FACTORS[suffix]
    nanos = -(-magnitude * 10**9 // 1)  # ParseQuantity rounds up below a nano
    magnitude = Fraction(nanos, 10**9)
    return -magnitude if whole < 0 else magnitude


@given(quantities, quantities)
def test_compare_to_is_exact_and_antisymmetric(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    """CEL's compareTo on quantities agrees with exact Fraction arithmetic on the written values."""
    qa, qb = Quantity.parse(_text(a)), Quantity.parse(_text(b))
    expected = (_exact(a) > _exact(b)) - (_exact(a) < _exact(b))
    assert qa.compare(qb) == expected == -qb.compare(qa)
    device = dradevices.parse_slice_device("d.example.com", "p", {"name": "x", "capacity": {"c": {"value": _text(a)}}})
    selectors = deviceselectors.compile_selectors(
        [f"device.capacity['d.example.com'].c.compareTo(quantity('{_text(b)}')) == {expected}"])
    assert selectors.matches(device)


versions = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                     st.lists(st.one_of(st.integers(0, 3), st.sampled_from(["alpha", "beta", "rc", "a-1"])),
                              max_size=3))


@given(versions, versions)
def test_semver_compare_is_a_total_order_consistent_with_equality(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
    va = Version(a[0], a[1], a[2], tuple(a[3]))
    vb = Version(b[0], b[1], b[2], tuple(b[3]))
    assert Version.parse(str(va)) == va
    assert va.compare(vb) == -vb.compare(va)
    assert (va.compare(vb) == 0) == (va == vb) == (str(va) == str(vb))


@pytest.mark.parametrize("text", ["1e1001", "1e-1001", "1E999999999", "1e+000099999999999999999999"])
def test_an_exponent_out_of_range_is_refused_not_computed(text: str) -> None:
    # an exact fraction of 1e999999999 would be a billion-digit integer: minutes and gigabytes, from one selector
    with pytest.raises(ValueError, match="exponent out of range"):
        Quantity.parse(text)
    assert Quantity.parse("1e1000").value == 10**1000 and Quantity.parse("1e-0005").value == Fraction(1, 10**5)


# A hang guard, not a speed target: the old pattern backtracked quadratically, about 25 s for each of these (the
# C matcher holds the GIL, so the guard fires when it returns); a 10 KiB selector's isQuantity() took 7 s.
@pytest.mark.timeout(5, method="thread")
@pytest.mark.parametrize("text", ["1" * 20_000 + "x", "-" + "9" * 20_000 + "Kx"])
def test_a_long_run_of_digits_that_ends_wrong_is_refused_without_backtracking(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        Quantity.parse(text)
