"""API writes per bound pod, and pods bound per second, with the device annotations in the Binding (now)
and as a separate pod PATCH before the Binding (the write pattern before: ``main`` until issue 12).

Both run in this one process, side by side, on the same sandbox settings: the sandbox serves HTTP on this
event loop and the real operator (``OperatorThread``, Kopf and all) runs on its own loop in a thread. "Before"
is the same operator with ``ClusterApi.bind_pod`` wrapped to write the annotations with a pod PATCH first and
then bind without them, exactly the two requests the placement path used to make. Every write is counted
from the sandbox's request log (kmock's, every HTTP request it served), by resource:
pod PATCH, ``pods/binding``, ``pods/status``, group (finalizer), ``shareddevicegroups/status``, events. The
load generator creates its groups and pods straight in the sandbox store, so they are not in the log.

    python -m benchmarks.bench_operator_writes --quick
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from deviceshare.api import names
from deviceshare.operator import storage
from deviceshare.operator.command import OperatorThread
from deviceshare.operator.config import OperatorConfig
from deviceshare.sandbox import Sandbox, apiserver

GPU = "nvidia.com/gpu"
NS = "bench"
WRITES = ("PATCH pod", "POST binding", "PATCH pod status", "PATCH group", "PATCH group status", "POST event")


@dataclasses.dataclass(frozen=True)
class Result:
    mode: str
    groups: int
    pods_per_group: int
    bound: int
    seconds: float  # first pod created -> last pod bound
    writes: dict[str, int]

    @property
    def pods(self) -> int:
        return self.groups * self.pods_per_group

    @property
    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    def per_pod(self, *kinds: str) -> float:
        return sum(self.writes.get(k, 0) for k in kinds) / max(1, self.bound)


def _kind(method: str, path: str) -> str | None:
    parts = path.strip("/").split("/")
    if method == "GET" or "namespaces" not in parts:
        return None
    rest = parts[parts.index("namespaces") + 2:]
    if rest[:1] == ["events"]:
        return "POST event" if method == "POST" else None
    if rest[:1] == ["pods"] and len(rest) == 2:
        return f"{method} pod"
    if rest[:1] == ["pods"] and len(rest) == 3:
        return {"binding": "POST binding", "status": "PATCH pod status"}.get(rest[2])
    if rest[:1] == [names.PLURAL] and len(rest) == 2:
        return f"{method} group"
    if rest[:1] == [names.PLURAL] and len(rest) == 3 and rest[2] == "status":
        return f"{method} group status"
    return None


@contextlib.contextmanager
def _split_binding() -> Iterator[None]:
    """The write pattern before: annotations with a pod PATCH, then a Binding without them."""
    bind: Callable[..., Any] = storage.ClusterApi.bind_pod

    async def two_writes(self: storage.ClusterApi, key: Any, uid: str, node: str, annotations: Any) -> None:
        await self.annotate_pod(key, uid, annotations)
        await bind(self, key, uid, node, {})

    storage.ClusterApi.bind_pod = two_writes  # type: ignore[method-assign]
    try:
        yield
    finally:
        storage.ClusterApi.bind_pod = bind  # type: ignore[method-assign]


async def measure(mode: str, groups: int, pods_per_group: int, nodes: int) -> Result:
    limit = apiserver._REQUEST_LOG_LIMIT
    apiserver._REQUEST_LOG_LIMIT = 10**7  # keep every request of the run
    split = _split_binding() if mode == "before" else contextlib.nullcontext()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp, split:
            async with Sandbox(nodes=nodes, gpus=8, kubelet_delay=0.01, kubeconfig_path=Path(tmp) / "kubeconfig",
                               bookmark_interval=1.0) as sandbox:
                return await _run(sandbox, mode, groups, pods_per_group)
    finally:
        apiserver._REQUEST_LOG_LIMIT = limit


async def _run(sandbox: Sandbox, mode: str, groups: int, pods_per_group: int) -> Result:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    config = OperatorConfig(kubeconfig=str(sandbox.kubeconfig), metrics_port=None)
    operator = await OperatorThread(config).start()
    try:
        await asyncio.sleep(0.5)  # its watches settle on the idle cluster
        log = sandbox.api._requests
        first = len(log)
        t0 = time.perf_counter()
        for g in range(groups):
            sandbox.create({"apiVersion": names.API_VERSION, "kind": names.KIND,
                            "metadata": {"name": f"g{g}", "namespace": NS}, "spec": {"resources": {GPU: 1}}})
            for i in range(pods_per_group):
                sandbox.create(_pod(f"g{g}-{i}", f"g{g}"))
            await asyncio.sleep(0)  # let the API serve the operator meanwhile, as a real one would
        want = groups * pods_per_group
        deadline = time.perf_counter() + 120
        bound = 0
        while time.perf_counter() < deadline:
            bound = sum(1 for p in sandbox.list("pods", NS) if p["spec"].get("nodeName"))
            if bound >= want:
                break
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - t0
        # The trailing writes (events, the reconciler's status writes) count too: wait until the API is quiet.
        seen = -1
        while len(log) != seen and time.perf_counter() < deadline:
            seen = len(log)
            await asyncio.sleep(1.0)
        writes = collections.Counter(
            k for r in list(log)[first:] if (k := _kind(str(r.method.value).upper(), r.url.path)) is not None
        )
        return Result(mode, groups, pods_per_group, bound, seconds, dict(writes))
    finally:
        await operator.stop()


def _pod(name: str, group: str) -> dict[str, Any]:
    """A member as the webhook leaves it."""
    env = "NVIDIA_VISIBLE_DEVICES"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": {names.POD_GROUP_ANNOTATION: group},
                     "labels": {names.POD_GROUP_LABEL: group}},
        "spec": {"schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{
            "name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m"}},
            "env": [{"name": env, "valueFrom": {"fieldRef": {"fieldPath": names.env_field_path(env)}}}],
        }]},
    }


def _row(r: Result) -> str:
    pod = r.per_pod("PATCH pod", "POST binding")
    groups = sum(r.writes.get(k, 0) for k in ("PATCH group", "PATCH group status")) / max(1, r.groups)
    total = sum(r.writes.values()) / max(1, r.bound)
    detail = ", ".join(f"{k} {r.writes.get(k, 0)}" for k in WRITES)
    return (f"| {r.mode} | {r.groups} x {r.pods_per_group} | {r.bound} | {pod:.2f} | {groups:.2f} "
            f"| {r.per_pod('POST event'):.2f} | {total:.2f} | {r.seconds:.2f} | {r.rate:.0f} | {detail} |")


def section(results: list[Result], nodes: int) -> str:
    rows = "\n".join(_row(r) for r in results)
    return f"""## Operator: API writes per bound pod, before and after the annotations moved into the Binding

In one process, side by side, on a {nodes}-node x 8-GPU sandbox: the real operator binds groups of 1-GPU
pods created at once; writes are counted from the sandbox's request log. *before* is the same operator with
the pod's device annotations written by a pod PATCH ahead of the Binding (the write pattern until issue 12),
*after* is the code as it is (one write per pod: the Binding, which carries the annotations). Group writes
(finalizer, status) are per group; events (Scheduled per pod, Bound per group) are per pod. The operator and
the sandbox share this process's CPU (a thread each side of the GIL), so pods/s compare only with each other.

| mode | groups x pods | bound | pod writes per pod (PATCH + binding) | group writes per group \
| events per pod | all writes per pod | create→all bound s | pods bound/s | writes by kind |
|---|---|---|---|---|---|---|---|---|---|
{rows}
"""


def run(quick: bool) -> str:
    nodes = 25 if quick else 100
    shapes = [(100, 1), (25, 4)] if quick else [(400, 1), (100, 4)]
    results = []
    for groups, per in shapes:
        for mode in ("before", "after"):
            results.append(asyncio.run(measure(mode, groups, per, nodes)))
    return section(results, nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
