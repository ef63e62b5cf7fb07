"""CEL device selectors (DeviceClass ``spec.selectors``, a request's ``exactly.selectors``), answered as
kube-scheduler answers them: compiled once with Kubernetes' DRA CEL environment, then run per device.

From the real source (kubernetes/kubernetes, 2026):

- staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go: the ``device`` variable (``driver``,
  ``allowMultipleAllocations``, ``attributes``, ``capacity``), ``cel.bind`` (ext.Bindings), ``includes``, an
  unknown domain reading as an empty map; a result must be ``bool``. Its errors are ``compilation failed:
  ERROR: <input>:L:C: ...`` — here :class:`SelectorError`, with ``selectorchecks`` doing what cel-go's type
  checker rejects (cel-python does not type-check).
- staging/src/k8s.io/dynamic-resource-allocation/structured/.../allocator.go ``selectorsMatch``: the
  selectors of a class and then of the request run in order and the first ``false`` ends it; a run-time error
  (``no such key: productName`` for an attribute the device lacks, ``no such overload`` comparing a string
  attribute with an int) is not a ``false``: it fails the allocation with ``selector #i: CEL runtime error:
  ...`` — here :class:`SelectorRuntimeError`. Whether it fails the claim or only skips the device is the
  caller's rule; kube-scheduler fails the pod's scheduling attempt.
- k8s.io/apiserver/pkg/cel/library quantity.go, semverlib.go, lists.go, regex.go and cel-go ext/strings.go:
  the functions cel-python lacks, in ``dracel`` / ``dracellib``.

Not modelled: CEL cost limits (``CELSelectorExpressionMaxCost``); the length limit is the API's validation.
Not supported, and refused at compile time rather than run differently: optional types (``.?field``,
``orValue``: cel-python cannot parse them), two-variable comprehensions (``all(k, v, ...)``) and the ``sets``,
``url``, ``ip``, ``cidr`` and ``format`` libraries of Kubernetes' base environment, none of which DRA drivers'
examples use.

Speed: cel-python interprets its parse tree, about 1-2 ms per evaluation. An expression only sees the parts of
``device`` it names (``device.attributes['gpu.nvidia.com'].productName``), so its verdicts are cached by
those parts: thousands of identical GPUs cost one evaluation. ``benchmarks/bench_selectors.py`` measures it.
cel-python is imported on the first compile, not at start-up.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceshare.core import dradevices, selectorchecks, selectortrees
from deviceshare.core.dradevices import SliceDevice
from deviceshare.core.dravalues import Quantity, Version

_MEMO_MAX = 65536


class SelectorError(ValueError):
    """A selector kube-apiserver would refuse. ``detail`` is its reason as the API words it
    (``compilation failed: ERROR: <input>:1:8: undefined field 'foo'``), for a field error on the expression."""

    def __init__(self, expression: str, detail: str) -> None:
        super().__init__(f"invalid CEL selector {expression!r}: {detail}")
        self.expression = expression
        self.detail = detail


class SelectorRuntimeError(ValueError):
    """A selector failed on a device (kube-scheduler's ``CEL runtime error``): the claim cannot be allocated
    with it until the selector or the device changes."""

    def __init__(self, index: int, expression: str, device: SliceDevice, reason: str) -> None:
        super().__init__(f"selector #{index} ({expression!r}): CEL runtime error on device {device.id}: {reason}")
        self.index = index
        self.expression = expression
        self.device = device
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Selectors:
    """Compiled selectors, all of which a device must satisfy. ``matches`` is cheap for devices that look
    alike to the expressions (see the module doc)."""

    programs: tuple[_Program, ...]

    @property
    def expressions(self) -> tuple[str, ...]:
        return tuple(p.expression for p in self.programs)

    def matches(self, device: SliceDevice) -> bool:
        """True when every selector accepts the device; :class:`SelectorRuntimeError` when one fails on it
        (the selectors before it having accepted it, as kube-scheduler runs them)."""
        for index, program in enumerate(self.programs):
            verdict = program.verdict(device)
            if isinstance(verdict, str):
                raise SelectorRuntimeError(index, program.expression, device, verdict)
            if not verdict:
                return False
        return True

    def __add__(self, other: Selectors) -> Selectors:
        """The class's selectors followed by the request's, as the allocator checks them."""
        return Selectors(self.programs + other.programs)


def compile_selectors(expressions: Sequence[str]) -> Selectors:
    """Compile (cached per expression); :class:`SelectorError` for the first one that does not compile."""
    if isinstance(expressions, str):
        raise TypeError("compile_selectors takes a sequence of expressions, not one string")
    return Selectors(tuple(_compile(e) for e in expressions))


def compile_api_selectors(items: Sequence[Mapping[str, Any]] | None) -> Selectors:
    """The ``selectors`` list of a DeviceClass spec or of a request's ``exactly`` as the API holds it
    (``[{cel: {expression: ...}}]``); :class:`SelectorError` for an entry without an expression, or one that
    does not compile."""
    expressions = []
    for i, item in enumerate(items or ()):
        cel = item.get("cel") if isinstance(item, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expression, str):
            raise SelectorError("", f"selectors[{i}].cel.expression: Required value")
        expressions.append(expression)
    return compile_selectors(expressions)


NO_SELECTORS = Selectors(())


# -- compiling ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import celpy

    return celpy.Environment()


@functools.lru_cache(maxsize=1)
def _functions() -> dict[str, Any]:
    from deviceshare.core import dracel, dracellib

    return {
        **dracel.QUANTITY_AND_SEMVER, **dracellib.STRINGS_LISTS_REGEX,
        "_==_": dracel.equal, "_!=_": dracel.not_equal, "_iterable": dracel.iterable,
        "_&&_": dracel.logical_and, "_||_": dracel.logical_or,
        "_<_": dracel.ordering("_<_", lambda c: c < 0), "_<=_": dracel.ordering("_<=_", lambda c: c <= 0),
        "_>_": dracel.ordering("_>_", lambda c: c > 0), "_>=_": dracel.ordering("_>=_", lambda c: c >= 0),
    }


@functools.lru_cache(maxsize=1024)
def _compile(expression: str) -> _Program:
    if not isinstance(expression, str) or not expression.strip():
        raise SelectorError(str(expression), "compilation failed: ERROR: <input>:1:1: the expression is empty")
    import celpy

    env = _environment()
    try:
        tree = env.compile(expression)
    except celpy.celparser.CELParseError as e:
        raise SelectorError(expression, _syntax_error(expression, e)) from None
    except RecursionError:
        raise SelectorError(expression, _compile_error(expression, "expression nested too deeply", 1, 0)) from None
    try:
        tree = selectortrees.rewrite_bind(tree)
        selectorchecks.check(tree)
    except RecursionError:
        raise SelectorError(expression, _compile_error(expression, "expression nested too deeply", 1, 0)) from None
    except selectorchecks.Problem as e:
        raise SelectorError(expression, _compile_error(expression, e.message, e.line, e.column)) from None
    return _Program(expression, env.program(selectortrees.guard_macros(tree), functions=_functions()),
                    selectortrees.device_reads(tree))


def _compile_error(expression: str, message: str, line: int, column: int) -> str:
    source = expression.splitlines()[line - 1] if expression.splitlines() else expression
    return f"compilation failed: ERROR: <input>:{line}:{column + 1}: {message}\n | {source}\n | {'.' * column}^"


def _syntax_error(expression: str, e: Any) -> str:
    line, column = getattr(e, "line", None) or 1, max((getattr(e, "column", None) or 1) - 1, 0)
    return _compile_error(expression, "Syntax error: unexpected input", line, column)


# -- evaluating ---------------------------------------------------------------------------------------------------

Path = selectortrees.Path
_ABSENT = ("absent",)


class _Program:
    """One compiled expression and its verdicts, keyed by what the expression can see of a device."""

    def __init__(self, expression: str, runner: Any, reads: tuple[Path, ...] | None) -> None:
        self.expression = expression
        self.runner = runner
        self.reads = reads  # None: the expression sees the whole device
        self.projectors = None if reads is None else tuple(_projector(p) for p in reads)
        self.memo: collections.OrderedDict[Any, bool | str] = collections.OrderedDict()
        self.evaluations = 0

    def verdict(self, device: SliceDevice) -> bool | str:
        """True/False, or the run-time error's reason."""
        key = device if self.projectors is None else tuple(project(device) for project in self.projectors)
        found = self.memo.get(key)
        if found is not None:
            return found
        found = self._evaluate(device)
        self.memo[key] = found
        if len(self.memo) > _MEMO_MAX:
            self.memo.popitem(last=False)
        return found

    def _evaluate(self, device: SliceDevice) -> bool | str:
        from celpy import celtypes
        from celpy.evaluation import CELEvalError

        from deviceshare.core import dracel

        self.evaluations += 1
        try:
            result = self.runner.evaluate({"device": dracel.device_value(device)})
        except CELEvalError as e:
            return _reason(e)
        except (RecursionError, ArithmeticError, TypeError, ValueError, KeyError) as e:  # celpy's own failures
            return f"{type(e).__name__}: {e}"
        if isinstance(result, CELEvalError):
            return _reason(result)
        if not isinstance(result, celtypes.BoolType):
            return f"CEL result of type {dracel.type_name(result)} could not be converted to bool"
        return bool(result)


_NO_SUCH_KEY = re.compile(r"no such member in mapping: '([^']*)'")


def _reason(error: Exception) -> str:
    """celpy's error, worded as cel-go's where they differ (``no such key: x``)."""
    while error.args and isinstance(error.args[0], str) and error.args[0] == "evaluation error" \
            and len(error.args) > 2 and error.args[2] and isinstance(error.args[2][0], str):
        error = Exception(*error.args[2])
    text = str(error.args[0]) if error.args else str(error)
    text = text.split(" (in activation ")[0]
    m = _NO_SUCH_KEY.search(text)
    if m:
        return f"no such key: {m.group(1)}"
    if text == "no such key" and len(error.args) > 2 and error.args[2]:
        return f"no such key: {error.args[2][0]}"
    return text


def _tagged(value: Any) -> Any:
    """A value with its type, so that True and 1 (equal in Python) stay apart in a cache key."""
    kind = type(value)
    if kind is tuple:
        return (kind, tuple(_tagged(v) for v in value))
    if kind is dradevices.DeviceCapacity:
        return (Quantity, value.value)
    return (kind, value)


def _projector(path: Path) -> Callable[[SliceDevice], Any]:
    """What an expression reading ``device.<path>`` sees of a device, as a function of the device."""
    head = path[0]
    if head == "driver":
        return operator.attrgetter("driver")
    if head == "allowMultipleAllocations":
        return operator.attrgetter("allow_multiple_allocations")
    if head not in ("attributes", "capacity"):
        return lambda device: _ABSENT  # a field cel-go's checker refused already
    values = operator.attrgetter(head)
    if len(path) == 1:
        return lambda device: tuple(sorted((k, _tagged(v)) for k, v in values(device).items()))
    if len(path) == 2:
        prefix = path[1] + "/"
        return lambda device: tuple(sorted((k, _tagged(v)) for k, v in values(device).items()
                                           if k.startswith(prefix)))
    name = f"{path[1]}/{path[2]}"

    def one(device: SliceDevice) -> Any:
        value = values(device).get(name, _ABSENT)
        return value if value is _ABSENT else _tagged(value)
    return one


__all__ = ["NO_SELECTORS", "Quantity", "SelectorError", "SelectorRuntimeError", "Selectors", "Version",
           "compile_api_selectors", "compile_selectors"]
