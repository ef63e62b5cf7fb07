"""The two value types DRA devices carry besides bool, int and string: semantic versions and quantities.

Both are compared exactly as Kubernetes compares them, because a device selector's answer depends on it:

- :class:`Version` is blang/semver v4's ``semver.Parse`` (strict ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``, no
  leading zeros in numeric parts) and ``Version.Compare`` (build metadata ignored; a pre-release sorts before
  its release; numeric identifiers compare as numbers and below alphanumeric ones; a shorter pre-release list
  sorts first when the common part is equal). ``semver(s, true)``'s normalisation follows
  k8s.io/apiserver/pkg/cel/library/semverlib.go ``normalizeAndParse``.
- :class:`Quantity` is apimachinery's ``resource.ParseQuantity`` grammar (``<signedNumber><suffix>``, binary
  ``Ki..Ei``, decimal ``n u m k M G T P E`` or an exponent ``e<n>``/``E<n>``; no surrounding blanks), held as
  an exact fraction, so ``quantity('200M').compareTo(quantity('0.2G')) == 0`` as ``Quantity.Cmp`` says.
  Values more precise than ``1n`` round up to the next nano, as ``ParseQuantity`` rounds them. Not as
  Kubernetes: an exponent beyond ``MAX_EXPONENT`` (``1e1001``) is refused, where ParseQuantity takes any int32
  one; an exact fraction would have to build ``10**exponent`` (minutes for ``1e999999999``).
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import math
import re

_NUMERIC = re.compile(r"^(0|[1-9][0-9]*)$")
_IDENTIFIER = re.compile(r"^[0-9A-Za-z-]+$")
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
                     r"(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$")


@functools.total_ordering
@dataclasses.dataclass(frozen=True, eq=False)
class Version:
    """A semantic version (semver.org 2.0.0). Equality and order ignore build metadata, as semver's Compare."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Version:
        """semver.Parse; ValueError naming what is wrong."""
        if not isinstance(text, str):
            raise ValueError(f"not a semantic version: {text!r}")
        m = _SEMVER.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD])")
        pre: list[int | str] = []
        if m.group(4) is not None:
            for part in m.group(4).split("."):
                if not part or not _IDENTIFIER.match(part):
                    raise ValueError(f"{text!r}: invalid pre-release identifier {part!r}")
                if part.isdigit():
                    if not _NUMERIC.match(part):
                        raise ValueError(f"{text!r}: pre-release number {part!r} has a leading zero")
                    pre.append(int(part))
                else:
                    pre.append(part)
        build: list[str] = []
        if m.group(5) is not None:
            for part in m.group(5).split("."):
                if not part or not _IDENTIFIER.match(part):
                    raise ValueError(f"{text!r}: invalid build identifier {part!r}")
                build.append(part)
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), tuple(pre), tuple(build))

    @classmethod
    def parse_normalized(cls, text: str) -> Version:
        """``semver(s, true)``: a leading ``v`` dropped, leading zeros dropped, missing minor/patch as 0."""
        if not isinstance(text, str):
            raise ValueError(f"not a semantic version: {text!r}")
        parts = text.removeprefix("v").split(".", 2)
        for i, part in enumerate(parts):
            if len(part) > 1:
                stripped = part.lstrip("0")
                if not stripped or not stripped[0].isdigit():
                    stripped = "0" + stripped
                parts[i] = stripped
        if len(parts) < 3:
            if any(c in parts[-1] for c in "+-"):
                raise ValueError(f"{text!r}: a short version cannot carry pre-release or build metadata")
            parts += ["0"] * (3 - len(parts))
        return cls.parse(".".join(parts))

    def compare(self, other: Version) -> int:
        """-1, 0 or 1, as semver's ``Version.Compare``."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)  # a release sorts after its pre-releases
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            if isinstance(a, int) != isinstance(b, int):
                return -1 if isinstance(a, int) else 1  # numeric identifiers sort first
            return -1 if a < b else 1  # type: ignore[operator]  # same type, checked above
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.compare(other) == 0

    def __lt__(self, other: Version) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


# One way to split the digits (``[0-9]+(?:\.[0-9]*)?``, not ``[0-9]+\.?[0-9]*``): the latter backtracks quadratically on
# a long run of digits that ends wrong, seconds for a 10 KiB selector's ``isQuantity('111...1x')``.
_QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
# ParseQuantity takes any int32 exponent (inf.Dec keeps it as a scale); an exact fraction would have to build
# 10**exponent, minutes and gigabytes for ``1e999999999``. Beyond this the text is refused as out of range.
MAX_EXPONENT = 1000
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NANO = fractions.Fraction(1, 10**9)
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


@functools.total_ordering
@dataclasses.dataclass(frozen=True, eq=False)
class Quantity:
    """A Kubernetes resource quantity as an exact number; ``text`` is how it was written (for messages)."""

    value: fractions.Fraction
    text: str = ""
    _hash: int = dataclasses.field(init=False, repr=False, compare=False, default=0)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """resource.ParseQuantity; ValueError naming what is wrong."""
        if isinstance(text, bool) or not isinstance(text, str | int):
            raise ValueError(f"not a quantity: {text!r}")
        if isinstance(text, int):
            return cls(fractions.Fraction(text), str(text))
        return _parse_quantity(text)

    @classmethod
    def of(cls, value: int | fractions.Fraction) -> Quantity:
        return cls(fractions.Fraction(value), str(value))

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def as_int64(self) -> int | None:
        """The value as an int64, or None when it has a fraction or overflows (``Quantity.AsInt64``)."""
        if self.value.denominator != 1 or not INT64_MIN <= self.value.numerator <= INT64_MAX:
            return None
        return self.value.numerator

    def as_float(self) -> float:
        try:
            return float(self.value)
        except OverflowError:
            return math.inf if self.value > 0 else -math.inf

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.value))  # Fraction's hash is slow; cache keys hash it often

    def __str__(self) -> str:
        return self.text or str(self.value)


@functools.lru_cache(maxsize=4096)
def _parse_quantity(text: str) -> Quantity:
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a quantity (e.g. 80Gi, 1.5G, 500m, 1e9)")
    sign, digits, suffix = m.group(1), m.group(2), m.group(3) or ""
    number = fractions.Fraction(digits if not digits.endswith(".") else digits[:-1] or "0")
    if suffix in _BINARY:
        number *= 2 ** _BINARY[suffix]
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = suffix[1:].lstrip("+-").lstrip("0")  # its digits: no int() of thousands of them either
        if len(exponent) > len(str(MAX_EXPONENT)) or int(exponent or "0") > MAX_EXPONENT:
            raise ValueError(f"{text!r}: exponent out of range (at most {MAX_EXPONENT} either way)")
        number *= fractions.Fraction(10) ** (int(exponent or "0") * (-1 if suffix[1] == "-" else 1))
    else:
        number *= fractions.Fraction(10) ** _DECIMAL[suffix]
    if (number / _NANO).denominator != 1:  # more precise than 1n: ParseQuantity rounds up (away from zero)
        number = math.ceil(number / _NANO) * _NANO
    return Quantity(-number if sign == "-" else number, text)
