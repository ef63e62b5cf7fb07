"""The install grants exactly the access the operator and webhook need (least privilege).

The expected tables are the requirement (issue 6); the comparison with what the code calls is
made elsewhere with :func:`tests.manifests.rbac_rules.grants`.
"""

from __future__ import annotations

import pytest

from tests.manifests import kube_objects, rbac_rules

NS = "deviceshare-system"
ALL = rbac_rules.CLUSTER_WIDE
OPERATOR = f"{NS}/deviceshare-operator"
WEBHOOK = f"{NS}/deviceshare-webhook"

EXPECTED = {
    OPERATOR: rbac_rules.expand({
        (ALL, "deviceshare.io", "shareddevicegroups"): ["get", "list", "watch", "patch", "update"],
        (ALL, "deviceshare.io", "shareddevicegroups/status"): ["get", "patch", "update"],
        (ALL, "", "pods"): ["get", "list", "watch", "patch"],
        (ALL, "", "pods/binding"): ["create"],
        (ALL, "", "pods/status"): ["patch"],
        (ALL, "", "nodes"): ["get", "list", "watch"],
        (ALL, "", "events"): ["create", "patch"],
        (ALL, "events.k8s.io", "events"): ["create", "patch"],
        (ALL, "", "namespaces"): ["list", "watch"],
        (ALL, "apiextensions.k8s.io", "customresourcedefinitions"): ["list", "watch"],
        (NS, "kopf.dev", "kopfpeerings"): ["get", "list", "watch", "patch"],
        (NS, "", "configmaps"): ["get", "list", "watch"],
    }),
    WEBHOOK: rbac_rules.expand({
        (ALL, "deviceshare.io", "shareddevicegroups"): ["get", "list", "watch"],
        (ALL, "", "pods"): ["list", "watch"],
    }),
}


@pytest.fixture(scope="module")
def grants(base_objects: list[kube_objects.KubeObject]) -> set[rbac_rules.Grant]:
    return rbac_rules.grants(base_objects)


@pytest.mark.parametrize("account", sorted(EXPECTED))
def test_each_account_gets_exactly_the_expected_rules(grants: set[rbac_rules.Grant], account: str) -> None:
    actual = rbac_rules.rules_of(grants, account)
    assert actual - EXPECTED[account] == set(), "granted but not needed"
    assert EXPECTED[account] - actual == set(), "needed but not granted"


def test_only_the_two_accounts_are_granted_anything(grants: set[rbac_rules.Grant]) -> None:
    assert {g.account for g in grants} == set(EXPECTED)


def test_no_wildcards_no_secrets_no_escalation(base_objects: list[kube_objects.KubeObject]) -> None:
    for role in kube_objects.select(base_objects, "ClusterRole") + kube_objects.select(base_objects, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{kube_objects.ref(role)}: wildcard in {field}"
            assert "secrets" not in rule["resources"], kube_objects.ref(role)
            assert not {"escalate", "bind", "impersonate", "delete", "deletecollection"} & set(rule["verbs"])


def test_deployments_run_as_the_accounts_that_hold_the_grants(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    accounts = {f"{d['metadata']['namespace']}/{d['spec']['template']['spec']['serviceAccountName']}"
                for d in kube_objects.select(base_objects, "Deployment")}
    assert accounts == set(EXPECTED)
    declared = {f"{sa['metadata']['namespace']}/{sa['metadata']['name']}"
                for sa in kube_objects.select(base_objects, "ServiceAccount")}
    assert accounts <= declared


@pytest.mark.parametrize(("broken", "error"), [
    ({"kind": "ClusterRoleBinding", "metadata": {"name": "x"},
      "roleRef": {"kind": "ClusterRole", "name": "missing"}, "subjects": []}, LookupError),
    ({"kind": "RoleBinding", "metadata": {"name": "x", "namespace": NS},
      "roleRef": {"kind": "ClusterRole", "name": "deviceshare-webhook"},
      "subjects": [{"kind": "User", "name": "alice"}]}, ValueError),
])
def test_grants_refuses_what_it_cannot_model(
    base_objects: list[kube_objects.KubeObject], broken: kube_objects.KubeObject, error: type[Exception]
) -> None:
    with pytest.raises(error):
        rbac_rules.grants([*base_objects, broken])


def test_a_rolebinding_to_a_clusterrole_grants_only_in_its_namespace(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    extra = {"kind": "RoleBinding", "metadata": {"name": "x", "namespace": "ml"},
             "roleRef": {"kind": "ClusterRole", "name": "deviceshare-webhook"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ml"}]}
    rules = rbac_rules.rules_of(rbac_rules.grants([*base_objects, extra]), "ml/reader")
    assert {r.scope for r in rules} == {"ml"}
    assert rbac_rules.Rule("ml", "", "pods", "list") in rules
