"""Admission: the sandbox calls admission webhooks and evaluates ValidatingAdmissionPolicies.

Mutating webhooks (``MutatingWebhookConfiguration``) as kube-apiserver calls them on CREATE, and
validating ones (``ValidatingWebhookConfiguration``) on CREATE and UPDATE, after the policies of
:mod:`policies`: configurations in name order, webhooks in their order; a
webhook is called when its ``rules``, ``namespaceSelector``, ``objectSelector`` and
``matchConditions`` (CEL) match; the call is an HTTPS POST of an ``admission.k8s.io/v1``
AdmissionReview, verified against ``caBundle`` (server name: the URL host, or
``NAME.NAMESPACE.svc`` for service references); the returned JSONPatch is applied; failures
follow ``failurePolicy`` and ``timeoutSeconds``. Not done: ``reinvocationPolicy`` (no second
round), mutation on UPDATE, DELETE/CONNECT operations, ``sideEffects`` dry-run checks.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
import jsonpatch

from deviceshare.sandbox import catalog, cel, claimquotas, dra, errors, identity, policies, priority, selectors, store

Endpoints = Mapping[tuple[str, str], str]  # (namespace, service name) -> "https://127.0.0.1:PORT"


def review_request(
    rtype: catalog.ResourceType,
    namespace: str | None,
    obj: Mapping[str, Any] | None,
    operation: str = "CREATE",
    *,
    old: Mapping[str, Any] | None = None,
    subresource: str = "",
    user: identity.User = identity.ADMIN,
) -> dict[str, Any]:
    """The ``request`` part of an AdmissionReview, also the ``request`` variable of matchConditions."""
    kind = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
    resource = {"group": rtype.group, "version": rtype.version, "resource": rtype.plural}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": store.meta(obj or old or {}).get("name", ""),
        "operation": operation,
        "userInfo": user.info(),
        "object": obj,
        "oldObject": old,
        # As kube-apiserver does: a webhook with side effects must skip them for ``?dryRun=All``.
        "dryRun": store.DRY_RUN.get(),
        "options": {"kind": f"{operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"},
    }
    if subresource:
        request["subResource"] = request["requestSubResource"] = subresource
    if namespace:
        request["namespace"] = namespace
    return request


class Admission:
    def __init__(self, objects: store.ObjectStore, endpoints: Endpoints | None = None) -> None:
        self.store = objects
        self.endpoints = dict(endpoints or {})
        self.policies = policies.Policies(objects)

    def _webhooks(self, plural: str = "mutatingwebhookconfigurations") -> list[Mapping[str, Any]]:
        configs, _ = self.store.list_objects(self.store.catalog.lookup(plural))
        return [
            hook
            for config in sorted(configs, key=lambda c: c["metadata"]["name"])
            for hook in config.get("webhooks") or []
        ]

    def _selected(
        self,
        hook: Mapping[str, Any],
        rtype: catalog.ResourceType,
        namespace: str | None,
        obj: Mapping[str, Any],
        operation: str = "CREATE",
        subresource: str = "",
    ) -> bool:
        rules = hook.get("rules") or []
        if not any(policies.rule_matches(rule, rtype, operation, subresource) for rule in rules):
            return False
        if not selectors.from_object(hook.get("objectSelector")).matches(store.meta(obj).get("labels")):
            return False
        ns_selector = selectors.from_object(hook.get("namespaceSelector"))
        if rtype.key == ("", "namespaces"):
            return ns_selector.matches(store.meta(obj).get("labels"))
        if namespace:
            try:
                ns_labels = store.meta(
                    self.store.get(self.store.catalog.lookup("namespaces"), None, namespace)
                ).get("labels")
            except errors.ApiError:
                ns_labels = {}
            return ns_selector.matches(ns_labels)
        return True

    async def admit_create(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        obj: dict[str, Any],
        user: identity.User = identity.ADMIN,
    ) -> dict[str, Any]:
        """The object after the Priority plugin and every matching webhook mutated it; raises ApiError on
        denial/failure."""
        if rtype.key == ("", "pods"):
            obj = priority.admit_pod(self.store, obj)
        for hook in self._webhooks():
            if not self._selected(hook, rtype, namespace, obj):
                continue
            name = hook.get("name", "")
            fail_closed = hook.get("failurePolicy", "Fail") == "Fail"
            request = review_request(rtype, namespace, obj, user=user)
            try:
                if not self._conditions_met(hook, request):
                    continue
                response = await self._call(hook, request)
            except _CallFailed as e:
                if fail_closed:
                    raise errors.internal(f'failed calling webhook "{name}": {e}') from e
                continue
            obj = self._apply_response(name, request, response, obj)
        return obj

    async def validate(
        self,
        rtype: catalog.ResourceType,
        namespace: str | None,
        operation: str,
        obj: Mapping[str, Any] | None,
        old: Mapping[str, Any] | None = None,
        *,
        subresource: str = "",
        user: identity.User = identity.ADMIN,
    ) -> None:
        """Validating admission of a write: the Priority plugin's PriorityClass rule, policies, validating
        webhooks, then ResourceQuota for a ResourceClaim (``claimquotas``); raises ApiError."""
        if rtype.key == priority.KEY and operation in ("CREATE", "UPDATE") and obj is not None and not subresource:
            priority.check_class(self.store, operation, obj)
        self.policies.check(rtype, namespace, operation, subresource, obj, old, user)
        for hook in self._webhooks("validatingwebhookconfigurations"):
            if not self._selected(hook, rtype, namespace, obj or old or {}, operation, subresource):
                continue
            name = hook.get("name", "")
            request = review_request(
                rtype, namespace, obj, operation, old=old, subresource=subresource, user=user
            )
            try:
                if not self._conditions_met(hook, request):
                    continue
                response = await self._call(hook, request)
            except _CallFailed as e:
                if hook.get("failurePolicy", "Fail") == "Fail":
                    raise errors.internal(f'failed calling webhook "{name}": {e}') from e
                continue
            if not response.get("allowed"):
                self._apply_response(name, request, response, {})
        # ResourceQuota comes after the validating webhooks (kube-apiserver's plugin order); nothing is awaited
        # between its charge and the store's write.
        if rtype.key == dra.RESOURCE_CLAIMS and operation == "CREATE" and obj is not None and not subresource:
            claimquotas.admit(self.store, namespace or "", obj)

    def _conditions_met(self, hook: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
        variables = {"object": request["object"], "oldObject": request["oldObject"], "request": request}
        for condition in hook.get("matchConditions") or []:
            try:
                if not cel.is_true(condition["expression"], variables):
                    return False
            except cel.CelError as e:
                raise _CallFailed(f"matchCondition {condition.get('name')!r} failed: {e}") from e
        return True

    def _url(self, hook: Mapping[str, Any]) -> tuple[str, str | None]:
        client = hook.get("clientConfig") or {}
        if client.get("url"):
            return client["url"], None
        service = client.get("service") or {}
        key = (service.get("namespace", ""), service.get("name", ""))
        base = self.endpoints.get(key)
        if base is None:
            raise _CallFailed(
                f'service "{key[1]}" in namespace "{key[0]}" has no endpoint in the sandbox '
                f"(pass Sandbox(service_endpoints=...))"
            )
        return base.rstrip("/") + (service.get("path") or "/"), f"{key[1]}.{key[0]}.svc"

    async def _call(self, hook: Mapping[str, Any], request: Mapping[str, Any]) -> Mapping[str, Any]:
        url, server_name = self._url(hook)
        timeout = float(hook.get("timeoutSeconds", 10))
        bundle = (hook.get("clientConfig") or {}).get("caBundle")
        try:
            context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode() if bundle else None)
        except (ValueError, ssl.SSLError) as e:
            raise _CallFailed(f"invalid caBundle: {e}") from e
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        target = f"{url}{'&' if '?' in url else '?'}timeout={int(timeout)}s"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.post(target, json=review, ssl=context, server_hostname=server_name) as response,
            ):
                if response.status != 200:
                    raise _CallFailed(f'failed to call webhook: Post "{target}": status {response.status}')
                body = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError, ssl.SSLError) as e:
            raise _CallFailed(f'failed to call webhook: Post "{target}": {type(e).__name__}: {e}') from e
        result = body.get("response") if isinstance(body, Mapping) else None
        if not isinstance(result, Mapping):
            raise _CallFailed("received invalid webhook response: no response field")
        if result.get("uid") != request["uid"]:
            raise _CallFailed(f"expected response.uid={request['uid']!r}, got {result.get('uid')!r}")
        return result

    @staticmethod
    def _apply_response(
        name: str, request: Mapping[str, Any], response: Mapping[str, Any], obj: dict[str, Any]
    ) -> dict[str, Any]:
        if not response.get("allowed"):
            status = response.get("status") or {}
            code = int(status.get("code") or 400)
            code = code if code >= 400 else 400
            denied = f'admission webhook "{name}" denied the request'
            reason = status.get("message") or status.get("reason")
            message = f"{denied}: {reason}" if reason else f"{denied} without explanation"
            raise errors.ApiError(code, status.get("reason") or "", message)
        if not response.get("patch"):
            return obj
        if response.get("patchType") != "JSONPatch":
            raise errors.internal(
                f'webhook "{name}" returned an unsupported patchType {response.get("patchType")!r}'
            )
        try:
            operations = json.loads(base64.b64decode(response["patch"]))
            patched = jsonpatch.JsonPatch(operations).apply(obj)
        except (ValueError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise errors.internal(f'webhook "{name}" returned an invalid patch: {e}') from e
        if not isinstance(patched, dict):
            raise errors.internal(f'webhook "{name}" patched the object into a non-object')
        return patched


class _CallFailed(Exception):
    """The webhook could not be asked (network, TLS, timeout, bad reply): failurePolicy decides."""
