"""The derivation behind the RBAC test reads the code correctly and refuses what it cannot read."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.manifests import code_access
from tests.manifests.code_access import Access

SRC = code_access.SRC


@pytest.mark.parametrize(("method", "path", "expected"), [
    ("GET", "/api/v1/nodes", Access("", "nodes", "list")),
    ("GET", "/api/v1/namespaces/{}/pods/{}", Access("", "pods", "get")),
    ("POST", "/api/v1/namespaces/{}/pods/{}/binding", Access("", "pods/binding", "create")),
    ("PATCH", "/api/v1/namespaces/{}/pods/{}/status", Access("", "pods/status", "patch")),
    ("POST", "/api/v1/namespaces/{}/events", Access("", "events", "create")),
    ("GET", "/apis/deviceshare.io/v1alpha1/shareddevicegroups", Access("deviceshare.io", "shareddevicegroups", "list")),
    ("PUT", "/apis/deviceshare.io/v1alpha1/namespaces/{}/shareddevicegroups/{}",
     Access("deviceshare.io", "shareddevicegroups", "update")),
    ("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/{}", Access("kopf.dev", "clusterkopfpeerings", "get")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/{own}/leases/{}",
     Access("coordination.k8s.io", "leases", "update", own_namespace=True)),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/{own}/leases",
     Access("coordination.k8s.io", "leases", "create", own_namespace=True)),
    ("GET", "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{}", Access("coordination.k8s.io", "leases", "get")),
    ("GET", "/api/v1/namespaces", Access("", "namespaces", "list")),
    ("GET", "/api/v1/namespaces/{}", Access("", "namespaces", "get")),
    ("DELETE", "/api/v1/namespaces/{}/pods", Access("", "pods", "deletecollection")),
])
def test_paths_map_to_what_the_authorizer_checks(method: str, path: str, expected: Access) -> None:
    assert code_access.access_for(method, path) == expected


def test_every_storage_call_is_read(tmp_path: Path) -> None:
    calls = code_access.storage_calls()
    source = code_access.storage_source()
    sites = sum(source.count(f"self.{helper}(") for helper in code_access.REQUESTS)
    # _list and _lease_write pass their parameters on to _call, _group_write and _claim_write to _write: not call
    # sites.
    assert len(calls) == sites - 4 == len(code_access.storage_call_sites())
    assert ("POST", "/api/v1/namespaces/{}/pods/{}/binding") in calls
    assert ("PATCH", "/apis/deviceshare.io/v1alpha1/namespaces/{}/shareddevicegroups/{}/status") in calls
    assert ("PATCH", "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}/status") in calls


def test_a_new_call_shows_up_and_an_opaque_one_is_refused(tmp_path: Path) -> None:
    module = tmp_path / "storage.py"
    module.write_text(textwrap.dedent('''
        def _cm_path(ns):
            return f"/api/v1/namespaces/{ns}/configmaps"
        class ClusterApi:
            async def make(self, ns):
                await self._call("POST", _cm_path(ns) + "", "x")
    '''))
    assert code_access.storage_calls(module) == [("POST", "/api/v1/namespaces/{}/configmaps")]
    module.write_text("class A:\n    async def f(self, p):\n        await self._call('GET', p, 'x')\n")
    with pytest.raises(code_access.UnresolvedCall):
        code_access.storage_calls(module)


def test_the_operator_talks_to_the_api_only_through_its_storage_module() -> None:
    assert list(code_access.api_client_uses(SRC / "operator")) == []


def test_the_webhook_cache_lists_and_watches_groups_pods_and_quotas_and_gets_a_group_on_a_miss() -> None:
    watched = [("deviceshare.io", "shareddevicegroups"), ("", "pods"), ("", "resourcequotas")]
    assert code_access.webhook_needs() == {
        Access(g, r, v) for g, r in watched for v in ("list", "watch")
    } | {Access("deviceshare.io", "shareddevicegroups", "get")}


def test_the_webhook_derivation_refuses_a_write(tmp_path: Path) -> None:
    module = tmp_path / "groups.py"
    module.write_text("watching.Reflector(x)\nasyncio.create_task(x)\n"
                      "client.CoreV1Api(api).patch_namespaced_pod('a', 'b', {})\n")
    with pytest.raises(code_access.UnresolvedCall):
        code_access.webhook_needs(module)


def test_kopf_needs_follow_its_mode() -> None:
    with_peering = code_access.kopf_needs(peering=True)
    assert code_access.kopf_is_clusterwide()
    assert code_access.kopf_is_standalone()  # one leader is elected on a Lease, not by Kopf's peering
    assert code_access.kopf_needs() == code_access.kopf_needs(peering=False)
    assert Access("kopf.dev", "clusterkopfpeerings", "patch") in with_peering
    assert not any(a.resource == "namespaces" for a in with_peering)  # cluster-wide Kopf does not scan them
    assert {a.resource for a in with_peering - code_access.kopf_needs(peering=False)} == {"clusterkopfpeerings"}
    assert "nodes" not in {a.resource for a in with_peering}  # nodes come through our own reflector


def test_the_operator_watches_nodes_pods_groups_and_quotas_with_its_own_reflectors() -> None:
    assert code_access.storage_reflected() == {
        Access("", "nodes", "list"), Access("", "nodes", "watch"),
        Access("", "pods", "list"), Access("", "pods", "watch"),
        Access("", "resourcequotas", "list"), Access("", "resourcequotas", "watch"),
        Access("deviceshare.io", "shareddevicegroups", "list"), Access("deviceshare.io", "shareddevicegroups", "watch"),
        # DRA (CONTRACT §13): the slices, classes and claims the allocation reads (storage/drastatus.py)
        *(Access("resource.k8s.io", kind, verb) for kind in ("resourceslices", "deviceclasses", "resourceclaims")
          for verb in ("list", "watch")),
    }
    assert Access("", "pods", "watch") in code_access.operator_needs()


def test_the_leader_election_lease_is_needed_in_the_operators_namespace_only() -> None:
    leases = {a for a in code_access.operator_needs() if a.resource == "leases"}
    assert leases == {Access("coordination.k8s.io", "leases", v, own_namespace=True)
                      for v in ("get", "create", "update")}


def test_groups_through_kopf_need_no_access_the_default_does_not() -> None:
    """``--groups-through-kopf`` swaps our group watch for Kopf's: the same list and watch, no CRD access (its
    scanning stays off), so the installed RBAC serves either way."""
    through_kopf = code_access.kopf_needs(groups_through_kopf=True) - code_access.kopf_needs()
    assert through_kopf == {Access("deviceshare.io", "shareddevicegroups", "list"),
                            Access("deviceshare.io", "shareddevicegroups", "watch")}
    assert code_access.operator_needs(groups_through_kopf=True) == code_access.operator_needs()
