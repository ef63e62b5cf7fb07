"""What the code actually asks of the API server, derived from the code itself (for the RBAC test).

- The operator: every call it makes outside Kopf goes through the ``operator/storage`` package, by one of
  its request helpers (``_call``/``_write``/``_lease_write(method, path, ...)``, ``_list(path, ...)`` for a
  GET, ``_group_write(path, ...)`` for a PATCH); the method and the (f-string) path of each call are read
  from the AST and mapped to (apiGroup, resource, verb) as the API server's authorizer would. The helpers'
  own bodies, which only pass their parameters on, are not call sites.
- Kopf, for the operator: the resources its registered handlers watch (from a real registry filled
  by ``operator.handlers.register``), plus what Kopf itself needs in the mode ``operator/handlers.py``
  starts it in (cluster-wide or not, standalone or peering, read from the ``kopf.operator(...)`` call):
  the CRD watch (unless the startup handler disables Kopf's scanning), event posting, the peering object unless
  standalone; and namespaces only when it is not
  cluster-wide (kopf's ``_core/reactor/observation.py`` skips the namespace scan when cluster-wide).
- A path whose namespace is the parameter ``own_namespace`` (the leader-election Lease) needs access in
  the operator's own namespace only: :attr:`Access.own_namespace`, a Role rather than a ClusterRole.
- The webhook: every ``list_*`` API method its cache hands to a ``watching.Reflector``
  (``webhooks/groups.py``), each of which lists and then watches.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import kopf
from kopf._cogs.structs import references

from deviceshare.api import names
from deviceshare.operator import handlers
from deviceshare.operator.config import OperatorConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "deviceshare"
STORAGE = SRC / "operator" / "storage"  # the package: every API call of the operator
COMMAND = SRC / "operator" / "handlers.py"  # where kopf.operator(...) is called
WEBHOOK_CACHE = SRC / "webhooks" / "groups.py"

_VERB_BY_METHOD = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
PLACEHOLDER = "{}"
OWN = "{own}"  # the operator's own namespace


class Access(NamedTuple):
    api_group: str
    resource: str
    verb: str
    own_namespace: bool = False  # needed in the operator's namespace only


class UnresolvedCall(Exception):
    """A call whose method or path cannot be read statically: the RBAC test cannot vouch for it."""


# -- paths -------------------------------------------------------------------------------------


def access_for(method: str, path: str) -> Access:
    """``("GET", "/api/v1/namespaces/{}/pods/{}")`` -> ``Access("", "pods", "get")``."""
    segments = path.split("?")[0].strip("/").split("/")
    if segments[0] == "api":
        group, rest = "", segments[2:]
    elif segments[0] == "apis":
        group, rest = segments[1], segments[3:]
    else:
        raise UnresolvedCall(f"not a resource path: {path}")
    own = False
    if len(rest) >= 2 and rest[0] == "namespaces" and (len(rest) > 2 or rest[1] == OWN):
        own = rest[1] == OWN
        rest = rest[2:]
    if not rest or PLACEHOLDER in rest[0]:
        raise UnresolvedCall(f"resource not literal in {path}")
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    if method == "GET":
        verb = "get" if len(rest) > 1 else "list"
    elif method == "DELETE" and len(rest) == 1:
        verb = "deletecollection"
    else:
        verb = _VERB_BY_METHOD[method]
    return Access(group, resource, verb, own)


def _functions(trees: list[ast.Module]) -> dict[str, ast.FunctionDef]:
    return {node.name: node for tree in trees for node in tree.body if isinstance(node, ast.FunctionDef)}


# Request helpers: name -> (its HTTP method, or the index of the argument that gives it; the path's index).
REQUESTS: dict[str, tuple[str | int, int]] = {
    "_call": (0, 1), "_write": (0, 1), "_lease_write": (0, 1), "_list": ("GET", 0), "_group_write": ("PATCH", 0),
    "_claim_write": ("PATCH", 0),
}


def _modules(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.glob("*.py"))


def storage_source(path: Path = STORAGE) -> str:
    return "\n".join(p.read_text() for p in _modules(path))


def _path_template(expr: ast.expr, functions: dict[str, ast.FunctionDef]) -> str:
    """An f-string path with every runtime value as ``{}`` and ``names.X`` constants filled in."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return "".join(_path_template(v, functions) for v in expr.values)
    if isinstance(expr, ast.FormattedValue):
        value = expr.value
        if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                and value.value.id == "names"):
            return str(getattr(names, value.attr))
        if any(isinstance(n, ast.Name) and n.id == "own_namespace" for n in ast.walk(value)):
            return OWN
        return PLACEHOLDER
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _path_template(expr.left, functions) + _path_template(expr.right, functions)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in functions:
        returns = [n for n in ast.walk(functions[expr.func.id]) if isinstance(n, ast.Return)]
        if len(returns) == 1 and returns[0].value is not None:
            return _path_template(returns[0].value, functions)
    raise UnresolvedCall(f"cannot read the path {ast.unparse(expr)!r} at line {expr.lineno}")


def storage_call_sites(path: Path = STORAGE) -> list[ast.Call]:
    """Every call of a request helper, outside the helpers' own bodies (which pass their parameters on)."""
    trees = [ast.parse(p.read_text()) for p in _modules(path)]
    forwarded: set[int] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in REQUESTS:
                forwarded |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return [
        node for tree in trees for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REQUESTS
        and id(node) not in forwarded
    ]


def storage_calls(path: Path = STORAGE) -> list[tuple[str, str]]:
    """(method, path template) of every request the operator's storage makes."""
    functions = _functions([ast.parse(p.read_text()) for p in _modules(path)])
    out: list[tuple[str, str]] = []
    for node in storage_call_sites(path):
        assert isinstance(node.func, ast.Attribute)
        method_at, path_at = REQUESTS[node.func.attr]
        method: ast.expr | str | None = method_at if isinstance(method_at, str) else (
            node.args[method_at] if len(node.args) > method_at else None
        )
        if isinstance(method, ast.Constant) and isinstance(method.value, str):
            method = method.value
        if not isinstance(method, str) or len(node.args) <= path_at:
            raise UnresolvedCall(f"{node.func.attr} at line {node.lineno} has no literal method and path")
        out.append((method, _path_template(node.args[path_at], functions)))
    return out


_REFLECTED = re.compile(r"k8s\.CoreV1Api\(self\._client\)\.(list_\w+)")
_REFLECTED_CUSTOM = re.compile(
    r"k8s\.CustomObjectsApi\(self\._client\)\.list_cluster_custom_object,\s*names\.GROUP,\s*names\.VERSION,"
    r"\s*names\.PLURAL"
)
# The DRA reflectors (storage/drastatus.py): one call site, for each kind of its WATCHED tuple (read from its AST).
_REFLECTED_DRA = re.compile(
    r"k8s\.CustomObjectsApi\(self\._client\)\.list_cluster_custom_object,\s*names\.DRA_API_GROUP,\s*VERSION,"
    r"\s*plural\)"
)


def storage_reflected(path: Path | None = None) -> set[Access]:
    """list + watch for each collection the storage module mirrors with a ``watching.Reflector``."""
    source = storage_source(path or STORAGE)
    if (_REFLECTED.search(source) or "CustomObjectsApi" in source) and "watching.Reflector(" not in source:
        raise UnresolvedCall("a list call in the storage module that no Reflector uses")
    readable = len(_REFLECTED_CUSTOM.findall(source)) + len(_REFLECTED_DRA.findall(source))
    if source.count("CustomObjectsApi(") != readable:
        raise UnresolvedCall("a CustomObjectsApi call in the storage module this check cannot read")
    needs = {Access("", _core_plural(m), v) for m in _REFLECTED.findall(source) for v in ("list", "watch")}
    if _REFLECTED_CUSTOM.search(source):
        needs |= {Access(names.GROUP, names.PLURAL, v) for v in ("list", "watch")}
    if _REFLECTED_DRA.search(source):
        needs |= {Access(names.DRA_API_GROUP, kind, v) for kind in _dra_watched() for v in ("list", "watch")}
    return needs


def _dra_watched(path: Path = STORAGE / "drastatus.py") -> tuple[str, ...]:
    """The kinds of ``WATCHED = (SLICES, CLASSES, CLAIMS)``, their values read from the module's constants."""
    tree = ast.parse(path.read_text())
    constants: dict[str, str] = {}
    watched: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            targets = node.targets[0]
            if isinstance(targets, ast.Tuple):
                for name, value in zip(targets.elts, node.value.elts, strict=True):
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant):
                        constants[name.id] = str(value.value)
            elif isinstance(targets, ast.Name) and targets.id == "WATCHED":
                watched = [constants[e.id] for e in node.value.elts if isinstance(e, ast.Name)]
    if not watched:
        raise UnresolvedCall("storage/drastatus.py has no readable WATCHED tuple")
    return tuple(watched)


def api_client_uses(package: Path) -> Iterator[str]:
    """Places in ``package`` that talk to the API other than through ``ClusterApi._call``."""
    pattern = re.compile(r"\.call_api\(|CoreV1Api|CustomObjectsApi|ApiextensionsV1Api|EventsV1Api|AppsV1Api")
    for file in sorted(package.rglob("*.py")):
        for lineno, line in enumerate(file.read_text().splitlines(), 1):
            if pattern.search(line) and not (
                file.parent == STORAGE and (
                    "self._client.call_api(" in line or _REFLECTED.search(line)
                    or "k8s.CustomObjectsApi(self._client).list_cluster_custom_object," in line
                )
            ):
                yield f"{file.relative_to(SRC)}:{lineno}: {line.strip()}"


# -- Kopf --------------------------------------------------------------------------------------


def _kopf_operator_kwargs(path: Path = COMMAND) -> dict[str, ast.expr]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "operator"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "kopf"):
            return {k.arg: k.value for k in node.keywords if k.arg}
    raise UnresolvedCall(f"no kopf.operator(...) call in {path}")


def kopf_is_clusterwide() -> bool:
    value = _kopf_operator_kwargs().get("clusterwide")
    if not isinstance(value, ast.Constant) or not isinstance(value.value, bool):
        raise UnresolvedCall("kopf.operator(clusterwide=...) is not a literal")
    return value.value


def kopf_is_standalone() -> bool:
    value = _kopf_operator_kwargs().get("standalone")
    if not isinstance(value, ast.Constant) or not isinstance(value.value, bool):
        raise UnresolvedCall("kopf.operator(standalone=...) is not a literal")
    return value.value


def kopf_scanning_disabled(path: Path = COMMAND) -> bool:
    """Whether the startup handler sets ``settings.scanning.disabled = True``: Kopf then never watches CRDs
    (``kopf/_core/reactor/observation.py``: the resource observer's watch runs only without it)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and ast.unparse(node.targets[0]) == "settings.scanning.disabled"):
            return isinstance(node.value, ast.Constant) and node.value.value is True
    return False


def kopf_needs(*, peering: bool | None = None, groups_through_kopf: bool = False) -> set[Access]:
    """Kopf's needs; ``peering`` defaults to what ``handlers.run`` starts it with (not standalone);
    ``groups_through_kopf``: with ``deviceshare operator --groups-through-kopf``."""
    peering = not kopf_is_standalone() if peering is None else peering
    registry = kopf.OperatorRegistry()
    handlers.register(registry, OperatorConfig(groups_through_kopf=groups_through_kopf))
    needs: set[Access] = set()
    watched = [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers(),
               *registry._spawning.get_all_handlers()]
    changing = list(registry._changing.get_all_handlers())
    for handler in [*watched, *changing]:
        selector = handler.selector
        assert selector is not None and selector.any_name, f"handler {handler.id} selects no single resource"
        needs |= {Access(selector.group or "", selector.any_name, v) for v in ("list", "watch")}
    for handler in changing:  # progress/diff-base annotations and finalizers are written by patch
        needs.add(Access(handler.selector.group or "", handler.selector.any_name, "patch"))  # type: ignore[union-attr]
    crds, events = references.CRDS, references.EVENTS
    if not kopf_scanning_disabled():
        needs |= {Access(crds.group or "", str(crds.any_name), v) for v in ("list", "watch")}
    needs.add(Access(events.group or "", str(events.any_name), "create"))  # Kopf posts k8s events
    clusterwide = kopf_is_clusterwide()
    if not clusterwide:
        ns = references.NAMESPACES
        needs |= {Access(ns.group or "", str(ns.any_name), v) for v in ("list", "watch")}
    if peering:
        selector = references.CLUSTER_PEERINGS_K if clusterwide else references.NAMESPACED_PEERINGS_K
        needs |= {Access(selector.group or "", str(selector.any_name), v) for v in ("list", "watch", "patch")}
    return needs


def operator_needs(*, groups_through_kopf: bool = False) -> set[Access]:
    return ({access_for(m, p) for m, p in storage_calls()} | storage_reflected()
            | kopf_needs(groups_through_kopf=groups_through_kopf))


# -- webhook -----------------------------------------------------------------------------------


def _core_plural(method: str) -> str:
    """``list_pod_for_all_namespaces`` -> ``pods`` (kubernetes_asyncio's CoreV1Api naming)."""
    match = re.fullmatch(r"list_(?:namespaced_)?(\w+?)(?:_for_all_namespaces)?", method)
    if not match:
        raise UnresolvedCall(f"unknown list method {method}")
    return match.group(1).replace("_", "") + "s"


def webhook_needs(path: Path = WEBHOOK_CACHE) -> set[Access]:
    tree = ast.parse(path.read_text())
    if "watching.Reflector(" not in path.read_text():
        raise UnresolvedCall("the webhook cache no longer uses watching.Reflector (list + watch)")
    needs: set[Access] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_api_object(node.value):
            if node.attr == "get_namespaced_custom_object":  # the cache-miss lookup (GroupIndex.refresh)
                call = next((c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.func is node), None)
                if call is None or len(call.args) < 4:
                    raise UnresolvedCall(f"line {node.lineno}: get_namespaced_custom_object without group/plural")
                needs.add(Access(_name_value(call.args[0]), _name_value(call.args[3]), "get"))
                continue
            if not node.attr.startswith("list_"):
                raise UnresolvedCall(f"the webhook calls {node.attr}: add it to this derivation")
            parent_call = next((c for c in ast.walk(tree) if isinstance(c, ast.Call)
                                and any(a is node for a in c.args)), None)
            if node.attr == "list_cluster_custom_object":
                if parent_call is None or len(parent_call.args) < 4:
                    raise UnresolvedCall(f"line {node.lineno}: list_cluster_custom_object without group/plural")
                group, plural = (_name_value(parent_call.args[1]), _name_value(parent_call.args[3]))
            else:
                group, plural = "", _core_plural(node.attr)
            needs |= {Access(group, plural, v) for v in ("list", "watch")}
    return needs


def _is_api_object(expr: ast.expr) -> bool:
    """``client.CoreV1Api(api)``, ``k8s.CustomObjectsApi(api)``...: a kubernetes_asyncio API object."""
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr.endswith("Api") and expr.func.attr != "ApiClient")


def _name_value(expr: ast.expr) -> str:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "names":
        return str(getattr(names, expr.attr))
    raise UnresolvedCall(f"cannot read {ast.unparse(expr)!r}")
