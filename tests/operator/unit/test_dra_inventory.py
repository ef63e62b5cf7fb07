"""The DRA inventory (operator/drainventory.py): what a node offers per DeviceClass once its ResourceSlices are
folded in, what is withheld, which claims are ours, and the claim selectors' answers across slice changes."""

from __future__ import annotations

import dataclasses
from typing import Any

from deviceshare.core import inventory
from deviceshare.operator import drainventory
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
