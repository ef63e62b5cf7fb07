"""Quota bypass at placement (issue 12), against the operator alone: no group webhook, so every group is
created whatever the quota says (as two groups created together both pass the webhook's cache). The
operator is the authoritative check: it places a group only if its namespace's ResourceQuota on
``requests.nvidia.com/gpu`` still has room for it beside the groups it has already placed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from deviceshare.api import names
from tests.security.operator_attacks import (
    GPU,
    System,
    assert_safe,
    decided_again,
    group_status,
    node_of,
    refusal,
)


async def gpu_quota(system: System, ns: str, hard: int) -> None:
    """An admin's quota, and the wait until the operator's quota watch has it (as for any watch, a group
    placed within those milliseconds is checked against the quotas before it)."""
    await system.kube.ensure_namespace(ns)
    system.cluster.create({"apiVersion": "v1", "kind": "ResourceQuota",
                           "metadata": {"name": "gpu-budget", "namespace": ns},
                           "spec": {"hard": {f"requests.{GPU}": str(hard)}}})
    runtime: Any = getattr(system.operator.memo, "runtime", None)
    assert runtime is not None
    await system.kube.wait_for(lambda: any(q.hard.get(GPU) == hard for q in runtime.scheduler.quotas.quotas(ns)),
                               "the operator to see the quota")


async def test_two_groups_created_at_once_are_not_both_placed_beyond_the_quota(system: System) -> None:
    kube = system.kube
    await gpu_quota(system, "team-a", 3)
    await system.group("team-a", "a", 2)
    await system.group("team-a", "b", 2)  # 2 + 2 > 3, and nothing refused it at creation
    await asyncio.gather(
        system.member("team-a", "a-0", "a", bound=False), system.member("team-a", "b-0", "b", bound=False)
    )

    async def one_bound() -> str | None:
        bound = [g for g in ("a", "b") if node_of(system, "team-a", f"{g}-0")]
        return bound[0] if bound else None

    winner = await kube.wait_for(one_bound, "one of the two groups placed")
    loser = "b" if winner == "a" else "a"
    message = await refusal(
        system, "team-a", f"{loser}-0",
        f'SharedDeviceGroup "{loser}" would put namespace team-a over its device budget',
        f'ResourceQuota "gpu-budget" allows requests.{GPU} 3', "groups hold 2", "this group needs 2",
    )
    assert message == (
        f'SharedDeviceGroup "{loser}" would put namespace team-a over its device budget: ResourceQuota '
        f'"gpu-budget" allows requests.{GPU} 3, groups hold 2, this group needs 2'
    )
    await kube.wait_group("team-a", loser, lambda g: any(
        c.get("type") == names.CONDITION_SCHEDULED and "over its device budget" in c.get("message", "")
        for c in (g.get("status") or {}).get("conditions") or []), "the group's status names the quota")
    await decided_again(system, "team-a", f"{loser}-0")  # a second chance to place it, refused again
    assert node_of(system, "team-a", f"{loser}-0") is None
    assert group_status(system, "team-a", loser).get("allocatedDevices") is None
    await system.kube.wait_bound("team-a", f"{winner}-0")
    system.bound_with.pop(("team-a", f"{winner}-0"), None)

    # Another namespace has its own budget (none): a whole node is still placed there.
    await system.group("team-b", "c", 2)
    await system.member("team-b", "c-0", "c")

    # The winner goes: its devices leave the namespace's budget and the loser is placed.
    await kube.delete_pod("team-a", f"{winner}-0")
    await kube.delete_group("team-a", winner)
    await kube.wait_bound("team-a", f"{loser}-0")
    assert_safe(system)


async def test_groups_that_fit_the_quota_exactly_are_all_placed(system: System) -> None:
    await gpu_quota(system, "team-a", 4)
    for name in ("a", "b"):
        await system.group("team-a", name, 2)
    await asyncio.gather(*(system.member("team-a", f"{g}-0", g) for g in ("a", "b")))
    assert {group_status(system, "team-a", g)["phase"] for g in ("a", "b")} == {names.PHASE_BOUND}
    # A third group of one device is one too many.
    await system.group("team-a", "c", 1)
    await system.member("team-a", "c-0", "c", bound=False)
    await refusal(system, "team-a", "c-0", "groups hold 4, this group needs 1")
    assert_safe(system)
