"""The DRA invariants (CONTRACT §13), judged from the API's state only, on every change the sandbox store makes.

:class:`ClaimWitness` is a listener of the sandbox store (``cluster.store.listeners``): it is called with every
ResourceClaim and Pod change, in the order the API stored them, so a breach that lasts one write is seen, not
only what a sampling watchdog happens to catch. It keeps its own copy of each claim's allocation and reservations
and of each running member pod, written here from the objects' fields (never from ``deviceshare``), and says:

- a device (driver, pool, device) in two claims' ``status.allocation`` at once (any claim: kube-scheduler's too);
- a member pod bound and not finished whose claim is missing, not allocated, allocated on another node than the
  pod's, or does not list the pod in ``status.reservedFor`` (a pod is reserved *before* it is bound, and stays
  reserved until it finishes or is gone: kube-controller-manager's resourceclaim controller drops a bound pod only
  then);
- a claim deleted while the API still showed an allocation (release clears it first).

The devices here allow one allocation each (the sandbox's ``dra=True`` driver): sharing (``dra_shared``) is not
judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from deviceshare.api import names
from tests.reliability import invariants

Device = tuple[str, str, str]  # driver, pool, device
Key = tuple[str, str]  # namespace, name

_TERMINAL = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class ClaimView:
    uid: str
    devices: frozenset[Device]
    node: str | None  # the allocation's node (its nodeSelector's matchFields on metadata.name)
    reserved: frozenset[str]  # uids in status.reservedFor


@dataclasses.dataclass(frozen=True)
class MemberView:
    uid: str
    node: str
    claim: Key


def _key(obj: Mapping[str, Any]) -> Key:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace", "")), str(md.get("name", "")))


def claim_view(claim: Mapping[str, Any]) -> ClaimView:
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    devices = frozenset((str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                        for r in (allocation.get("devices") or {}).get("results") or [])
    node = None
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and field.get("values"):
                node = str(field["values"][0])
    reserved = frozenset(str(r.get("uid")) for r in status.get("reservedFor") or [])
    return ClaimView(str((claim.get("metadata") or {}).get("uid")), devices, node, reserved)


def member_view(pod: Mapping[str, Any]) -> MemberView | None:
    """A bound, unfinished pod of a group that uses a claim (as the webhook wires one), else None."""
    md, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if not (md.get("annotations") or {}).get(names.POD_GROUP_ANNOTATION) or not spec.get("nodeName"):
        return None
    if (pod.get("status") or {}).get("phase") in _TERMINAL:
        return None
    claim = next((c.get("resourceClaimName") for c in spec.get("resourceClaims") or []
                  if c.get("name") == names.POD_CLAIM_NAME), None)
    if not claim:
        return None
    return MemberView(str(md.get("uid")), str(spec["nodeName"]), (str(md.get("namespace", "")), str(claim)))


class ClaimWitness:
    """Called by the sandbox store with every change; ``found`` lists each breach once, with the resourceVersion
    of the change that showed it. It never raises (it runs inside the store's write)."""

    def __init__(self) -> None:
        self.claims: dict[Key, ClaimView] = {}
        self.members: dict[Key, MemberView] = {}
        self.holders: dict[Device, Key] = {}
        self.found: list[str] = []
        self.changes = 0  # claim and member changes judged
        self.reservations = 0  # pods seen bound with their claim reserved for them
        self.deleted_claims = 0

    def __call__(self, event: Any) -> None:
        try:
            kind = event.obj.get("kind")
            if kind == "ResourceClaim":
                self._on_claim(event.type, event.obj, event.rv)
            elif kind == "Pod":
                self._on_pod(event.type, event.obj, event.rv)
        except Exception as e:  # a bug here must fail the test, not the API's write
            self._say(f"the witness failed on rv {getattr(event, 'rv', '?')}: {e!r}")

    def _say(self, line: str) -> None:
        if line not in self.found:
            self.found.append(line)

    def _on_claim(self, kind: str, claim: Mapping[str, Any], rv: int) -> None:
        key = _key(claim)
        self.changes += 1
        old = self.claims.pop(key, None)
        for device in old.devices if old else ():
            if self.holders.get(device) == key:
                del self.holders[device]
        if kind == "DELETED":
            self.deleted_claims += 1
            if claim_view(claim).devices:
                self._say(f"rv {rv}: claim {key[0]}/{key[1]} deleted while allocated "
                          f"{sorted(claim_view(claim).devices)}")
            self._check_claim_users(key, rv)
            return
        view = claim_view(claim)
        self.claims[key] = view
        for device in sorted(view.devices):
            other = self.holders.get(device)
            if other is not None and other != key:
                self._say(f"rv {rv}: device {'/'.join(device)} in the allocations of {other[0]}/{other[1]} "
                          f"and {key[0]}/{key[1]}")
            else:
                self.holders[device] = key
        self._check_claim_users(key, rv)

    def _check_claim_users(self, key: Key, rv: int) -> None:
        for pod, member in self.members.items():
            if member.claim == key:
                self._check_member(pod, member, rv)

    def _on_pod(self, kind: str, pod: Mapping[str, Any], rv: int) -> None:
        key = _key(pod)
        member = member_view(pod) if kind != "DELETED" else None
        if member is None:
            self.members.pop(key, None)
            return
        self.changes += 1
        if key not in self.members:
            self.reservations += 1
        self.members[key] = member
        self._check_member(key, member, rv)

    def _check_member(self, pod: Key, member: MemberView, rv: int) -> None:
        claim = self.claims.get(member.claim)
        where = f"rv {rv}: pod {pod[0]}/{pod[1]} runs on {member.node}"
        if claim is None:
            self._say(f"{where} without its claim {member.claim[1]}")
        elif not claim.devices:
            self._say(f"{where} and its claim {member.claim[1]} is not allocated")
        elif claim.node != member.node:
            self._say(f"{where} but its claim {member.claim[1]} is allocated on {claim.node}")
        elif member.uid not in claim.reserved:
            self._say(f"{where} but is not in its claim {member.claim[1]}'s reservedFor")


def prepare_failures(cluster: Any, namespace: str) -> list[str]:
    """The kubelet's ``FailedPrepareDynamicResources`` events in ``namespace``: a pod bound to a node whose claim
    was not allocated there, not reserved for it, or whose device another claim had prepared."""
    return [f"{e['involvedObject']['name']}: {e.get('message')}" for e in cluster.list("events", namespace)
            if e.get("reason") == "FailedPrepareDynamicResources"]


def mirrors(cluster: Any, namespace: str, device_class: str) -> list[str]:
    """Each DRA group with a member bound: its status (``nodeName``, ``allocatedDevices[class]`` as
    ``<pool>/<device>``) is its claim's allocation. Meaningful when quiet."""
    found: list[str] = []
    bound = {(p["metadata"].get("annotations") or {}).get(names.POD_GROUP_ANNOTATION)
             for p in cluster.list("pods", namespace) if member_view(p) is not None}
    for group in cluster.list(names.PLURAL, namespace):
        name = group["metadata"]["name"]
        if name not in bound:
            continue
        claim = cluster.get("resourceclaims", names.claim_name(name), namespace)
        view = claim_view(claim or {})
        status = group.get("status") or {}
        shown = sorted(f"{pool}/{device}" for _, pool, device in view.devices)
        held = sorted((status.get("allocatedDevices") or {}).get(device_class) or [])
        if status.get("nodeName") != view.node or held != shown:
            found.append(f"group {name} says {status.get('nodeName')} {held}, its claim {view.node} {shown}")
    return found


def is_dra(obj: Mapping[str, Any]) -> bool:
    """A DRA group (``spec.claim``) or a pod wired to a claim."""
    spec = obj.get("spec") or {}
    return bool(spec.get("claim") or spec.get("resourceClaims"))


def device_plugin_breaches(cluster: Any, dra_nodes: frozenset[str]) -> list[str]:
    """Beside DRA groups: the device-plugin groups' invariant (``invariants.violations``, DRA groups and their pods
    left out: their devices are not the nodes' extended resources), and no device-plugin group holding devices on a
    node whose GPUs are DRA devices (the operator's rule: one GPU is never offered twice)."""
    snapshot = invariants.from_sandbox(cluster)
    plugin = invariants.Snapshot(snapshot.nodes, [g for g in snapshot.groups if not is_dra(g)],
                                 [p for p in snapshot.pods if not is_dra(p)])
    found = invariants.violations(plugin)
    for group in plugin.groups:
        status = group.get("status") or {}
        if status.get("nodeName") in dra_nodes and status.get("allocatedDevices"):
            found.append(f"device-plugin group {group['metadata']['name']} holds {status['allocatedDevices']} on "
                         f"{status['nodeName']}, whose GPUs are DRA devices")
    return found
