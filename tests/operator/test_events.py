"""Repeated events are counted on one Event, as client-go's recorder does, not posted anew each time."""

from __future__ import annotations

from typing import Any

from deviceshare.sandbox import Sandbox
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"


async def test_a_pod_retried_as_unschedulable_gets_one_counted_event(cluster: Sandbox, kube: Kube) -> None:
    running = await start_operator(operator_config(cluster, backoff_initial=0.05, backoff_max=0.1,
                                                   unschedulable_flush=0.2))
    try:
        await kube.create_group("ev", "huge", {GPU: 16})  # nodes have 8: never fits
        await kube.create_pod("ev", "p", "huge")

        async def counted() -> list[dict[str, Any]] | None:
            failed = [e for e in await kube.events("ev", "p") if e["reason"] == "FailedScheduling"]
            return failed if failed and max(int(e.get("count") or 1) for e in failed) >= 3 else None

        failed = await kube.wait_for(counted, "FailedScheduling counted three times")
        assert len(failed) == 1, [(e["message"], e.get("count")) for e in failed]
        event = failed[0]
        assert "insufficient nvidia.com/gpu" in event["message"]
        assert event["lastTimestamp"] >= event["firstTimestamp"]

        # Deleted (expired) meanwhile: the next repeat posts a fresh Event instead of failing.
        cluster.delete("events", event["metadata"]["name"], "ev")

        async def reposted() -> list[dict[str, Any]] | None:
            again = [e for e in await kube.events("ev", "p") if e["reason"] == "FailedScheduling"]
            return again or None

        again = await kube.wait_for(reposted, "a new FailedScheduling event")
        assert len(again) == 1 and again[0]["metadata"]["name"] != event["metadata"]["name"]
    finally:
        await running.stop()
