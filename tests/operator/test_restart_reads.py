"""A restart reads the cluster once (client-go's informer pattern): the rebuild lists nodes, groups and pods, and
the watches go on from those lists' resourceVersions, with no list of their own; what changes between the list
and the watch's start arrives on the watch. The same against a server that answers every list whole, ignoring
``limit`` (as kube-apiserver's watch cache did at resourceVersion=0)."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests import waiting
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"
READ = ("nodes", "pods", names.PLURAL)  # what the rebuild lists, and the operator's reflectors watch


@pytest.fixture(params=[False, True], ids=["paged", "whole lists"])
def sandbox_options(request: pytest.FixtureRequest) -> dict[str, object]:
    return {"nodes": 4, "gpus": 8, "whole_lists": request.param}


def lists(cluster: Sandbox) -> dict[str, int]:
    return {plural: cluster.api.lists[plural] for plural in READ}


async def bound_groups(cluster: Sandbox, kube: Kube, count: int) -> list[dict[str, Any]]:
    """``count`` groups of two members, each placed by an operator that then stops: the cluster to restart into."""
    first = await start_operator(operator_config(cluster))
    try:
        for i in range(count):
            await kube.create_group("r", f"g{i}", {GPU: 2})
            for m in range(2):
                await kube.create_pod("r", f"g{i}-{m}", f"g{i}")
        return [await kube.wait_bound("r", f"g{i}-{m}") for i in range(count) for m in range(2)]
    finally:
        await first.stop()


async def test_a_restart_lists_each_collection_once_then_places_what_waits(cluster: Sandbox, kube: Kube) -> None:
    before = await bound_groups(cluster, kube, 3)
    await kube.create_group("r", "waiting", {GPU: 2})
    await kube.create_pod("r", "w", "waiting")
    listed = lists(cluster)

    second = await start_operator(operator_config(cluster))
    try:
        await kube.wait_bound("r", "w")
        assert {p: n - listed[p] for p, n in lists(cluster).items()} == {p: 1 for p in READ}
        for pod in before:  # nothing the restart found in place moved
            now = await kube.pod("r", pod["metadata"]["name"])
            assert now is not None and now["spec"]["nodeName"] == pod["spec"]["nodeName"]
            assert now["metadata"]["annotations"] == pod["metadata"]["annotations"]
    finally:
        await second.stop()


async def test_a_pod_created_between_the_list_and_the_watchs_start_is_placed(cluster: Sandbox, kube: Kube) -> None:
    await kube.create_group("r", "late", {GPU: 1})
    # The operator's second request for all pods is its watch (the first is the rebuild's list): held.
    watch = cluster.inject_fault("GET", r"^/api/v1/pods$", every=2, times=1, hold=True)
    operator = await start_operator(operator_config(cluster))
    try:
        await waiting.until(lambda: watch.fired == 1, "the operator's pods watch, held after its list")
        await kube.create_pod("r", "late-0", "late")  # after the list, before the watch has started
        watch.release()
        pod = await kube.wait_bound("r", "late-0")
        assert pod["spec"]["nodeName"]
        assert cluster.api.lists["pods"] == 1  # seen on the watch, not on a list of its own
    finally:
        await operator.stop()
