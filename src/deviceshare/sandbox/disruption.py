"""The disruption controller: keeps every PodDisruptionBudget's ``status`` true to the pods it selects.

kube-controller-manager's controller, in small: a pod or budget event marks the budgets of its
namespace for another pass; a pass computes the status (:mod:`budgets`) and writes it through the
``status`` subresource when it changed; a budget with pods evicted in the last two minutes is looked at
again when the first of them expires. Like the sandbox's Deployment controller it runs in the loop it
was started in, one pass per budget at a time, and only reacts to watch events (nothing polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import budgets, errors, store

BudgetKey = tuple[str, str]
_SCALED = {"Deployment": "deployments", "ReplicaSet": "replicasets", "StatefulSet": "statefulsets"}


class DisruptionController:
    def __init__(self, objects: store.ObjectStore) -> None:
        self.store = objects
        self._budgets = objects.catalog.lookup("poddisruptionbudgets")
        self._pods = objects.catalog.lookup("pods")
        self._by_namespace: dict[str, set[str]] = {}  # the budgets there, so a pod event costs a lookup
        self._dirty: set[BudgetKey] = set()
        self._running: set[BudgetKey] = set()
        self._timers: dict[BudgetKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.listeners.append(self._on_event)
        for budget in self.store.list_objects(self._budgets)[0]:
            md = store.meta(budget)
            self._by_namespace.setdefault(md.get("namespace", ""), set()).add(md["name"])
            self._schedule((md.get("namespace", ""), md["name"]))

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()

    def _on_event(self, event: store.WatchEvent) -> None:
        md = store.meta(event.obj)
        namespace = md.get("namespace", "")
        if event.key == self._budgets.key:
            names = self._by_namespace.setdefault(namespace, set())
            if event.type == "DELETED":
                names.discard(md["name"])
                return
            names.add(md["name"])
            self._schedule((namespace, md["name"]))
        elif event.key == self._pods.key:
            for name in self._by_namespace.get(namespace, ()):
                self._schedule((namespace, name))

    def _schedule(self, key: BudgetKey) -> None:
        self._dirty.add(key)
        if self._loop is None or key in self._running:
            return
        self._running.add(key)
        task = self._loop.create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: BudgetKey) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                self._pass(key)
                await asyncio.sleep(0)  # let the events of this pass's write arrive before the next
        finally:
            self._running.discard(key)

    def _pass(self, key: BudgetKey) -> None:
        namespace, name = key
        try:
            budget = self.store.get(self._budgets, namespace, name)
        except errors.ApiError:
            return
        listed, _ = self.store.list_objects(self._pods, namespace, copied=False)
        pods = [p for p in listed if budgets.selects(budget, p)]
        now = datetime.datetime.now(datetime.UTC)
        status, recheck = budgets.status_of(budget, pods, self._scale_of, now)
        if status != budget.get("status"):
            with contextlib.suppress(errors.ApiError):
                self.store.write_status(self._budgets, namespace, name, lambda obj: obj.update(status=status))
        if recheck is not None and self._loop is not None:
            if key in self._timers:
                self._timers[key].cancel()
            self._timers[key] = self._loop.call_later(recheck, self._schedule, key)

    def _scale_of(self, ref: Mapping[str, Any], namespace: str) -> int | None:
        """``spec.replicas`` of a pod's controller, when it is a kind with a scale and it exists."""
        plural = _SCALED.get(str(ref.get("kind")))
        if plural is None:
            return None
        try:
            owner = self.store.get(self.store.catalog.lookup(plural), namespace, str(ref.get("name")))
        except errors.ApiError:
            return None
        if store.meta(owner).get("uid") != ref.get("uid"):
            return None
        return int((owner.get("spec") or {}).get("replicas", 1))
