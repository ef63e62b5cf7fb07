"""The node agent component and the MPS overlay render into objects the API server accepts, whose pieces
agree with each other and with the code (RBAC exactly what the agent calls; one MPS root everywhere)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.charts import rendering
from tests.charts.test_chart import _assert_same_install
from tests.manifests import code_access, kube_objects, rbac_rules
from tests.manifests.test_schemas import _validate_all

ROOT = Path(__file__).resolve().parents[2]
NS = "deviceshare-node"
AGENT = f"{NS}/deviceshare-node-agent"
PUBLISHING = ROOT / "src" / "deviceshare" / "nodeagent" / "publishing.py"


def _render(tmp: Path, components: list[str]) -> list[kube_objects.KubeObject]:
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations")
    shutil.copytree(ROOT / "manifests", tmp / "manifests")
    shutil.copytree(ROOT / "crds", tmp / "crds")
    install = tmp / "manifests" / "overlays" / "install"
    install.mkdir()
    listed = ", ".join(components)
    (install / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../cert-manager]\ncomponents: [{listed}]\n"
    )
    return kube_objects.render(install)


@pytest.fixture(scope="module")
def with_agent(tmp_path_factory: pytest.TempPathFactory) -> list[kube_objects.KubeObject]:
    return _render(tmp_path_factory.mktemp("agent"), ["../../node-agent"])


@pytest.fixture(scope="module")
def with_mps(tmp_path_factory: pytest.TempPathFactory) -> list[kube_objects.KubeObject]:
    return _render(tmp_path_factory.mktemp("mps"), ["../../node-agent", "../mps"])


def test_every_object_is_valid_and_part_of_deviceshare(
    with_agent: list[kube_objects.KubeObject], with_mps: list[kube_objects.KubeObject]
) -> None:
    for objects in (with_agent, with_mps):
        _validate_all(objects)
        for obj in objects:
            assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "deviceshare", \
                kube_objects.ref(obj)


def agent_needs() -> set[rbac_rules.Rule]:
    """Every ``rest.call(self._api, METHOD, self._path ...)`` of the agent's publishing module, as RBAC."""
    tree = ast.parse(PUBLISHING.read_text())
    methods = {
        node.args[1].value for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call"
        and len(node.args) >= 3 and isinstance(node.args[1], ast.Constant)
    }
    assert "self._path = f\"/api/v1/nodes/{" in PUBLISHING.read_text(), "the agent's one path moved"
    return {rbac_rules.Rule(rbac_rules.CLUSTER_WIDE, *code_access.access_for(m, "/api/v1/nodes/{}")[:3])
            for m in methods}


def test_the_agent_may_get_and_patch_nodes_and_nothing_else(with_agent: list[kube_objects.KubeObject]) -> None:
    granted = rbac_rules.rules_of(rbac_rules.grants(with_agent), AGENT)
    assert granted == agent_needs() == {rbac_rules.Rule("*", "", "nodes", "get"),
                                        rbac_rules.Rule("*", "", "nodes", "patch")}


def _pod(objects: list[kube_objects.KubeObject], name: str) -> dict[str, Any]:
    return dict(kube_objects.one(objects, "DaemonSet", name)["spec"]["template"]["spec"])


def test_the_policy_names_the_account_the_agent_runs_as(with_agent: list[kube_objects.KubeObject]) -> None:
    pod = _pod(with_agent, "deviceshare-node-agent")
    daemonset = kube_objects.one(with_agent, "DaemonSet", "deviceshare-node-agent")
    account = f"system:serviceaccount:{daemonset['metadata']['namespace']}:{pod['serviceAccountName']}"
    policy = kube_objects.one(with_agent, "ValidatingAdmissionPolicy", "deviceshare-node-agent")
    assert f"'{account}'" in policy["spec"]["matchConditions"][0]["expression"]
    binding = kube_objects.one(with_agent, "ValidatingAdmissionPolicyBinding", "deviceshare-node-agent")
    assert binding["spec"]["policyName"] == "deviceshare-node-agent"
    assert binding["spec"]["validationActions"] == ["Deny"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_without_mps_the_agent_passes_the_restricted_pod_security_level(
    with_agent: list[kube_objects.KubeObject],
) -> None:
    pod = _pod(with_agent, "deviceshare-node-agent")
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert not pod.get("volumes") and not pod.get("hostNetwork") and not pod.get("hostPID")


def _args(objects: list[kube_objects.KubeObject], kind: str, name: str) -> list[str]:
    spec = kube_objects.one(objects, kind, name)["spec"]["template"]["spec"]
    return list(spec["containers"][0].get("args", []))


def test_the_mps_overlay_switches_every_piece_on_with_one_root(with_mps: list[kube_objects.KubeObject]) -> None:
    assert "--mps" in _args(with_mps, "Deployment", "deviceshare-operator")
    roots = [a.split("=", 1)[1] for a in _args(with_mps, "Deployment", "deviceshare-webhook")
             if a.startswith("--mps-root=")]
    assert roots == ["/run/deviceshare/mps"]
    pipe = f"{roots[0]}/pipe"
    assert f"--mps-pipe-directory={pipe}" in _args(with_mps, "DaemonSet", "deviceshare-node-agent")
    agent = _pod(with_mps, "deviceshare-node-agent")
    assert {v["hostPath"]["path"] for v in agent["volumes"]} == {pipe}
    assert agent["containers"][0]["volumeMounts"][0]["readOnly"] is True

    daemon = _pod(with_mps, "deviceshare-mps-control-daemon")
    env = {e["name"]: e["value"] for e in daemon["containers"][0]["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert {v["hostPath"]["path"] for v in daemon["volumes"]} == {roots[0], f"{roots[0]}/shm"}
    namespace = kube_objects.one(with_mps, "Namespace", NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert kube_objects.one(with_mps, "DaemonSet", "deviceshare-mps-control-daemon")["metadata"]["namespace"] == NS


@pytest.mark.parametrize("mps", [False, True])
def test_the_chart_installs_what_the_components_install(
    with_agent: list[kube_objects.KubeObject], with_mps: list[kube_objects.KubeObject], mps: bool
) -> None:
    """One source: nodeAgent.enabled (and mps.enabled) in the chart, the kustomize components beside an overlay."""
    values = {"webhook.certificates": "cert-manager", "nodeAgent.enabled": "true", "mps.enabled": str(mps).lower()}
    chart = rendering.objects(rendering.template_text(values))
    _validate_all(chart)
    _assert_same_install(chart, with_mps if mps else with_agent)


def test_helm_lint_passes_with_the_node_agent_and_mps() -> None:
    proc = rendering.helm("lint", "--strict", str(rendering.CHART), "--set=nodeAgent.enabled=true",
                          "--set=mps.enabled=true", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
