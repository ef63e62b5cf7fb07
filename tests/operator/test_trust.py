"""What the operator trusts, module by module: rebuild claims, membership records, names in paths."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.api import names
from deviceshare.core import ledger as ledgers
from deviceshare.core import members as member_rules
from deviceshare.operator import rebuild, state, storage

GPU = "nvidia.com/gpu"
OURS = names.DEFAULT_SCHEDULER_NAME


def _group(ns: str, name: str, node: str | None = None, devices: list[str] | None = None,
           members: list[str] | None = None) -> state.GroupRecord:
    status: dict[str, object] = {"phase": "Pending"}
    if node is not None:
        status = {"phase": "Bound", "nodeName": node, "allocatedDevices": {GPU: devices or []},
                  "members": members or []}
    return state.group_record({
        "metadata": {"namespace": ns, "name": name, "uid": f"{ns}/{name}", "resourceVersion": "1", "generation": 1},
        "spec": {"resources": {GPU: 1}}, "status": status,
    })


def _pod(ns: str, name: str, *, group: str | None, node: str | None, devices: list[str] | None,
         scheduler: str = OURS, phase: str = "Running") -> state.PodRecord:
    ann: dict[str, str] = {}
    if group is not None:
        ann[names.POD_GROUP_ANNOTATION] = group
    if devices is not None:
        ann[names.POD_SELECTED_DEVICES_ANNOTATION] = json.dumps({GPU: ",".join(devices)})
    return state.pod_record({
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}", "annotations": ann},
        "spec": {"nodeName": node, "schedulerName": scheduler, "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    })


def test_rebuild_counts_a_pod_only_where_a_record_of_ours_agrees() -> None:
    groups = [
        _group("t", "holder", "n1", ["0", "1"], members=["listed", "unjoined"]),
        _group("t", "pending"),
    ]
    pods = [
        _pod("t", "listed", group="holder", node="n1", devices=["0", "1"]),
        _pod("t", "unjoined", group=None, node="n1", devices=None),  # annotations removed by its owner
        _pod("t", "just-bound", group="holder", node="n1", devices=["1", "0"]),  # bound before the status listed it
        _pod("t", "other-node", group="holder", node="n2", devices=["0", "1"]),
        _pod("t", "decoy", group="pending", node="n1", devices=["0"]),
        _pod("m", "plain", group=None, node="n1", devices=["1"], scheduler="default-scheduler"),
        _pod("m", "ghost-0", group="ghost", node="n1", devices=["2"]),  # its group is gone: ours, free devices
        _pod("m", "ghost-1", group="ghost", node="n1", devices=["1"]),  # ... but on a holder's device
        _pod("m", "evil", group="../x?watch=true", node="n1", devices=["3"]),
    ]
    sorted_claims = rebuild.sort_claims(groups, pods, OURS)
    assert sorted_claims.members == {
        ("t", "listed"): ("uid-t-listed", "holder"),
        ("t", "unjoined"): ("uid-t-unjoined", "holder"),
        ("t", "just-bound"): ("uid-t-just-bound", "holder"),
        ("m", "ghost-0"): ("uid-m-ghost-0", "ghost"),
    }
    assert [(c.group, c.node, dict(c.devices)) for c in sorted_claims.claims] == [
        (("t", "holder"), "n1", {GPU: ("0", "1")}),
        (("m", "ghost"), "n1", {GPU: ("2",)}),
    ]
    why = {u.pod.name: u.why for u in sorted_claims.untrusted}
    assert set(why) == {"other-node", "decoy", "plain", "ghost-1", "evil"}
    assert 'status of SharedDeviceGroup "pending" does not record it' in why["decoy"]
    assert "not scheduled by" in why["plain"]
    assert f"{GPU} 1 on node n1 belong to a group whose status holds them" in why["ghost-1"]


_DEVICES = [str(i) for i in range(4)]


@st.composite
def _cluster(draw: st.DrawFn) -> tuple[list[state.GroupRecord], list[state.PodRecord]]:
    """Bound groups on disjoint devices (as the operator leaves them), then any pods a tenant can write."""
    groups: list[state.GroupRecord] = []
    for node in ("n1", "n2"):
        free = list(_DEVICES)
        for i in range(draw(st.integers(0, 2))):
            take = draw(st.integers(1, len(free))) if free else 0
            if not take:
                break
            ids, free = free[:take], free[take:]
            groups.append(_group("t", f"{node}-g{i}", node, ids, members=draw(st.lists(st.sampled_from(["p0", "p1"])))))
    groups.append(_group("t", "pending"))
    pods = [
        _pod(
            draw(st.sampled_from(["t", "m"])), f"p{i}",
            group=draw(st.one_of(st.none(), st.sampled_from([g.name for g in groups] + ["ghost", "gone"]))),
            node=draw(st.sampled_from(["n1", "n2"])),
            devices=draw(st.one_of(st.none(), st.lists(st.sampled_from(_DEVICES), min_size=1, unique=True))),
            scheduler=draw(st.sampled_from([OURS, "default-scheduler"])),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    return groups, pods


@settings(max_examples=200, deadline=None)
@given(_cluster())
def test_no_pod_a_tenant_writes_makes_a_bound_group_conflict(
    cluster: tuple[list[state.GroupRecord], list[state.PodRecord]],
) -> None:
    groups, pods = cluster
    sorted_claims = rebuild.sort_claims(groups, pods, OURS)
    ledger = ledgers.DeviceLedger()
    report = ledger.rebuild(sorted_claims.claims)
    statused = {g.key for g in groups if g.status.node_name}
    for conflict in report.conflicts:
        assert not statused & set(conflict.groups), conflict
    for g in groups:  # every bound group keeps exactly its devices
        if g.status.node_name:
            held = ledger.allocation(g.key)
            assert held is not None and held.node == g.status.node_name
            assert sorted(held.devices[GPU]) == sorted(g.status.allocated_devices[GPU])
    for (ns, _), (_, group) in sorted_claims.members.items():  # members only in their own namespace's groups
        assert (ns, group) in statused or (ns, group) not in {g.key for g in groups}


def test_membership_follows_the_binding_not_the_annotation() -> None:
    cluster = state.ClusterState()
    pending = _pod("t", "p", group="a", node=None, devices=None, phase="Pending")
    cluster.upsert_pod(pending)
    assert pending.group_key == ("t", "a")
    cluster.assume(pending, "n1", {names.POD_SELECTED_DEVICES_ANNOTATION: '{"nvidia.com/gpu":"0"}'}, "a")
    for annotation in (None, "b", "../b"):  # un-joined, re-pointed, garbage
        cluster.upsert_pod(_pod("t", "p", group=annotation, node="n1", devices=["0"]))
        assert cluster.pods[("t", "p")].group_key == ("t", "a")
        assert [p.name for p in cluster.members_on_devices(("t", "a"))] == ["p"]
        assert not cluster.members_on_devices(("t", "b"))
    # A new pod under the same name is nobody's member until we bind it.
    recreated = _pod("t", "p", group="a", node="n1", devices=["0"])
    cluster.upsert_pod(state.pod_record({"metadata": {"namespace": "t", "name": "p", "uid": "new",
                                                      "annotations": {names.POD_GROUP_ANNOTATION: "a"}},
                                         "spec": {"nodeName": "n1", "schedulerName": OURS}}))
    assert cluster.pods[("t", "p")].group_key is None
    assert recreated.group_key is None  # bound by someone else: no member of anything
    assert _pod("t", "q", group="../b?watch=1", node=None, devices=None).group_key is None


@settings(max_examples=100, deadline=None)
@given(
    annotation=st.one_of(st.none(), st.sampled_from(["a", "b", "../b"])),
    node=st.one_of(st.none(), st.sampled_from(["n1", "n2"])),
    devices=st.one_of(st.none(), st.lists(st.sampled_from(_DEVICES), min_size=1, unique=True)),
    scheduler=st.sampled_from([OURS, "default-scheduler"]),
    phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
    group=st.sampled_from(["a", "c"]),
)
def test_a_recorded_membership_changes_nothing_else_about_the_pod(
    annotation: str | None, node: str | None, devices: list[str] | None, scheduler: str, phase: str, group: str,
) -> None:
    pod = _pod("t", "p", group=annotation, node=node, devices=devices, scheduler=scheduler, phase=phase)
    cluster = state.ClusterState()
    cluster.record_binding(pod.key, pod.uid, group)  # as a rebuild does, before it stores the records
    cluster.upsert_pod(pod)
    assert cluster.pods[pod.key] == dataclasses.replace(pod, member_of=group)
    assert [p.key for p in cluster.members(("t", group))] == [pod.key]


def test_names_stay_one_path_segment() -> None:
    path = storage._group_path(("t", "../shareddevicegroups?watch=true&x=1"))
    assert path.rsplit("/", 1) == [f"/apis/{names.API_VERSION}/namespaces/t/{names.PLURAL}",
                                   "..%2Fshareddevicegroups%3Fwatch%3Dtrue%26x%3D1"]
    assert storage._pod_path(("t", "a/b")).endswith("/pods/a%2Fb")
    for name in ("", ".", ".."):
        with pytest.raises(storage.Invalid):
            storage._group_path(("t", name))
    assert member_rules.group_name_problem("../shareddevicegroups?watch=true&x=1") is not None
    assert member_rules.group_name_problem("trainer-1") is None
