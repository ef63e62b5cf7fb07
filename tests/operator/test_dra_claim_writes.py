"""The claim writes of operator/storage against a lying API: a create that landed answers 409 or loses its answer, a
delete or finalizer write whose answer is dropped; each read back, never guessed, and each fault proven fired."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.operator import storage
from deviceshare.operator.readback import Seen
from deviceshare.operator.storage import draclaims
from deviceshare.sandbox import Sandbox
from tests.sandbox.dra_objects import claim

NS = "default"
KEY = (NS, "g-devices")
CLAIM = r"/namespaces/default/resourceclaims/g-devices$"


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with Sandbox(nodes=1, gpus=2, dra=True, kubeconfig_path=tmp_path / "kubeconfig") as sandbox:
        yield sandbox


def body() -> dict[str, Any]:
    made = claim("g-devices")
    made["metadata"]["finalizers"] = [names.GROUP_FINALIZER]
    return made


async def test_a_second_create_answers_the_claim_already_there(api: storage.ClusterApi, box: Sandbox) -> None:
    outcomes: list[str] = []
    api.on_write = lambda verb, resource, result: outcomes.append(f"{verb} {resource} {result}")
    first = await api.create_claim(body())
    second = await api.create_claim(body())  # 409 AlreadyExists: the claim read back, for the caller to judge
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert outcomes == ["create resourceclaims ok", "create resourceclaims conflict"]
    assert len(box.list("resourceclaims")) == 1


@pytest.mark.parametrize("answer", [{"status": 504}, {"drop": True}])
async def test_a_create_that_landed_with_its_answer_lost_is_read_back(
    api: storage.ClusterApi, box: Sandbox, answer: dict[str, Any]
) -> None:
    fault = box.inject_fault("POST", r"/namespaces/default/resourceclaims$", applied=True, **answer)
    made = await api.create_claim(body())
    assert fault.fired == 1
    assert made["metadata"]["uid"] == box.list("resourceclaims")[0]["metadata"]["uid"]
    assert len(box.list("resourceclaims")) == 1


async def test_a_create_that_did_not_land_is_sent_again(api: storage.ClusterApi, box: Sandbox) -> None:
    fault = box.inject_fault("POST", r"/namespaces/default/resourceclaims$", status=504)  # not applied
    made = await api.create_claim(body())
    assert fault.fired == 1 and made["metadata"]["name"] == "g-devices"


async def test_a_delete_whose_answer_is_dropped_is_read_back(api: storage.ClusterApi, box: Sandbox) -> None:
    made = await api.create_claim(body())
    meta = made["metadata"]
    fault = box.inject_fault("DELETE", CLAIM, applied=True, drop=True)
    await api.delete_claim(KEY, uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert fault.fired == 1
    deleting = box.get("resourceclaims", "g-devices", NS)
    assert deleting is not None and deleting["metadata"]["deletionTimestamp"]  # held by our finalizer
    fault = box.inject_fault("PATCH", CLAIM, applied=True, status=504)
    gone = await api.set_claim_finalizers(KEY, [], uid=meta["uid"],
                                          resource_version=deleting["metadata"]["resourceVersion"])
    assert fault.fired == 1 and gone is None and box.get("resourceclaims", "g-devices", NS) is None


async def test_a_delete_conditional_on_an_old_version_is_refused(api: storage.ClusterApi, box: Sandbox) -> None:
    """A claim allocated after it was read is never deleted on the strength of that read."""
    made = await api.create_claim(body())
    box.patch("resourceclaims", "g-devices", {"metadata": {"labels": {"changed": "yes"}}}, NS)
    with pytest.raises(storage.Conflict):
        await api.delete_claim(KEY, uid=made["metadata"]["uid"], resource_version=made["metadata"]["resourceVersion"])
    assert not box.get("resourceclaims", "g-devices", NS)["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize(
    ("shown", "seen"),
    [
        (None, Seen.LANDED),
        ({"metadata": {"uid": "other"}}, Seen.LANDED),  # another claim under the name: ours is gone
        ({"metadata": {"uid": "u", "deletionTimestamp": "2026-11-27T20:00:00Z"}}, Seen.LANDED),
        ({"metadata": {"uid": "u", "resourceVersion": "7"}}, Seen.NOT_YET),
        ({"metadata": {"uid": "u", "resourceVersion": "8"}}, Seen.OVERTAKEN),
    ],
)
def test_what_a_delete_read_back_shows(shown: dict[str, Any] | None, seen: Seen) -> None:
    assert draclaims.delete_seen(shown, uid="u", precondition="7") is seen


@pytest.mark.parametrize(
    ("shown", "written", "seen"),
    [
        (None, [], Seen.LANDED),  # our finalizer was its last: deleted
        (None, [names.GROUP_FINALIZER], Seen.GONE),
        ({"metadata": {"uid": "u", "finalizers": [], "resourceVersion": "8"}}, [], Seen.LANDED),
        ({"metadata": {"uid": "u", "finalizers": ["x"], "resourceVersion": "7"}}, [], Seen.NOT_YET),
        ({"metadata": {"uid": "u", "finalizers": ["x"], "resourceVersion": "8"}}, [], Seen.OVERTAKEN),
    ],
)
def test_what_a_finalizer_write_read_back_shows(
    shown: dict[str, Any] | None, written: list[str], seen: Seen
) -> None:
    assert draclaims.finalizers_seen(shown, uid="u", written=written, precondition="7") is seen


async def test_a_replica_that_may_not_write_sends_no_claim_write(api: storage.ClusterApi, box: Sandbox) -> None:
    made = await api.create_claim(body())
    meta = made["metadata"]
    fence = storage.OpenFence(30.0)
    api.fence = fence
    fence.open = False  # deposed: not the leader any more
    with pytest.raises(storage.Fenced):
        await api.create_claim(claim("other-devices"))
    with pytest.raises(storage.Fenced):
        await api.delete_claim(KEY, uid=meta["uid"], resource_version=meta["resourceVersion"])
    with pytest.raises(storage.Fenced):
        await api.set_claim_finalizers(KEY, [], uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert [c["metadata"]["name"] for c in box.list("resourceclaims")] == ["g-devices"]
    shown = box.get("resourceclaims", "g-devices", NS)
    assert shown is not None and shown["metadata"]["finalizers"] == [names.GROUP_FINALIZER]
    assert not shown["metadata"].get("deletionTimestamp")
