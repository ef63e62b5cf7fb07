"""What cel-go's type checker rejects in a device selector before it ever runs, done on cel-python's parse tree
(cel-python parses but does not type-check), plus two things the selector engine needs from the tree.

kube-apiserver compiles every selector with the DRA environment (k8s.io/dynamic-resource-allocation/cel/
compile.go) and refuses, with ``compilation failed: ERROR: <input>:L:C: ...``:

- a name that is not declared: only ``device`` (and macro variables) exist — ``undeclared reference to 'x'``;
  an unknown function or method is the same error;
- a field ``device`` does not have (``driver``, ``attributes``, ``capacity``, ``allowMultipleAllocations``) —
  ``undefined field 'x'``;
- an operator or function applied to types with no overload, where the types are known (``device.driver ==
  1``, ``!device.driver``, ``quantity(1)``) — ``found no matching overload for '_==_' applied to '(string,
  int)'``; attribute values are ``dyn``, so anything goes on them until run time;
- a result that is not ``bool`` (or ``dyn``) — ``must evaluate to bool or the unknown type, not string``.

The tree is cel-python's lark tree, read by shape (``data``, ``children``, tokens' ``type``/``value``) so this
module imports neither. Also here: :func:`rewrite_bind` (``cel.bind(v, init, body)``, cel-go's ext.Bindings,
becomes ``[init].map(v, body)[0]``, which celpy can run) and :func:`device_reads` (which parts of ``device`` the
expression can see, so equal views share one evaluation).
"""

from __future__ import annotations

import re
from typing import Any

DYN, BOOL, INT, UINT, DOUBLE, STRING, BYTES, NULL = "dyn", "bool", "int", "uint", "double", "string", "bytes", \
    "null_type"
LIST, MAP, QUANTITY, SEMVER = "list(dyn)", "map(string, dyn)", "kubernetes.Quantity", "kubernetes.Semver"
DEVICE, ATTRIBUTES, DOMAIN_ATTRIBUTES = "kubernetes.DRADevice", "map(string, map(string, dyn))", "map(string, dyn)*"
CAPACITY, DOMAIN_CAPACITY = "map(string, map(string, kubernetes.Quantity))", "map(string, kubernetes.Quantity)"
_NUMBERS = (INT, UINT, DOUBLE)
_MAPS = (MAP, ATTRIBUTES, DOMAIN_ATTRIBUTES, CAPACITY, DOMAIN_CAPACITY)
DEVICE_FIELDS = {"driver": STRING, "attributes": ATTRIBUTES, "capacity": CAPACITY, "allowMultipleAllocations": BOOL}
_LITERALS = {"INT_LIT": INT, "UINT_LIT": UINT, "FLOAT_LIT": DOUBLE, "STRING_LIT": STRING, "MLSTRING_LIT": STRING,
             "BYTES_LIT": BYTES, "BOOL_LIT": BOOL, "NULL_LIT": NULL}
_S, _L, _Q, _V = (STRING,), (LIST,), (QUANTITY,), (SEMVER,)
# method -> (receiver types, argument counts, result); receiver ``None``: any
METHODS: dict[str, tuple[tuple[str, ...] | None, tuple[int, ...], str]] = {
    "compareTo": ((QUANTITY, SEMVER), (1,), INT), "isGreaterThan": ((QUANTITY, SEMVER), (1,), BOOL),
    "isLessThan": ((QUANTITY, SEMVER), (1,), BOOL), "major": (_V, (0,), INT), "minor": (_V, (0,), INT),
    "patch": (_V, (0,), INT), "sign": (_Q, (0,), INT), "isInteger": (_Q, (0,), BOOL), "asInteger": (_Q, (0,), INT),
    "asApproximateFloat": (_Q, (0,), DOUBLE), "add": (_Q, (1,), QUANTITY), "sub": (_Q, (1,), QUANTITY),
    "mul": (_Q, (1,), QUANTITY),
    "startsWith": (_S, (1,), BOOL), "endsWith": (_S, (1,), BOOL), "contains": (_S, (1,), BOOL),
    "matches": (_S, (1,), BOOL), "lowerAscii": (_S, (0,), STRING), "upperAscii": (_S, (0,), STRING),
    "replace": (_S, (2, 3), STRING), "split": (_S, (1, 2), LIST), "substring": (_S, (1, 2), STRING),
    "trim": (_S, (0,), STRING), "charAt": (_S, (1,), STRING), "reverse": (_S, (0,), STRING),
    "find": (_S, (1,), STRING), "findAll": (_S, (1, 2), LIST),
    "indexOf": ((STRING, LIST), (1, 2), INT), "lastIndexOf": ((STRING, LIST), (1, 2), INT),
    "join": (_L, (0, 1), STRING), "isSorted": (_L, (0,), BOOL), "sum": (_L, (0,), DYN), "min": (_L, (0,), DYN),
    "max": (_L, (0,), DYN), "size": ((STRING, BYTES, LIST, *_MAPS), (0,), INT), "includes": (None, (1,), BOOL),
}
# global function -> (argument types per position (None: any), argument counts, result)
FUNCTIONS: dict[str, tuple[tuple[str | None, ...], tuple[int, ...], str]] = {
    "quantity": ((STRING,), (1,), QUANTITY), "isQuantity": ((STRING,), (1,), BOOL),
    "semver": ((STRING, BOOL), (1, 2), SEMVER), "isSemver": ((STRING, BOOL), (1, 2), BOOL),
    "size": ((None,), (1,), INT), "matches": ((STRING, STRING), (2,), BOOL), "dyn": ((None,), (1,), DYN),
    "int": ((None,), (1,), INT), "uint": ((None,), (1,), UINT), "double": ((None,), (1,), DOUBLE),
    "string": ((None,), (1,), STRING), "bool": ((None,), (1,), BOOL), "bytes": ((None,), (1,), BYTES),
    "type": ((None,), (1,), "type"), "duration": ((STRING,), (1,), "duration"),
    "timestamp": ((None,), (1,), "timestamp"),
}
TYPE_NAMES = {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
MACROS = {"all": BOOL, "exists": BOOL, "exists_one": BOOL, "map": LIST, "filter": LIST}
_PLAIN_STRING = re.compile(r"""^(?:"([^"\\\n]*)"|'([^'\\\n]*)')$""")


class Problem(Exception):
    """A selector cel-go would not compile; ``line``/``column`` as cel-go counts them (1-based, 0-based)."""

    def __init__(self, message: str, node: Any, shift: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line, self.column = _position(node)
        self.column = max(self.column + shift, 0)


def _position(node: Any) -> tuple[int, int]:
    for item in _walk_first(node):
        line = getattr(item, "line", None)
        if line is not None:
            return int(line), int(getattr(item, "column", 1)) - 1
        meta = getattr(item, "meta", None)
        if meta is not None and not getattr(meta, "empty", True):
            return int(meta.line), int(meta.column) - 1
    return 1, 0


def _walk_first(node: Any) -> list[Any]:
    out = [node]
    while hasattr(node, "children") and node.children:
        node = node.children[0]
        out.append(node)
    return out


def _kids(node: Any) -> list[Any]:
    return [c for c in node.children if hasattr(c, "data")]


def check(tree: Any) -> str:
    """Raise :class:`Problem` for what cel-go's checker rejects; else the static result type."""
    result = _Checker().infer(tree, {})
    if result not in (BOOL, DYN):
        raise Problem(f"must evaluate to bool or the unknown type, not {_shown(result)}", tree)
    return result


def _shown(kind: str) -> str:
    return MAP if kind == DOMAIN_ATTRIBUTES else kind


def _unify(a: str, b: str) -> str:
    return a if a == b else DYN


class _Checker:
    def infer(self, node: Any, scope: dict[str, str]) -> str:  # one branch per grammar rule
        data, kids = str(node.data), _kids(node)
        if data in ("expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication") \
                and len(kids) == 1:
            return self.infer(kids[0], scope)
        if data == "expr":
            cond, yes, no = (self.infer(k, scope) for k in kids)
            if cond not in (BOOL, DYN) or (DYN not in (yes, no) and yes != no):
                raise _overload("_?_:_", node, cond, yes, no)
            return _unify(yes, no)
        if data in ("conditionalor", "conditionaland"):
            left, right = self.infer(kids[0], scope), self.infer(kids[1], scope)
            if left not in (BOOL, DYN) or right not in (BOOL, DYN):
                raise _overload("_||_" if data == "conditionalor" else "_&&_", node, left, right)
            return BOOL
        if data == "relation":
            return self._relation(node, kids, scope)
        if data in ("addition", "multiplication"):
            return self._arithmetic(node, kids, scope)
        if data == "unary":
            if len(kids) == 1:
                return self.infer(kids[0], scope)
            operand = self.infer(kids[1], scope)
            if kids[0].data == "unary_not":
                if operand not in (BOOL, DYN):
                    raise _overload("!_", node, operand)
                return BOOL
            if operand not in (INT, DOUBLE, DYN):
                raise _overload("-_", node, operand)
            return operand
        if data in ("member", "primary", "paren_expr"):
            return self.infer(kids[0], scope)
        if data == "literal":
            return _LITERALS.get(node.children[0].type, DYN)
        if data == "list_lit":
            for k in kids:
                self.infer(k, scope)
            return LIST
        if data in ("map_lit", "exprlist", "mapinits"):
            for k in kids:
                self.infer(k, scope)
            return MAP
        if data == "ident":
            name = str(node.children[0])
            if name in scope:
                return scope[name]
            if name == "device":
                return DEVICE
            if name in TYPE_NAMES:
                return "type"
            raise Problem(f"undeclared reference to '{name}' (in container '')", node)
        if data == "member_dot":
            return self._field(node, self.infer(kids[0], scope), str(node.children[1]))
        if data == "member_index":
            return self._index(node, self.infer(kids[0], scope), self.infer(kids[1], scope))
        if data == "member_dot_arg":
            return self._method(node, kids, scope)
        if data == "ident_arg":
            return self._function(node, kids, scope)
        raise Problem(f"unsupported syntax ({data})", node)

    def _relation(self, node: Any, kids: list[Any], scope: dict[str, str]) -> str:
        op = str(kids[0].data)
        left, right = self.infer(_kids(kids[0])[0], scope), self.infer(kids[1], scope)
        name = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
                "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "@in"}[op]
        if DYN in (left, right):
            return BOOL
        if op == "relation_in":
            if right not in (LIST, *_MAPS):
                raise _operator(name, kids[0], left, right)
        elif op in ("relation_eq", "relation_ne"):
            if left != right and not (left in _NUMBERS and right in _NUMBERS) and NULL not in (left, right) \
                    and not (left in _MAPS and right in _MAPS):
                raise _operator(name, kids[0], left, right)
        elif not ((left in _NUMBERS and right in _NUMBERS)
                  or (left == right and left in (BOOL, STRING, BYTES, "timestamp", "duration"))):
            raise _operator(name, kids[0], left, right)
        return BOOL

    def _arithmetic(self, node: Any, kids: list[Any], scope: dict[str, str]) -> str:
        op = str(kids[0].data)
        left, right = self.infer(_kids(kids[0])[0], scope), self.infer(kids[1], scope)
        name = {"addition_add": "_+_", "addition_sub": "_-_", "multiplication_mul": "_*_",
                "multiplication_div": "_/_", "multiplication_mod": "_%_"}[op]
        if DYN in (left, right):
            return DYN
        allowed = (INT, UINT, DOUBLE, STRING, BYTES, LIST) if op == "addition_add" else \
            (INT, UINT) if op == "multiplication_mod" else _NUMBERS
        if left != right or left not in allowed:
            raise _operator(name, kids[0], left, right)
        return left

    def _field(self, node: Any, receiver: str, field: str) -> str:
        if receiver == DEVICE:
            if field not in DEVICE_FIELDS:
                raise Problem(f"undefined field '{field}'", node.children[1], shift=-1)  # cel-go points at the dot
            return DEVICE_FIELDS[field]
        return self._index(node, receiver, STRING)

    def _index(self, node: Any, receiver: str, key: str) -> str:
        if receiver in (ATTRIBUTES, CAPACITY):
            if key not in (STRING, DYN):
                raise _overload("_[_]", node, receiver, key)
            return DOMAIN_ATTRIBUTES if receiver == ATTRIBUTES else DOMAIN_CAPACITY
        if receiver == DOMAIN_CAPACITY:
            return QUANTITY
        if receiver in (DYN, MAP, DOMAIN_ATTRIBUTES, LIST):
            return DYN
        if receiver == DEVICE:
            return DYN
        raise Problem(f"type '{_shown(receiver)}' does not support field selection", node)

    def _method(self, node: Any, kids: list[Any], scope: dict[str, str]) -> str:
        name = str(node.children[1])
        args = _kids(kids[1]) if len(kids) > 1 else []
        if name in MACROS:
            receiver = self.infer(kids[0], scope)
            variable = ident_name(args[0]) if len(args) in (2, 3) else None
            if variable is None or (name != "map" and len(args) != 2):
                raise Problem(f"found no matching overload for '{name}' (macro needs a variable and an "
                              "expression)", node)
            if receiver not in (LIST, DYN, *_MAPS):
                raise _overload(name, node, receiver)
            inner = {**scope, variable: STRING if receiver in _MAPS else DYN}
            for arg in args[1:]:
                body = self.infer(arg, inner)
            if name != "map" and body not in (BOOL, DYN):
                raise _overload(name, node, receiver, body)
            return MACROS[name]
        receiver = self.infer(kids[0], scope)
        arg_types = [self.infer(a, scope) for a in args]
        if name not in METHODS:
            raise Problem(f"undeclared reference to '{name}' (in container '')", node.children[1])
        receivers, counts, result = METHODS[name]
        if len(args) not in counts or (receivers is not None and receiver != DYN and receiver not in receivers
                                       and not (receiver in _MAPS and MAP in receivers)):
            raise _overload(name, node, receiver, *arg_types, member=True)
        if receiver in (QUANTITY, SEMVER) and name in ("compareTo", "isGreaterThan", "isLessThan") \
                and arg_types[0] not in (receiver, DYN):
            raise _overload(name, node, receiver, *arg_types, member=True)
        return result

    def _function(self, node: Any, kids: list[Any], scope: dict[str, str]) -> str:
        name = str(node.children[0])
        args = _kids(kids[0]) if kids else []
        if name == "has":
            if len(args) != 1 or _unwrap(args[0]).data != "member_dot":
                raise Problem("invalid argument to has() macro", node)
            self.infer(args[0], scope)
            return BOOL
        if name not in FUNCTIONS:
            raise Problem(f"undeclared reference to '{name}' (in container '')", node)
        types, counts, result = FUNCTIONS[name]
        arg_types = [self.infer(a, scope) for a in args]
        if len(args) not in counts or any(want is not None and got not in (want, DYN)
                                          for want, got in zip(types, arg_types, strict=False)):
            raise _overload(name, node, *arg_types)
        return result


def _operator(name: str, operation: Any, left: str, right: str) -> Problem:
    """A binary operator without an overload, located at the operator as cel-go locates it: ``operation`` is
    the ``relation_eq``-like node that spans the left operand and the operator."""
    problem = _overload(name, operation, left, right)
    symbol = name.strip("_@")
    meta = operation.meta
    if not getattr(meta, "empty", True):
        problem.line, problem.column = int(meta.end_line), max(int(meta.end_column) - len(symbol) - 1, 0)
    return problem


def _overload(name: str, node: Any, *types: str, member: bool = False) -> Problem:
    shown = [_shown(t) for t in types]
    applied = f"{shown[0]}.({', '.join(shown[1:])})" if member else f"({', '.join(shown)})"
    return Problem(f"found no matching overload for '{name}' applied to '{applied}'", node)


def _unwrap(node: Any) -> Any:
    """The first node below a chain of single-child wrappers (expr -> ... -> member)."""
    while hasattr(node, "children") and len(_kids(node)) == 1 and len(node.children) == 1 \
            and str(node.data) not in ("member_dot", "member_index", "member_dot_arg", "ident_arg", "ident",
                                        "literal", "list_lit", "map_lit"):
        node = node.children[0]
    return node


def ident_name(node: Any) -> str | None:
    inner = _unwrap(node)
    return str(inner.children[0]) if str(inner.data) == "ident" else None


def string_literal(node: Any) -> str | None:
    """The text of a plain quoted string literal (no escapes, no raw prefix), else None."""
    inner = _unwrap(node)
    if str(inner.data) != "literal" or inner.children[0].type != "STRING_LIT":
        return None
    m = _PLAIN_STRING.match(str(inner.children[0]))
    return None if m is None else (m.group(1) if m.group(1) is not None else m.group(2))
