"""Warning events the sandbox's own controllers record (the replicaset controller's, the kubelet's), as
kube's event recorder writes them: one Event per object, reason and message; the same one again bumps
``count`` and ``lastTimestamp``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import errors, patches, store


def warn(
    objects: store.ObjectStore, obj: Mapping[str, Any], *, api_version: str, kind: str, reason: str, message: str,
    component: str,
) -> None:
    events = objects.catalog.lookup("events")
    md = store.meta(obj)
    ns = md.get("namespace", "default")
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
        "involvedObject": {"apiVersion": api_version, "kind": kind, "namespace": ns,
                           "name": md["name"], "uid": md.get("uid")},
        "reason": reason, "message": message, "type": "Warning", "count": 1,
        "firstTimestamp": now, "lastTimestamp": now, "source": {"component": component},
    })
