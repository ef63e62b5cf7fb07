"""A SharedDeviceGroup gets the operator's finalizer when it is created: AdmissionReview in, decision out.

The finalizer makes a group's deletion wait until no member pod runs on its devices (``Releasing``). The
operator used to add it with a write of its own after every group creation (a PATCH per group, conditional
on the group's resourceVersion); set here, by the API server in the creation itself, that write is gone and
a one-pod group costs the API three writes: its binding, one status write and one event.

Pure, like :mod:`admission`: the review in, a :class:`~deviceshare.webhooks.admission.Decision` out; no I/O,
no cache. The MutatingWebhookConfiguration sends only group CREATEs that lack the finalizer (a CEL
``matchCondition``), with ``failurePolicy: Ignore``: should the webhook be down, the group is created without
the finalizer and the operator adds it where it is missing (before it places the group, and in its
reconcile), so nothing is lost but the saved write, and no group creation waits on the webhook's health.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceshare.api import names
from deviceshare.webhooks import admission, reviews


def decide(body: Mapping[str, Any], finalizer: str = names.GROUP_FINALIZER) -> admission.Decision:
    """The decision for one review (raises :class:`reviews.MalformedReview` naming the field at fault):
    a SharedDeviceGroup CREATE without ``finalizer`` is patched to carry it; anything else passes untouched."""
    request = reviews.request_of(body)
    if not reviews.is_group_write(request, ("CREATE",)):
        return admission.Decision(allowed=True, outcome="skipped")
    group = request.get("object")
    if group is None:
        raise reviews.MalformedReview("request.object is missing: a SharedDeviceGroup CREATE carries the group")
    meta = group.get("metadata")
    if meta is None:
        meta = {}
    elif not isinstance(meta, Mapping):
        raise reviews.MalformedReview(f"request.object.metadata is {reviews.describe(meta)}, not an object")
    present = meta.get("finalizers")
    if present is None:
        patch: dict[str, Any] = {"op": "add", "path": admission.pointer("metadata", "finalizers"), "value": [finalizer]}
        if "metadata" not in group:
            patch = {"op": "add", "path": admission.pointer("metadata"), "value": {"finalizers": [finalizer]}}
        return admission.Decision(allowed=True, patch=[patch], outcome="patched")
    if not isinstance(present, list) or not all(isinstance(f, str) for f in present):
        raise reviews.MalformedReview(
            f"request.object.metadata.finalizers is {reviews.describe(present)}, not an array of strings"
        )
    if finalizer in present:
        return admission.Decision(allowed=True, outcome="unchanged")
    added = {"op": "add", "path": admission.pointer("metadata", "finalizers", "-"), "value": finalizer}
    return admission.Decision(allowed=True, patch=[added], outcome="patched")
