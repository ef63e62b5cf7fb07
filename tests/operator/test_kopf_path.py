"""With ``--groups-through-kopf`` the SharedDeviceGroup lifecycle arrives through Kopf, and Kopf leaves nothing of its
own behind; without it (the default) groups come through the operator's own reflector.

Groups are then watched by Kopf (one ``on.event`` handler, ``operator/handlers.py``); nodes and pods always by the
operator's own reflectors. The sandbox records every request with its headers, so who watched what is read off the wire:
Kopf sends ``User-Agent: kopf/<version>``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator, operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"
GROUPS = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"


@pytest.fixture
async def kopf_operator(cluster: Sandbox) -> AsyncIterator[RunningOperator]:
    running = await start_operator(operator_config(cluster, groups_through_kopf=True))
    yield running
    await running.stop()


def watches(cluster: Sandbox, path: str) -> list[str]:
    """The User-Agent of every watch request on ``path`` (cluster-wide) the sandbox has served."""
    return [str(r.headers.get("User-Agent", "")) for r in cluster.api
            if r.url.path == path and str(r.params.get("watch", "")).lower() in ("true", "1")]


def kopf_marks(obj: dict[str, Any]) -> list[str]:
    """Anything Kopf writes on the objects it handles: its annotations (progress, last-handled) and finalizer."""
    meta = obj.get("metadata") or {}
    marks = [k for k in meta.get("annotations") or {} if "kopf" in k or k.startswith(f"{names.GROUP}/")]
    return marks + [f for f in meta.get("finalizers") or [] if f != names.GROUP_FINALIZER]


async def test_a_group_created_changed_and_deleted_is_handled_through_kopf(
    cluster: Sandbox, kube: Kube, kopf_operator: RunningOperator
) -> None:
    operator = kopf_operator
    runtime = operator.memo.runtime
    await kube.create_group("ml", "train", {GPU: 9})  # more than any node has: it waits
    await kube.create_pod("ml", "train-0", "train")
    await kube.wait_group("ml", "train", lambda g: names.GROUP_FINALIZER in g["metadata"].get("finalizers", []),
                          "our finalizer on the group")
    await kube.wait_for(lambda: runtime.intake.groups.delivered >= 1, "the group's event through Kopf")
    applied = runtime.intake.groups.delivered

    # A spec change: the group now fits, and its pod is bound.
    cluster.patch(names.PLURAL, "train", {"spec": {"resources": {GPU: 2}}}, "ml")
    await kube.wait_bound("ml", "train-0")
    assert runtime.intake.groups.delivered > applied

    # Deletion, held by our finalizer until the member is gone, then released and let go.
    await kube.delete_group("ml", "train")
    await kube.wait_group("ml", "train", lambda g: g["status"]["phase"] == names.PHASE_RELEASING, "Releasing")
    await kube.delete_pod("ml", "train-0")
    await kube.wait_for(lambda: cluster.get(names.PLURAL, "train", "ml") is None, "the group gone")

    # Kopf watched the groups, and only Kopf; nodes and pods were watched by the operator alone; no CRD watch.
    group_watchers = watches(cluster, GROUPS)
    assert group_watchers and all(ua.startswith("kopf/") for ua in group_watchers), group_watchers
    for path in ("/api/v1/pods", "/api/v1/nodes"):
        assert watches(cluster, path) and not any(ua.startswith("kopf/") for ua in watches(cluster, path)), path
    assert watches(cluster, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") == []
    # ... and wrote nothing of its own on the group at any time: every write to it was ours.
    writes = [r for r in cluster.api if r.url.path.startswith(f"/apis/{names.API_VERSION}/namespaces/ml/")
              and str(r.method.value) in ("PATCH", "PUT", "POST")]
    assert writes and not [r for r in writes if str(r.headers.get("User-Agent", "")).startswith("kopf/")]


async def test_kopf_leaves_no_annotation_or_finalizer_on_groups_it_handled(
    cluster: Sandbox, kube: Kube, kopf_operator: RunningOperator
) -> None:
    operator = kopf_operator
    for name in ("a", "b"):
        await kube.create_group("ml", name, {GPU: 1})
        await kube.create_pod("ml", f"{name}-0", name)
    for name in ("a", "b"):
        await kube.wait_bound("ml", f"{name}-0")
        group = await kube.wait_group("ml", name, lambda g: g["status"]["phase"] == names.PHASE_BOUND, "Bound")
        assert kopf_marks(group) == []
    await kube.wait_for(lambda: operator.memo.runtime.intake.groups.delivered >= 2, "both groups through Kopf")


async def test_by_default_groups_come_through_the_operators_own_watch(
    cluster: Sandbox, kube: Kube, operator: RunningOperator
) -> None:
    await kube.create_group("ml", "solo", {GPU: 1})
    await kube.create_pod("ml", "solo-0", "solo")
    await kube.wait_bound("ml", "solo-0")
    group_watchers = watches(cluster, GROUPS)
    assert group_watchers and not any(ua.startswith("kopf/") for ua in group_watchers), group_watchers
    assert operator.memo.runtime.intake.groups.delivered == 0
    assert watches(cluster, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions") == []


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # Kopf's default settings.persistence.finalizer


async def test_kopf_never_takes_off_a_finalizer_a_tenant_put_on_a_group(
    cluster: Sandbox, kube: Kube, kopf_operator: RunningOperator
) -> None:
    """Kopf removes its own finalizer from any object it watches that no handler of a changing kind needs, on every
    replica, outside our fence: a standby would write. A tenant can write that finalizer onto its group."""
    runtime = kopf_operator.memo.runtime
    await kube.create_group("ml", "pinned", {GPU: 9})
    await kube.wait_group("ml", "pinned", lambda g: names.GROUP_FINALIZER in g["metadata"].get("finalizers", []),
                          "our finalizer on the group")
    cluster.patch(names.PLURAL, "pinned", {"metadata": {"finalizers": [names.GROUP_FINALIZER, KOPF_FINALIZER]}}, "ml")
    seen = runtime.intake.groups.delivered
    await kube.wait_for(lambda: runtime.intake.groups.delivered > seen, "the tenant's change through Kopf")
    # Kopf patches an event's object once its handlers ran, before its worker takes the object's next event: after a
    # later change has come through, any patch for the tenant's change has been sent.
    cluster.patch(names.PLURAL, "pinned", {"spec": {"resources": {GPU: 8}}}, "ml")
    seen = runtime.intake.groups.delivered
    await kube.wait_for(lambda: runtime.intake.groups.delivered > seen, "a later change through Kopf")
    kopf_writes = [r for r in cluster.api if str(r.method.value) in ("PATCH", "PUT", "POST", "DELETE")
                   and str(r.headers.get("User-Agent", "")).startswith("kopf/")]
    assert kopf_writes == []
    assert KOPF_FINALIZER in (cluster.get(names.PLURAL, "pinned", "ml") or {})["metadata"]["finalizers"]
