"""The webhook's memory of the cluster: groups by name, live members per group, device quotas.

Admission must answer within its timeout, so it never calls the API; list+watch loops
(:class:`deviceshare.kube.watching.Reflector`) keep this index current instead, one over every
SharedDeviceGroup, one over the pods that carry the ``deviceshare.io/group`` label, and one over
ResourceQuotas (the namespace device budget, :mod:`deviceshare.core.budget`). Until all have
finished their first list the index answers ``WARMING`` and the server denies with a message
that asks for a retry, rather than guessing.

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
import sys
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
import pydantic
from kubernetes_asyncio import client

from deviceshare.api import models, names
from deviceshare.core import budget
from deviceshare.kube import watching
from deviceshare.webhooks import admission, misses

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
_TERMINATED = frozenset({"Succeeded", "Failed"})


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj_or_version: Mapping[str, Any] | str | None) -> int | None:
    """A resourceVersion as the integer it compares as (KEP-5504), or None if it is not one."""
    if isinstance(obj_or_version, Mapping):
        obj_or_version = (obj_or_version.get("metadata") or {}).get("resourceVersion")
    if isinstance(obj_or_version, str) and obj_or_version.isdecimal() and obj_or_version[0] != "0":
        return int(obj_or_version)
    return None


class _Groups:
    """Sink: every group's spec, parsed once when it changes rather than at each admission."""

    def __init__(self) -> None:
        self.specs: dict[Key, models.GroupSpec] = {}
        self.deleting: set[Key] = set()  # groups with a deletionTimestamp (held by the finalizer)
        self.seen: int | None = None  # the newest resourceVersion the list+watch has delivered
        self.ahead: dict[Key, int] = {}  # groups whose state came from a GET newer than the watch
        self._delivered = 0  # the newest resourceVersion a watch event brought, synced or not
        self._next: tuple[dict[Key, models.GroupSpec], set[Key]] = ({}, set())  # a list being paged in

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.begin()
        self.page(objects)
        self.end(resource_version)

    # A list page by page (watching.PagedSink): built aside, swapped in whole at its end, so admissions meanwhile
    # answer from the previous list and no relist ever sits in memory whole.
    def begin(self) -> None:
        self._next = ({}, set())

    def page(self, objects: list[watching.Object]) -> None:
        specs, deleting = self._next
        for obj in objects:
            _parse_into(specs, deleting, "ADDED", obj)

    def end(self, resource_version: str | None) -> None:
        (self.specs, self.deleting), self.ahead = self._next, {}
        self._next = ({}, set())
        listed = _version(resource_version)  # the watch may have brought newer ones while the list was paged in
        self.seen = None if listed is None else max(listed, self._delivered)

    def apply(self, event_type: str, obj: watching.Object) -> None:
        """A watch event, applied unless a GET has already put a newer state of the group here."""
        key, version = _key(obj), _version(obj)
        if version is not None:
            self._delivered = max(self._delivered, version)
            if self.seen is not None:
                self.seen = max(self.seen, version)
        got = self.ahead.get(key)
        if got is not None:
            if version is not None and version <= got:
                if version == got:  # the watch has caught up with the GET
                    del self.ahead[key]
                return
            del self.ahead[key]
        self._store(event_type, obj)

    def adopt(self, obj: watching.Object) -> bool:
        """A GET's answer: stored only if it is newer than everything the watch has delivered."""
        key, version = _key(obj), _version(obj)
        if version is None or self.seen is None or version <= self.seen or version <= self.ahead.get(key, 0):
            return False
        self._store("ADDED", obj)
        self.ahead[key] = version
        return True

    def _store(self, event_type: str, obj: watching.Object) -> None:
        _parse_into(self.specs, self.deleting, event_type, obj)


def _parse_into(specs: dict[Key, models.GroupSpec], deleting: set[Key], event_type: str, obj: watching.Object) -> None:
    key = _key(obj)
    deleting.discard(key)
    if event_type == "DELETED":
        specs.pop(key, None)
        return
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        deleting.add(key)
    spec = _spec(obj.get("spec") or {})
    if spec is None:
        # The CRD schema should have refused it; without a valid spec there is nothing to join.
        logger.warning("SharedDeviceGroup %s/%s has an invalid spec", *key)
        specs.pop(key, None)
    else:
        specs[key] = spec


_SPECS: dict[bytes, models.GroupSpec | None] = {}  # by the spec's JSON: 30,000 groups share a few dozen specs


def _spec(raw: Mapping[str, Any]) -> models.GroupSpec | None:
    """The spec as the model, one shared instance per distinct spec (a bounded memo; the model is frozen)."""
    try:
        key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        key = b""
    if key and key in _SPECS:
        return _SPECS[key]
    try:
        spec: models.GroupSpec | None = models.GroupSpec.model_validate(raw)
    except pydantic.ValidationError:
        spec = None
    if key:
        if len(_SPECS) >= 4096:
            _SPECS.pop(next(iter(_SPECS)))
        _SPECS[key] = spec
    return spec


class _Members:
    """Sink: which live pods carry which group label."""

    def __init__(self) -> None:
        self.group_of: dict[Key, str] = {}  # pod key -> group name
        self.counts: dict[Key, int] = {}  # group key -> live members
        self._next: tuple[dict[Key, str], dict[Key, int]] = ({}, {})  # a list being paged in

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.begin()
        self.page(objects)
        self.end(resource_version)

    # Page by page, built aside and swapped in at the end (see _Groups).
    def begin(self) -> None:
        self._next = ({}, {})

    def page(self, objects: list[watching.Object]) -> None:
        for obj in objects:
            _member_into(*self._next, "ADDED", obj)

    def end(self, resource_version: str | None = None) -> None:
        (self.group_of, self.counts), self._next = self._next, ({}, {})

    def apply(self, event_type: str, obj: watching.Object) -> None:
        _member_into(self.group_of, self.counts, event_type, obj)


def _member_into(group_of: dict[Key, str], counts: dict[Key, int], event_type: str, obj: watching.Object) -> None:
    pod = _key(obj)
    old = group_of.pop(pod, None)
    if old is not None:
        _count(counts, (pod[0], old), -1)
    if event_type == "DELETED" or not _is_live(obj):
        return
    group = ((obj.get("metadata") or {}).get("labels") or {}).get(names.POD_GROUP_LABEL)
    if group:
        group_of[pod] = sys.intern(str(group))
        _count(counts, (pod[0], group_of[pod]), +1)


def _count(counts: dict[Key, int], group: Key, delta: int) -> None:
    n = counts.get(group, 0) + delta
    if n > 0:
        counts[group] = n
    else:
        counts.pop(group, None)


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

    def __init__(self, miss_limiter: misses.MissLimiter | None = None) -> None:
        self._groups = _Groups()
        self._members = _Members()
        self._quotas = _Quotas()
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
        if isinstance(obj, dict) and _key(obj) == key and not self._groups.adopt(obj):
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
