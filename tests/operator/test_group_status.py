"""Every group gets a status and a Scheduled condition from the moment the operator sees it.

Including the two cases a new user meets first: groups that existed before the operator started, and a
group whose pods were created without the webhook (the most common set-up mistake), which must say so.
"""

from __future__ import annotations

from typing import Any

from deviceshare.cli import explain
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import operator_config, start_operator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"


def scheduled(group: dict[str, Any]) -> dict[str, Any]:
    conds = {c["type"]: c for c in (group.get("status") or {}).get("conditions") or []}
    return dict(conds.get("Scheduled") or {})


async def test_pre_existing_and_webhook_skipped_groups_get_their_status(cluster: Sandbox, kube: Kube) -> None:
    # Before the operator: an empty group, and a group whose pods went around the webhook
    # (schedulerName left at default-scheduler, as `kubectl apply` on a bare cluster leaves it).
    await kube.create_group("ml", "empty", {GPU: 1})
    await kube.create_group("ml", "trainer", {GPU: 2})
    await kube.create_pod("ml", "trainer-0", "trainer", scheduler="default-scheduler")
    await kube.create_pod("ml", "evaluator", "trainer", scheduler="default-scheduler")

    running = await start_operator(operator_config(cluster))
    try:
        empty = await kube.wait_group("ml", "empty", lambda g: bool(scheduled(g)), "empty group's condition")
        assert empty["status"]["phase"] == "Pending"
        assert scheduled(empty)["reason"] == "WaitingForMembers"

        trainer = await kube.wait_group("ml", "trainer", lambda g: bool(scheduled(g)), "trainer's condition")
        assert trainer["status"]["phase"] == "Pending"
        cond = scheduled(trainer)
        assert (cond["status"], cond["reason"]) == ("False", "PodsSkippedWebhook")
        assert "evaluator, trainer-0" in cond["message"] and "webhook" in cond["message"]
        assert trainer["status"]["members"] == ["evaluator", "trainer-0"]

        # explain agrees with what kubectl shows: the same phase and the same condition.
        lines = await explain.run_async(str(cluster.kubeconfig), "ml", "trainer-0")
        text = "\n".join(lines)
        assert "Group ml/trainer: phase Pending" in text
        assert "PodsSkippedWebhook" in text and "default-scheduler" in text

        # Recreated through the webhook's route (our schedulerName), the group is placed and says so.
        await kube.delete_pod("ml", "trainer-0")
        await kube.delete_pod("ml", "evaluator")
        await kube.create_pod("ml", "trainer-0", "trainer")
        await kube.wait_bound("ml", "trainer-0")
        bound = await kube.wait_group("ml", "trainer", lambda g: scheduled(g).get("reason") == "Bound", "Bound")
        assert bound["status"]["phase"] == "Bound"
    finally:
        await running.stop()
