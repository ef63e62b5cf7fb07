"""Deployments that make pods, and their ``scale`` subresource: what the quickstart's kubectl commands need.

kube-controller-manager's Deployment -> ReplicaSet -> Pod chain, collapsed into one small controller: a
Deployment's pods are made from its template, named ``<deployment>-<n>`` (lowest free ``n``) and owned by
the Deployment, so the store's garbage collector removes them with it. Creations go through admission as
any API create does, so the webhook mutates them, and may deny one (a group's ``maxMembers``): the denial
becomes a ``FailedCreate`` Warning event on the Deployment, as the ReplicaSet controller posts, counted
rather than repeated. Its status counts replicas, updated, ready and available pods for ``kubectl get
deploy``. ``deployments/{name}/scale`` reads and writes ``spec.replicas`` as an ``autoscaling/v1`` Scale
(``kubectl scale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import admission, errors, events, fieldshapes, managedfields, patches, store

DeploymentKey = tuple[str, str]


def _owner(pod: Mapping[str, Any]) -> str | None:
    for ref in store.meta(pod).get("ownerReferences") or []:
        if ref.get("kind") == "Deployment" and ref.get("controller"):
            return str(ref.get("name"))
    return None


def _index(name: str, prefix: str) -> int:
    tail = name[len(prefix):]
    return int(tail) if tail.isdigit() else -1


class DeploymentController:
    """Keeps each Deployment's pod count at ``spec.replicas``; runs in the loop it was started in."""

    def __init__(self, objects: store.ObjectStore, webhooks: admission.Admission) -> None:
        self.store = objects
        self.admission = webhooks
        self._deployments = objects.catalog.lookup("deployments")
        self._pods = objects.catalog.lookup("pods")
        self._dirty: set[DeploymentKey] = set()  # changed since their last pass
        self._running: set[DeploymentKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.listeners.append(self._on_event)
        for deployment in self.store.list_objects(self._deployments)[0]:
            md = store.meta(deployment)
            self._schedule((md.get("namespace", ""), md["name"]))

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)
        for task in self._tasks:
            task.cancel()

    def _on_event(self, event: store.WatchEvent) -> None:
        md = store.meta(event.obj)
        if event.key == self._deployments.key and event.type != "DELETED":
            self._schedule((md.get("namespace", ""), md["name"]))
        elif event.key == self._pods.key:
            owner = _owner(event.obj)
            if owner is not None:
                self._schedule((md.get("namespace", ""), owner))

    def _schedule(self, key: DeploymentKey) -> None:
        self._dirty.add(key)
        if self._loop is None or key in self._running:
            return  # the running loop for this Deployment takes another pass
        self._running.add(key)
        task = self._loop.create_task(self._run(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: DeploymentKey) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                await self._pass(key)
        finally:
            self._running.discard(key)

    async def _pass(self, key: DeploymentKey) -> None:
        """Create or delete pods towards ``spec.replicas``; once there, write the status. Every change
        comes back as a watch event, which asks for another pass."""
        ns, name = key
        try:
            deployment = self.store.get(self._deployments, ns, name)
        except errors.ApiError:
            return
        if store.meta(deployment).get("deletionTimestamp"):
            return
        prefix = f"{name}-"
        pods = sorted(
            (p for p in self.store.list_objects(self._pods, ns)[0]
             if _owner(p) == name and not store.meta(p).get("deletionTimestamp")),
            key=lambda p: _index(store.meta(p)["name"], prefix),
        )
        want = int((deployment.get("spec") or {}).get("replicas", 1))
        changed = False
        if len(pods) < want:
            taken = {_index(store.meta(p)["name"], prefix) for p in pods}
            free = (i for i in range(want * 2 + len(pods)) if i not in taken)
            for _ in range(want - len(pods)):
                if not await self._create_pod(deployment, f"{prefix}{next(free)}"):
                    break
                changed = True
        for pod in pods[want:][::-1]:  # scale down: the newest (highest index) first
            with contextlib.suppress(errors.ApiError):
                self.store.delete(self._pods, ns, store.meta(pod)["name"])
                changed = True
        if not changed:
            self._write_status(deployment, pods)

    async def _create_pod(self, deployment: Mapping[str, Any], name: str) -> bool:
        md = store.meta(deployment)
        template = (deployment.get("spec") or {}).get("template") or {}
        tmd = template.get("metadata") or {}
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": md.get("namespace"),
                "labels": dict(tmd.get("labels") or {}),
                "annotations": dict(tmd.get("annotations") or {}),
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "Deployment", "name": md["name"], "uid": md.get("uid"),
                    "controller": True, "blockOwnerDeletion": True,
                }],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        try:
            admitted = await self.admission.admit_create(self._pods, md.get("namespace"), pod)
            self.store.create(self._pods, md.get("namespace"), admitted)
        except errors.ApiError as e:
            if e.code == 409:
                return True  # made meanwhile by another pass
            self._record(deployment, "FailedCreate", f'Error creating: pods "{name}" is forbidden: {e.message}')
            return False
        return True

    def _write_status(self, deployment: Mapping[str, Any], pods: list[dict[str, Any]]) -> None:
        md = store.meta(deployment)
        ready = sum(
            1 for p in pods
            if any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (p.get("status") or {}).get("conditions") or [])
        )
        status = {
            "observedGeneration": md.get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
        }

        def mutate(obj: dict[str, Any]) -> None:
            obj["status"] = {**(obj.get("status") or {}), **status}

        with contextlib.suppress(errors.ApiError):
            self.store.write_status(self._deployments, md.get("namespace"), md["name"], mutate)

    def _record(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning event on ``obj``; the same one again bumps ``count`` and ``lastTimestamp``."""
        events.record(self.store, obj, reason, message, component="replicaset-controller")


# -- the scale subresource --------------------------------------------------------------------------


def scale_of(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The ``autoscaling/v1`` Scale of a Deployment."""
    md = store.meta(deployment)
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in md},
        "spec": {"replicas": int((deployment.get("spec") or {}).get("replicas", 1))},
        "status": {
            "replicas": int((deployment.get("status") or {}).get("replicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def serve_scale(
    objects: store.ObjectStore,
    method: str,
    namespace: str | None,
    name: str,
    content_type: str,
    body: Any,
    manager: str = "",
) -> dict[str, Any]:
    """GET, PUT or PATCH ``deployments/{name}/scale``; ``manager`` then owns ``spec.replicas`` (an Update
    entry with subresource ``scale``, as kube-apiserver records it)."""
    rtype = objects.catalog.lookup("deployments")
    current = objects.get(rtype, namespace, name)
    if method == "GET":
        return scale_of(current)
    if method == "PUT":
        wanted = body
    elif method == "PATCH":
        wanted = patches.apply(content_type or patches.MERGE, scale_of(current), body, custom=False)
    else:
        raise errors.method_not_allowed()
    replicas = ((wanted or {}).get("spec") or {}).get("replicas") if isinstance(wanted, Mapping) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid("Scale", "autoscaling", name,
                             [("spec.replicas", f"Invalid value: {replicas!r}: must be greater than or equal to 0")])
    precondition = store.meta(wanted).get("resourceVersion")
    patch: dict[str, Any] = {"spec": {"replicas": replicas}}
    if precondition:
        patch["metadata"] = {"resourceVersion": precondition}
    old, new = objects.prepare_update(rtype, namespace, name, patches.MERGE, patch)
    if manager:
        managedfields.track_update(fieldshapes.root(None), old, new, manager, rtype.api_version,
                                   has_status=rtype.has_status, subresource="scale")
    stored = objects.commit_update(rtype, old, new)  # nothing ran in between: never None
    return scale_of(stored if stored is not None else objects.get(rtype, namespace, name))
