"""An in-memory :class:`~deviceshare.operator.storage.ClusterApi` for unit tests of the scheduler and the reconciler.

It keeps group and pod bodies, answers the calls they make the way the API server would (resourceVersion
preconditions, merge patches, a Binding that copies its annotations onto the pod, a deleted group gone once
its last finalizer is), and records every write, so a test can count them and say which failed. Any call
it does not model fails the test instead of reaching for a network.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceshare.api import names
from deviceshare.core import inventory
from deviceshare.operator import state, storage
from deviceshare.operator.config import OperatorConfig
from deviceshare.operator.context import Context
from deviceshare.operator.queueing import ReconcileQueue
from deviceshare.operator.reconciler import GroupReconciler
from deviceshare.operator.scheduler import PodScheduler

GPU = "nvidia.com/gpu"


@dataclasses.dataclass(frozen=True)
class Write:
    verb: str  # "finalizers" | "status" | "bind" | "annotate"
    kind: str  # "group" | "pod"
    key: tuple[str, str]
    body: Any


class FakeApi(storage.ClusterApi):
    def __init__(self) -> None:  # no ApiClient: nothing here goes over a network
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.events: list[tuple[str, str, str]] = []  # (object name, reason, message)
        self._lost_after: Write | None = None
        self._rv = 100
        # Failure injection: an exception to raise instead of the next such write (then cleared).
        self.fail_bind: Exception | None = None
        self.before_write: Callable[[Write], None] | None = None  # sees each write before it lands
        # The next write of each verb named here lands, then its answer is lost beyond what a read-back could
        # recover (storage.Uncertain reaches the caller); with ``lands=False`` it is lost before landing.
        self.lose_answer: dict[str, bool] = {}
        self.protected: set[tuple[str, str]] = set()  # pods a PodDisruptionBudget keeps from eviction

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the fake API does not model {args[:2]}")

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, write: Write) -> None:
        if self.before_write is not None:
            self.before_write(write)
        lands = self.lose_answer.pop(write.verb, None)
        if lands is False:
            raise storage.Uncertain(f"{write.verb} {write.key}: answer lost (not landed)")
        self.writes.append(write)
        if lands:
            self._lost_after = write

    def _answer(self) -> None:
        """Called after a write took effect: raise Uncertain if its answer is to be lost."""
        lost, self._lost_after = self._lost_after, None
        if lost is not None:
            raise storage.Uncertain(f"{lost.verb} {lost.key}: answer lost (landed)")

    def writes_to(self, kind: str) -> list[Write]:
        return [w for w in self.writes if w.kind == kind]

    # -- objects -------------------------------------------------------------------------------

    def add_group(self, name: str, *, namespace: str = "ns", finalizers: Sequence[str] = (),
                  status: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
        body = {
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", "generation": 1,
                         "resourceVersion": self._next_rv(), "finalizers": list(finalizers)},
            "spec": {"resources": {GPU: 1}, **spec},
            "status": dict(status or {}),
        }
        self.groups[(namespace, name)] = body
        return copy.deepcopy(body)

    def delete_group(self, key: tuple[str, str]) -> dict[str, Any]:
        body = self.groups[key]
        body["metadata"]["deletionTimestamp"] = "2026-11-23T12:00:00Z"
        body["metadata"]["resourceVersion"] = self._next_rv()
        return copy.deepcopy(body)

    def add_pod(self, name: str, group: str | None, *, namespace: str = "ns", priority: int | None = None,
                **container: Any) -> dict[str, Any]:
        annotations = {} if group is None else {names.POD_GROUP_ANNOTATION: group}
        rv = self._next_rv()
        body: dict[str, Any] = {
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}", "annotations": annotations,
                         "resourceVersion": rv, "creationTimestamp": f"2026-11-24T10:{int(rv) // 60 % 60:02d}:"
                                                                     f"{int(rv) % 60:02d}Z"},
            "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "x", **container}]},
            "status": {"phase": "Pending"},
        }
        if priority is not None:
            body["spec"]["priority"] = priority
        self.pods[(namespace, name)] = body
        return copy.deepcopy(body)

    def pod_now(self, key: tuple[str, str], **status: Any) -> dict[str, Any]:
        """The pod as a watch event would show it now, with ``status`` fields changed (e.g. phase)."""
        body = self.pods[key]
        body["status"].update(status)
        body["metadata"]["resourceVersion"] = self._next_rv()
        return copy.deepcopy(body)

    # -- reads ---------------------------------------------------------------------------------

    async def get_group(self, key: tuple[str, str]) -> dict[str, Any]:
        if key not in self.groups:
            raise storage.Gone(f"shareddevicegroup {key[0]}/{key[1]} not found")
        return copy.deepcopy(self.groups[key])

    async def read_group(self, key: tuple[str, str]) -> state.GroupRecord:
        return state.group_record(await self.get_group(key))

    async def read_group_if_exists(self, key: tuple[str, str]) -> state.GroupRecord | None:
        return await self.read_group(key) if key in self.groups else None

    async def get_pod(self, key: tuple[str, str]) -> dict[str, Any] | None:
        return copy.deepcopy(self.pods[key]) if key in self.pods else None

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        return []

    # -- writes --------------------------------------------------------------------------------

    async def patch_group_status(self, key: tuple[str, str], status: Mapping[str, Any], *, uid: str,
                                 resource_version: str) -> state.GroupRecord:
        body = self._group_for_write(key, uid, resource_version)
        self._record(Write("status", "group", key, copy.deepcopy(dict(status))))
        for field, value in status.items():
            if value is None:
                body["status"].pop(field, None)
            else:
                body["status"][field] = copy.deepcopy(value)
        body["metadata"]["resourceVersion"] = self._next_rv()
        self._answer()
        return state.group_record(copy.deepcopy(body))

    async def set_group_finalizers(self, key: tuple[str, str], finalizers: Sequence[str], *, uid: str,
                                   resource_version: str) -> state.GroupRecord:
        body = self._group_for_write(key, uid, resource_version)
        self._record(Write("finalizers", "group", key, list(finalizers)))
        body["metadata"]["finalizers"] = list(finalizers)
        body["metadata"]["resourceVersion"] = self._next_rv()
        answer = copy.deepcopy(body)
        if body["metadata"].get("deletionTimestamp") and not finalizers:
            del self.groups[key]  # the API server deletes it once its last finalizer is gone
        self._answer()
        return state.group_record(answer)

    def _group_for_write(self, key: tuple[str, str], uid: str, resource_version: str) -> dict[str, Any]:
        if key not in self.groups or self.groups[key]["metadata"]["uid"] != uid:
            raise storage.Gone(f"shareddevicegroup {key[0]}/{key[1]} not found")
        body = self.groups[key]
        if resource_version != body["metadata"]["resourceVersion"]:
            raise storage.Conflict(f"shareddevicegroup {key[0]}/{key[1]}: resourceVersion {resource_version} is stale")
        return body

    async def bind_pod(self, key: tuple[str, str], uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if self.fail_bind is not None:
            error, self.fail_bind = self.fail_bind, None
            raise error
        body = self.pods.get(key)
        if body is None:
            raise storage.Gone(f"pod {key[0]}/{key[1]} not found")
        if body["metadata"]["uid"] != uid or body["spec"].get("nodeName"):
            raise storage.Conflict(f"pod {key[0]}/{key[1]} is another pod, or bound already")
        self._record(Write("bind", "pod", key, {"node": node, "annotations": dict(annotations)}))
        body["spec"]["nodeName"] = node
        body["metadata"]["annotations"].update(annotations)
        body["metadata"]["resourceVersion"] = self._next_rv()
        self._answer()

    async def annotate_pod(self, key: tuple[str, str], uid: str, annotations: Mapping[str, str | None]) -> None:
        self._record(Write("annotate", "pod", key, dict(annotations)))
        ann = self.pods[key]["metadata"]["annotations"]
        for k, v in annotations.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v

    async def evict_pod(self, key: tuple[str, str], uid: str) -> bool:
        """The Eviction API: refused (False) for the pods in ``protected``, else the pod starts terminating."""
        if key in self.protected:
            return False
        self._record(Write("evict", "pod", key, None))
        body = self.pods.get(key)
        if body is not None and body["metadata"]["uid"] == uid:
            body["metadata"]["deletionTimestamp"] = "2026-11-24T12:00:00Z"
            body["metadata"]["resourceVersion"] = self._next_rv()
        return True

    async def emit_event(self, *, name: str, reason: str, message: str, **_: Any) -> str | None:
        self.events.append((name, reason, message))
        return f"{name}.{len(self.events)}"

    async def count_event(self, namespace: str, event_name: str, count: int) -> bool:
        return True


def node(
    name: str, gpus: int = 2, *, ready: bool = True, labels: Mapping[str, str] | None = None
) -> inventory.NodeInfo:
    return inventory.node_from_object({
        "metadata": {"name": name, "labels": {names.NODE_MODE_LABEL: names.NODE_MODE_SHARED, **(labels or {})}},
        "status": {"allocatable": {GPU: str(gpus), "cpu": "8", "memory": "16Gi"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


class Harness:
    """A Context over a FakeApi, with the scheduler and the reconciler the runtime would make from it.

    The only place these tests construct them: if their constructors change, this is what changes."""

    def __init__(self, *nodes: inventory.NodeInfo, **config: Any) -> None:
        self.api = FakeApi()
        self.ctx = Context(config=OperatorConfig(metrics_port=None, **config), api=self.api)
        for n in nodes:
            self.ctx.ledger.upsert_node(n)
        self.scheduler = PodScheduler(self.ctx)
        self.reconciles = ReconcileQueue(debounce=0.0, allocations=self.ctx.ledger.allocations)
        self.reconciler = GroupReconciler(self.ctx, self.reconciles, pods=self)

    def pod_read(self, pod: state.PodRecord, body: Mapping[str, Any] | None) -> None:
        """What the intake does with a member read again (reconciler.PodReads), reduced to the records."""
        if body is None:
            self.ctx.state.remove_pod(pod.key)
        else:
            self.ctx.state.upsert_pod(state.pod_record(body))

    def see(self, body: Mapping[str, Any]) -> None:
        """A watch event (ADDED/MODIFIED) for ``body``, as the intake would record it."""
        if body.get("spec", {}).get("containers") is not None:
            self.ctx.state.upsert_pod(state.pod_record(body))
        else:
            self.ctx.state.upsert_group(state.group_record(body))

    async def events(self) -> list[tuple[str, str, str]]:
        await self.ctx.drain()
        return self.api.events
