"""The webhook configurations: opted-in pod creations to the webhook, and group writes to its budget check.

Built in Python so the demo, tests and manifests share one definition. The webhook is only called
for pods that carry the group annotation (a CEL ``matchCondition``), so ``failurePolicy: Fail``
applies to them alone: an unavailable webhook blocks group pods (which could not get their devices
anyway) and nothing else. The namespace selector leaves out ``kube-system`` and the webhook's own
namespace, so the webhook can never block the pods that would bring it back.

The ValidatingWebhookConfiguration sends SharedDeviceGroup creations and spec changes to the
namespace device budget check (``/validate-groups``); manifests/base holds the same two objects.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from deviceshare.api import names
from deviceshare.webhooks import server

DEFAULT_NAME = "deviceshare-webhook"
WEBHOOK_NAME = "pods.deviceshare.io"
GROUPS_WEBHOOK_NAME = "groups.deviceshare.io"
SPEC_CHANGED = "request.operation == 'CREATE' || object.spec != oldObject.spec"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace since 1.21
OPTED_IN = (
    f"has(object.metadata.annotations) && '{names.POD_GROUP_ANNOTATION}' in object.metadata.annotations"
)


def build(
    *,
    ca_bundle: bytes | str,
    service_name: str | None = None,
    service_namespace: str = names.DEFAULT_NAMESPACE,
    service_port: int = 443,
    url: str | None = None,
    name: str = DEFAULT_NAME,
    timeout_seconds: int = 5,
    excluded_namespaces: Sequence[str] = ("kube-system",),
) -> dict[str, Any]:
    """The configuration, pointing either at a Service (in-cluster) or at a URL (the sandbox).

    ``ca_bundle`` is the CA's PEM bytes or their base64 text; ``url`` is the webhook's base URL or
    its full ``/mutate-pods`` URL. The service namespace is always excluded as well.
    """
    client_config = _client_config(
        ca_bundle, service_name, service_namespace, service_port, url, timeout_seconds, server.MUTATE_PATH
    )
    excluded = list(dict.fromkeys([*excluded_namespaces, service_namespace]))
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "deviceshare"}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client_config,
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "matchPolicy": "Equivalent",
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": excluded}
                    ]
                },
                "matchConditions": [{"name": "opted-in", "expression": OPTED_IN}],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }


def build_group_validation(
    *,
    ca_bundle: bytes | str,
    service_name: str | None = None,
    service_namespace: str = names.DEFAULT_NAMESPACE,
    service_port: int = 443,
    url: str | None = None,
    name: str = DEFAULT_NAME,
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of the group budget check (arguments as for :func:`build`;
    ``url`` is the webhook's base URL)."""
    client_config = _client_config(
        ca_bundle, service_name, service_namespace, service_port, url, timeout_seconds,
        server.VALIDATE_GROUPS_PATH,
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "deviceshare"}},
        "webhooks": [
            {
                "name": GROUPS_WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client_config,
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": [names.GROUP],
                        "apiVersions": [names.VERSION],
                        "resources": [names.PLURAL],
                        "scope": "Namespaced",
                    }
                ],
                "matchPolicy": "Equivalent",
                "matchConditions": [{"name": "spec-changed", "expression": SPEC_CHANGED}],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
            }
        ],
    }


def _client_config(
    ca_bundle: bytes | str,
    service_name: str | None,
    service_namespace: str,
    service_port: int,
    url: str | None,
    timeout_seconds: int,
    path: str,
) -> dict[str, Any]:
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
        client_config["service"] = {"name": service_name, "namespace": service_namespace, "path": path,
                                    "port": service_port}
    return client_config
