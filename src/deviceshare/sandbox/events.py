"""Events the sandbox's own controllers and kubelet record (core/v1), as client-go's event recorder does:
the same event again (same object, reason and message) bumps ``count`` and ``lastTimestamp`` of the one
already stored instead of adding another."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import errors, patches, store


def record(
    objects: store.ObjectStore, obj: Mapping[str, Any], reason: str, message: str, *,
    component: str, type_: str = "Warning",
) -> None:
    """An event about ``obj`` (its apiVersion and kind as stored) from ``component``."""
    events = objects.catalog.lookup("events")
    md = store.meta(obj)
    ns = md.get("namespace") or "default"
    digest = hashlib.sha1(f"{md.get('uid')}/{reason}/{message}".encode()).hexdigest()[:16]
    event_name = f"{md['name']}.{digest}"
    now = store.now()
    try:
        existing = objects.get(events, ns, event_name)
    except errors.ApiError:
        existing = None
    if existing is not None:
        objects.patch(events, ns, event_name, patches.MERGE,
                      {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": now})
        return
    objects.create(events, ns, {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name, "namespace": ns},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "namespace": ns,
                           "name": md["name"], "uid": md.get("uid")},
        "reason": reason, "message": message, "type": type_, "count": 1,
        "firstTimestamp": now, "lastTimestamp": now, "source": {"component": component},
    })
