"""The sandbox API server as a process of its own, for the operator benchmarks.

Its CPU and memory are then its own: ``bench_operator`` reads them beside the operator's, so a figure says which
side a run was waiting on. The child serves :class:`deviceshare.sandbox.Sandbox` on uvloop (as ``deviceshare
sandbox`` does) until told to stop, optionally filled first with Bound groups and their Running members
(:func:`populate_bound`, straight into its store).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import dataclasses
import json
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import yaml

from deviceshare.api import names
from deviceshare.kube import loops

GPU = "nvidia.com/gpu"
NAMESPACE = "bench"


@dataclasses.dataclass(frozen=True)
class Sizes:
    nodes: int
    gpus: int
    groups: int
    pods_per_group: int
    gpus_per_group: int


def _sandbox_main(
    sizes: Sizes, prepopulate: bool, kubeconfig: str, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event, results: Any, profile_path: str | None = None,
    crds: str | None = None,
) -> None:
    from deviceshare.sandbox import command

    command.tune_collector()  # as `deviceshare sandbox` does
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:  # as `deviceshare sandbox`
            runner.run(_serve_sandbox(sizes, prepopulate, Path(kubeconfig), ready, stop, crds))
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


async def _serve_sandbox(
    sizes: Sizes, prepopulate: bool, kubeconfig: Path, ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event, crds: str | None = None,
) -> None:
    from deviceshare.sandbox import Sandbox

    sandbox = Sandbox(nodes=sizes.nodes, gpus=sizes.gpus, kubelet_delay=0.5, kubeconfig_path=kubeconfig,
                      crds=Path(crds) if crds else None)
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    if prepopulate:
        populate_bound(sandbox, sizes)
    async with sandbox:
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)


def populate_bound(sandbox: Any, sizes: Sizes) -> None:
    """Bound groups packed onto nodes, each with bound Running members that carry their devices."""
    per_node = sizes.gpus // sizes.gpus_per_group
    for g in range(sizes.groups):
        node = f"gpu-node-{(g // per_node) % sizes.nodes}"
        first = (g % per_node) * sizes.gpus_per_group
        ids = [str(i) for i in range(first, first + sizes.gpus_per_group)]
        name = f"g{g}"
        sandbox.create({
            "apiVersion": names.API_VERSION, "kind": names.KIND,
            "metadata": {"name": name, "namespace": NAMESPACE, "finalizers": [names.GROUP_FINALIZER]},
            "spec": {"resources": {GPU: sizes.gpus_per_group}},
        })
        members = [f"{name}-p{i}" for i in range(sizes.pods_per_group)]
        sandbox.patch(names.PLURAL, name, {"status": {
            "phase": names.PHASE_BOUND, "nodeName": node, "allocatedDevices": {GPU: ids},
            "members": members, "memberCount": len(members),
        }}, NAMESPACE, subresource="status")
        for pod_name in members:
            body = pod_body(pod_name, name)
            body["metadata"]["annotations"][names.POD_SELECTED_DEVICES_ANNOTATION] = json.dumps({GPU: ",".join(ids)})
            body["metadata"]["annotations"][names.POD_ENV_ANNOTATION_PREFIX + "NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            body["spec"]["nodeName"] = node
            sandbox.create(body)
            sandbox.patch("pods", pod_name, {"status": {"phase": "Running"}}, NAMESPACE, subresource="status")


def pod_body(name: str, group: str) -> dict[str, Any]:
    """A member as the webhook leaves it."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "annotations": {names.POD_GROUP_ANNOTATION: group}, "labels": {names.POD_GROUP_LABEL: group},
        },
        "spec": {
            "schedulerName": names.DEFAULT_SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
    }


class Child:
    """A spawned process with a stop event; stopping waits for it, then kills it if it hangs."""

    def __init__(self, target: Any, *args: Any, extra: tuple[Any, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop_event = ctx.Event(), ctx.Event()
        self.results: Any = ctx.Queue()
        self.process = ctx.Process(
            target=target, args=(*args, self.ready, self.stop_event, self.results, *extra), daemon=True
        )

    def start(self, timeout: float) -> psutil.Process:
        self.process.start()
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if not self.process.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.process.name} exited or was not ready in {timeout}s")
        return psutil.Process(self.process.pid)

    def stop(self) -> None:
        self.stop_event.set()
        self.process.join(30)
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(5)


def sandbox_child(
    sizes: Sizes, prepopulate: bool, kubeconfig: Path, profile_path: str | None = None, crds: Path | None = None
) -> Child:
    """``crds``: the CRD folder to serve (the repository's when None)."""
    return Child(_sandbox_main, sizes, prepopulate, str(kubeconfig), extra=(profile_path, str(crds) if crds else None))


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def rss_mib(proc: psutil.Process) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB."""
    current = proc.memory_info().rss / 2**20
    peak = current
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return current, peak


def server_of(kubeconfig: Path) -> tuple[str, dict[str, str]]:
    cfg = yaml.safe_load(kubeconfig.read_text())
    token = cfg["users"][0]["user"]["token"]
    return cfg["clusters"][0]["cluster"]["server"], {"Authorization": f"Bearer {token}"}
