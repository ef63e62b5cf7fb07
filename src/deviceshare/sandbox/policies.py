"""ValidatingAdmissionPolicy: the sandbox evaluates stored policies and bindings on every API write.

As kube-apiserver does (admissionregistration.k8s.io/v1): each ``ValidatingAdmissionPolicyBinding``
names a policy; the write is checked when the policy's ``matchConstraints`` and the binding's
``matchResources`` both match it (``resourceRules`` with subresources such as ``pods/binding``,
``excludeResourceRules``, ``namespaceSelector``, ``objectSelector``) and every ``matchConditions``
expression holds. Then each ``validations`` expression must be true; a false one with the
binding's ``validationActions`` containing ``Deny`` is refused with the validation's
``messageExpression`` (or ``message``) and ``reason`` (default ``Invalid``, 422). A failing
expression follows ``failurePolicy`` (default ``Fail``: refused).

CEL variables: ``object``, ``oldObject`` (null on CREATE), ``request`` (``operation``, ``subResource``,
``userInfo``...), ``namespaceObject``, and ``params`` (always null). Not done: ``paramKind``/``paramRef``,
``variables``, ``auditAnnotations``, ``authorizer``, type checking, and the ``Warn``/``Audit`` actions
(they refuse nothing, so they are accepted and ignored). With no policy stored nothing is checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import catalog, cel, errors, identity, selectors, store

_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


def resource_matches(allowed: list[str], plural: str, subresource: str) -> bool:
    """kube's rule semantics: ``*`` is every resource (not subresources), ``*/*`` everything,
    ``pods/*`` every pods subresource, ``*/status`` every status subresource."""
    for entry in allowed:
        res, _, sub = entry.partition("/")
        if res not in ("*", plural):
            continue
        if entry == "*/*" or (subresource and sub in ("*", subresource)) or (not sub and not subresource):
            return True
    return False


def rule_matches(
    rule: Mapping[str, Any], rtype: catalog.ResourceType, operation: str, subresource: str = ""
) -> bool:
    def has(field: str, value: str) -> bool:
        allowed = rule.get(field) or []
        return "*" in allowed or value in allowed

    scope = rule.get("scope", "*")
    scope_ok = scope == "*" or (scope == "Namespaced") == rtype.namespaced
    return (
        has("operations", operation)
        and has("apiGroups", rtype.group)
        and has("apiVersions", rtype.version)
        and resource_matches(list(rule.get("resources") or []), rtype.plural, subresource)
        and scope_ok
    )


class Policies:
    """The stored policies and bindings, checked against one write at a time."""

    def __init__(self, objects: store.ObjectStore) -> None:
        self.store = objects

    def _all(self, plural: str) -> list[dict[str, Any]]:
        try:
            rtype = self.store.catalog.lookup(plural)
        except KeyError:
            return []
        items, _ = self.store.list_objects(rtype, copied=False)
        return items

    def check(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        operation: str,
        subresource: str,
        obj: Mapping[str, Any] | None,
        old: Mapping[str, Any] | None,
        user: identity.User,
    ) -> None:
        """Raise the refusal of the first binding whose policy denies this write; nothing if allowed."""
        bindings = self._all("validatingadmissionpolicybindings")
        if not bindings:
            return
        policies = {store.meta(p).get("name"): p for p in self._all("validatingadmissionpolicies")}
        labels = store.meta(obj or old or {}).get("labels")
        namespace_object = self._namespace(namespace)
        for binding in sorted(bindings, key=lambda b: store.meta(b).get("name", "")):
            spec = binding.get("spec") or {}
            policy = policies.get(spec.get("policyName"))
            if policy is None or "Deny" not in (spec.get("validationActions") or []):
                continue
            pspec = policy.get("spec") or {}
            if not all(
                _matches(constraints, rtype, operation, subresource, labels, namespace_object)
                for constraints in (pspec.get("matchConstraints"), spec.get("matchResources"))
                if constraints is not None
            ):
                continue
            request = {
                "kind": {"group": rtype.group, "version": rtype.version, "kind": rtype.kind},
                "resource": {"group": rtype.group, "version": rtype.version, "resource": rtype.plural},
                "subResource": subresource,
                "name": store.meta(obj or old or {}).get("name", ""),
                "namespace": namespace or "",
                "operation": operation,
                "userInfo": user.info(),
                "dryRun": store.DRY_RUN.get(),
            }
            variables = {
                "object": obj,
                "oldObject": old,
                "request": request,
                "namespaceObject": namespace_object,
                "params": None,
            }
            names = (store.meta(policy).get("name", ""), store.meta(binding).get("name", ""))
            refusal = _refusal(*names, pspec, variables)
            if refusal is not None:
                raise refusal

    def _namespace(self, namespace: str | None) -> dict[str, Any] | None:
        if not namespace:
            return None
        try:
            return self.store.get(self.store.catalog.lookup("namespaces"), None, namespace)
        except errors.ApiError:
            return None


def _matches(
    constraints: Mapping[str, Any],
    rtype: catalog.ResourceType,
    operation: str,
    subresource: str,
    labels: Mapping[str, str] | None,
    namespace_object: Mapping[str, Any] | None,
) -> bool:
    rules = constraints.get("resourceRules")
    if rules is not None and not any(rule_matches(r, rtype, operation, subresource) for r in rules):
        return False
    if any(rule_matches(r, rtype, operation, subresource) for r in constraints.get("excludeResourceRules") or []):
        return False
    if not selectors.from_object(constraints.get("objectSelector")).matches(labels):
        return False
    if rtype.namespaced and namespace_object is not None:
        ns_labels = store.meta(namespace_object).get("labels")
        return selectors.from_object(constraints.get("namespaceSelector")).matches(ns_labels)
    return True


def _refusal(
    policy: str, binding: str, spec: Mapping[str, Any], variables: Mapping[str, Any]
) -> errors.ApiError | None:
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    prefix = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request"
    try:
        for condition in spec.get("matchConditions") or []:
            if not cel.is_true(condition["expression"], variables):
                return None
    except cel.CelError as e:
        return errors.ApiError(403, "Forbidden", f"{prefix}: matchCondition failed: {e}") if fail_closed else None
    for validation in spec.get("validations") or []:
        expression = validation.get("expression", "")
        try:
            if cel.is_true(expression, variables):
                continue
        except cel.CelError as e:
            if fail_closed:
                return errors.ApiError(403, "Forbidden", f"{prefix}: expression '{expression}' resulted in error: {e}")
            continue
        reason = validation.get("reason") or "Invalid"
        return errors.ApiError(_CODES.get(reason, 422), reason, f"{prefix}: {_message(validation, variables)}")
    return None


def _message(validation: Mapping[str, Any], variables: Mapping[str, Any]) -> str:
    """``messageExpression`` if it yields a non-empty string, else ``message``, else the expression."""
    if validation.get("messageExpression"):
        try:
            text = str(cel.evaluate(validation["messageExpression"], variables)).strip()
            if text and "\n" not in text:
                return text
        except cel.CelError:
            pass
    return str(validation.get("message") or f"failed expression: {validation.get('expression', '')}")


