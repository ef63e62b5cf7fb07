"""A small kubelet for the simulated nodes (``nodes.py``): bound pods start running, and can be completed.

The kubelet acts on watch events of pods: a pod bound to an
existing, Ready node turns Running after ``delay`` seconds, like a container that started. As the
real kubelet's admission does, a pod that does not tolerate one of the node's ``NoExecute`` taints
is rejected instead (phase ``Failed``, reason ``UntoleratedTaint``): that is what stops a pod that
names a tainted node in ``spec.nodeName`` and so skips every scheduler.

A pod with ``spec.resourceClaims`` starts only once each claim is allocated for its node and reserved for it
(``draprepare.py``); until then it stays Pending with a ``FailedPrepareDynamicResources`` event, and is tried
again when a claim or a slice changes. The CDI devices its containers got are kept in :attr:`Kubelet.started_cdi`.

Like the real kubelet, it resolves each container's env when the container starts, downward-API
``fieldRef`` entries included (``metadata.annotations['...']``): what it resolved is kept in
:attr:`Kubelet.started_env`, so a test can read the values a container saw (annotations written after
the start are not among them, as on a real node). The devices each container is given are decided as the
node's NVIDIA container toolkit would (:mod:`containerstart`: by CDI annotation on ``cdi`` nodes, by
``NVIDIA_VISIBLE_DEVICES`` on the others) and kept in :attr:`Kubelet.started_devices`; a container whose CDI
devices the node lacks is not created (``CreateContainerError`` and a ``Failed`` event), as on a real node.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from deviceshare.sandbox import containerstart, dradriver, draprepare, events, nodes, store


class Kubelet:
    """Moves bound pods to Running; the loop it runs in is the one it was started in."""

    def __init__(self, objects: store.ObjectStore, delay: float) -> None:
        self.store = objects
        self.delay = delay
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._stopping_now: set[tuple[str, str]] = set()
        self._slow: dict[tuple[str, str], asyncio.Event] = {}  # pods whose containers take their time to stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pods = objects.catalog.lookup("pods")
        self._nodes = objects.catalog.lookup("nodes")
        # (namespace, pod) -> container -> env name -> value, as resolved when the pod started.
        self.started_env: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        # (namespace, pod) -> container -> the CDI names of the devices it was given (containerstart).
        self.started_devices: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        # (namespace, pod) -> container -> the CDI devices its DRA claims gave it when the pod started.
        self.started_cdi: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.gpu_driver: dradriver.GpuDriver | None = None  # the DRA driver's plugin on the GPU nodes, if any
        self._claims_pending: dict[tuple[str, str], dict[str, Any]] = {}  # pods waiting for their claims
        self.prepared_claims = dradriver.Checkpoint()  # what the DRA plugins prepared, node by node
        self._claim_keys = {objects.catalog.lookup(p).key for p in ("resourceclaims", "resourceslices")}

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.store.listeners.append(self._on_event)
        for pod in self.store.list_objects(self._pods)[0]:  # pods bound before the start
            self._consider(pod)

    def stop(self) -> None:
        if self._on_event in self.store.listeners:
            self.store.listeners.remove(self._on_event)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _on_event(self, event: store.WatchEvent) -> None:
        if event.key in self._claim_keys:  # a claim reserved or a driver's slice published: try again
            self._retry_claims_pending()
        elif event.key == self._pods.key and (
            event.type == "DELETED" or (event.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):  # an inactive pod: its claims are unprepared where no other pod uses them
            md = store.meta(event.obj)
            self._claims_pending.pop((md.get("namespace", ""), md["name"]), None)
            self.prepared_claims.release((md.get("namespace", ""), md["name"]))
            self._retry_claims_pending()  # a device it held may be free for another claim now
            if event.type != "DELETED" and md.get("deletionTimestamp"):
                self._stopping(event.obj)
        elif event.key == self._pods.key:
            if store.meta(event.obj).get("deletionTimestamp"):
                self._stopping(event.obj)
            else:
                self._consider(event.obj)

    def _retry_claims_pending(self) -> None:
        for pod in list(self._claims_pending.values()):
            self._consider(pod)

    def _stopping(self, pod: Mapping[str, Any]) -> None:
        """A pod deleted gracefully on this node: its containers stop (after ``delay``, not the whole grace
        period: they heed SIGTERM), the pod turns Failed, and the kubelet removes it (grace 0, by uid)."""
        md = store.meta(pod)
        key = (md.get("namespace", ""), md["name"])
        if not (pod.get("spec") or {}).get("nodeName") or self._loop is None or key in self._stopping_now:
            return
        if key in self._timers:
            self._timers.pop(key).cancel()  # it will not start now
        self._stopping_now.add(key)
        slow = self._slow.get(key)
        if slow is not None:  # they stop when told (the test's stand-in for a long SIGTERM handler)
            stopped = self._loop.create_task(slow.wait())
            stopped.add_done_callback(lambda _: self._finish(key, md.get("uid")))
            return
        self._loop.call_later(self.delay, self._finish, key, md.get("uid"))

    def slow_to_stop(self, namespace: str, name: str) -> asyncio.Event:
        """The pod's containers, once asked to stop, keep running until the returned event is set: what a
        process with a long SIGTERM handler does within its grace period (the pod stays Running, terminating)."""
        return self._slow.setdefault((namespace, name), asyncio.Event())

    def _finish(self, key: tuple[str, str], uid: str | None) -> None:
        try:
            pod = self.store.get(self._pods, key[0], key[1])
            if store.meta(pod).get("uid") != uid:
                return
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self.complete(key[0], key[1], "Failed")  # (its event finds the key still stopping)
            with contextlib.suppress(Exception):  # gone meanwhile, or held by a finalizer: as the real kubelet
                self.store.delete(self._pods, key[0], key[1], {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
        except Exception:
            return  # gone meanwhile
        finally:
            self._stopping_now.discard(key)

    def _consider(self, pod: Mapping[str, Any]) -> None:
        md = store.meta(pod)
        key = (md.get("namespace", ""), md["name"])
        pending = pod.get("status", {}).get("phase", "Pending") == "Pending"
        if (
            not pending
            or not pod.get("spec", {}).get("nodeName")
            or key in self._timers
            or self._loop is None
        ):
            return
        self._timers[key] = self._loop.call_later(self.delay, self._start_pod, key, md.get("uid"))

    def _start_pod(self, key: tuple[str, str], uid: str | None) -> None:
        self._timers.pop(key, None)
        try:
            pod = self.store.get(self._pods, key[0], key[1])
            host = self.store.get(self._nodes, None, pod["spec"]["nodeName"])
        except Exception:  # pod gone, or bound to a node that does not exist: nothing starts
            return
        if (
            store.meta(pod).get("uid") != uid
            or not nodes.ready(host)
            or store.meta(pod).get("deletionTimestamp")
            # finished (or started) meanwhile: a kubelet never takes a terminated pod back to Running
            or (pod.get("status") or {}).get("phase", "Pending") != "Pending"
        ):
            return
        taint = _untolerated_no_execute(host, pod)
        if taint is not None:
            self.store.write_status(self._pods, key[0], key[1], lambda p: _rejected(p, taint))
            return
        spec = pod.get("spec", {})
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        claim_devices: dict[str, list[str]] | None = None
        if spec.get("resourceClaims"):
            try:
                plugins = dradriver.plugins_on(self.gpu_driver, store.meta(host)["name"])
                prepared = draprepare.prepare(self.store, pod, host, plugins, self.prepared_claims)
            except draprepare.PrepareError as e:  # as the kubelet's syncPod: an event, and a retry later
                self._claims_pending[key] = pod
                message = f"Failed to prepare dynamic resources: prepare dynamic resources: {e}"
                events.record(self.store, pod, draprepare.FAILED, message, component="kubelet")
                return
            self._claims_pending.pop(key, None)
            claim_devices = {str(c.get("name")): draprepare.container_devices(c, prepared) for c in containers}
        env = {str(c.get("name")): containerstart.container_env(pod, c) for c in containers}
        devices: dict[str, tuple[str, ...]] = {}
        for c in containers:
            name = str(c.get("name"))
            try:
                devices[name] = containerstart.devices_for(pod, name, env[name], host)
            except containerstart.Unresolvable as e:  # CreateContainer fails: the pod stays Pending
                self._not_created(pod, name, str(e), init=c in (spec.get("initContainers") or []))
                return
        self.started_env[key] = env
        self.started_devices[key] = devices
        if claim_devices is not None:
            self.started_cdi[key] = claim_devices
        self.store.write_status(self._pods, key[0], key[1], _running)

    def _not_created(self, pod: Mapping[str, Any], container: str, why: str, *, init: bool) -> None:
        """What the kubelet shows when the runtime refuses to create a container: the container waits with
        ``CreateContainerError`` and a Warning event ``Failed`` says why (its retries are not modelled)."""
        message = f"failed to create containerd container: {why}"
        field = "initContainerStatuses" if init else "containerStatuses"

        def waiting(p: dict[str, Any]) -> None:
            p.setdefault("status", {})[field] = [{
                "name": container, "ready": False, "started": False, "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerError", "message": message}},
            }]

        md = store.meta(pod)
        self.store.write_status(self._pods, md.get("namespace"), md["name"], waiting)
        events.record(self.store, pod, "Failed", f"Error: {message}", component="kubelet")

    def complete(self, namespace: str, name: str, phase: str = "Succeeded") -> dict[str, Any]:
        def finished(pod: dict[str, Any]) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = phase
            for cs in status.get("containerStatuses") or []:
                cs.update(
                    ready=False,
                    started=False,
                    state={
                        "terminated": {
                            "exitCode": 0 if phase == "Succeeded" else 1,
                            "reason": "Completed" if phase == "Succeeded" else "Error",
                            "startedAt": cs.get("state", {}).get("running", {}).get("startedAt"),
                            "finishedAt": store.now(),
                        }
                    },
                )
            store.set_condition(pod, "Ready", "False", "PodCompleted")
            store.set_condition(pod, "ContainersReady", "False", "PodCompleted")

        return self.store.write_status(self._pods, namespace, name, finished)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("key")) and toleration.get("value", "") == taint.get("value", "")


def _untolerated_no_execute(host: Mapping[str, Any], pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tolerations = pod.get("spec", {}).get("tolerations") or []
    for taint in host.get("spec", {}).get("taints") or []:
        if taint.get("effect") == "NoExecute" and not any(_tolerates(t, taint) for t in tolerations):
            return dict(taint)
    return None


def _rejected(pod: dict[str, Any], taint: Mapping[str, Any]) -> None:
    pod.setdefault("status", {}).update(
        phase="Failed",
        reason="UntoleratedTaint",
        message=(
            f"Pod was rejected: Predicate TaintToleration failed: node(s) had untolerated taint "
            f"{{{taint.get('key')}: {taint.get('value', '')}}}"
        ),
    )


def _running(pod: dict[str, Any]) -> None:
    started = store.now()
    status = pod.setdefault("status", {})
    status.update(
        phase="Running",
        hostIP="10.0.0.1",
        podIP="10.244.0.10",
        startTime=started,
        podIPs=[{"ip": "10.244.0.10"}],
    )
    status["containerStatuses"] = [
        {
            "name": c.get("name"),
            "image": c.get("image"),
            "imageID": f"sandbox://{c.get('image')}",
            "containerID": f"sandbox://{c.get('name')}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": started}},
        }
        for c in pod.get("spec", {}).get("containers") or []
    ]
    for condition in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        store.set_condition(pod, condition, "True")
