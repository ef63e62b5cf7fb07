"""What the webhook's list+watch loops keep (``groups.GroupIndex`` reads it): each a ``watching.Sink``.

:class:`Groups` holds every SharedDeviceGroup's spec (parsed once per distinct spec), which ones are deleting,
and the newest resourceVersion delivered, so that a GET's answer joins only if it is newer than the watch
(KEP-5504: versions of one resource compare as integers); :class:`Members` counts the live pods that carry each
group's label; :class:`Quotas` keeps the device limits of every ResourceQuota. A relist is taken in page by
page beside the current cache and swapped in at its end.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import orjson
import pydantic

from deviceshare.api import models, names
from deviceshare.core import budget
from deviceshare.kube import watching

logger = logging.getLogger("deviceshare.webhooks.groups")  # the name its warnings always had

Key = tuple[str, str]  # (namespace, name)
_TERMINATED = frozenset({"Succeeded", "Failed"})


def key_of(obj: Mapping[str, Any]) -> Key:
    """An object's (namespace, name)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj_or_version: Mapping[str, Any] | str | None) -> int | None:
    """A resourceVersion as the integer it compares as (KEP-5504), or None if it is not one."""
    if isinstance(obj_or_version, Mapping):
        obj_or_version = (obj_or_version.get("metadata") or {}).get("resourceVersion")
    if isinstance(obj_or_version, str) and obj_or_version.isdecimal() and obj_or_version[0] != "0":
        return int(obj_or_version)
    return None


class Groups:
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
        key, version = key_of(obj), _version(obj)
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
        key, version = key_of(obj), _version(obj)
        if version is None or self.seen is None or version <= self.seen or version <= self.ahead.get(key, 0):
            return False
        self._store("ADDED", obj)
        self.ahead[key] = version
        return True

    def _store(self, event_type: str, obj: watching.Object) -> None:
        _parse_into(self.specs, self.deleting, event_type, obj)


def _parse_into(specs: dict[Key, models.GroupSpec], deleting: set[Key], event_type: str, obj: watching.Object) -> None:
    key = key_of(obj)
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


class Members:
    """Sink: which live pods carry which group label."""

    def __init__(self) -> None:
        self.group_of: dict[Key, str] = {}  # pod key -> group name
        self.counts: dict[Key, int] = {}  # group key -> live members
        self._next: tuple[dict[Key, str], dict[Key, int]] = ({}, {})  # a list being paged in

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.begin()
        self.page(objects)
        self.end(resource_version)

    # Page by page, built aside and swapped in at the end (see Groups).
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
    pod = key_of(obj)
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


class Quotas:
    """Sink: the device limits of every ResourceQuota that has some, by namespace."""

    def __init__(self) -> None:
        self.by_key: dict[Key, budget.Quota] = {}

    def replace(self, objects: list[watching.Object], resource_version: str | None = None) -> None:
        self.by_key = {}
        for obj in objects:
            self.apply("ADDED", obj)

    def apply(self, event_type: str, obj: watching.Object) -> None:
        key = key_of(obj)
        quota = None if event_type == "DELETED" else budget.quota_from_object(obj)
        if quota is None:
            self.by_key.pop(key, None)
        else:
            self.by_key[key] = quota


def _is_live(pod: watching.Object) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in _TERMINATED
