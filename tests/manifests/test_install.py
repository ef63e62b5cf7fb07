"""The base installs a working operator and webhook: the pieces point at each other correctly.

Each check is something a user would hit as a broken install: a probe on a port nobody listens
on, a Service or PodDisruptionBudget that selects no pod, a webhook call that goes nowhere, a pod
that the `restricted` Pod Security level refuses.
"""

from __future__ import annotations

from typing import Any

import celpy
import celpy.adapter
import pytest
import yaml

from deviceshare.api import envnames, names
from tests.manifests import kube_objects

NS = "deviceshare-system"
IMAGE = "ghcr.io/deviceshare/deviceshare:0.1.0"


def _deployment(objects: list[kube_objects.KubeObject], component: str) -> kube_objects.KubeObject:
    return kube_objects.one(objects, "Deployment", f"deviceshare-{component}")


def _container(deployment: kube_objects.KubeObject) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("component", ["operator", "webhook"])
def test_two_replicas_spread_over_nodes_and_a_budget_keeps_one(
    base_objects: list[kube_objects.KubeObject], component: str
) -> None:
    deployment = _deployment(base_objects, component)
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert kube_objects.selector_matches(deployment["spec"]["selector"], labels)
    terms = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
               and kube_objects.selector_matches(t["podAffinityTerm"]["labelSelector"], labels)
               for t in terms)
    budgets = [p for p in kube_objects.select(base_objects, "PodDisruptionBudget")
               if kube_objects.selector_matches(p["spec"]["selector"], labels)]
    assert len(budgets) == 1
    assert budgets[0]["spec"]["minAvailable"] == 1


def test_budgets_and_deployments_do_not_select_each_others_pods(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    operator_labels = _deployment(base_objects, "operator")["spec"]["template"]["metadata"]["labels"]
    webhook = _deployment(base_objects, "webhook")
    assert not kube_objects.selector_matches(webhook["spec"]["selector"], operator_labels)


@pytest.mark.parametrize("component", ["operator", "webhook"])
def test_containers_pass_the_restricted_pod_security_level(
    base_objects: list[kube_objects.KubeObject], component: str
) -> None:
    deployment = _deployment(base_objects, component)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    namespace = kube_objects.one(base_objects, "Namespace", NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("component", ["operator", "webhook"])
def test_probes_target_a_declared_port(base_objects: list[kube_objects.KubeObject], component: str) -> None:
    container = _container(_deployment(base_objects, component))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["port"] in ports


def test_operator_runs_the_operator_command_with_its_environment(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    container = _container(_deployment(base_objects, "operator"))
    assert container["image"] == IMAGE
    assert [*container["command"], *container.get("args", [])] == [
        "deviceshare", "operator", "--leader-elect", "--env-config", "/config/env-names.yaml",
        "--handover=env", "--cdi-kind=nvidia.com/gpu=nvidia.com/gpu"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _deployment(base_objects, "operator")["spec"]["template"]["spec"]["volumes"]}
    assert mounts["env-names"] == "/config"
    assert volumes["env-names"]["configMap"]["name"] == "deviceshare-env-names"
    kube_objects.one(base_objects, "ConfigMap", "deviceshare-env-names")
    env = _env(container)
    assert env[names.ENV_NAMESPACE] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env[names.ENV_SCHEDULER_NAME] == names.DEFAULT_SCHEDULER_NAME
    assert {p["containerPort"] for p in container["ports"]} == {8080}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_webhook_serves_tls_from_the_mounted_secret_and_reads_the_env_names(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    deployment = _deployment(base_objects, "webhook")
    container = _container(deployment)
    argv = [*container["command"], *container.get("args", [])]
    assert argv[:2] == ["deviceshare", "webhook"]
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags["--port"] == "8443"
    assert _env(container)[names.ENV_SCHEDULER_NAME] == names.DEFAULT_SCHEDULER_NAME

    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}

    def volume_for(path: str) -> dict[str, Any]:
        directory, _, _ = path.rpartition("/")
        return dict(volumes[mounts[directory]])

    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        assert flags[flag].endswith("/" + key)
        assert volume_for(flags[flag])["secret"]["secretName"] == "deviceshare-webhook-tls"
    config_volume = volume_for(flags["--env-config"])
    config_map = kube_objects.one(base_objects, "ConfigMap", config_volume["configMap"]["name"])
    assert flags["--env-config"].rpartition("/")[2] in config_map["data"]

    https = {p["name"]: p["containerPort"] for p in container["ports"]}["https"]
    assert https == int(flags["--port"])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}


def test_default_env_names_config_keeps_the_built_in_mapping(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    text = kube_objects.one(base_objects, "ConfigMap", "deviceshare-env-names")["data"]["env-names.yaml"]
    assert envnames.EnvNames.from_mapping(yaml.safe_load(text)).as_dict() == envnames.EnvNames().as_dict()


def test_the_commented_cuda_example_works_when_uncommented(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    text = kube_objects.one(base_objects, "ConfigMap", "deviceshare-env-names")["data"]["env-names.yaml"]
    example = [line.removeprefix("# ") for line in text.splitlines()
               if line.startswith("# envNames:") or line.startswith("#   ")]
    mapping = envnames.EnvNames.from_mapping(yaml.safe_load("\n".join(example)))
    assert mapping.for_resource("nvidia.com/gpu") == ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def test_service_reaches_the_webhook_pods_on_their_tls_port(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    service = kube_objects.one(base_objects, "Service", "deviceshare-webhook")
    pods = [t for _, t in kube_objects.pod_templates(base_objects)
            if kube_objects.selector_matches({"matchLabels": service["spec"]["selector"]},
                                             t["metadata"]["labels"])]
    assert len(pods) == 1
    container = pods[0]["spec"]["containers"][0]
    assert container["name"] == "webhook"
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    assert port["targetPort"] in {p["name"] for p in container["ports"]}


def _webhook(objects: list[kube_objects.KubeObject], name: str = "pods.deviceshare.io") -> dict[str, Any]:
    config = kube_objects.one(objects, "MutatingWebhookConfiguration", "deviceshare")
    (webhook,) = [w for w in config["webhooks"] if w["name"] == name]
    return dict(webhook)


def test_admission_calls_go_to_the_webhook_service(base_objects: list[kube_objects.KubeObject]) -> None:
    webhook = _webhook(base_objects)
    target = webhook["clientConfig"]["service"]
    service = kube_objects.one(base_objects, "Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"]
    assert target["port"] in {p["port"] for p in service["spec"]["ports"]}
    assert target["path"] == "/mutate-pods"
    assert webhook["name"] == "pods.deviceshare.io"
    assert webhook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"], "scope": "Namespaced"}]
    assert (webhook["failurePolicy"], webhook["sideEffects"]) == ("Fail", "None")
    assert webhook["timeoutSeconds"] == 5
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["admissionReviewVersions"] == ["v1"]
    finalizer = _webhook(base_objects, "group-finalizer.deviceshare.io")
    assert finalizer["clientConfig"]["service"] == {**target, "path": "/mutate-groups"}
    assert (finalizer["failurePolicy"], finalizer["sideEffects"]) == ("Ignore", "None")


@pytest.mark.parametrize(("annotations", "called"), [
    (None, False),
    ({}, False),
    ({"team": "ml"}, False),
    ({names.POD_GROUP_ANNOTATION: "trainer"}, True),
    ({names.POD_GROUP_ANNOTATION: ""}, True),  # the webhook itself denies an empty name, with a message
    ({"team": "ml", names.POD_GROUP_ANNOTATION: "x"}, True),
])
def test_only_pods_that_opt_in_reach_the_webhook(
    base_objects: list[kube_objects.KubeObject], annotations: dict[str, str] | None, called: bool
) -> None:
    """The matchConditions, evaluated as CEL the way the API server does."""
    env = celpy.Environment()
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {}}
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    results = [env.program(env.compile(c["expression"])).evaluate({"object": celpy.adapter.json_to_cel(pod)})
               for c in _webhook(base_objects)["matchConditions"]]
    assert all(bool(r) for r in results) is called


@pytest.mark.parametrize(("namespace", "called"), [
    ("kube-system", False), (NS, False), ("default", True), ("ml", True),
])
def test_system_namespaces_are_never_sent_to_the_webhook(
    base_objects: list[kube_objects.KubeObject], namespace: str, called: bool
) -> None:
    selector = _webhook(base_objects)["namespaceSelector"]
    # Every namespace carries this label (set by the API server since 1.22).
    assert kube_objects.selector_matches(selector, {"kubernetes.io/metadata.name": namespace}) is called


def test_leader_election_needs_no_kopf_peering_and_only_a_namespaced_role(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    # The replicas elect a leader on a Lease (created by the first one); Kopf runs standalone.
    assert not any("kopf" in str(o["apiVersion"]) or "kopf" in o["metadata"]["name"] for o in base_objects)
    role = kube_objects.one(base_objects, "Role", "deviceshare-operator-leader-election")
    assert role["metadata"]["namespace"] == NS
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]
    assert all("leases" not in r["resources"] for c in kube_objects.select(base_objects, "ClusterRole")
               for r in c["rules"])


def test_the_shareddevicegroup_crd_is_installed(base_objects: list[kube_objects.KubeObject]) -> None:
    crd = kube_objects.one(base_objects, "CustomResourceDefinition", f"{names.PLURAL}.{names.GROUP}")
    assert crd["spec"]["names"]["kind"] == names.KIND


def test_a_dra_group_claims_status_is_guarded_by_a_policy_that_fails_closed(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    """`kubectl apply -k manifests/base` installs deviceshare-group-claims (docs/security.md), bound to deny, on the
    claims and their status subresource, trusting the operator's account and the resourceclaim controller's."""
    policy = kube_objects.one(base_objects, "ValidatingAdmissionPolicy", "deviceshare-group-claims")
    binding = kube_objects.one(base_objects, "ValidatingAdmissionPolicyBinding", "deviceshare-group-claims")
    assert binding["spec"] == {"policyName": "deviceshare-group-claims", "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
        "resources": ["resourceclaims", "resourceclaims/status"]}]
    rules = [v["messageExpression"].split(":")[0].removeprefix("'rule ") for v in spec["validations"]]
    assert rules == ["group-claim-operator-made", "group-claim-marks-fixed", "group-claim-finalizer-operator-only",
                     "group-claim-no-delete-protection", "group-claim-allocation-operator-only",
                     "group-claim-reserved-for-operator-only"]
    expressions = "\n".join(v["expression"] for v in spec["validations"])
    assert f"'system:serviceaccount:{NS}:deviceshare-operator'" in expressions
    assert '"system:serviceaccount:kube-system:resource-claim-controller"' in expressions
    assert f"'{names.POD_GROUP_LABEL}' in object.metadata.labels" in spec["matchConditions"][0]["expression"]
