"""The operator's only door to the API server: every read it makes outside Kopf's watches, and every write.

Pods and groups are watched here too (:meth:`ClusterApi.pod_reflector`, :meth:`ClusterApi.group_reflector`),
not through Kopf: they are nearly all the events, and Kopf's per-event machinery cost more CPU than the
scheduling decision itself.

API exceptions are converted here, once, into errors by intent: ``Conflict`` (stale resourceVersion or
a precondition failed: re-read and retry), ``Gone`` (the object no longer exists), ``Invalid`` (the API
refused the write: 400/403/415/422, the same write retried at once would be refused again) and
``RetryLater`` for the rest (retry with backoff): our own, since Kopf never sees them. Group reads and
writes answer with the parsed record (:class:`~.state.GroupRecord`), kept with ``ClusterState.keep``.

Every name in a path is URL-quoted: names come from annotations a pod's owner writes, and a name such as
``../shareddevicegroups?watch=true`` must stay one path segment, not become another request.
"""

from __future__ import annotations

import datetime
import functools
import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import rest, watching

from . import state as state_

logger = logging.getLogger(__name__)

GroupKey = tuple[str, str]
PodKey = tuple[str, str]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class Conflict(Exception):
    """409: the object changed underneath us (or a uid/resourceVersion precondition failed)."""


class Gone(Exception):
    """404: the object was deleted."""


class Invalid(Exception):
    """400/403/415/422: the API refused what we sent (validation, admission, RBAC); not a transient error."""


class RetryLater(Exception):
    """Anything else (5xx, 429, a timeout, a dropped connection): the same request may work after ``delay``
    seconds (the server's ``Retry-After`` on a 429)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _translate(status: int, message: str, headers: Mapping[str, str] | None, what: str) -> Exception:
    text = f"{what}: {status} {message}"
    if status == 409:
        return Conflict(text)
    if status == 404:
        return Gone(text)
    if status in (400, 403, 415, 422):
        return Invalid(text)
    delay: float | None = None
    retry_after = (headers or {}).get("Retry-After", "")
    if status == 429 and retry_after.isdigit():
        delay = float(retry_after)
    return RetryLater(text, delay=delay or 1.0)


class ClusterApi:
    """Reads and writes for one ApiClient (created at start-up, closed at cleanup)."""

    def __init__(self, api_client: k8s.ApiClient, *, request_timeout: float = 30.0) -> None:
        self._client = api_client
        # No call may hang for ever: a stuck write would hold its group's lock.
        self.request_timeout = request_timeout

    def pod_reflector(self, sink: watching.Sink, *, watch_timeout_s: int = 300) -> watching.Reflector:
        """A list+watch of every pod, feeding ``sink`` (a relist hands over the whole collection, so
        deletions missed while the watch was down are seen, unlike Kopf's re-list)."""
        call = k8s.CoreV1Api(self._client).list_pod_for_all_namespaces
        return watching.Reflector(
            call, sink, name="pods", watch_timeout_s=watch_timeout_s, request_timeout_s=self.request_timeout
        )

    def group_reflector(self, sink: watching.Sink, *, watch_timeout_s: int = 300) -> watching.Reflector:
        """A list+watch of every SharedDeviceGroup, feeding ``sink`` (as :meth:`pod_reflector`)."""
        call = functools.partial(
            k8s.CustomObjectsApi(self._client).list_cluster_custom_object, names.GROUP, names.VERSION, names.PLURAL
        )
        return watching.Reflector(
            call, sink, name=names.PLURAL, watch_timeout_s=watch_timeout_s, request_timeout_s=self.request_timeout
        )

    def quota_reflector(self, sink: watching.Sink, *, watch_timeout_s: int = 300) -> watching.Reflector:
        """A list+watch of every ResourceQuota (the namespaces' device budgets), feeding ``sink``."""
        call = k8s.CoreV1Api(self._client).list_resource_quota_for_all_namespaces
        return watching.Reflector(
            call, sink, name="resourcequotas", watch_timeout_s=watch_timeout_s,
            request_timeout_s=self.request_timeout,
        )

    async def close(self) -> None:
        await self._client.close()

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> Any:
        try:
            return await rest.call(
                self._client, method, path, body, content_type=content_type, timeout=self.request_timeout
            )
        except rest.ApiError as e:
            raise _translate(e.status, e.message, e.headers, what) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RetryLater(f"{what}: {e!r}", delay=1.0) from e

    # -- reads ---------------------------------------------------------------------------------

    async def list_nodes(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/api/v1/nodes", "list nodes")).get("items") or [])

    async def list_pods(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/api/v1/pods", "list pods")).get("items") or [])

    async def list_groups(self) -> list[dict[str, Any]]:
        data = await self._call("GET", f"/apis/{names.API_VERSION}/{names.PLURAL}", "list shareddevicegroups")
        return list(data.get("items") or [])

    async def read_group(self, key: GroupKey) -> state_.GroupRecord:
        """The group as the API shows it now (``Gone`` if it does not exist)."""
        body = await self._call("GET", _group_path(key), f"get shareddevicegroup {names.key_text(key)}")
        return state_.group_record(body)

    async def read_group_if_exists(self, key: GroupKey) -> state_.GroupRecord | None:
        try:
            return await self.read_group(key)
        except Gone:
            return None

    async def get_pod(self, key: PodKey) -> dict[str, Any] | None:
        """The pod as the API shows it now; None if it does not exist."""
        try:
            data: dict[str, Any] = await self._call("GET", _pod_path(key), f"get pod {names.key_text(key)}")
        except Gone:
            return None
        return data

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's ResourceQuotas (its device budget), read when a group is placed before the
        quota reflector has its first list."""
        data = await self._call(
            "GET", f"/api/v1/namespaces/{_segment(namespace)}/resourcequotas", f"list resourcequotas in {namespace}"
        )
        return list(data.get("items") or [])

    # -- the leader-election Lease (in the operator's own namespace only; see leadership.py) --------

    async def get_lease(self, own_namespace: str, name: str) -> dict[str, Any]:
        data: dict[str, Any] = await self._call("GET", _lease_path(own_namespace, name), f"get lease {name}")
        return data

    async def create_lease(self, own_namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """409 (``Conflict``) when another replica created it first."""
        data: dict[str, Any] = await self._call(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{_segment(own_namespace)}/leases",
            "create lease", dict(body),
        )
        return data

    async def replace_lease(self, own_namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A PUT carrying the resourceVersion read: 409 (``Conflict``) when the Lease changed since."""
        data: dict[str, Any] = await self._call(
            "PUT", _lease_path(own_namespace, name), f"update lease {name}", dict(body)
        )
        return data

    # -- group writes --------------------------------------------------------------------------

    async def patch_group_status(
        self, key: GroupKey, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> state_.GroupRecord:
        """Merge-patch our status fields; with ``resource_version`` the write is conditional (409 if stale)."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        data: dict[str, Any] = await self._call(
            "PATCH", _group_path(key) + "/status", f"patch status of shareddevicegroup {names.key_text(key)}",
            body, content_type=MERGE_PATCH,
        )
        return state_.group_record(data)

    async def set_group_finalizers(
        self, key: GroupKey, finalizers: Sequence[str], *, resource_version: str
    ) -> state_.GroupRecord:
        """Replace the finalizer list, conditional on resourceVersion so no one else's entry is lost."""
        body = {"metadata": {"finalizers": list(finalizers), "resourceVersion": resource_version}}
        data: dict[str, Any] = await self._call(
            "PATCH", _group_path(key), f"patch finalizers of shareddevicegroup {names.key_text(key)}",
            body, content_type=MERGE_PATCH,
        )
        return state_.group_record(data)

    # -- pod writes ----------------------------------------------------------------------------

    async def annotate_pod(self, key: PodKey, uid: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations; the uid makes it a precondition (a recreated pod is not touched).

        Only to put back what a running member's owner changed: placement writes them in the Binding."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        await self._call(
            "PATCH", _pod_path(key), f"annotate pod {names.key_text(key)}", body, content_type=MERGE_PATCH
        )

    async def bind_pod(self, key: PodKey, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Bind to ``node``; the API server copies the Binding's annotations onto the pod in the same write
        (kube-apiserver's ``BindingREST``), so the pod is never bound without its devices."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": key[1], "namespace": key[0], "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", _pod_path(key) + "/binding", f"bind pod {names.key_text(key)} to {node}", body)

    async def set_pod_scheduled_condition(
        self, key: PodKey, *, status: str, reason: str, message: str
    ) -> None:
        """PodScheduled condition, merged by type (strategic merge), as kube-scheduler writes it."""
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                        "lastProbeTime": None,
                    }
                ]
            }
        }
        await self._call(
            "PATCH", _pod_path(key) + "/status", f"set PodScheduled on pod {names.key_text(key)}",
            body, content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- events --------------------------------------------------------------------------------

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
            await self._call(
                "POST", f"/api/v1/namespaces/{_segment(namespace)}/events",
                f"event {reason} for {kind} {namespace}/{name}", body,
            )
        except Exception as e:  # events are advisory
            logger.warning("could not post event %s for %s %s/%s: %s", reason, kind, namespace, name, e)
            return None
        return event_name

    async def count_event(self, namespace: str, event_name: str, count: int) -> bool:
        """Set an Event's ``count`` and bump its ``lastTimestamp``; False if it is gone (or the write failed)."""
        try:
            await self._call(
                "PATCH", f"/api/v1/namespaces/{namespace}/events/{event_name}", f"event {event_name}",
                {"count": count, "lastTimestamp": now_rfc3339()}, content_type=MERGE_PATCH,
            )
        except Exception as e:  # events are advisory; a missing one is posted anew by the caller
            if not isinstance(e, Gone):
                logger.warning("could not count event %s/%s: %s", namespace, event_name, e)
            return False
        return True


def _segment(name: str) -> str:
    """``name`` as exactly one path segment (no name the API server accepts is empty, "." or "..")."""
    if name in ("", ".", ".."):
        raise Invalid(f"{name!r} cannot be the name of an object")
    return quote(name, safe="")


def _lease_path(own_namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{_segment(own_namespace)}/leases/{_segment(name)}"


def _group_path(key: GroupKey) -> str:
    return f"/apis/{names.API_VERSION}/namespaces/{_segment(key[0])}/{names.PLURAL}/{_segment(key[1])}"


def _pod_path(key: PodKey) -> str:
    return f"/api/v1/namespaces/{_segment(key[0])}/pods/{_segment(key[1])}"
