"""cel-python (``celpy``) dressed as kube-scheduler's CEL environment for device selectors: the ``device``
value and the Kubernetes library functions cel-python lacks. Imported only by ``deviceselectors`` when the
first selector is compiled (it imports celpy, which takes a while to load).

What cel-go / Kubernetes do, and where it comes from:

- ``device``: k8s.io/dynamic-resource-allocation/cel/compile.go ``DeviceMatches``: ``driver`` (string),
  ``allowMultipleAllocations`` (bool, false when unset), ``attributes`` and ``capacity`` as maps of domain ->
  map of id -> value; looking up a domain the device does not have yields an empty map
  (``newStringInterfaceMapWithDefault``), so only the missing *id* is the runtime error ``no such key``.
  Version attributes are semver values, capacities quantities.
- Equality is cel-go's heterogeneous equality: values of different types are unequal (``1 == '1'`` is false, not
  an error), numbers compare by value across int/uint/double, lists and maps element-wise.
- k8s.io/apiserver/pkg/cel/library quantity.go (``quantity``, ``isQuantity``, ``compareTo``, ``isGreaterThan``,
  ``isLessThan``, ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add``, ``sub``, ``mul``),
  semverlib.go (``semver``, ``isSemver`` with the optional normalise flag, ``major``/``minor``/``patch``,
  the comparisons), lists.go (``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``, ``lastIndexOf``),
  regex.go (``find``, ``findAll``); cel-go ext/strings.go (``charAt``, ``indexOf``, ``lastIndexOf``,
  ``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``, ``join``, ``reverse``);
  compile.go's ``includes`` (1.36 list-typed attributes).

Methods dispatch on the receiver's type here (celpy calls ``x.f(y)`` as ``f(x, y)`` whatever ``x`` is); a
receiver of the wrong type is cel-go's runtime ``no such overload``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from celpy import celtypes
from celpy.evaluation import CELEvalError

from deviceshare.core import dradevices
from deviceshare.core.dravalues import INT64_MAX, INT64_MIN, Quantity, Version

Value = Any  # a celpy value or a CELEvalError
_T = TypeVar("_T")


class _Opaque(Generic[_T]):
    """A Kubernetes library value inside CEL, equal by its value (``apiservercel.Quantity``/``Semver``)."""

    __slots__ = ("value",)
    function = ""

    def __init__(self, value: _T) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"{self.function}({str(self.value)!r})"


class QuantityValue(_Opaque[Quantity]):
    function = "quantity"


class SemverValue(_Opaque[Version]):
    function = "semver"


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def error(message: str) -> CELEvalError:
    return CELEvalError(message, TypeError, (message,))


def no_overload(name: str, *args: Value) -> CELEvalError:
    return error(f"no such overload: {name}({', '.join(type_name(a) for a in args)})")


def type_name(value: Value) -> str:
    """CEL's name for a value's type; celpy hands back plain Python values from some operations too."""
    for kind, name in ((bool, "bool"), (celtypes.BoolType, "bool"), (celtypes.UintType, "uint"), (int, "int"),
                       (float, "double"), (str, "string"), (bytes, "bytes"), (list, "list"), (dict, "map"),
                       (QuantityValue, "Quantity"), (SemverValue, "Semver"), (celtypes.TimestampType, "timestamp"),
                       (celtypes.DurationType, "duration"), (type, "type")):
        if isinstance(value, kind):
            return name
    return "null_type" if value is None else type(value).__name__


# -- the device -------------------------------------------------------------------------------------------------


def to_cel(value: dradevices.DeviceAttribute | Quantity) -> Value:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, Version):
        return SemverValue(value)
    if isinstance(value, Quantity):
        return QuantityValue(value)
    return celtypes.ListType([to_cel(v) for v in value])


def device_value(device: dradevices.SliceDevice) -> celtypes.MapType:
    """The ``device`` variable, as compile.go's DeviceMatches builds it."""
    return celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.allow_multiple_allocations),
        celtypes.StringType("attributes"): _by_domain(device.attributes, to_cel),
        celtypes.StringType("capacity"): _by_domain(device.capacity, lambda c: QuantityValue(c.value)),
    })


def _by_domain(values: Mapping[str, Any], convert: Callable[[Any], Value]) -> DomainMap:
    domains: dict[str, dict[Any, Value]] = {}
    for name, value in values.items():
        domain, ident = dradevices.split_qualified(name)
        domains.setdefault(domain, {})[celtypes.StringType(ident)] = convert(value)
    return DomainMap({celtypes.StringType(d): celtypes.MapType(v) for d, v in domains.items()})


# -- equality and order (cel-go's heterogeneous equality) ---------------------------------------------------------

def is_number(v: Value) -> bool:
    return type_name(v) in ("int", "uint", "double")


def _plain(v: Value) -> Any:
    """A number as Python's own (celpy's int types refuse to meet each other; Python compares int and float
    exactly, as cel-go's cross-type numeric comparisons do)."""
    return float(v) if isinstance(v, float) else int(v)


def same(a: Value, b: Value) -> bool:
    if is_number(a) and is_number(b):
        return bool(_plain(a) == _plain(b))
    if isinstance(a, type) or isinstance(b, type):
        return a is b
    if isinstance(a, celtypes.ListType) and isinstance(b, celtypes.ListType):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, celtypes.MapType) and isinstance(b, celtypes.MapType):
        return len(a) == len(b) and all(k in b and same(v, b[k]) for k, v in a.items())
    if type_name(a) != type_name(b):
        return False
    return bool(a == b)


def equal(a: Value, b: Value) -> Value:
    for v in (a, b):
        if isinstance(v, CELEvalError):
            return v
    return celtypes.BoolType(same(a, b))


def not_equal(a: Value, b: Value) -> Value:
    result = equal(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(not result)


_ORDERED = ("bool", "string", "bytes", "timestamp", "duration")


def ordering(name: str, test: Callable[[int], bool]) -> Callable[[Value, Value], Value]:
    def compare(a: Value, b: Value) -> Value:
        for v in (a, b):
            if isinstance(v, CELEvalError):
                return v
        if is_number(a) and is_number(b):
            a, b = _plain(a), _plain(b)
        elif type_name(a) != type_name(b) or type_name(a) not in _ORDERED:
            return no_overload(name, a, b)
        return celtypes.BoolType(test((a > b) - (a < b)))
    compare.__name__ = name
    return compare


def _logical(name: str, absorbing: bool) -> Callable[[Value, Value], Value]:
    """cel-go's commutative ``&&`` / ``||``: the absorbing value wins over an error on either side; otherwise
    the first error is the result (``no such key: type``, not a complaint about two errors)."""
    def combine(a: Value, b: Value) -> Value:
        bools = [isinstance(v, celtypes.BoolType) for v in (a, b)]
        if any(ok and bool(v) is absorbing for ok, v in zip(bools, (a, b), strict=True)):
            return celtypes.BoolType(absorbing)
        if all(bools):
            return celtypes.BoolType(not absorbing)
        for v in (a, b):
            if isinstance(v, CELEvalError):
                return v
        return no_overload(name, a, b)
    combine.__name__ = name
    return combine


logical_and, logical_or = _logical("_&&_", absorbing=False), _logical("_||_", absorbing=True)


def iterable(value: Value) -> Value:
    """What a macro may run over: a list or a map, else cel-go's error."""
    if isinstance(value, CELEvalError | celtypes.ListType | celtypes.MapType):
        return value
    return error(f"got '{_GO_TYPES.get(type_name(value), type_name(value))}', expected iterable type")


_GO_TYPES = {"bool": "types.Bool", "int": "types.Int", "uint": "types.Uint", "double": "types.Double",
             "string": "types.String", "bytes": "types.Bytes", "Semver": "cel.Semver", "Quantity": "cel.Quantity"}


# -- quantity and semver ------------------------------------------------------------------------------------------


def guarded(name: str, func: Callable[..., Value]) -> Callable[..., Value]:
    """Errors in arguments propagate; a wrong type or count is ``no such overload``; ValueError is the
    function's own error (``quantity('1,5')``)."""
    def call(*args: Value) -> Value:
        for a in args:
            if isinstance(a, CELEvalError):
                return a
        try:
            return func(*args)
        except TypeError:
            return no_overload(name, *args)
        except ValueError as e:
            return error(str(e))
    call.__name__ = call.__qualname__ = name
    return call


def as_string(v: Value) -> str:
    if not isinstance(v, celtypes.StringType):
        raise TypeError
    return str(v)


def as_int(v: Value) -> int:
    if not isinstance(v, celtypes.IntType):
        raise TypeError
    return int(v)


def _comparable(a: Value, b: Value) -> int:
    if isinstance(a, QuantityValue) and isinstance(b, QuantityValue):
        return a.value.compare(b.value)
    if isinstance(a, SemverValue) and isinstance(b, SemverValue):
        return a.value.compare(b.value)
    raise TypeError


def _quantity(v: Value) -> Quantity:
    if not isinstance(v, QuantityValue):
        raise TypeError
    return v.value


def _semver(v: Value) -> Version:
    if not isinstance(v, SemverValue):
        raise TypeError
    return v.value


def _int64(value: int) -> Value:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("integer overflow")
    return celtypes.IntType(value)


def _semver_parse(text: Value, normalize: Value = None) -> Version:
    if normalize is not None and not isinstance(normalize, celtypes.BoolType):
        raise TypeError
    return Version.parse_normalized(as_string(text)) if normalize else Version.parse(as_string(text))


def _semver_ok(text: Value, normalize: Value = None) -> bool:
    try:
        _semver_parse(text, normalize)
    except ValueError:
        return False
    return True


def _quantity_ok(text: Value) -> bool:
    try:
        Quantity.parse(as_string(text))
    except ValueError:
        return False
    return True


def _plus(q: Value, other: Value, sign: int) -> Value:
    amount = other.value.value if isinstance(other, QuantityValue) else as_int(other)
    return QuantityValue(Quantity.of(_quantity(q).value + sign * amount))


def _as_integer(q: Value) -> Value:
    value = _quantity(q).as_int64()
    if value is None:
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(value)


_QUANTITY_AND_SEMVER: dict[str, Callable[..., Value]] = {
    "quantity": lambda s: QuantityValue(Quantity.parse(as_string(s))),
    "isQuantity": lambda s: celtypes.BoolType(_quantity_ok(s)),
    "semver": lambda s, n=None: SemverValue(_semver_parse(s, n)),
    "isSemver": lambda s, n=None: celtypes.BoolType(_semver_ok(s, n)),
    "compareTo": lambda a, b: celtypes.IntType(_comparable(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_comparable(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_comparable(a, b) < 0),
    "major": lambda v: celtypes.IntType(_semver(v).major),
    "minor": lambda v: celtypes.IntType(_semver(v).minor),
    "patch": lambda v: celtypes.IntType(_semver(v).patch),
    "sign": lambda q: celtypes.IntType(_quantity(q).sign()),
    "isInteger": lambda q: celtypes.BoolType(_quantity(q).as_int64() is not None),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(_quantity(q).as_float()),
    "add": lambda q, o: _plus(q, o, 1),
    "sub": lambda q, o: _plus(q, o, -1),
    "mul": lambda q, n: QuantityValue(Quantity.of(_quantity(q).value * as_int(n))),
}

QUANTITY_AND_SEMVER = {name: guarded(name, func) for name, func in _QUANTITY_AND_SEMVER.items()}
