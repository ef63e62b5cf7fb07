"""Kubernetes ``resource.Quantity`` strings as exact numbers.

Both layers need them: ``api`` validates ``spec.share`` (``460m``, ``12Gi``) and ``core`` reads node
allocatable, pod requests and declared device memory. ``api`` may not import ``core``, so the one
parser lives here.
"""

from __future__ import annotations

import decimal
import functools
import math
import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": "1e-9", "u": "1e-6", "m": "1e-3", "": "1", "k": "1e3", "M": "1e6", "G": "1e9",
            "T": "1e12", "P": "1e15", "E": "1e18"}

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

MIB = 2**20


def quantity(q: str | int | float) -> decimal.Decimal:
    """A Kubernetes resource.Quantity as an exact decimal; ValueError when it is not one."""
    if isinstance(q, bool):
        raise ValueError(f"not a quantity: {q!r}")
    if isinstance(q, int):
        return decimal.Decimal(q)
    if isinstance(q, float):
        if not math.isfinite(q):
            raise ValueError(f"not a quantity: {q!r}")
        return decimal.Decimal(repr(q))
    if not isinstance(q, str):
        raise ValueError(f"not a quantity: {q!r}")
    match = _QUANTITY.match(q.strip())
    if not match:
        raise ValueError(f"not a quantity: {q!r}")
    number, suffix = decimal.Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number.scaleb(int(suffix[1:]))
    return number * decimal.Decimal(_DECIMAL[suffix])


def parse_milli(q: str | int | float) -> int:
    """A quantity in thousandths, rounded up like the API server does ("100m", "2", "0.5")."""
    return _milli(q, type(q).__name__)


def parse_bytes(q: str | int | float) -> int:
    """A quantity as a whole number, rounded up ("512Mi", "1G", "1e9")."""
    return _whole(q, type(q).__name__)


# Cached: 10,000 pods carry a handful of distinct quantities (the type keeps 1 and "1" apart).
@functools.lru_cache(maxsize=4096)
def _milli(q: str | int | float, _type: str) -> int:
    return math.ceil(quantity(q) * 1000)


@functools.lru_cache(maxsize=4096)
def _whole(q: str | int | float, _type: str) -> int:
    return math.ceil(quantity(q))


def format_mib(n_bytes: int) -> str:
    """Bytes as whole MiB, rounded down (a limit must not promise more than was reserved)."""
    return f"{n_bytes // MIB}"


def format_milli(milli: int) -> str:
    """Thousandths in the canonical Quantity form: ``1000`` -> ``1``, ``460`` -> ``460m``."""
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def format_bytes(n_bytes: int) -> str:
    """Bytes in the largest binary unit that divides them exactly (``12Gi``, ``1536Mi``, ``100``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if n_bytes and n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)
