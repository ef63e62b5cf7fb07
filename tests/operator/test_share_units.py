"""The operator's pure pieces for shares (CONTRACT §7): rebuild claims, per-node metrics, messages."""

from __future__ import annotations

import re
from typing import Any

from deviceshare.api import names
from deviceshare.core import capacity, inventory
from deviceshare.core import ledger as ledgers
from deviceshare.operator import metrics, rebuild, state, statuses

GPU = "nvidia.com/gpu"
INTEL = "gpu.intel.com/i915"
GIB = 2**30


def node(name: str, resource: str = GPU, count: int = 2, labels: dict[str, str] | None = None) -> inventory.NodeInfo:
    return inventory.node_from_object({
        "metadata": {"name": name, "labels": {names.NODE_MODE_LABEL: names.NODE_MODE_SHARED, **(labels or {})}},
        "status": {"allocatable": {resource: str(count), "cpu": "8", "memory": "8Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def group(name: str, status: dict[str, Any], share: dict[str, Any] | None = None) -> state.GroupRecord:
    spec: dict[str, Any] = {"resources": {GPU: 1}}
    if share:
        spec["share"] = {GPU: share}
    return state.group_record({"metadata": {"namespace": "ns", "name": name, "uid": name}, "spec": spec,
                               "status": status})


def member(name: str, group_name: str, devices: str) -> state.PodRecord:
    return state.pod_record({
        "metadata": {"namespace": "ns", "name": name, "uid": name,
                     "annotations": {names.POD_GROUP_ANNOTATION: group_name,
                                     names.POD_SELECTED_DEVICES_ANNOTATION: devices}},
        "spec": {"nodeName": "n", "schedulerName": names.DEFAULT_SCHEDULER_NAME, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    })


def bound(devices: list[str]) -> dict[str, Any]:
    return {"phase": "Bound", "nodeName": "n", "allocatedDevices": {GPU: devices}}


def test_a_rebuild_reads_each_share_back_and_reports_overcommitment_without_resolving_it() -> None:
    groups = [group("a", bound(["0"]), {"memory": "50Gi"}), group("b", bound(["0"]), {"memory": "40Gi"}),
              group("c", bound(["1"]), {"compute": "250m"})]
    pods = [member("a-0", "a", '{"nvidia.com/gpu":"0"}')]
    sorted_ = rebuild.sort_claims(groups, pods, names.DEFAULT_SCHEDULER_NAME)
    claims = sorted_.claims
    assert {(c.source, dict(c.share)[GPU]) for c in claims} == {
        ("status of ns/a", capacity.Share(memory_bytes=50 * GIB)),
        ("status of ns/b", capacity.Share(memory_bytes=40 * GIB)),
        ("status of ns/c", capacity.Share(compute_milli=250)),
    }
    assert sorted_.members == {("ns", "a-0"): ("a-0", "a")}  # the member of a sharing group is recognised
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(node("n", labels={names.NVIDIA_GPU_MEMORY_LABEL: "81920"}))
    report = ledger.rebuild(claims)
    (conflict,) = report.conflicts
    assert (conflict.device, conflict.groups) == ("0", (("ns", "a"), ("ns", "b")))
    assert "more than the device's 80Gi" in conflict.reason
    # Both keep what they claimed; the over-committed device takes nobody new, the other still does.
    assert ledger.allocation(("ns", "a")) is not None and ledger.allocation(("ns", "b")) is not None
    try:
        ledger.reserve(("ns", "d"), "n", {GPU: ["0"]}, {GPU: capacity.Share(compute_milli=10)})
        raise AssertionError("a device found over-committed took another sharer")
    except ledgers.DeviceConflict:
        pass
    ledger.reserve(("ns", "e"), "n", {GPU: ["1"]}, {GPU: capacity.Share(compute_milli=750)})


def test_tiles_come_back_from_the_status() -> None:
    tiles = group("t", {**bound(["0"]), "allocatedTiles": {GPU: ["0.1"]}}, {"tiles": 1})
    (claim,) = rebuild.sort_claims([tiles], [], names.DEFAULT_SCHEDULER_NAME).claims
    assert dict(claim.tiles) == {GPU: ("0.1",)} and dict(claim.share) == {GPU: capacity.Share(tiles=1)}


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    found = re.findall(rf'^{name}{{node="([^"]+)",resource="([^"]+)"}} (\S+)$', text, re.M)
    return {(n, r): float(v) for n, r, v in found}


def test_metrics_count_compute_memory_and_tiles_given_out_per_node() -> None:
    ledger = ledgers.DeviceLedger()
    ledger.upsert_node(node("n", labels={names.NVIDIA_GPU_MEMORY_LABEL: "81920"}))
    ledger.upsert_node(node("i", INTEL, 2, labels={names.INTEL_TILES_LABEL: "4"}))
    ledger.reserve(("ns", "a"), "n", {GPU: ["0"]}, {GPU: capacity.Share(compute_milli=250, memory_bytes=20 * GIB)})
    ledger.reserve(("ns", "b"), "n", {GPU: ["0"]}, {GPU: capacity.Share(memory_bytes=16 * GIB)})
    ledger.reserve(("ns", "w"), "n", {GPU: ["1"]})
    ledger.reserve(("ns", "t"), "i", {INTEL: ["0"]}, {INTEL: capacity.Share(tiles=1)}, {INTEL: ["0.1"]})
    m = metrics.Metrics()
    m.bind_ledger(ledger)
    text = m.exposition().decode()
    assert _samples(text, "deviceshare_compute_allocated") == {("n", GPU): 1.25, ("i", INTEL): 0.0}
    assert _samples(text, "deviceshare_device_memory_allocated_bytes") == {("n", GPU): (20 + 16 + 80) * GIB}
    assert _samples(text, "deviceshare_device_memory_bytes") == {("n", GPU): 160 * GIB}
    assert _samples(text, "deviceshare_tiles_allocated") == {("i", INTEL): 1.0}
    assert _samples(text, "deviceshare_devices_allocated")[("n", GPU)] == 2.0


def test_messages_name_the_share() -> None:
    allocation = ledgers.Allocation(("ns", "a"), "n", {GPU: ("0",), INTEL: ("1",)}, ledgers.AllocationState.COMMITTED,
                                    {GPU: capacity.Share(compute_milli=460, memory_bytes=12 * GIB),
                                     INTEL: capacity.Share(tiles=1)}, {INTEL: ("1.0",)})
    assert statuses.describe_allocation(allocation) == (
        "gpu.intel.com/i915 1 (tiles=1: 1.0); nvidia.com/gpu 0 (compute=460m,memory=12Gi)")
