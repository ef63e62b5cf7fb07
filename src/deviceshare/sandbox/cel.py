"""CEL evaluation (cel-python) for CRD ``x-kubernetes-validations`` and webhook ``matchConditions``.

Programs are compiled once per expression and cached: compiling is the slow part, and CRDs and
webhook configurations repeat the same few rules on every request. ``celpy`` is imported on first
use so the sandbox starts fast when no rule is evaluated.

Results are cached too (evaluating is ~2 ms in celpy, and a CRD's root rules run on every status
write). The key is the expression plus the *parts of the variables it reads*: for each mention of a
variable, the chain of field selections after it (``self.spec.resources``), cut before a method call
(``self.spec.all(...)`` reads all of ``spec``) and before anything that is not a plain selection
(an index, ``.?``), so the projection always covers what the expression can see. A status write that
leaves ``spec`` and ``status.phase`` alone then reuses the verdict of the rules that read only those.
"""

from __future__ import annotations

import collections
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

_OLD_SELF = re.compile(r"\boldSelf\b")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MENTION = re.compile(rf"(?<![.\w])({_IDENT})((?:\s*\.\s*{_IDENT})*)(\s*\()?")
_HAS_BEFORE = re.compile(r"(?<![\w.])has\(\s*$")
_RESULTS_MAX = 8192
_results: collections.OrderedDict[tuple[str, str], bool | str] = collections.OrderedDict()


class CelError(Exception):
    """The expression did not compile or failed at run time."""


def is_transition_rule(rule: str) -> bool:
    """Rules that mention ``oldSelf`` run only on updates, as in kube-apiserver."""
    return bool(_OLD_SELF.search(rule))


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import celpy

    return celpy.Environment()  # building the parser is the expensive part: once per process


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    env = _environment()
    try:
        return env.program(env.compile(expression))
    except Exception as e:  # celpy raises its own CELParseError/CELSyntaxError and Lark errors
        raise CelError(f"compilation failed: {e}") from e


def compiled(expression: str) -> None:
    """Compile (and cache) ``expression``; :class:`CelError` when it does not compile."""
    _program(expression)


def evaluate(expression: str, variables: Mapping[str, Any]) -> Any:
    """Evaluate with JSON-like variables; returns the CEL value (a bool for rules and conditions)."""
    from celpy import adapter

    program = _program(expression)
    activation = {name: adapter.json_to_cel(value) for name, value in variables.items()}
    try:
        result = program.evaluate(activation)
    except Exception as e:
        raise CelError(str(e)) from e
    if isinstance(result, Exception):  # celpy returns CELEvalError values for some failures
        raise CelError(str(result))
    return result


Read = tuple[tuple[str, ...], bool]  # (field path, whether only the presence of its last field matters)


@functools.lru_cache(maxsize=512)
def _reads(expression: str) -> dict[str, tuple[Read, ...]]:
    """Variable name -> what the expression may read under it: field paths (() is the whole value),
    each marked presence-only when it is the whole argument of ``has()``."""
    found: dict[str, set[Read]] = {}
    for m in _MENTION.finditer(expression):
        path = tuple(part.strip() for part in m.group(2).split(".")[1:])
        if m.group(3):  # the last selection is a method called on what precedes it
            path = path[:-1]
        rest = expression[m.end(2):].lstrip()
        if rest.startswith((".", "[")) and not m.group(3):  # `.?field`, an index: stop one earlier
            path = path[:-1] if rest.startswith(".") and path else path
        presence = (
            bool(path) and not m.group(3) and rest.startswith(")")
            and _HAS_BEFORE.search(expression, 0, m.start()) is not None
        )
        found.setdefault(m.group(1), set()).add((path, presence))
    return {name: tuple(sorted(reads)) for name, reads in found.items()}


def _project(value: Any, path: tuple[str, ...], presence: bool) -> list[Any]:
    """What the expression can see at ``path``; equal projections mean equal views. ``presence``: only
    whether the last field exists (``has(x.a.b)`` reads the keys of ``x.a``, not the value of ``b``)."""
    walk = path[:-1] if presence else path
    for depth, part in enumerate(walk):
        if not isinstance(value, Mapping):
            return [depth, "value", value]  # what the rule sees here is this whole non-map value
        if part not in value:
            return [depth, "absent"]
        value = value[part]
    if presence:
        if isinstance(value, Mapping):
            return [len(walk), "has", path[-1] in value]
        return [len(walk), "value", value]
    return [len(walk), "value", value]


def _key(expression: str, variables: Mapping[str, Any]) -> str | None:
    reads = _reads(expression)
    parts = []
    for name, value in variables.items():
        for path, presence in reads.get(name, ()):
            parts.append([name, path, presence, *_project(value, path, presence)])
    try:
        return json.dumps(parts, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def is_true(expression: str, variables: Mapping[str, Any]) -> bool:
    """Evaluate a rule or condition that must yield a bool (cached by what it reads; see the module doc)."""
    key = _key(expression, variables)
    if key is not None:
        cached = _results.get((expression, key))
        if cached is not None:
            _results.move_to_end((expression, key))
            if isinstance(cached, str):
                raise CelError(cached)
            return cached
    try:
        verdict: bool | str = _is_true(expression, variables)
    except CelError as e:
        verdict = str(e)
    if key is not None:
        _results[(expression, key)] = verdict
        if len(_results) > _RESULTS_MAX:
            _results.popitem(last=False)
    if isinstance(verdict, str):
        raise CelError(verdict)
    return verdict


def _is_true(expression: str, variables: Mapping[str, Any]) -> bool:
    from celpy import celtypes

    result = evaluate(expression, variables)
    if isinstance(result, celtypes.BoolType):
        return bool(result)
    if not isinstance(result, bool):
        raise CelError(f"expression {expression!r} evaluated to {type(result).__name__}, not bool")
    return bool(result)
