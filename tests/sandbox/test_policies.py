"""ValidatingAdmissionPolicy in the sandbox: stored, discovered, and evaluated on writes as kube-apiserver does."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.sandbox import Sandbox, catalog, identity, policies
from tests.sandbox.helpers import PODS, Http, pod

TENANT = {"Authorization": f"Bearer {identity.TENANT_TOKEN}"}
OPERATOR = {"Authorization": f"Bearer {identity.OPERATOR_TOKEN}"}
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAPB = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
PODS_TYPE = catalog.ResourceType("", "v1", "pods", "Pod")


def policy(name: str, expression: str, **validation: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "failurePolicy": validation.pop("failurePolicy", "Fail"),
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                "operations": ["CREATE", "UPDATE"],
                                                "resources": validation.pop("resources", ["pods"])}]},
        "validations": [{"expression": expression, **validation}],
    }
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": spec}


def binding(name: str, actions: tuple[str, ...] = ("Deny",), **match: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": name, "validationActions": list(actions)}
    if match:
        spec["matchResources"] = match
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": spec}


async def install(http: Http, vap: dict[str, Any], vapb: dict[str, Any]) -> None:
    assert (await http.call("POST", VAP, vap))[0] == 201
    assert (await http.call("POST", VAPB, vapb))[0] == 201


@pytest.mark.parametrize(("allowed", "plural", "sub", "expected"), [
    (["pods"], "pods", "", True),
    (["pods"], "pods", "binding", False),
    (["pods/binding"], "pods", "binding", True),
    (["pods/*"], "pods", "status", True),
    (["pods/*"], "pods", "", False),
    (["*"], "nodes", "", True),
    (["*"], "pods", "status", False),
    (["*/status"], "pods", "status", True),
    (["*/*"], "pods", "ephemeralcontainers", True),
])
def test_resource_rules_treat_subresources_as_kube_apiserver(
    allowed: list[str], plural: str, sub: str, expected: bool
) -> None:
    assert policies.resource_matches(allowed, plural, sub) is expected


async def test_policies_are_served_and_discoverable(http: Http) -> None:
    status, resources = await http.call("GET", "/apis/admissionregistration.k8s.io/v1")
    assert status == 200
    assert {"validatingadmissionpolicies", "validatingadmissionpolicybindings"} <= {
        r["name"] for r in resources["resources"]}
    await install(http, policy("p", "true"), binding("p"))
    status, listed = await http.call("GET", VAPB)
    assert [b["metadata"]["name"] for b in listed["items"]] == ["p"]
    assert (await http.call("DELETE", f"{VAP}/p"))[0] == 200


async def test_without_a_policy_every_user_writes_as_before(http: Http) -> None:
    assert (await http.call("POST", PODS, pod("p"), headers=TENANT))[0] == 201
    status, _ = await http.call("PATCH", f"{PODS}/p", {"metadata": {"annotations": {"x": "y"}}},
                                content_type="application/merge-patch+json", headers=TENANT)
    assert status == 200


async def test_a_denial_names_the_rule_and_the_user_from_the_bearer_token(http: Http) -> None:
    await install(http, policy(
        "only-operator", "request.userInfo.username.startsWith('system:serviceaccount:')",
        messageExpression="'rule only-operator: ' + request.userInfo.username + ' may not ' + request.operation",
        message="static fallback", reason="Forbidden"), binding("only-operator"))
    status, body = await http.call("POST", PODS, pod("p"), headers=TENANT)
    assert (status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == ("ValidatingAdmissionPolicy 'only-operator' with binding 'only-operator' denied "
                               "request: rule only-operator: tenant-alice may not CREATE")
    assert (await http.call("POST", PODS, pod("p"), headers=OPERATOR))[0] == 201
    # No token, or one the sandbox does not know: the admin, as every existing client.
    status, body = await http.call("POST", PODS, pod("q"))
    assert status == 403 and "system:admin may not CREATE" in body["message"]


async def test_message_falls_back_and_reason_sets_the_code(http: Http) -> None:
    await install(http, policy("p", "false", messageExpression="''", message="rule p: no"), binding("p"))
    status, body = await http.call("POST", PODS, pod("p"))
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"].endswith("denied request: rule p: no")


async def test_only_deny_actions_refuse(http: Http) -> None:
    await install(http, policy("p", "false"), binding("p", ("Warn", "Audit")))
    assert (await http.call("POST", PODS, pod("p")))[0] == 201


@pytest.mark.parametrize(("failure_policy", "status"), [("Fail", 403), ("Ignore", 201)])
async def test_an_expression_that_fails_follows_the_failure_policy(
    http: Http, failure_policy: str, status: int
) -> None:
    await install(http, policy("p", "object.spec.nonexistent.field == 1", failurePolicy=failure_policy),
                  binding("p"))
    assert (await http.call("POST", PODS, pod("p")))[0] == status


async def test_the_bindings_namespace_selector_exempts_namespaces(http: Http, sandbox: Sandbox) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "exempt", "labels": {"exempt": "true"}}})
    selector = {"matchExpressions": [{"key": "exempt", "operator": "NotIn", "values": ["true"]}]}
    await install(http, policy("p", "false"), binding("p", namespaceSelector=selector))
    assert (await http.call("POST", PODS, pod("p")))[0] == 422
    exempt = pod("p", metadata={"namespace": "exempt"})
    assert (await http.call("POST", "/api/v1/namespaces/exempt/pods", exempt))[0] == 201


async def test_updates_see_old_and_new_and_the_subresource(http: Http, sandbox: Sandbox) -> None:
    await install(http, policy(
        "frozen", "request.operation != 'UPDATE' || object.metadata.labels == oldObject.metadata.labels",
        resources=["pods", "pods/status"]), binding("frozen"))
    assert (await http.call("POST", PODS, pod("p", metadata={"labels": {"a": "1"}})))[0] == 201
    patch = {"metadata": {"labels": {"a": "2"}}}
    status, _ = await http.call("PATCH", f"{PODS}/p", patch, content_type="application/merge-patch+json")
    assert status == 422
    assert sandbox.get("pods", "p", "default")["metadata"]["labels"] == {"a": "1"}  # type: ignore[index]
    status, _ = await http.call("PATCH", f"{PODS}/p/status", {"status": {"phase": "Running"}},
                                content_type="application/merge-patch+json")
    assert status == 200


async def test_a_binding_is_admitted_as_a_pods_binding_create(http: Http) -> None:
    await install(http, policy(
        "no-annotated-bindings",
        "request.subResource != 'binding' || object.kind != 'Binding' || !has(object.metadata.annotations)",
        resources=["pods/binding"]), binding("no-annotated-bindings"))
    assert (await http.call("POST", PODS, pod("p")))[0] == 201
    assert (await http.call("POST", PODS, pod("q")))[0] == 201
    annotated = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "annotations": {"a": "b"}},
                 "target": {"kind": "Node", "name": "gpu-node-0"}}
    assert (await http.call("POST", f"{PODS}/p/binding", annotated))[0] == 422
    plain = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "q"},
             "target": {"kind": "Node", "name": "gpu-node-0"}}
    assert (await http.call("POST", f"{PODS}/q/binding", plain))[0] == 201


async def test_a_policy_sees_whether_the_request_is_a_dry_run(http: Http) -> None:
    await install(http, policy("no-rehearsals", "!request.dryRun", message="no dry runs here"),
                  binding("no-rehearsals"))
    status, error = await http.call("POST", PODS, pod("tried"), params={"dryRun": "All"})
    assert status == 422 and "no dry runs here" in error["message"], error
    assert (await http.call("POST", PODS, pod("kept")))[0] == 201


async def test_the_schema_answers_a_malformed_object_before_validating_admission(http: Http) -> None:
    """kube-apiserver validates the object (rest.BeforeCreate/BeforeUpdate) before calling validating admission:
    a group whose resources are not numbers gets the schema's message, not a policy's or a webhook's."""
    everything = policy("no-groups", "false", message="denied by the policy", resources=["shareddevicegroups"])
    everything["spec"]["matchConstraints"]["resourceRules"][0]["apiGroups"] = ["deviceshare.io"]
    everything["spec"]["matchConstraints"]["resourceRules"][0]["apiVersions"] = ["v1alpha1"]
    await install(http, everything, binding("no-groups"))
    groups = "/apis/deviceshare.io/v1alpha1/namespaces/default/shareddevicegroups"
    bad = {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
           "metadata": {"name": "g", "namespace": "default"}, "spec": {"resources": {"nvidia.com/gpu": "two"}}}
    status, answer = await http.call("POST", groups, bad)
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert "must be of type integer" in answer["message"] and "denied by the policy" not in answer["message"]
    good = {**bad, "spec": {"resources": {"nvidia.com/gpu": 1}}}
    status, answer = await http.call("POST", groups, good)
    assert status == 422 and "denied by the policy" in answer["message"]  # the policy does run on a valid group
