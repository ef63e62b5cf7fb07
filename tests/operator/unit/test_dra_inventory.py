"""The DRA inventory (operator/drainventory.py): what a node offers per DeviceClass once its ResourceSlices are
folded in, what is withheld, which claims are ours, and the claim selectors' answers across slice changes."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from deviceshare.api import models
from deviceshare.core import inventory
from deviceshare.core import ledger as ledgers
from deviceshare.operator import drainventory, draplacing
from deviceshare.sandbox import dradriver
from tests.core import builders

CLASS = dradriver.DEVICE_CLASS


def slice_of(node: str, gpus: int = 2, version: str = "1", taint: int | None = None) -> dict[str, Any]:
    devices = [dradriver.gpu_device(node, d, 81920, shared=False) for d in range(gpus)]
    if taint is not None:
        devices[taint]["taints"] = [{"key": "example.com/xid", "effect": "NoExecute"}]
    return {"metadata": {"name": f"{node}-slice", "resourceVersion": version},
            "spec": {"driver": dradriver.DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def claim_of(name: str, devices: list[str], owner: str | None = None, ns: str = "ml") -> dict[str, Any]:
    refs = [{"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup", "name": owner, "uid": "u",
             "controller": True}] if owner else []
    return {"metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "ownerReferences": refs},
            "status": {"allocation": {"devices": {"results": [
                {"request": "devices", "driver": dradriver.DRIVER, "pool": d.split("/")[0], "device": d.split("/")[1]}
                for d in devices]}}}}


def inventory_with(held: dict[tuple[str, str], dict[str, tuple[str, ...]]]) -> drainventory.DraInventory:
    dra = drainventory.DraInventory(held.get)
    dra.on_class("ADDED", dradriver.device_class())
    return dra


def test_a_node_with_a_slice_offers_its_gpus_once_as_dra_devices() -> None:
    dra = inventory_with({})
    plain = dra.node(builders.node("plain", gpus=2))
    assert plain.devices == {builders.GPU: ("0", "1")}  # no slice: the extended resource as before
    dra.on_slice("ADDED", slice_of("n1", taint=1))
    info = dra.node(builders.node("n1", gpus=2))
    assert info.devices == {CLASS: ("n1/gpu-0", "n1/gpu-1")}  # nvidia.com/gpu, the class's extendedResourceName, gone
    assert info.withheld == {CLASS: frozenset({"n1/gpu-1"})}
    assert CLASS not in info.device_memory  # not shareable: the devices do not allow multiple allocations


def test_other_claims_withhold_their_devices_ours_do_not() -> None:
    held: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    dra = inventory_with(held)
    dra.on_slice("ADDED", slice_of("n1", gpus=4))
    dra.node(builders.node("n1", gpus=4))
    dra.on_claim("ADDED", claim_of("theirs", ["n1/gpu-0"]))
    dra.on_claim("ADDED", claim_of("g-devices", ["n1/gpu-1"], owner="g"))  # named and owned, but not held yet
    dra.on_claim("ADDED", claim_of("h-devices", ["n1/gpu-2"], owner="g"))  # owned by g under another name
    assert dra.view("n1") is not None
    assert dra.view("n1").withheld == {CLASS: frozenset({"n1/gpu-0", "n1/gpu-1", "n1/gpu-2"})}  # type: ignore[union-attr]
    held[("ml", "g")] = {CLASS: ("n1/gpu-1",)}  # the ledger holds it: ours
    assert dra.view("n1").withheld == {CLASS: frozenset({"n1/gpu-0", "n1/gpu-2"})}  # type: ignore[union-attr]
    dra.on_claim("DELETED", {"metadata": {"namespace": "ml", "name": "theirs"}})
    assert dra.view("n1").withheld == {CLASS: frozenset({"n1/gpu-2"})}  # type: ignore[union-attr]


def test_claim_selectors_are_answered_again_after_a_slice_changes() -> None:
    dra = inventory_with({})
    dra.on_slice("ADDED", slice_of("n1", gpus=2))
    uuid = dradriver.gpu_uuid("n1", 1)
    selectors = [f"device.attributes['{dradriver.DRIVER}'].uuid == '{uuid}'"]
    assert dra.excluded(CLASS, selectors) == {"n1": frozenset({"n1/gpu-0"})}
    work, generation = dra.excluded_work(CLASS, selectors), dra.generation
    dra.on_slice("ADDED", slice_of("n2", gpus=1))  # meanwhile a slice changes: the answer computed before is stale
    dra.keep_excluded(CLASS, selectors, generation, work())
    assert not dra.has_excluded(CLASS, selectors)
    assert dra.excluded(CLASS, selectors) == {"n1": frozenset({"n1/gpu-0"}), "n2": frozenset({"n2/gpu-0"})}


def test_nodes_without_the_class_keep_their_inventory() -> None:
    dra = inventory_with({})
    base = dataclasses.replace(builders.node("n1", gpus=0), devices={})
    dra.on_slice("ADDED", slice_of("n1"))
    dra.on_class("DELETED", {"metadata": {"name": CLASS}})
    assert dra.node(base) == base
    assert isinstance(base, inventory.NodeInfo)


async def test_a_decision_never_evaluates_selectors_on_the_event_loop_after_a_slice_changed() -> None:
    """The pre-filter evaluates a claim's selectors in a worker thread; should a slice change before the decision,
    the decision waits for another evaluation (None) instead of running cel-python over every device there."""
    dra = inventory_with({})
    dra.on_slice("ADDED", slice_of("n1", gpus=2))
    uuid = dradriver.gpu_uuid("n1", 1)
    spec = models.GroupSpec.model_validate({"claim": {"deviceClassName": CLASS, "count": 1, "selectors": [
        f"device.attributes['{dradriver.DRIVER}'].uuid == '{uuid}'"]}})

    class Ctx:  # what draplacing reads of the operator's context
        pass

    ctx: Any = Ctx()
    ctx.dra = dra
    await draplacing.prepare(ctx, spec)
    snapshot = ledgers.DeviceLedger().snapshot()
    assert draplacing.narrowed(ctx, spec, snapshot) is not None  # evaluated for the slices as they are
    dra.on_slice("ADDED", slice_of("n2", gpus=1))  # a slice changes during the pre-filter's other awaits
    evaluations = []
    dra.excluded_work = lambda *a: evaluations.append(a) or (lambda: {})  # type: ignore[method-assign]
    assert draplacing.narrowed(ctx, spec, snapshot) is None
    assert evaluations == []  # nothing evaluated here: the next cycle's pre-filter does it off the loop


def test_a_dra_node_whose_slice_goes_away_does_not_offer_its_held_gpus_as_the_extended_resource() -> None:
    """The kubelet deletes a node's ResourceSlices when its DRA driver unregisters (a restart, an upgrade) while a
    group still holds devices there: those GPUs must not come back as ``nvidia.com/gpu`` for a device-plugin
    group meanwhile (handed twice); once no claim allocates them, the node is a device-plugin node again."""
    held = {("ml", "g"): {CLASS: ("n1/gpu-0",)}}
    dra = inventory_with(held)
    dra.on_slice("ADDED", slice_of("n1", gpus=2))
    assert builders.GPU not in dra.node(builders.node("n1", gpus=2)).devices
    dra.on_claim("ADDED", claim_of("g-devices", ["n1/gpu-0"], owner="g"))
    dra.on_slice("DELETED", {"metadata": {"name": "n1-slice"}})
    assert builders.GPU not in dra.node(builders.node("n1", gpus=2)).devices
    assert dra.on_claim("DELETED", {"metadata": {"namespace": "ml", "name": "g-devices"}}) == {"n1"}  # looked at again
    assert dra.node(builders.node("n1", gpus=2)).devices == {builders.GPU: ("0", "1")}


def test_a_rebuild_trusts_only_a_claim_its_group_owns_by_uid() -> None:
    """After a restart the claims of our groups are records of what deviceshare gave: a claim named
    ``<group>-devices`` whose controller reference names the group but not its uid (a tenant's, or one an earlier
    group of that name left) is somebody else's allocation, never the group's holding."""
    from deviceshare.operator import draintake, records

    group = records.group_record({"metadata": {"namespace": "ml", "name": "g", "uid": "uid-g", "generation": 1},
                                  "spec": {"claim": {"deviceClassName": CLASS, "count": 1}}})
    dra = inventory_with({})
    dra.on_slice("ADDED", slice_of("n1", gpus=2))
    dra.node(builders.node("n1", gpus=2))
    tenants = claim_of("g-devices", ["n1/gpu-0"], owner="g")  # controller reference with uid "u"
    dra.on_claim("ADDED", tenants)
    assert draintake.our_claims(dra, {("ml", "g"): group}) == []
    tenants["metadata"]["ownerReferences"][0]["uid"] = "uid-g"  # the group's own claim
    dra.on_claim("ADDED", tenants)
    assert [c.devices for c in draintake.our_claims(dra, {("ml", "g"): group})] == [{CLASS: ("n1/gpu-0",)}]


def test_a_gone_groups_claim_we_just_allocated_is_released_before_its_devices_even_if_the_watch_lags() -> None:
    """A roll-back or a release of a group that is gone asks whether its claim holds an allocation first: the
    claim we wrote a moment ago (remembered from the write's answer) counts even before its watch event arrives,
    or the ledger would give the devices back while the API shows the claim allocated."""
    from deviceshare.operator import draallocation

    class Ctx:
        pass

    ctx: Any = Ctx()
    ctx.dra = inventory_with({})
    written = claim_of("g-devices", ["n1/gpu-0"], owner="g")
    ctx.dra.bodies.keep(("ml", "g"), written)  # reserve_for's answer; the claims watch has not shown it yet
    assert draallocation.holds_claim(ctx, None, ("ml", "g"))
    ctx.dra.bodies.keep(("ml", "g"), {**written, "status": {}})  # cleared
    assert not draallocation.holds_claim(ctx, None, ("ml", "g"))


def test_a_device_that_cannot_be_read_is_skipped_and_named_its_slice_mates_still_offered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A driver's slice is input: an attribute with two values set (the API's validation refuses it; a
    driver that skipped it, or a stale object, still shows it) makes that device unreadable, offered to no class
    and named in the log; the rest of the slice, and the next node's, fold as usual."""
    dra = inventory_with({})
    body = slice_of("n1", gpus=3)
    body["spec"]["devices"][1]["attributes"]["productName"] = {"string": "NVIDIA H100", "int": 1}
    body["spec"]["devices"].append("not a device")
    with caplog.at_level(logging.WARNING, logger="deviceshare.operator.draobjects"):
        dra.on_slice("ADDED", body)
    dra.on_slice("ADDED", slice_of("n2", gpus=1))
    assert dra.node(builders.node("n1", gpus=3)).devices == {CLASS: ("n1/gpu-0", "n1/gpu-2")}
    assert dra.node(builders.node("n2", gpus=1)).devices == {CLASS: ("n2/gpu-0",)}
    assert any("n1-slice" in r.getMessage() and "gpu-1" in r.getMessage()
               and "attributes['productName']: exactly one of" in r.getMessage() for r in caplog.records)
    assert any("n1-slice" in r.getMessage() and "device name: Required value" in r.getMessage()
               for r in caplog.records)


def test_a_slice_updated_over_and_over_keeps_one_class_answer_and_none_once_deleted() -> None:
    """The class's answer is kept per slice and replaced at each update (a health taint flapping updates a slice
    every few seconds; kept per version, every update would leave one behind for the operator's lifetime)."""
    dra = inventory_with({})
    for version in range(1, 51):
        dra.on_slice("MODIFIED", slice_of("n1", gpus=2, version=str(version), taint=version % 2))
        info = dra.node(builders.node("n1", gpus=2))
        assert info.withheld == {CLASS: frozenset({f"n1/gpu-{version % 2}"})}  # the update's taint, not a stale one
    assert len(dra._matches) == 1  # one (class, slice) answer
    dra.on_slice("DELETED", {"metadata": {"name": "n1-slice"}})
    assert dra._matches == {}
    assert dra.node(builders.node("n1", gpus=2)).devices == {builders.GPU: ("0", "1")}
