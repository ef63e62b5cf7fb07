"""The cluster of ``bench_scale``: Kubernetes' envelope (5,000 nodes, 150,000 pods) in a sandbox process.

30,000 Bound groups of five Running members each, six groups per 8-GPU node, every member as the webhook and the
operator leave it (scheduler name, group label and annotation, the env vars read through the downward API, the
shared-node toleration, ``selected-devices`` and the env annotations the Binding wrote) with a Running status
(PodScheduled and Ready conditions, one container status): about 1.6 KB of JSON a pod. They are put straight
into the sandbox's store (its write path, no HTTP: filling 150,000 pods over HTTP would take the sandbox longer
than everything measured). The sandbox then serves them over HTTP like any other; its lists answer from its
encoded-JSON cache.

The child also takes commands (``commands`` queue): ``"expire"`` moves the resourceVersion past every watcher's,
forgets the watch history and closes every watch, so each client's resume gets 410 Gone and relists, as after an
API server's watch cache moved on; ``"whole"`` / ``"paged"`` make its lists ignore ``limit`` (one body each, as
kube-apiserver's watch cache answered resourceVersion=0) or page again; ``"lists"`` puts the LIST requests it has
begun, by plural, on ``results``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing.synchronize
import time
from pathlib import Path
from typing import Any

from deviceshare.api import names
from deviceshare.kube import loops

GPU = "nvidia.com/gpu"
NAMESPACES = 20  # tenants; groups spread over them
ENV = "NVIDIA_VISIBLE_DEVICES"


@dataclasses.dataclass(frozen=True)
class ScaleSizes:
    nodes: int
    groups: int
    pods_per_group: int
    gpus: int = 8
    groups_per_node: int = 6

    @property
    def pods(self) -> int:
        return self.groups * self.pods_per_group


def sizes(quick: bool) -> ScaleSizes:
    return ScaleSizes(500, 3000, 5) if quick else ScaleSizes(5000, 30000, 5)


def namespace(g: int) -> str:
    return f"team-{g % NAMESPACES}"


def placed(sizes: ScaleSizes, g: int) -> tuple[str, str]:
    """Group ``g``'s node and device: groups fill nodes ``groups_per_node`` at a time, one GPU each."""
    return f"gpu-node-{(g // sizes.groups_per_node) % sizes.nodes}", str(g % sizes.groups_per_node)


def member(sizes: ScaleSizes, g: int, i: int) -> dict[str, Any]:
    node, device = placed(sizes, g)
    group = f"g{g}"
    env_from = {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": names.env_field_path(ENV)}}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{group}-p{i}", "namespace": namespace(g),
            "labels": {names.POD_GROUP_LABEL: group, "app": f"job-{g}"},
            "annotations": {
                names.POD_GROUP_ANNOTATION: group,
                names.POD_SELECTED_DEVICES_ANNOTATION: json.dumps({GPU: device}, separators=(",", ":")),
                names.env_annotation(ENV): device,
            },
        },
        "spec": {
            "schedulerName": names.DEFAULT_SCHEDULER_NAME, "nodeName": node,
            "containers": [{
                "name": "main", "image": "registry.example/ml/train:1.4.2",
                "args": ["--epochs", "90", "--data", "/data"],
                "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
                "env": [{"name": ENV, **env_from}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-{g}"}}],
            "tolerations": [{"key": names.SHARED_NODE_TAINT, "operator": "Exists"}],
            "restartPolicy": "Never",
        },
    }


def running_status(node: str) -> dict[str, Any]:
    now = "2026-11-24T08:00:00Z"
    return {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1", "startTime": now,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                           {"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                                   "image": "registry.example/ml/train:1.4.2", "imageID": "", "containerID": "",
                                   "state": {"running": {"startedAt": now}}}]}


def fill(sandbox: Any, sizes: ScaleSizes) -> None:
    """Every group Bound with its members listed, every member bound and Running (see the module docstring)."""
    for n in range(NAMESPACES):
        sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{n}"}})
    for g in range(sizes.groups):
        node, device = placed(sizes, g)
        members = [f"g{g}-p{i}" for i in range(sizes.pods_per_group)]
        sandbox.create({
            "apiVersion": names.API_VERSION, "kind": names.KIND,
            "metadata": {"name": f"g{g}", "namespace": namespace(g), "finalizers": [names.GROUP_FINALIZER]},
            "spec": {"resources": {GPU: 1}},
        })
        sandbox.patch(names.PLURAL, f"g{g}", {"status": {
            "phase": names.PHASE_BOUND, "nodeName": node, "allocatedDevices": {GPU: [device]},
            "members": members, "memberCount": len(members), "observedGeneration": 1,
            "conditions": [{"type": names.CONDITION_SCHEDULED, "status": "True", "reason": "Bound",
                            "message": f"placed on node {node} with {GPU} {device}",
                            "lastTransitionTime": "2026-11-24T08:00:00Z", "observedGeneration": 1}],
        }}, namespace(g), subresource="status")
        for i in range(sizes.pods_per_group):
            sandbox.create(member(sizes, g, i))
            sandbox.patch("pods", f"g{g}-p{i}", {"status": running_status(node)}, namespace(g), subresource="status")


def sandbox_main(
    sizes: ScaleSizes, kubeconfig: str, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event, results: Any, commands: Any,
) -> None:
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(_serve(sizes, Path(kubeconfig), ready, stop, results, commands))


async def _serve(
    sizes: ScaleSizes, kubeconfig: Path, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event, results: Any, commands: Any,
) -> None:
    from deviceshare.sandbox import Sandbox

    started = time.perf_counter()
    # The watch history holds what a burst of placements needs; the kubelet starts the probes' pods.
    sandbox = Sandbox(nodes=sizes.nodes, gpus=sizes.gpus, kubelet_delay=0.05, kubeconfig_path=kubeconfig,
                      watch_history=20_000)
    fill(sandbox, sizes)
    results.put({"fill_s": time.perf_counter() - started})
    loop = asyncio.get_running_loop()

    def expire() -> None:
        """Every watcher's resourceVersion falls behind the history: held streams deliver nothing (no bookmark
        moves them on), a write moves the version on, the history is forgotten, the streams close."""
        sandbox.stall_watches()
        sandbox.create({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": f"expire-{time.monotonic_ns()}", "namespace": "default"}})
        sandbox.compact()
        sandbox.drop_watches()
        sandbox.resume_watches()

    def obey() -> None:
        while True:
            command = commands.get()
            if command == "expire":
                loop.call_soon_threadsafe(expire)
            elif command in ("whole", "paged"):  # every list answered whole (limit ignored), or in pages
                loop.call_soon_threadsafe(setattr, sandbox.api, "whole_lists", command == "whole")
            elif command == "lists":  # the LIST requests begun so far, by plural
                loop.call_soon_threadsafe(lambda: results.put(dict(sandbox.api.lists)))
            elif command == "stop":
                return

    async with sandbox:
        ready.set()
        waiter = loop.run_in_executor(None, obey)
        await loop.run_in_executor(None, stop.wait)
        commands.put("stop")
        await waiter
