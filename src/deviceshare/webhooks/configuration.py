"""The webhook configurations: opted-in pod creations to the webhook, and group writes to its budget check.

Built in Python so the demo, tests and manifests share one definition. The webhook is only called
for pods that carry the group annotation (a CEL ``matchCondition``), so ``failurePolicy: Fail``
applies to them alone: an unavailable webhook blocks group pods (which could not get their devices
anyway) and nothing else. The namespace selector leaves out ``kube-system`` and the webhook's own
namespace, so the webhook can never block the pods that would bring it back.

The same MutatingWebhookConfiguration sends SharedDeviceGroup creations that lack the operator's finalizer
to ``/mutate-groups``, which adds it (:mod:`finalizers`), with ``failurePolicy: Ignore``: the operator still
adds the finalizer wherever it is missing, so an unavailable webhook costs one API write per group and never
blocks a group's creation.

The ValidatingWebhookConfiguration sends SharedDeviceGroup creations and spec changes to the
namespace device budget check (``/validate-groups``); manifests/base holds the same two objects.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

from deviceshare.api import names
from deviceshare.webhooks import server

DEFAULT_NAME = "deviceshare-webhook"
WEBHOOK_NAME = "pods.deviceshare.io"
GROUPS_WEBHOOK_NAME = "groups.deviceshare.io"
FINALIZER_WEBHOOK_NAME = "group-finalizer.deviceshare.io"
SPEC_CHANGED = "request.operation == 'CREATE' || object.spec != oldObject.spec"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace since 1.21
OPTED_IN = (
    f"has(object.metadata.annotations) && '{names.POD_GROUP_ANNOTATION}' in object.metadata.annotations"
)
NO_FINALIZER = (
    f"!has(object.metadata.finalizers) || !('{names.GROUP_FINALIZER}' in object.metadata.finalizers)"
)


class Endpoint(TypedDict, total=False):
    """Where the API server reaches the webhook, as both builders take it: exactly one of
    ``service_name`` (in-cluster, with ``service_namespace``, default ``names.DEFAULT_NAMESPACE``, and
    ``service_port``, default 443) and ``url`` (the webhook's base URL; the sandbox). ``name`` names
    the configuration (default ``DEFAULT_NAME``); ``timeout_seconds`` is 1..5 (default 5)."""

    service_name: str | None
    service_namespace: str
    service_port: int
    url: str | None
    name: str
    timeout_seconds: int


def build(
    *,
    ca_bundle: bytes | str,
    excluded_namespaces: Sequence[str] = ("kube-system",),
    **endpoint: Unpack[Endpoint],
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration (pods, then groups' finalizer), pointing either at a Service or at a URL
    (see :class:`Endpoint`).

    ``ca_bundle`` is the CA's PEM bytes or their base64 text; ``url`` may also be the full
    ``/mutate-pods`` URL. The service namespace is always excluded as well.
    """
    service_namespace = endpoint.get("service_namespace", names.DEFAULT_NAMESPACE)
    excluded = list(dict.fromkeys([*excluded_namespaces, service_namespace]))
    pods = _hook(
        WEBHOOK_NAME, server.MUTATE_PATH, ca_bundle, endpoint,
        rule={
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        namespace_selector={
            "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": excluded}]
        },
        condition={"name": "opted-in", "expression": OPTED_IN},
        reinvocation="IfNeeded",
    )
    finalizer = _hook(
        FINALIZER_WEBHOOK_NAME, server.MUTATE_GROUPS_PATH, ca_bundle, endpoint,
        rule={
            "operations": ["CREATE"],
            "apiGroups": [names.GROUP],
            "apiVersions": [names.VERSION],
            "resources": [names.PLURAL],
            "scope": "Namespaced",
        },
        condition={"name": "no-finalizer", "expression": NO_FINALIZER},
        failure_policy="Ignore",
    )
    return _configuration("MutatingWebhookConfiguration", endpoint, [pods, finalizer])


def build_group_validation(*, ca_bundle: bytes | str, **endpoint: Unpack[Endpoint]) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the group budget check (arguments as for :func:`build`)."""
    hook = _hook(
        GROUPS_WEBHOOK_NAME, server.VALIDATE_GROUPS_PATH, ca_bundle, endpoint,
        rule={
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [names.GROUP],
            "apiVersions": [names.VERSION],
            "resources": [names.PLURAL],
            "scope": "Namespaced",
        },
        condition={"name": "spec-changed", "expression": SPEC_CHANGED},
    )
    return _configuration("ValidatingWebhookConfiguration", endpoint, [hook])


def _hook(
    webhook_name: str,
    path: str,
    ca_bundle: bytes | str,
    endpoint: Endpoint,
    *,
    rule: dict[str, Any],
    condition: dict[str, str],
    namespace_selector: dict[str, Any] | None = None,
    reinvocation: str | None = None,
    failure_policy: str = "Fail",
) -> dict[str, Any]:
    """One webhook with the settings all share: behind a match condition, no side effects, v1 reviews,
    equivalent matching; ``failurePolicy: Fail`` unless said otherwise."""
    unknown = sorted(set(endpoint) - Endpoint.__optional_keys__)
    if unknown:  # what a plain signature would refuse: a misspelt setting must not be dropped silently
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    timeout_seconds = endpoint.get("timeout_seconds", 5)
    hook: dict[str, Any] = {
        "name": webhook_name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(ca_bundle, endpoint, timeout_seconds, path),
        "rules": [rule],
        "matchPolicy": "Equivalent",
    }
    if namespace_selector is not None:
        hook["namespaceSelector"] = namespace_selector
    hook.update(
        matchConditions=[condition], failurePolicy=failure_policy, sideEffects="None", timeoutSeconds=timeout_seconds
    )
    if reinvocation is not None:
        hook["reinvocationPolicy"] = reinvocation
    return hook


def _configuration(kind: str, endpoint: Endpoint, hooks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": endpoint.get("name", DEFAULT_NAME), "labels": {"app.kubernetes.io/name": "deviceshare"}},
        "webhooks": hooks,
    }


def _client_config(ca_bundle: bytes | str, endpoint: Endpoint, timeout_seconds: int, path: str) -> dict[str, Any]:
    service_name, url = endpoint.get("service_name"), endpoint.get("url")
    if (service_name is None) == (url is None):
        raise ValueError("give exactly one of service_name or url")
    if not 1 <= timeout_seconds <= 5:
        raise ValueError("timeoutSeconds must be between 1 and 5 so pod creation never stalls")
    bundle = base64.b64encode(ca_bundle).decode() if isinstance(ca_bundle, bytes) else ca_bundle
    client_config: dict[str, Any] = {"caBundle": bundle}
    if url is not None:
        base = url.removesuffix(server.MUTATE_PATH).rstrip("/")
        client_config["url"] = base + path
    else:
        service_namespace = endpoint.get("service_namespace", names.DEFAULT_NAMESPACE)
        client_config["service"] = {"name": service_name, "namespace": service_namespace, "path": path,
                                    "port": endpoint.get("service_port", 443)}
    return client_config
