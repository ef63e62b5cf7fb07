"""The webhook's memory of the cluster: groups by name, live members per group, device quotas.

Admission must answer within its timeout, so it never calls the API; list+watch loops
(:class:`deviceshare.kube.watching.Reflector`) keep this index current instead, one over every
SharedDeviceGroup, one over the pods that carry the ``deviceshare.io/group`` label, and one over
ResourceQuotas (the namespace device budget, :mod:`deviceshare.core.budget`); what each keeps is in
:mod:`sinks`. Until all have finished their first list the index answers ``WARMING`` and the server
denies with a message that asks for a retry, rather than guessing.

A miss may be a group created a moment ago that the watch has not delivered yet, so the server asks
for it once (:meth:`GroupIndex.refresh`). That answer joins the cache only if it is newer than what
the watch has delivered: resourceVersions of one resource compare as integers (KEP-5504, conformance
since Kubernetes 1.35, and what every etcd-backed API server has always sent), and the watch
delivers a collection in resourceVersion order. So a GET that answers with a version the watch has
already passed (a lagging read, or one that raced a DELETED event) neither brings back a deleted
group nor rolls a group back, and a watch event older than a GET's answer is not applied over it.
Lookups are rate-limited per name (:mod:`misses`).

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
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from deviceshare.api import models, names
from deviceshare.core import budget
from deviceshare.kube import watching
from deviceshare.webhooks import admission, misses, sinks

logger = logging.getLogger(__name__)

Key = sinks.Key


class GroupIndex:
    """A :class:`deviceshare.webhooks.admission.GroupView` fed by list+watch (see the module docstring)."""

    def __init__(self, miss_limiter: misses.MissLimiter | None = None) -> None:
        self._groups = sinks.Groups()
        self._members = sinks.Members()
        self._quotas = sinks.Quotas()
        self.reflectors: list[watching.Reflector] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._api: client.ApiClient | None = None
        self.misses = misses.MissLimiter() if miss_limiter is None else miss_limiter
        self._lookups: dict[Key, asyncio.Task[None]] = {}  # in flight, shared by concurrent misses

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
            name: spec.requested for (ns, name), spec in self._groups.specs.items() if ns == namespace
        }

    async def refresh(self, namespace: str, name: str, timeout_s: float) -> None:
        """Read one group from the API into the cache (a miss may be a watch that lags a fresh create).

        At most once per name per interval (:attr:`misses`); concurrent misses of one name share one
        GET. Bounded by ``timeout_s``; on any failure, or an answer the watch has already passed, the
        cache stays as it was and the miss stands.
        """
        key = (namespace, name)
        if self._api is None or not name:
            return
        lookup = self._lookups.get(key)
        if lookup is None:
            if not self.misses.admit(key):
                return
            lookup = asyncio.create_task(self._lookup(self._api, key, timeout_s), name=f"lookup {namespace}/{name}")
            self._lookups[key] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(key, None))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(lookup), timeout_s)

    async def _lookup(self, api: client.ApiClient, key: Key, timeout_s: float) -> None:
        call = client.CustomObjectsApi(api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, key[0], names.PLURAL, key[1]
        )
        try:
            obj = await asyncio.wait_for(call, timeout_s)
        except (client.ApiException, TimeoutError, aiohttp.ClientError, ValueError) as e:
            if not (isinstance(e, client.ApiException) and e.status == 404):
                logger.warning("looking up SharedDeviceGroup %s/%s failed: %s", *key, e)
            return
        if isinstance(obj, dict) and sinks.key_of(obj) == key and not self._groups.adopt(obj):
            logger.debug("SharedDeviceGroup %s/%s: the API's answer is not newer than the watch", *key)

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
        tasks = [*self._tasks, *self._lookups.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
