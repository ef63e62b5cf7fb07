"""CEL evaluation (cel-python) for CRD ``x-kubernetes-validations`` and webhook ``matchConditions``.

Programs are compiled once per expression and cached: compiling is the slow part, and CRDs and
webhook configurations repeat the same few rules on every request. ``celpy`` is imported on first
use so the sandbox starts fast when no rule is evaluated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

_OLD_SELF = re.compile(r"\boldSelf\b")


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


def is_true(expression: str, variables: Mapping[str, Any]) -> bool:
    from celpy import celtypes

    result = evaluate(expression, variables)
    if isinstance(result, celtypes.BoolType):
        return bool(result)
    if not isinstance(result, bool):
        raise CelError(f"expression {expression!r} evaluated to {type(result).__name__}, not bool")
    return bool(result)
