"""Intake: what the cluster tells us goes into the operator's state, and the work it makes due into the queues.

Watch events come from our own reflectors (nodes, groups and pods, through a :class:`NodeFeed` and a
:class:`Feed` each), or, with ``--groups-through-kopf``, the groups from Kopf's ``on.event`` handler
(``handlers.py``) through the term's gate, :class:`~.groupfeed.GroupFeed`. Every ``on_*`` method is
synchronous and cheap: it updates the ledger and the records in ``ctx.state``, then makes pods due for a
decision (:class:`~.queueing.SchedulingQueue`) and groups due for a status reconcile
(:class:`~.queueing.ReconcileQueue`). Nothing here decides or writes to the API.

Deletions can be missed (a watch that relists, or hangs without an error); three things catch them: a list that
lacks an object we hold (:meth:`Feed.replace`), a member a release waits on read again (:meth:`Intake.pod_read`,
called by the reconciler), and the periodic :meth:`Intake.audit`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.core import inventory
from deviceshare.kube import watching

from . import draintake
from . import state as state_
from .context import Context
from .groupfeed import GroupFeed
from .queueing import ReconcileQueue, SchedulingQueue

logger = logging.getLogger(__name__)


class Intake:
    """Watch events in; state updated and work enqueued. ``is_ours`` says whether a pod waits for our decision."""

    def __init__(
        self,
        ctx: Context,
        pods: SchedulingQueue[state_.PodKey],
        groups: ReconcileQueue,
        *,
        is_ours: Callable[[state_.PodRecord], bool],
    ) -> None:
        self.ctx = ctx
        self._pods, self._groups, self._is_ours = pods, groups, is_ours
        # The pods and groups feeds, from the first term on (see :meth:`watch`); or the groups from Kopf, gated by
        # the term (``--groups-through-kopf``).
        self.pod_reflector: watching.Reflector | None = None
        self.group_reflector: watching.Reflector | None = None
        self.groups = GroupFeed(self.on_group)

    def watch(self, quotas: watching.Sink, *, resume_from: Mapping[str, str | None]) -> list[asyncio.Task[None]]:
        """Start watching nodes, groups, pods and ResourceQuotas (into ``quotas``); the tasks run until cancelled.

        Called at the start of each term, right after the rebuild listed nodes, groups and pods: their watches
        resume from those lists' resourceVersions (``resume_from``, by ``nodes``/``groups``/``pods``), so what
        happened during the rebuild arrives as events on the state the rebuild made. With the groups through Kopf
        no group watch starts here: Kopf's stream, held during the rebuild, is replayed from the groups' list on
        (:class:`GroupFeed`).
        """
        loop, api = asyncio.get_running_loop(), self.ctx.api
        nodes = NodeFeed(self)
        pods = Feed(self.ctx, "pod", lambda: self.ctx.state.pods, self.on_pod, self.pod_gone)
        node_reflector = api.node_reflector(nodes, resume_from=resume_from.get("nodes"))
        self.pod_reflector = api.pod_reflector(pods, resume_from=resume_from.get("pods"))
        quota_reflector = api.quota_reflector(quotas)  # device budgets (quotas.py)
        tasks = [
            loop.create_task(node_reflector.run(), name="watch nodes"),
            loop.create_task(self.pod_reflector.run(), name="watch pods"),
            loop.create_task(quota_reflector.run(), name="watch resourcequotas"),
        ]
        if self.ctx.config.groups_through_kopf:
            self.groups.open(resume_from.get("groups"))
        else:
            groups = Feed(self.ctx, "group", lambda: self.ctx.state.groups, self.on_group, self.group_gone)
            self.group_reflector = api.group_reflector(groups, resume_from=resume_from.get("groups"))
            tasks.append(loop.create_task(self.group_reflector.run(), name="watch groups"))
        if self.ctx.dra_served:  # DRA (CONTRACT §13): slices, classes and claims, into the nodes' views
            for kind in draintake.KINDS:
                feed = draintake.DraFeed(kind, lambda: self.ctx.dra, lambda: self.ctx.ledger, self._pods.move_parked)
                reflector = api.dra_reflector(kind, feed, resume_from=resume_from.get(kind))
                tasks.append(loop.create_task(reflector.run(), name=f"watch {kind}"))
        return tasks

    @property
    def synced(self) -> bool:
        """The pod and group feeds have each listed the cluster once (readiness; groups through Kopf were listed by
        the rebuild)."""
        feeds = [self.pod_reflector] if self.ctx.config.groups_through_kopf else [self.pod_reflector,
                                                                                 self.group_reflector]
        return all(f is not None and f.synced.is_set() for f in feeds)

    # -- watch events ----------------------------------------------------------------------------

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        ledger = self.ctx.ledger
        name = str((body.get("metadata") or {}).get("name", ""))
        if event_type == "DELETED":
            ledger.remove_node(name)
            self.ctx.dra.node_gone(name)
            self._groups.request_node(name)
            return
        node = self.ctx.dra.node(inventory.node_from_object(body))  # with its DRA devices (drainventory.py)
        old = ledger.node(name)
        if old == node:
            return  # a heartbeat: nothing placement cares about changed
        ledger.upsert_node(node)
        if old is None or old.ready != node.ready or old.unhealthy != node.unhealthy:
            self._groups.request_node(name)  # lost or back, or devices fell ill: DeviceUnhealthy (CONTRACT §9)
        self._pods.move_parked()

    def on_group(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type != "DELETED" and _known(self.ctx.state.groups, body):
            return  # the version we hold already (our own write's answer, kept before its event came)
        group = state_.group_record(body)
        if event_type == "DELETED":
            self.group_gone(group.key, group.uid)
            return
        old = self.ctx.state.groups.get(group.key)
        if not self.ctx.state.upsert_group(group):
            return
        self._groups.request(group.key)
        if old is None or old.generation != group.generation or old.deleting != group.deleting:
            for pod in self.ctx.state.members(group.key):
                if self._is_ours(pod):
                    self._pods.add(pod.key)

    def on_pod(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        ctx = self.ctx
        if event_type == "DELETED":
            meta = body.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            self.pod_gone(key, str(meta.get("uid", "")))
            return
        if _known(ctx.state.pods, body):
            return  # a version we hold already, or older: nothing new (a relist's, a late event)
        pod = state_.pod_record(body)
        old = ctx.state.upsert_pod(pod)
        pod = ctx.state.pods[pod.key]  # as stored (an assumed binding applied)
        if pod.on_devices and pod.node_name:
            if old is None or not old.on_devices or (old.node_name, old.demand) != (pod.node_name, pod.demand):
                ctx.ledger.account_pod(pod.key, pod.node_name, pod.demand.cpu_milli, pod.demand.memory_bytes)
        elif old is None or old.on_devices:
            ctx.ledger.forget_pod(pod.key)
        if self._is_ours(pod):
            self._pods.add(pod.key)
        else:
            self._pods.forget(pod.key)
        if pod.group_key is not None and (old is None or _member_changed(old, pod)):
            self._groups.request(pod.group_key)
        if old is not None and old.on_devices and not pod.on_devices:
            self._pods.move_parked()

    def group_gone(self, key: state_.GroupKey, uid: str) -> None:
        held = self.ctx.state.groups.get(key)
        if held is not None and uid and held.uid != uid:
            return  # an earlier group of that name: the one we hold replaced it
        self.ctx.state.groups.pop(key, None)
        self._groups.request(key)

    def pod_gone(self, key: state_.PodKey, uid: str) -> None:
        ctx = self.ctx
        held = ctx.state.pods.get(key)
        if held is not None and uid and held.uid != uid:
            return  # an earlier pod of that name: the one we hold replaced it
        old = ctx.state.remove_pod(key)
        ctx.ledger.forget_pod(key)
        self._pods.forget(key)
        if old is not None:
            if old.group_key is not None:
                self._groups.request(old.group_key)
            if old.on_devices:
                self._pods.move_parked()

    def pod_read(self, pod: state_.PodRecord, body: Mapping[str, Any] | None) -> None:
        """``pod`` read again from the API (None: not found). News the watch may never bring: a pod
        deleted while the watch was re-listing is absent from the list and has no DELETED event."""
        meta = (body or {}).get("metadata") or {}
        if body is None or meta.get("uid") != pod.uid:
            logger.info("pod %s/%s is gone; its deletion never came on the watch", *pod.key)
            self.ctx.metrics.missed_deletions.labels("pod").inc()
            self.pod_gone(pod.key, pod.uid)
            return
        held = self.ctx.state.pods.get(pod.key)
        if held is not None and held.uid == pod.uid and state_.newer(
            str(meta.get("resourceVersion", "")), held.resource_version
        ):
            self.on_pod("MODIFIED", body)

    # -- the audit ---------------------------------------------------------------------------------

    async def audit_loop(self) -> None:
        """The audit every ``audit_interval``; with the groups through Kopf, of the groups alone as soon as Kopf has
        listed them again (at start, or after its watch expired): its list carries no deletions, and Kopf reports
        none (with our own group reflector, :meth:`Feed.end` finds those)."""
        interval = self.ctx.config.audit_interval
        while True:
            relisted = await self.groups.relisted(interval)
            try:
                await self.audit(pods=not relisted)
            except Exception:
                logger.warning("audit of pods and groups failed; next one in %.0fs", interval, exc_info=True)

    async def audit(self, *, pods: bool = True) -> int:
        """Forget pods (unless not ``pods``) and groups the API no longer has although no DELETED event said so.
        Returns how many.

        A list alone cannot tell (what was created after it is missing from it too, and applying a list
        over newer watch events goes backwards); so a held object the list lacks is read by itself, and
        only a 404 or another uid under its name counts as deleted.
        """
        ctx = self.ctx
        forgotten = 0
        group_list = await ctx.api.list_groups(_uid)
        if pods:
            pod_list = await ctx.api.list_pods(_uid)
            listed = set(pod_list.items)  # only the uids, page by page: 150,000 pods' bodies never held at once
            for pod in [p for p in ctx.state.pods.values() if p.uid not in listed]:
                body = await ctx.api.get_pod(pod.key)
                if body is None or (body.get("metadata") or {}).get("uid") != pod.uid:
                    forgotten += 1
                self.pod_read(pod, body)
        listed = set(group_list.items)
        for group in [g for g in ctx.state.groups.values() if g.uid not in listed]:
            current = await ctx.api.read_group_if_exists(group.key)
            if current is not None and current.uid == group.uid:
                continue
            held = ctx.state.groups.get(group.key)
            if held is not None and held.uid == group.uid:
                logger.info("group %s/%s is gone; its deletion never came on the watch", *group.key)
                ctx.metrics.missed_deletions.labels("group").inc()
                self.group_gone(group.key, group.uid)
                forgotten += 1
        return forgotten


class NodeFeed:
    """The node reflector's sink: every node event, and each relist's nodes, go to :meth:`Intake.on_node`; a
    node a relist lacks was deleted while the watch was down."""

    def __init__(self, intake: Intake) -> None:
        self._intake = intake

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        self._intake.on_node(event_type, obj)

    def replace(self, objects: list[Mapping[str, Any]], resource_version: str | None = None) -> None:
        listed = {str((b.get("metadata") or {}).get("name", "")) for b in objects}
        for body in objects:
            self._intake.on_node("ADDED", body)
        if resource_version is None:
            return
        for node in self._intake.ctx.ledger.nodes():
            if node.name not in listed:
                self._intake.on_node("DELETED", {"metadata": {"name": node.name}})


class Feed:
    """A reflector's sink. Events go to ``apply`` (the intake's ``on_*``); a list (the first, and each relist
    after a watch expired) is the whole truth at its resourceVersion, so an object we hold that it lacks, and
    that we last saw at or before that version, was deleted while we were not watching: ``gone``.

    A list comes page by page (``watching.PagedSink``): each page is applied as it arrives, so a relist of
    150,000 pods never sits in memory whole, and the scheduling workers run between its pages."""

    def __init__(
        self,
        ctx: Context,
        kind: str,
        held: Callable[[], Mapping[tuple[str, str], state_.PodRecord | state_.GroupRecord]],
        apply: Callable[[str, Mapping[str, Any]], None],
        gone: Callable[[tuple[str, str], str], None],
    ) -> None:
        self.ctx, self.kind = ctx, kind
        self._held, self._gone = held, gone
        self.apply = apply
        self._listed: set[tuple[str, str]] = set()

    def replace(self, objects: list[Mapping[str, Any]], resource_version: str | None = None) -> None:
        self.begin()
        self.page(objects)
        self.end(resource_version)

    def begin(self) -> None:
        self._listed = set()

    def page(self, objects: list[Mapping[str, Any]]) -> None:
        for body in objects:
            self._listed.add(_key(body))
            if not _known(self._held(), body):  # we hold this version or a newer one already
                self.apply("ADDED", body)

    def end(self, resource_version: str | None) -> None:
        listed, self._listed = self._listed, set()
        if resource_version is None:  # undated: nothing it lacks can be called deleted
            return
        for key, have in list(self._held().items()):
            if key not in listed and state_.newer(resource_version, have.resource_version):
                self.ctx.metrics.missed_deletions.labels(self.kind).inc()
                self._gone(key, have.uid)


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _known(held: Mapping[tuple[str, str], state_.PodRecord | state_.GroupRecord], body: Mapping[str, Any]) -> bool:
    """Whether we hold this very object at this version or a newer one: then its body is not even parsed."""
    meta = body.get("metadata") or {}
    have = held.get((meta.get("namespace", ""), meta.get("name", "")))
    if have is None or have.uid != meta.get("uid"):
        return False
    version = str(meta.get("resourceVersion", ""))
    if not version or version == have.resource_version:
        return bool(version)
    try:
        return int(version) < int(have.resource_version)
    except ValueError:  # not comparable: take the event (as ``state.newer`` does)
        return False


def _member_changed(old: state_.PodRecord, new: state_.PodRecord) -> bool:
    return (
        old.node_name != new.node_name
        or old.terminated != new.terminated  # Pending -> Running changes nothing a group's status says
        or old.deleting != new.deleting
        or old.group != new.group
        or old.selected_devices != new.selected_devices
        or old.env_annotations != new.env_annotations
    )
