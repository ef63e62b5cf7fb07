"""The DRA witness itself: it flags every breach it claims to, at the change that makes it, and nothing else."""

from __future__ import annotations

from typing import Any

from deviceshare.api import names
from deviceshare.sandbox.watches import WatchEvent
from tests.reliability.drainvariants import ClaimWitness

NS = "w"


def claim(name: str, devices: list[tuple[str, str]], node: str | None = None, reserved: tuple[str, ...] = (),
          uid: str = "c") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if devices:
        status["allocation"] = {
            "devices": {"results": [{"request": "devices", "driver": "gpu.nvidia.com", "pool": p, "device": d}
                                    for p, d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node or devices[0][0]]}]}]},
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": u, "uid": u} for u in reserved]
    return {"kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS, "uid": uid}, "status": status}


def pod(name: str, group: str, node: str | None, phase: str = "Running") -> dict[str, Any]:
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": name,
                         "annotations": {names.POD_GROUP_ANNOTATION: group}},
            "spec": {"nodeName": node, "resourceClaims": [
                {"name": names.POD_CLAIM_NAME, "resourceClaimName": names.claim_name(group)}]},
            "status": {"phase": phase}}


def feed(witness: ClaimWitness, *events: tuple[str, dict[str, Any]]) -> list[str]:
    for rv, (kind, obj) in enumerate(events, start=1):
        witness(WatchEvent(rv, ("", ""), kind, obj))
    return witness.found


def test_a_device_in_two_claims_is_flagged_at_the_change_and_a_release_frees_it() -> None:
    found = feed(ClaimWitness(),
                 ("ADDED", claim("a-devices", [("n0", "gpu-0"), ("n0", "gpu-1")])),
                 ("ADDED", claim("b-devices", [("n0", "gpu-1")])))
    assert found == ["rv 2: device gpu.nvidia.com/n0/gpu-1 in the allocations of w/a-devices and w/b-devices"]
    # Released first, then taken: no breach.
    assert feed(ClaimWitness(),
                ("ADDED", claim("a-devices", [("n0", "gpu-1")])),
                ("MODIFIED", claim("a-devices", [])),
                ("ADDED", claim("b-devices", [("n0", "gpu-1")]))) == []
    # Same device name on another node's pool: another device.
    assert feed(ClaimWitness(), ("ADDED", claim("a-devices", [("n0", "gpu-0")])),
                ("ADDED", claim("b-devices", [("n1", "gpu-0")]))) == []


def test_a_running_member_must_be_reserved_in_its_allocated_claim_on_its_node() -> None:
    reserved = claim("g-devices", [("n0", "gpu-0")], reserved=("p",))
    assert feed(ClaimWitness(), ("ADDED", reserved), ("MODIFIED", pod("p", "g", "n0"))) == []
    assert feed(ClaimWitness(), ("ADDED", claim("g-devices", [("n0", "gpu-0")])),
                ("MODIFIED", pod("p", "g", "n0"))) == [
        "rv 2: pod w/p runs on n0 but is not in its claim g-devices's reservedFor"]
    assert feed(ClaimWitness(), ("ADDED", reserved), ("MODIFIED", pod("p", "g", "n1"))) == [
        "rv 2: pod w/p runs on n1 but its claim g-devices is allocated on n0"]
    assert feed(ClaimWitness(), ("MODIFIED", pod("p", "g", "n0"))) == ["rv 1: pod w/p runs on n0 without its claim "
                                                                       "g-devices"]
    # Released under the running pod: flagged at the claim's change.
    assert feed(ClaimWitness(), ("ADDED", reserved), ("MODIFIED", pod("p", "g", "n0")),
                ("MODIFIED", claim("g-devices", []))) == ["rv 3: pod w/p runs on n0 and its claim g-devices is not "
                                                          "allocated"]
    # Pending, finished or gone: nothing to hold.
    assert feed(ClaimWitness(), ("ADDED", pod("p", "g", None)), ("MODIFIED", pod("q", "g", "n0", "Succeeded")),
                ("ADDED", reserved), ("MODIFIED", pod("p", "g", "n0")), ("DELETED", pod("p", "g", "n0")),
                ("MODIFIED", claim("g-devices", []))) == []


def test_a_claim_deleted_while_allocated_is_flagged() -> None:
    assert feed(ClaimWitness(), ("ADDED", claim("g-devices", [("n0", "gpu-0")])),
                ("DELETED", claim("g-devices", [("n0", "gpu-0")]))) == [
        "rv 2: claim w/g-devices deleted while allocated [('gpu.nvidia.com', 'n0', 'gpu-0')]"]
    assert feed(ClaimWitness(), ("ADDED", claim("g-devices", [])), ("DELETED", claim("g-devices", []))) == []


def test_the_witness_never_raises_into_the_store() -> None:
    witness = ClaimWitness()
    witness(WatchEvent(1, ("", ""), "ADDED", {"kind": "ResourceClaim", "status": {"allocation": {"devices": 7}}}))
    assert witness.found and "witness failed" in witness.found[0]
