"""The tenant-attack harness for the operator layer alone: sandbox, webhook and operator, no admission policy.

Tenants act through the API only, with what a namespace's usual rights allow (create, patch and delete
pods, create and delete groups). Judgement is from API state, and the test keeps its own ground truth of
which group each member pod really belongs to (the pod's annotations are exactly what an attacker
rewrites, so they cannot be the judge):

- :func:`visible_twice`: no device is visible to, or held by, two groups: a group's status holds its
  devices on its node, and a member pod *sees* what its ``deviceshare.io/env.*`` annotations say on the
  node it runs on (``all`` is every device of the node);
- :func:`lost_devices`: every running member still sees exactly the devices it was bound with, and its
  group's status still holds them;
- :func:`refusal`: a refused pod carries the reason, as a ``PodScheduled=False`` condition and a
  ``FailedScheduling`` event.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.operator.command import OperatorThread
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs, configuration, server
from tests import waiting
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube
from tests.reliability import invariants, workload

GPU = "nvidia.com/gpu"
ENV = "NVIDIA_VISIBLE_DEVICES"
GroupKey = tuple[str, str]


@dataclasses.dataclass
class System:
    cluster: Sandbox
    kube: Kube
    operator: OperatorThread
    webhook: server.RunningWebhook
    # The test's own record of who belongs where: pod key -> group key, and what each member was bound with.
    truth: dict[tuple[str, str], GroupKey] = dataclasses.field(default_factory=dict)
    bound_with: dict[tuple[str, str], tuple[str, str]] = dataclasses.field(default_factory=dict)

    async def restart_operator(self) -> None:
        await self.operator.stop()
        self.operator = await start_operator(operator_config(self.cluster))

    async def group(self, ns: str, name: str, gpus: int, **spec: Any) -> None:
        await self.kube.create_group(ns, name, {GPU: gpus}, **spec)

    async def member(self, ns: str, name: str, group: str, *, bound: bool = True) -> dict[str, Any]:
        """An honest member, through the webhook; waits for its binding and remembers what it got."""
        await self.kube.create_pod(ns, name, group, scheduler="default-scheduler")
        self.truth[(ns, name)] = (ns, group)
        if not bound:
            pod = await self.kube.pod(ns, name)
            assert pod is not None
            return pod
        pod = await self.kube.wait_bound(ns, name)
        await self.kube.wait_for(lambda: self._running(ns, name), f"{ns}/{name} Running")
        annotations = pod["metadata"].get("annotations") or {}
        self.bound_with[(ns, name)] = (
            annotations[names.POD_SELECTED_DEVICES_ANNOTATION], annotations[names.env_annotation(ENV)]
        )
        return pod

    def _running(self, ns: str, name: str) -> bool:
        pod = self.cluster.get("pods", name, ns) or {}
        return (pod.get("status") or {}).get("phase") == "Running"

    async def raw_pod(self, ns: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A pod as a tenant writes it, sent as is (the webhook sees it only if it names a group)."""
        await self.kube.ensure_namespace(ns)
        data: dict[str, Any] = await self.kube._json(
            self.kube.core.create_namespaced_pod(ns, dict(body), _preload_content=False)
        )
        return data

    def metric(self, name: str) -> float:
        runtime = getattr(self.operator.memo, "runtime", None)
        assert runtime is not None, "the operator has no runtime"
        for line in runtime.ctx.metrics.exposition().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 2, "gpus": 4}


@pytest.fixture
async def system(cluster: Sandbox, kube: Kube, tmp_path: Path) -> AsyncIterator[System]:
    bundle = certs.generate(["127.0.0.1"])
    _, cert, key = bundle.write(tmp_path / "tls")
    hook = await server.start_webhook(tls_cert=cert, tls_key=key, kubeconfig=str(cluster.kubeconfig))
    running: OperatorThread | None = None
    try:
        cluster.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
        assert hook.index is not None and await hook.index.wait_synced(waiting.HANG_GUARD)
        running = await start_operator(operator_config(cluster))
        sys_ = System(cluster, kube, running, hook)
        yield sys_
        running = sys_.operator
    finally:
        if running is not None:
            await running.stop()
        await hook.stop()


# -- judging from API state ----------------------------------------------------------------------


def _node_devices(cluster: Sandbox) -> dict[str, frozenset[str]]:
    return {
        n["metadata"]["name"]: invariants.node_capacity(n).get(GPU, frozenset()) for n in cluster.list("nodes")
    }


def _ids(value: str, node_devices: frozenset[str]) -> set[str]:
    if value.strip().lower() == "all":
        return set(node_devices)
    return {i for i in value.split(",") if i}


def visible_twice(system: System) -> list[str]:
    """Devices held by or visible to two groups, as ``node/device: groups`` lines (empty: none)."""
    cluster = system.cluster
    capacity = _node_devices(cluster)
    seen: dict[tuple[str, str], set[GroupKey]] = {}
    for g in cluster.list(names.PLURAL):
        st = g.get("status") or {}
        if st.get("phase") in (names.PHASE_BOUND, names.PHASE_RELEASING) and st.get("nodeName"):
            key = (g["metadata"]["namespace"], g["metadata"]["name"])
            for d in (st.get("allocatedDevices") or {}).get(GPU, []):
                seen.setdefault((st["nodeName"], d), set()).add(key)
    for pod in cluster.list("pods"):
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key = (meta["namespace"], meta["name"])
        node = spec.get("nodeName")
        if key not in system.truth or not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        value = (meta.get("annotations") or {}).get(names.env_annotation(ENV))
        for d in _ids(value or "", capacity.get(node, frozenset())):
            seen.setdefault((node, d), set()).add(system.truth[key])
    return [
        f"{node}/{d}: {sorted(f'{ns}/{n}' for ns, n in groups)}"
        for (node, d), groups in sorted(seen.items()) if len(groups) > 1
    ]


def lost_devices(system: System) -> list[str]:
    """Running members that no longer see what they were bound with, or whose group no longer holds it."""
    out = []
    for (ns, name), (selected, env) in system.bound_with.items():
        pod = system.cluster.get("pods", name, ns)
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            continue
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(names.env_annotation(ENV)) != env or annotations.get(
            names.POD_SELECTED_DEVICES_ANNOTATION
        ) != selected:
            out.append(f"{ns}/{name} sees {annotations.get(names.env_annotation(ENV))!r}, was bound with {env!r}")
        gns, gname = system.truth[(ns, name)]
        group = system.cluster.get(names.PLURAL, gname, gns)
        status = (group or {}).get("status") or {}
        held = (status.get("allocatedDevices") or {}).get(GPU, [])
        wanted = sorted(json.loads(selected)[GPU].split(","))
        if status.get("nodeName") != pod["spec"].get("nodeName") or sorted(held) != wanted:
            out.append(f"{ns}/{name} runs on devices its group {gns}/{gname} no longer holds ({status})")
    return out


def assert_safe(system: System) -> None:
    twice, lost = visible_twice(system), lost_devices(system)
    assert not twice, "a device is visible to or held by two groups:\n" + "\n".join(twice)
    assert not lost, "a running member lost its devices:\n" + "\n".join(lost)


async def refusal(system: System, ns: str, name: str, *words: str, reason: str = "Unschedulable") -> str:
    """Wait until ``ns/name`` carries PodScheduled=False with ``reason`` and a FailedScheduling event, both
    containing every one of ``words``; returns the condition's message."""

    async def condition() -> str | None:
        pod = await system.kube.pod(ns, name)
        for c in ((pod or {}).get("status") or {}).get("conditions") or []:
            if (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", reason) and all(
                w in c.get("message", "") for w in words
            ):
                return str(c["message"])
        return None

    async def event() -> bool:
        return any(
            e.get("reason") == "FailedScheduling" and all(w in e.get("message", "") for w in words)
            for e in await system.kube.events(ns, name)
        )

    message: str = await system.kube.wait_for(condition, f"{ns}/{name}: PodScheduled=False/{reason} with {words}")
    await system.kube.wait_for(event, f"{ns}/{name}: a FailedScheduling event with {words}")
    return message


async def decided_again(system: System, ns: str, name: str) -> None:
    """Wait until the scheduler has decided the waiting pod ``ns/name`` once more, after this call, and said
    why it still waits (its FailedScheduling count rose): a placement that should not happen had its chance."""
    before = workload.failed_scheduling(system.cluster, ns, name)
    await system.kube.wait_for(lambda: workload.failed_scheduling(system.cluster, ns, name) > before,
                               f"{ns}/{name} decided again")


def requests_naming(system: System, text: str) -> list[str]:
    """Requests the API server received whose path or query contains ``text`` (raw or URL-quoted)."""
    quoted = urllib.parse.quote(text, safe="")
    return [f"{r.method.value} {r.url.raw_path_qs}" for r in system.cluster.api
            if any(t in r.url.raw_path_qs or t in urllib.parse.unquote(r.url.raw_path_qs) for t in (text, quoted))]


def node_of(system: System, ns: str, name: str) -> str | None:
    pod = system.cluster.get("pods", name, ns) or {}
    node: str | None = (pod.get("spec") or {}).get("nodeName")
    return node


def group_status(system: System, ns: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (system.cluster.get(names.PLURAL, name, ns) or {}).get("status") or {}
    return status
