"""What the selector engine does with cel-python's parse tree before running it (the tree is lark's, read by
shape as in ``selectorchecks``):

- :func:`rewrite_bind`: ``cel.bind(v, init, body)`` (cel-go's ext.Bindings, in kube-scheduler's DRA environment)
  becomes ``[init].map(v, body)[0]``, the same value in macros celpy runs;
- :func:`guard_macros`: a macro's receiver must be a list or a map, as cel-go requires (``got 'types.String',
  expected iterable type``); celpy would iterate a string's characters;
- :func:`device_reads`: which parts of ``device`` an expression can see, so that devices alike in those parts
  share one evaluation.
"""

from __future__ import annotations

import functools
from typing import Any

from deviceshare.core import selectorchecks

Path = tuple[str, ...]


def _parents(tree: Any) -> dict[int, Any]:
    parents: dict[int, Any] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in getattr(node, "children", ()):
            if hasattr(child, "data"):
                parents[id(child)] = node
                stack.append(child)
    return parents


def device_reads(tree: Any) -> tuple[Path, ...] | None:
    """Every ``device.a.b['c']`` chain the expression has, cut before anything that is not a constant field or
    key; None when it uses ``device`` whole or rebinds the name."""
    parents, paths = _parents(tree), set()
    for node in tree.iter_subtrees():
        if str(node.data) == "member_dot_arg" and str(node.children[1]) in selectorchecks.MACROS:
            args = [c for c in node.children[2:] if hasattr(c, "data")]
            if args and any(selectorchecks.ident_name(a) == "device" for a in args[0].children):
                return None
        if str(node.data) != "ident" or str(node.children[0]) != "device":
            continue
        path: list[str] = []
        current = parents[id(parents[id(node)])]  # primary -> member
        while True:
            parent = parents.get(id(current))
            if parent is None or parent.children[0] is not current:
                break
            if str(parent.data) == "member_dot":
                path.append(str(parent.children[1]))
            elif str(parent.data) == "member_index":
                key = selectorchecks.string_literal(parent.children[1])
                if key is None:
                    break
                path.append(key)
            else:
                break
            current = parents[id(parent)]
        if not path:
            return None
        paths.add(tuple(path))
    return tuple(sorted(paths))


def rewrite_bind(tree: Any) -> Any:
    """``cel.bind(v, init, body)`` -> ``[init].map(v, body)[0]``: the same value, in macros celpy runs."""
    for node in list(tree.iter_subtrees()):
        if str(node.data) != "member_dot_arg" or str(node.children[1]) != "bind":
            continue
        if selectorchecks.ident_name(node.children[0]) != "cel":
            continue
        args = [c for c in node.children[2].children if hasattr(c, "data")] if len(node.children) > 2 else []
        if len(args) != 3 or selectorchecks.ident_name(args[0]) is None:
            raise selectorchecks.Problem("cel.bind() needs a variable name, an initial value and an expression",
                                         node)
        token = node.children[1]
        make = functools.partial(_node, type(node), node.meta)
        listed = make("member", make("primary", make("list_lit", make("exprlist", args[1]))))
        mapped = make("member_dot_arg", listed, token.update(value="map"), make("exprlist", args[0], args[2]))
        zero = _expr(make, make("primary", make("literal", type(token)("INT_LIT", "0"))))
        node.data, node.children = type(node.data)("RULE", "member_index"), [make("member", mapped), zero]
    return tree


def _expr(make: Any, primary: Any) -> Any:
    """A whole expression tree around one ``primary`` node."""
    node = primary
    for rule in ("member", "unary", "multiplication", "addition", "relation", "conditionaland", "conditionalor",
                 "expr"):
        node = make(rule, node)
    return node


def guard_macros(tree: Any) -> Any:
    """``r.exists(x, ...)`` -> ``_iterable(r).exists(x, ...)``: cel-go fails a macro on a scalar (``got
    'types.String', expected iterable type``); celpy would iterate a string's characters."""
    for node in list(tree.iter_subtrees()):
        if str(node.data) != "member_dot_arg" or str(node.children[1]) not in selectorchecks.MACROS:
            continue
        make = functools.partial(_node, type(node), node.meta)
        name = type(node.children[1])("IDENT", "_iterable")
        wrapped = make("primary", make("ident_arg", name, make("exprlist", _expr(make, node.children[0]))))
        node.children[0] = make("member", wrapped)
    return tree


def _node(tree_class: Any, meta: Any, data: str, *children: Any) -> Any:
    return tree_class(data, list(children), meta=meta)
