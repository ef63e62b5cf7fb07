"""API writes per group and per bound pod, by kind: today's operator and install beside the current ones.

*today* is the operator of ``baseline.BASELINE`` (its own source tree, see ``baseline.py``) on today's install:
the operator adds each group's finalizer itself and posts two events per placement (``Bound`` on the group,
``Scheduled`` on the pod). *now* is this tree's operator on this tree's install: the MutatingWebhookConfiguration
(``webhooks/configuration.py``, what the chart ships) sends each group CREATE to the real webhook over TLS, which
adds the finalizer, and the placement is told by the group's status condition, not by an event of its own.

Both run in turn on the same sandbox settings: the sandbox (and, for *now*, the webhook) serve HTTP in this
process; the operator runs as ``deviceshare operator`` in its own process. Groups are created through the
sandbox's admission (as an HTTP client's would be: ``Sandbox.create_admitted``), pods as the webhook leaves them
(straight into the store). Every write is counted from the sandbox's request log (kmock's, every HTTP request it
served), by resource: pod PATCH, ``pods/binding``, ``pods/status``, group (finalizer), ``shareddevicegroups/
status``, events; the load generator's own creations are not in it.

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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks import baseline
from deviceshare.api import names
from deviceshare.sandbox import Sandbox, apiserver
from deviceshare.webhooks import certs, configuration, server

GPU = "nvidia.com/gpu"
NS = "bench"
WRITES = ("POST binding", "PATCH group", "PATCH group status", "POST event", "PATCH pod", "PATCH pod status")
ONE_POD_BUDGET = 3  # a binding, one status write, one event


@dataclasses.dataclass(frozen=True)
class Result:
    mode: str
    groups: int
    pods_per_group: int
    bound: int
    seconds: float  # first group created -> last pod bound
    writes: dict[str, int]

    @property
    def pods(self) -> int:
        return self.groups * self.pods_per_group

    @property
    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    def per_group(self, kind: str | None = None) -> float:
        counted = self.writes.get(kind, 0) if kind else sum(self.writes.values())
        return counted / max(1, self.groups)

    @property
    def within_budget(self) -> bool:
        """At most n bindings + n events + 1 status write per n-pod group (3 for a one-pod group)."""
        return self.bound == self.pods and self.per_group() <= 2 * self.pods_per_group + 1


def _kind(method: str, path: str) -> str | None:
    parts = path.strip("/").split("/")
    if method == "GET" or "namespaces" not in parts:
        return None
    rest = parts[parts.index("namespaces") + 2:]
    if rest[:1] == ["events"]:
        return f"{method} event"
    if rest[:1] == ["pods"] and len(rest) == 2:
        return f"{method} pod"
    if rest[:1] == ["pods"] and len(rest) == 3:
        return {"binding": "POST binding", "status": "PATCH pod status"}.get(rest[2])
    if rest[:1] == [names.PLURAL] and len(rest) == 2:
        return f"{method} group"
    if rest[:1] == [names.PLURAL] and len(rest) == 3 and rest[2] == "status":
        return f"{method} group status"
    return None


@contextlib.asynccontextmanager
async def _install(sandbox: Sandbox, tmp: Path, mode: str) -> AsyncIterator[None]:
    """*now*: the webhook serving, and the configuration that sends group CREATEs to it. *today*: neither (the
    pods come as the webhook leaves them in both modes)."""
    if mode != "now":
        yield
        return
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(sandbox.kubeconfig))
    try:
        sandbox.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        yield
    finally:
        await hook.stop()


async def measure(mode: str, groups: int, pods_per_group: int, nodes: int) -> Result:
    src = baseline.source() if mode == "today" else None
    if mode == "today" and src is None:
        raise RuntimeError(f"no git checkout with commit {baseline.BASELINE}: cannot run today's operator")
    limit = apiserver._REQUEST_LOG_LIMIT
    apiserver._REQUEST_LOG_LIMIT = 10**7  # keep every request of the run
    try:
        with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp:
            # Today's operator on today's CRD (a newer schema defaults fields its models refuse).
            async with Sandbox(nodes=nodes, gpus=8, kubelet_delay=0.01, kubeconfig_path=Path(tmp) / "kubeconfig",
                               bookmark_interval=1.0, crds=baseline.crds() if mode == "today" else None) as sandbox, \
                    _install(sandbox, Path(tmp), mode):
                sandbox.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
                operator = baseline.OperatorProcess(sandbox.kubeconfig, src=src)
                await asyncio.to_thread(operator.start)
                try:
                    return await _run(sandbox, mode, groups, pods_per_group)
                finally:
                    await asyncio.to_thread(operator.stop)
    finally:
        apiserver._REQUEST_LOG_LIMIT = limit


async def _run(sandbox: Sandbox, mode: str, groups: int, pods_per_group: int) -> Result:
    await asyncio.sleep(0.5)  # the operator's watches settle on the idle cluster
    log = sandbox.api._requests
    first = len(log)
    t0 = time.perf_counter()
    for g in range(groups):
        await sandbox.create_admitted({"apiVersion": names.API_VERSION, "kind": names.KIND,
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
    kinds = " | ".join(f"{r.per_group(k):.2f}" for k in ("POST binding", "PATCH group", "PATCH group status",
                                                         "POST event"))
    other = sum(v for k, v in r.writes.items() if k not in WRITES[:4])
    detail = ", ".join(f"{k} {v}" for k, v in sorted(r.writes.items()))
    budget = 2 * r.pods_per_group + 1
    return (f"| {r.mode} | {r.groups} x {r.pods_per_group} | {r.bound} | {kinds} | {other} "
            f"| **{r.per_group():.2f}** (budget {budget}) | {sum(r.writes.values()) / max(1, r.bound):.2f} "
            f"| {r.seconds:.2f} | {r.rate:.0f} | {detail} |")


def section(results: list[Result], nodes: int) -> str:
    rows = "\n".join(_row(r) for r in results)
    one = [r for r in results if r.pods_per_group == 1]
    now = [r for r in results if r.mode == "now"]
    one_now = max((r.per_group() for r in one if r.mode == "now"), default=float("nan"))
    one_today = max((r.per_group() for r in one if r.mode == "today"), default=float("nan"))
    met = bool(now) and all(r.within_budget for r in now) and one_now <= ONE_POD_BUDGET
    return f"""## Operator: API writes per group, today's operator and install beside the current ones

`benchmarks/bench_operator_writes.py`, on a {nodes}-node x 8-GPU sandbox: groups of 1-GPU pods created at once;
writes counted from the sandbox's request log, per group, by kind. *today*: the operator of commit
`{baseline.BASELINE}` (run from its own source) on today's install (no webhook for groups): it adds each
group's finalizer itself and posts a `Bound` event on the group beside the pod's `Scheduled`. *now*: this code,
with the chart's MutatingWebhookConfiguration installed in the sandbox and the real webhook serving it over TLS,
so each group is created with its finalizer, and the placement is told by the group's status condition alone.
The sandbox (and the webhook) serve from this process, the operator runs in its own; groups are created through
the sandbox's admission, pods as the webhook leaves them. pods/s compare only with each other, and *now*'s
include its creations' wait for the webhook (an HTTPS round trip served by this same process): this table
counts writes; the operator's speed is the previous section's.

| mode | groups x pods | bound | bindings per group | finalizer writes per group | status writes per group \
| events per group | other writes | **all writes per group** | writes per bound pod | create→all bound s \
| pods bound/s | writes by kind |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

One-pod groups: {one_today:.2f} writes per group today, {one_now:.2f} now.
Target: at most {ONE_POD_BUDGET} writes per one-pod group (binding, status, one event) and at most n bindings +
n events + 1 status write per n-pod group — {"**met**" if met else "**not met**"}.
"""


def run(quick: bool) -> str:
    nodes = 25 if quick else 100
    shapes = [(100, 1), (25, 4)] if quick else [(400, 1), (100, 4)]
    results = []
    for groups, per in shapes:
        for mode in ("today", "now"):
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
