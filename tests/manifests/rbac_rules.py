"""What the rendered RBAC actually grants, one (account, scope, group, resource, verb) at a time.

Bindings are resolved to their roles and every rule is expanded, so a test can compare the
grants with what the code needs — exactly, not "at least". Import as
``tests.manifests.rbac_rules`` and call :func:`grants` on rendered objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

CLUSTER_WIDE = "*"  # Grant.scope for ClusterRoleBindings


class Grant(NamedTuple):
    account: str      # "namespace/serviceaccount"
    scope: str        # a namespace, or CLUSTER_WIDE
    api_group: str    # "" for the core group
    resource: str     # "pods", "pods/binding", ...
    verb: str


class Rule(NamedTuple):
    """A grant without its holder: what one account may do."""

    scope: str
    api_group: str
    resource: str
    verb: str


def grants(objects: Iterable[Mapping[str, Any]]) -> set[Grant]:
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in {"Role", "ClusterRole"}}
    out: set[Grant] = set()
    for binding in objects:
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        namespace = binding["metadata"].get("namespace")
        role_ref = binding["roleRef"]
        role_ns = namespace if role_ref["kind"] == "Role" else None
        role = roles.get((role_ref["kind"], role_ns, role_ref["name"]))
        if role is None:
            raise LookupError(f"{binding['kind']} {binding['metadata']['name']} refers to a missing "
                              f"{role_ref['kind']} {role_ref['name']}")
        scope = CLUSTER_WIDE if binding["kind"] == "ClusterRoleBinding" else str(namespace)
        for subject in binding.get("subjects") or []:
            if subject["kind"] != "ServiceAccount":
                raise ValueError(f"{binding['metadata']['name']}: only ServiceAccounts are expected "
                                 f"as subjects, got {subject['kind']}")
            account = f"{subject.get('namespace', namespace)}/{subject['name']}"
            for rule in role.get("rules") or []:
                if rule.get("resourceNames") or rule.get("nonResourceURLs"):
                    raise ValueError(f"{role_ref['name']}: resourceNames/nonResourceURLs not modelled")
                out |= {Grant(account, scope, g, r, v)
                        for g in rule.get("apiGroups") or []
                        for r in rule.get("resources") or []
                        for v in rule.get("verbs") or []}
    return out


def rules_of(all_grants: Iterable[Grant], account: str) -> set[Rule]:
    """The grants of one account (``namespace/name``), without the account."""
    return {Rule(g.scope, g.api_group, g.resource, g.verb) for g in all_grants if g.account == account}


def expand(table: Mapping[tuple[str, str, str], Iterable[str]]) -> set[Rule]:
    """{(scope, group, resource): verbs} -> rules, for writing expectations compactly."""
    return {Rule(scope, group, resource, verb)
            for (scope, group, resource), verbs in table.items() for verb in verbs}
