"""The install grants exactly the access the operator and webhook code uses (least privilege).

What the code needs is derived from the code (:mod:`tests.manifests.code_access`), never listed by
hand, so a new API call without its RBAC rule — or a rule no code uses any more — fails here.
"""

from __future__ import annotations

import pytest

from tests.manifests import code_access, kube_objects, rbac_rules

NS = "deviceshare-system"
ALL = rbac_rules.CLUSTER_WIDE
OPERATOR = f"{NS}/deviceshare-operator"
WEBHOOK = f"{NS}/deviceshare-webhook"
ACCOUNTS = (OPERATOR, WEBHOOK)


def _args(objects: list[kube_objects.KubeObject], component: str) -> list[str]:
    deployment = next(d for d in kube_objects.select(objects, "Deployment")
                      if d["metadata"]["name"] == f"deviceshare-{component}")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


@pytest.fixture(scope="module")
def expected(base_objects: list[kube_objects.KubeObject]) -> dict[str, set[rbac_rules.Rule]]:
    # Everything runs cluster-wide (the operator is a cluster-wide Kopf operator and scheduler), so every
    # need is a cluster-wide rule, except the leader-election Lease: only in the operator's namespace,
    # and only when the Deployment runs with --leader-elect.
    electing = "--leader-elect" in _args(base_objects, "operator")
    return {
        OPERATOR: {rbac_rules.Rule(NS if a.own_namespace else ALL, *a[:3])
                   for a in code_access.operator_needs() if electing or not a.own_namespace},
        WEBHOOK: {rbac_rules.Rule(ALL, *a[:3]) for a in code_access.webhook_needs()},
    }


@pytest.fixture(scope="module")
def grants(base_objects: list[kube_objects.KubeObject]) -> set[rbac_rules.Grant]:
    return rbac_rules.grants(base_objects)


@pytest.mark.parametrize("account", ACCOUNTS)
def test_each_account_gets_exactly_what_its_code_uses(
    grants: set[rbac_rules.Grant], expected: dict[str, set[rbac_rules.Rule]], account: str
) -> None:
    actual = rbac_rules.rules_of(grants, account)
    assert actual - expected[account] == set(), "granted but no code uses it"
    assert expected[account] - actual == set(), "the code uses it but it is not granted"


def test_only_the_two_accounts_are_granted_anything(grants: set[rbac_rules.Grant]) -> None:
    assert {g.account for g in grants} == set(ACCOUNTS)


def test_no_wildcards_no_secrets_no_escalation(base_objects: list[kube_objects.KubeObject]) -> None:
    for role in kube_objects.select(base_objects, "ClusterRole") + kube_objects.select(base_objects, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{kube_objects.ref(role)}: wildcard in {field}"
            assert "secrets" not in rule["resources"], kube_objects.ref(role)
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            # delete: only a DRA group's own ResourceClaim at release (pods go through the Eviction API)
            if "delete" in rule["verbs"]:
                assert (rule["apiGroups"], rule["resources"]) == (["resource.k8s.io"], ["resourceclaims"])


def test_deployments_run_as_the_accounts_that_hold_the_grants(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    accounts = {f"{d['metadata']['namespace']}/{d['spec']['template']['spec']['serviceAccountName']}"
                for d in kube_objects.select(base_objects, "Deployment")}
    assert accounts == set(ACCOUNTS)
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
