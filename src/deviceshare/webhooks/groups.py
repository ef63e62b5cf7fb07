"""The webhook's memory of the cluster: groups by name, live members per group, device quotas.

Admission must answer within its timeout, so it never calls the API; list+watch loops
(:class:`deviceshare.kube.watching.Reflector`) keep this index current instead, one over every
SharedDeviceGroup, one over the pods that carry the ``deviceshare.io/group`` label, and one over
ResourceQuotas (the namespace device budget, :mod:`deviceshare.core.budget`). Until all have
finished their first list the index answers ``WARMING`` and the server denies with a message
that asks for a retry, rather than guessing.

``maxMembers`` is checked here best-effort: two replicas (or two concurrent admissions) may both
see ``n - 1`` members and admit one pod each. The operator enforces the limit authoritatively when
it schedules, so an over-admitted pod stays Pending; the webhook's check only catches the common
case early, with a clearer message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import pydantic
from kubernetes_asyncio import client

from deviceshare.api import models, names
from deviceshare.core import budget
from deviceshare.kube import watching
from deviceshare.webhooks import admission

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
_TERMINATED = frozenset({"Succeeded", "Failed"})


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class _Groups:
    """Sink: every group's spec, parsed once when it changes rather than at each admission."""

    def __init__(self) -> None:
        self.specs: dict[Key, models.GroupSpec] = {}
        self.deleting: set[Key] = set()  # groups with a deletionTimestamp (held by the finalizer)

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.specs, self.deleting = {}, set()
        for obj in objects:
            self.apply("ADDED", obj)

    def apply(self, event_type: str, obj: watching.Object) -> None:
        key = _key(obj)
        self.deleting.discard(key)
        if event_type == "DELETED":
            self.specs.pop(key, None)
            return
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            self.deleting.add(key)
        try:
            self.specs[key] = models.GroupSpec.model_validate(obj.get("spec") or {})
        except pydantic.ValidationError as e:
            # The CRD schema should have refused it; without a valid spec there is nothing to join.
            logger.warning("SharedDeviceGroup %s/%s has an invalid spec: %s", *key, e)
            self.specs.pop(key, None)


class _Members:
    """Sink: which live pods carry which group label."""

    def __init__(self) -> None:
        self.group_of: dict[Key, str] = {}  # pod key -> group name
        self.counts: dict[Key, int] = {}  # group key -> live members

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.group_of, self.counts = {}, {}
        for obj in objects:
            self.apply("ADDED", obj)

    def apply(self, event_type: str, obj: watching.Object) -> None:
        pod = _key(obj)
        old = self.group_of.pop(pod, None)
        if old is not None:
            self._count((pod[0], old), -1)
        if event_type == "DELETED" or not _is_live(obj):
            return
        group = ((obj.get("metadata") or {}).get("labels") or {}).get(names.POD_GROUP_LABEL)
        if group:
            self.group_of[pod] = str(group)
            self._count((pod[0], str(group)), +1)

    def _count(self, group: Key, delta: int) -> None:
        n = self.counts.get(group, 0) + delta
        if n > 0:
            self.counts[group] = n
        else:
            self.counts.pop(group, None)


class _Quotas:
    """Sink: the device limits of every ResourceQuota that has some, by namespace."""

    def __init__(self) -> None:
        self.by_key: dict[Key, budget.Quota] = {}

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.by_key = {}
        for obj in objects:
            self.apply("ADDED", obj)

    def apply(self, event_type: str, obj: watching.Object) -> None:
        key = _key(obj)
        quota = None if event_type == "DELETED" else budget.quota_from_object(obj)
        if quota is None:
            self.by_key.pop(key, None)
        else:
            self.by_key[key] = quota


def _is_live(pod: watching.Object) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in _TERMINATED


class GroupIndex:
    """A :class:`deviceshare.webhooks.admission.GroupView` fed by list+watch (see the module docstring)."""

    def __init__(self) -> None:
        self._groups = _Groups()
        self._members = _Members()
        self._quotas = _Quotas()
        self.reflectors: list[watching.Reflector] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._api: client.ApiClient | None = None

    # -- GroupView --------------------------------------------------------------------------

    def group(self, namespace: str, name: str) -> models.GroupSpec | admission.Unjoinable | None:
        if not self.synced:
            return admission.WARMING
        key = (namespace, name)
        return admission.DELETING if key in self._groups.deleting else self._groups.specs.get(key)

    def member_count(self, namespace: str, name: str) -> int:
        return self._members.counts.get((namespace, name), 0)

    # -- BudgetView --------------------------------------------------------------------------

    def quotas(self, namespace: str) -> list[budget.Quota]:
        return [q for (ns, _), q in sorted(self._quotas.by_key.items()) if ns == namespace]

    def group_resources(self, namespace: str) -> dict[str, dict[str, int]]:
        return {
            name: dict(spec.resources) for (ns, name), spec in self._groups.specs.items() if ns == namespace
        }

    async def refresh(self, namespace: str, name: str, timeout_s: float) -> None:
        """Read one group from the API into the cache (a miss may be a watch that lags a fresh create).

        Bounded by ``timeout_s``; on any failure the cache stays as it was and the miss stands.
        """
        if self._api is None or not name:
            return
        call = client.CustomObjectsApi(self._api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, names.PLURAL, name
        )
        try:
            obj = await asyncio.wait_for(call, timeout_s)
        except (client.ApiException, TimeoutError, aiohttp.ClientError) as e:
            if not (isinstance(e, client.ApiException) and e.status == 404):
                logger.warning("looking up SharedDeviceGroup %s/%s failed: %s", namespace, name, e)
            return
        if isinstance(obj, dict):
            self._groups.apply("ADDED", obj)

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Groups and members have their first list (what pod admission needs; quotas are apart, so
        a cluster that hides quotas from the webhook still admits pods)."""
        return bool(self.reflectors) and all(r.synced.is_set() for r in self.reflectors[:2])

    @property
    def budget_synced(self) -> bool:
        return self.synced and all(r.synced.is_set() for r in self.reflectors[2:])

    async def wait_synced(self, timeout_s: float) -> bool:
        """Whether every cache has its first list, waiting at most ``timeout_s`` in total."""
        if self.budget_synced:
            return True
        waits = [r.synced.wait() for r in self.reflectors]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        return self.synced

    def start(self, api: client.ApiClient, *, watch_timeout_s: int = 300, page_size: int = 500) -> None:
        """Start both list+watch loops on ``api`` (which the caller keeps and closes)."""
        self._api = api
        groups_call = functools.partial(
            client.CustomObjectsApi(api).list_cluster_custom_object, names.GROUP, names.VERSION, names.PLURAL
        )
        pods_call = functools.partial(
            client.CoreV1Api(api).list_pod_for_all_namespaces, label_selector=names.POD_GROUP_LABEL
        )
        quotas_call = client.CoreV1Api(api).list_resource_quota_for_all_namespaces
        sinks: tuple[tuple[Any, watching.Sink, str], ...] = (
            (groups_call, self._groups, names.PLURAL),
            (pods_call, self._members, "member pods"),
            (quotas_call, self._quotas, "resource quotas"),
        )
        self.reflectors = [
            watching.Reflector(call, sink, name=name, watch_timeout_s=watch_timeout_s, page_size=page_size)
            for call, sink, name in sinks
        ]
        self._tasks = [asyncio.create_task(r.run(), name=f"watch {r.name}") for r in self.reflectors]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
