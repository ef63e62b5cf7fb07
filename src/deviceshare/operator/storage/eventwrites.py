"""Posting Events: best effort, like kube-scheduler's recorder (``events.EventRecorder`` counts repeats)."""

from __future__ import annotations

import logging
import secrets

from deviceshare.api import names

from .errors import Gone
from .transport import MERGE_PATCH, Transport, _segment, now_rfc3339

logger = logging.getLogger(__name__)


class EventWrites(Transport):
    async def emit_event(
        self,
        *,
        kind: str,
        api_version: str,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        type_: str = "Normal",
        component: str = names.DEFAULT_SCHEDULER_NAME,
    ) -> str | None:
        """Best effort, like kube-scheduler's recorder: a lost event is logged, never fatal. Returns the
        Event's name (None if it could not be posted); repeats are counted by ``events.EventRecorder``."""
        ts = now_rfc3339()
        event_name = f"{name}.{secrets.token_hex(8)}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": {
                "kind": kind, "apiVersion": api_version, "namespace": namespace, "name": name, "uid": uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        try:
            await self._write(
                "POST", f"/api/v1/namespaces/{_segment(namespace)}/events",
                f"event {reason} for {kind} {namespace}/{name}", body, verb="create", resource="events",
            )
        except Exception as e:  # events are advisory
            logger.warning("could not post event %s for %s %s/%s: %s", reason, kind, namespace, name, e)
            return None
        return event_name

    async def count_event(self, namespace: str, event_name: str, count: int) -> bool:
        """Set an Event's ``count`` and bump its ``lastTimestamp``; False if it is gone (or the write failed)."""
        try:
            await self._write(
                "PATCH", f"/api/v1/namespaces/{_segment(namespace)}/events/{_segment(event_name)}",
                f"event {event_name}", {"count": count, "lastTimestamp": now_rfc3339()},
                verb="patch", resource="events", content_type=MERGE_PATCH,
            )
        except Exception as e:  # events are advisory; a missing one is posted anew by the caller
            if not isinstance(e, Gone):
                logger.warning("could not count event %s/%s: %s", namespace, event_name, e)
            return False
        return True
