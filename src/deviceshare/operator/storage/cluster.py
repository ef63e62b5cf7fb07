"""The operator's reads and writes of groups, pods, Leases and Events, and its watches of groups and pods.

Pods and groups are watched here too (:meth:`ClusterApi.pod_reflector`, :meth:`ClusterApi.group_reflector`),
not through Kopf: they are nearly all the events, and Kopf's per-event machinery cost more CPU than the
scheduling decision itself. Group reads and writes answer with the parsed record (:class:`~..state.GroupRecord`),
kept with ``ClusterState.keep``. Every name in a path is URL-quoted (see :func:`.transport._segment`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import watching

from .. import readback
from .. import state as state_
from ..readback import Seen
from . import drastatus
from .errors import READ_BACK_TRIES, Conflict, Gone, TooManyRequests, Uncertain
from .eventwrites import EventWrites
from .transport import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    GroupKey,
    PodKey,
    _group_path,
    _lease_path,
    _pod_path,
    _segment,
    now_rfc3339,
)

logger = logging.getLogger(__name__)


class ClusterApi(drastatus.DraReads, EventWrites):
    """Every read the operator makes outside its watches, and every write (lists of nodes, pods and groups: see
    :class:`.listing.Collections`; Events: :class:`.eventwrites.EventWrites`; a DRA group's ResourceClaim object:
    :class:`.draclaims.ClaimWrites`; the DRA watches and a claim's status: :class:`.drastatus.DraReads`)."""

    def node_reflector(self, sink: watching.Sink, *, resume_from: str | None = None) -> watching.Reflector:
        """A list+watch of every node, feeding ``sink`` (``resume_from``: see :class:`watching.Reflector`)."""
        call = k8s.CoreV1Api(self._client).list_node
        return self._reflector(call, sink, "nodes", resume_from)

    def pod_reflector(self, sink: watching.Sink, *, resume_from: str | None = None) -> watching.Reflector:
        """A list+watch of every pod, feeding ``sink`` (a relist hands over the whole collection, so
        deletions missed while the watch was down are seen, unlike Kopf's re-list)."""
        call = k8s.CoreV1Api(self._client).list_pod_for_all_namespaces
        return self._reflector(call, sink, "pods", resume_from)

    def group_reflector(self, sink: watching.Sink, *, resume_from: str | None = None) -> watching.Reflector:
        """A list+watch of every SharedDeviceGroup, feeding ``sink`` (as :meth:`pod_reflector`)."""
        call = functools.partial(
            k8s.CustomObjectsApi(self._client).list_cluster_custom_object, names.GROUP, names.VERSION, names.PLURAL
        )
        return self._reflector(call, sink, names.PLURAL, resume_from)

    def quota_reflector(self, sink: watching.Sink) -> watching.Reflector:
        """A list+watch of every ResourceQuota (the namespaces' device budgets), feeding ``sink``."""
        call = k8s.CoreV1Api(self._client).list_resource_quota_for_all_namespaces
        return self._reflector(call, sink, "resourcequotas", None)

    def _reflector(
        self, call: watching.ListCall, sink: watching.Sink, name: str, resume_from: str | None
    ) -> watching.Reflector:
        return watching.Reflector(
            call, sink, name=name, watch_timeout_s=self.watch_timeout_s, request_timeout_s=self.request_timeout,
            idle_timeout_s=self.watch_idle_s, resume_from=resume_from,
        )

    # -- reads ---------------------------------------------------------------------------------

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
        data: dict[str, Any] = await self._call(
            "GET", _lease_path(own_namespace, name), f"get lease {name}", lease=True
        )
        return data

    async def create_lease(self, own_namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """409 (``Conflict``) when another replica created it first."""
        return await self._lease_write(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{_segment(own_namespace)}/leases", "create lease", body
        )

    async def replace_lease(self, own_namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A PUT carrying the resourceVersion read: 409 (``Conflict``) when the Lease changed since."""
        return await self._lease_write("PUT", _lease_path(own_namespace, name), f"update lease {name}", body)

    async def _lease_write(self, method: str, path: str, what: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Not fenced (it is how a replica becomes the leader); a write whose answer was lost is ``Uncertain``, and
        the election reads the Lease back (leadership.py)."""
        verb = "create" if method == "POST" else "update"
        try:
            data: dict[str, Any] = await self._call(method, path, what, dict(body), lease=True)
        except Conflict:
            self.on_write(verb, "leases", "conflict")
            raise
        except Exception:
            self.on_write(verb, "leases", "failed")
            raise
        self.on_write(verb, "leases", "ok")
        return data

    # -- group writes --------------------------------------------------------------------------

    async def patch_group_status(
        self, key: GroupKey, status: Mapping[str, Any], *, uid: str, resource_version: str
    ) -> state_.GroupRecord:
        """Merge-patch our status fields, conditional on the resourceVersion they were computed from (409 if
        stale: read again and decide again). A lost answer is read back (see the module docstring)."""
        what = f"patch status of shareddevicegroup {names.key_text(key)}"
        body: dict[str, Any] = {"status": dict(status), "metadata": {"resourceVersion": resource_version}}
        judge = functools.partial(readback.status, uid=uid, written=status, precondition=resource_version)
        resource = "shareddevicegroups/status"
        return await self._group_write(_group_path(key) + "/status", key, what, body, resource, judge)

    async def set_group_finalizers(
        self, key: GroupKey, finalizers: Sequence[str], *, uid: str, resource_version: str
    ) -> state_.GroupRecord:
        """Replace the finalizer list, conditional on resourceVersion so no one else's entry is lost.

        When the last finalizer of a deleting group goes, the API server deletes it: the answer is the group as
        it was last (``deletionTimestamp`` set, no finalizers), also when that is only known from a read-back."""
        what = f"patch finalizers of shareddevicegroup {names.key_text(key)}"
        body = {"metadata": {"finalizers": list(finalizers), "resourceVersion": resource_version}}
        judge = functools.partial(readback.finalizers, uid=uid, written=finalizers, precondition=resource_version)
        return await self._group_write(_group_path(key), key, what, body, "shareddevicegroups", judge)

    async def _group_write(
        self, path: str, key: GroupKey, what: str, body: dict[str, Any], resource: str,
        judge: Callable[[dict[str, Any] | None], Seen],
    ) -> state_.GroupRecord:
        """A conditional write to a group, its lost answer resolved: sent again while the group still shows the
        version it was conditional on (only one of two such copies can land), until it shows what we wrote."""
        for _ in range(READ_BACK_TRIES):
            try:
                data: dict[str, Any] = await self._write(
                    "PATCH", path, what, body, verb="patch", resource=resource, content_type=MERGE_PATCH,
                    resolved_by_caller=True,
                )
                return state_.group_record(data)
            except Uncertain:
                seen, shown = await self._resolve(what, "patch", resource, lambda: self._read_group_body(key), judge)
            if seen is Seen.LANDED:
                if shown is None:  # a deleting group whose last finalizer we removed: deleted now
                    return _deleted(body, key)
                return state_.group_record(shown)
            if seen is Seen.GONE:
                raise Gone(f"{what}: the group no longer exists")
            if seen is Seen.OVERTAKEN:
                raise Conflict(f"{what}: the group changed while our write's answer was lost")
        raise Uncertain(f"{what}: the answer was lost {READ_BACK_TRIES} times")

    async def _read_group_body(self, key: GroupKey) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = await self._call(
                "GET", _group_path(key), f"get shareddevicegroup {names.key_text(key)}"
            )
        except Gone:
            return None
        return data

    # -- pod writes ----------------------------------------------------------------------------

    async def annotate_pod(self, key: PodKey, uid: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations; the uid makes it a precondition (a recreated pod is not touched).

        Only to put back what a running member's owner changed: placement writes them in the Binding. A lost
        answer is read back; an annotation patch is idempotent, so one not yet landed is sent again later."""
        what = f"annotate pod {names.key_text(key)}"
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        try:
            await self._write(
                "PATCH", _pod_path(key), what, body, verb="patch", resource="pods", content_type=MERGE_PATCH,
                resolved_by_caller=True,
            )
        except Uncertain:
            judge = functools.partial(readback.pod_annotations, uid=uid, written=annotations)
            seen, _ = await self._resolve(what, "patch", "pods", lambda: self.get_pod(key), judge)
            if seen is Seen.GONE:
                raise Gone(f"{what}: the pod no longer exists") from None
            if seen is not Seen.LANDED:
                raise

    async def bind_pod(self, key: PodKey, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Bind to ``node``; the API server copies the Binding's annotations onto the pod in the same write
        (kube-apiserver's ``BindingREST``), so the pod is never bound without its devices.

        Returns once the API shows the pod bound by this Binding. A lost answer, or a 409 (which our own earlier
        Binding that landed also causes), is read back: bound here with our annotations is success; bound by
        anyone else ``Conflict``; gone ``Gone``; not bound yet ``Uncertain`` (the Binding may still land: keep
        the devices and bind again later — a second Binding is refused with a 409 if the first one landed)."""
        what = f"bind pod {names.key_text(key)} to {node}"
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": key[1], "namespace": key[0], "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self._write(
                "POST", _pod_path(key) + "/binding", what, body, verb="bind", resource="pods/binding",
                resolved_by_caller=True,
            )
            return
        except (Uncertain, Conflict) as e:
            lost = e
        judge = functools.partial(readback.binding, uid=uid, node=node, annotations=annotations)
        seen, _ = await self._resolve(what, "bind", "pods/binding", lambda: self.get_pod(key), judge)
        if seen is Seen.LANDED:
            return
        if seen is Seen.GONE:
            raise Gone(f"{what}: the pod no longer exists") from lost
        if seen is Seen.OVERTAKEN:
            raise Conflict(f"{what}: the pod is bound by someone else") from lost
        if isinstance(lost, Conflict):  # refused, and not bound: a uid precondition that no longer holds
            raise Conflict(str(lost)) from lost
        raise Uncertain(f"{what}: the answer was lost and the pod is not bound yet") from lost

    async def evict_pod(self, key: PodKey, uid: str) -> bool:
        """Evict through ``pods/eviction`` (policy/v1), so PodDisruptionBudgets hold; the uid is a precondition
        (a pod recreated under the name is not touched). True once the API shows the pod gone or terminating;
        False when a PodDisruptionBudget refuses now (429). A lost answer is read back; one that cannot be
        settled is ``Uncertain``."""
        what = f"evict pod {names.key_text(key)}"
        body = {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": key[1], "namespace": key[0]},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        try:
            await self._write(
                "POST", _pod_path(key) + "/eviction", what, body, verb="evict", resource="pods/eviction",
                resolved_by_caller=True,
            )
            return True
        except TooManyRequests:
            return False
        except (Gone, Conflict):  # gone already, or another pod under the name: nothing of ours to evict
            return True
        except Uncertain:
            judge = functools.partial(readback.eviction, uid=uid)
            seen, _ = await self._resolve(what, "evict", "pods/eviction", lambda: self.get_pod(key), judge)
            if seen is not Seen.LANDED:
                raise
            return True

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
        await self._write(
            "PATCH", _pod_path(key) + "/status", f"set PodScheduled on pod {names.key_text(key)}",
            body, verb="patch", resource="pods/status", content_type=STRATEGIC_MERGE_PATCH,
        )

def _deleted(body: Mapping[str, Any], key: GroupKey) -> state_.GroupRecord:
    """A group deleted by our removal of its last finalizer, known only from a read-back's 404."""
    return state_.group_record({
        "metadata": {"namespace": key[0], "name": key[1], "finalizers": [],
                     "deletionTimestamp": now_rfc3339(), **(body.get("metadata") or {})},
    })
