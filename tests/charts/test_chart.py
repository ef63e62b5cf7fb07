"""The chart as ``helm lint`` / ``helm template`` see it, and its one source with the kustomize install.

The kustomize base's resource files and the cert-manager overlay's certificates are rendered from the
chart's templates (``make manifests``): a template changed without them, or a base file edited by hand,
fails here; so does any difference between what the two install paths render (objects, RBAC rules,
webhook rules, container args), in both certificate modes. Every rendered object is checked against the
Kubernetes 1.32 schemas, as the kustomize install's are.
"""

from __future__ import annotations

import copy
import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts import rendering
from tests.charts.conftest import MODES
from tests.manifests import kube_objects
from tests.manifests.test_schemas import _validate_all
from tests.monitoring.test_monitoring_manifests import validate as validate_monitoring

ROOT = rendering.ROOT
CHART = rendering.CHART
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_passes_strictly_in_each_certificate_mode(mode: str) -> None:
    proc = rendering.helm("lint", "--strict", str(CHART), f"--set=webhook.certificates={mode}", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(("values", "message"), [
    ({"operator.replica": "2"}, "at '/operator': additional properties 'replica' not allowed"),
    ({"operator.replicas": "two"}, "at '/operator/replicas': got string, want integer"),
    ({"webhook.certificates": "letsencrypt"},
     "at '/webhook/certificates': value must be one of 'self-signed', 'cert-manager', 'external'"),
    ({"mps.enabled": "true"}, "mps.enabled needs nodeAgent.enabled"),
    ({"mps.root": "run/mps"}, "at '/mps/root': 'run/mps' does not match"),
    ({"operator.leaderElect": "false"}, "operator.replicas > 1 needs operator.leaderElect: true"),
    ({"admissionPolicy.resourceClaimControllers": "system:kube-controller-manager"},
     "at '/admissionPolicy/resourceClaimControllers': got string, want array"),
])
def test_a_mistyped_or_unsupported_value_is_a_clear_error(values: dict[str, str], message: str) -> None:
    with pytest.raises(rendering.HelmError) as failed:
        rendering.template_text(values)
    assert message in str(failed.value)


def test_the_group_claim_policy_trusts_the_release_namespaces_operator_and_the_controllers_given() -> None:
    """The DRA claim policy's identities come from the release, as the other policies' do: the operator's service
    account in the namespace installed into, and admissionPolicy.resourceClaimControllers."""
    text = rendering.helm("template", rendering.RELEASE, str(CHART), "--namespace", "gpu-share",
                          "--set=admissionPolicy.resourceClaimControllers={system:kube-controller-manager}").stdout
    policy = kube_objects.one(rendering.objects(text), "ValidatingAdmissionPolicy", "deviceshare-group-claims")
    expressions = "\n".join(v["expression"] for v in policy["spec"]["validations"])
    assert "'system:serviceaccount:gpu-share:deviceshare-operator'" in expressions
    assert "deviceshare-system" not in expressions
    assert 'request.userInfo.username in ["system:kube-controller-manager"]' in expressions
    assert "resource-claim-controller" not in expressions


def test_chart_version_is_in_step_with_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == package


@pytest.mark.parametrize("mode", MODES)
def test_every_rendered_object_is_valid_for_kubernetes_1_32(
    chart_objects: dict[str, list[dict[str, Any]]], mode: str
) -> None:
    how = _validate_all(chart_objects[mode])
    assert how.count("cert-manager") == (4 if mode == "cert-manager" else 0)
    assert len(how) == len(chart_objects[mode]) > 20


def test_the_crd_is_crds_folder_and_helm_keeps_it(chart_objects: dict[str, list[dict[str, Any]]]) -> None:
    (source,) = kube_objects.load_file(ROOT / "crds" / "shareddevicegroups.yaml")
    installed = kube_objects.one(chart_objects["self-signed"], "CustomResourceDefinition", source["metadata"]["name"])
    assert installed["spec"] == source["spec"]
    assert installed["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert source["metadata"]["labels"].items() <= installed["metadata"]["labels"].items()
    dropped = rendering.objects(rendering.template_text({"crds.keep": "false"}))
    assert "annotations" not in kube_objects.one(dropped, "CustomResourceDefinition", source["metadata"]["name"])[
        "metadata"]
    assert not kube_objects.select(rendering.objects(rendering.template_text({"crds.enabled": "false"})),
                                   "CustomResourceDefinition")
    copy = CHART / "files" / "crds" / "shareddevicegroups.yaml"
    assert copy.read_text() == (ROOT / "crds" / "shareddevicegroups.yaml").read_text()  # `make manifests` copies it


def test_the_kustomize_files_are_rendered_from_the_current_chart() -> None:
    stale = rendering.stale()
    assert not stale, f"run `make manifests`: {[str(p.relative_to(ROOT)) for p in stale]} differ from the chart"


def test_a_hand_edit_of_a_rendered_file_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a copy of the repository with one base value changed is stale."""
    fake = tmp_path / "repo"
    for folder in ("manifests", "crds", "monitoring"):  # the rendered files, and the sources the chart copies
        shutil.copytree(ROOT / folder, fake / folder, dirs_exist_ok=True)
    operator = fake / "manifests" / "base" / "operator.yaml"
    operator.write_text(operator.read_text().replace("replicas: 2", "replicas: 3", 1))
    monkeypatch.setattr(rendering, "ROOT", fake)
    assert rendering.stale() == [operator]


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as both paths must agree on: Helm's own labels aside, certificate material aside."""
    out = copy.deepcopy(obj)
    labels = out["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    if out["kind"] == "CustomResourceDefinition":
        out["metadata"].pop("annotations", None)
    if out["kind"] == "Secret" and out["metadata"]["name"] == "deviceshare-webhook-tls":
        out["data"] = sorted(out.get("data", {}))
    for hook in out.get("webhooks", []):
        hook["clientConfig"].pop("caBundle", None)
    return out


def _by_ref(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {kube_objects.ref(o): _comparable(o) for o in objects}


# What only the kustomize install has: Helm installs into a namespace it is given (--create-namespace).
KUSTOMIZE_ONLY = {"Namespace deviceshare-system"}


def _assert_same_install(helm_objects: list[dict[str, Any]], kustomize_objects: list[dict[str, Any]]) -> None:
    chart, kustomize = _by_ref(helm_objects), _by_ref(kustomize_objects)
    assert set(kustomize) - set(chart) == KUSTOMIZE_ONLY
    assert set(chart) - set(kustomize) == set()
    for ref, obj in chart.items():
        assert obj == kustomize[ref], f"{ref} differs between the chart and the kustomize install:\n" + "\n".join(
            json.dumps(x, sort_keys=True)[:2000] for x in (obj, kustomize[ref]))


def test_cert_manager_mode_installs_what_the_cert_manager_overlay_installs(
    chart_objects: dict[str, list[dict[str, Any]]], cert_manager_objects: list[dict[str, Any]]
) -> None:
    _assert_same_install(chart_objects["cert-manager"], cert_manager_objects)


def test_self_signed_mode_installs_what_the_self_signed_overlay_installs(
    chart_objects: dict[str, list[dict[str, Any]]], self_signed: Any
) -> None:
    _assert_same_install(chart_objects["self-signed"], self_signed.objects)


@pytest.mark.parametrize(("value", "where"), [
    ("schedulerName=other-scheduler", "DEVICESHARE_SCHEDULER_NAME"),
    ("operator.leaderElect=false,operator.replicas=1", "--leader-elect"),
    ("admissionPolicy.enabled=false", "ValidatingAdmissionPolicy"),
])
def test_a_value_that_changes_the_install_makes_the_paths_differ(
    value: str, where: str, cert_manager_objects: list[dict[str, Any]]
) -> None:
    """The comparison can fail: a non-default value gives objects the kustomize install does not have."""
    values = dict(pair.split("=") for pair in value.split(","))
    changed = rendering.objects(rendering.template_text({"webhook.certificates": "cert-manager", **values}))
    with pytest.raises(AssertionError) as differs:
        _assert_same_install(changed, cert_manager_objects)
    assert where in str(differs.value) or "ValidatingAdmissionPolicy" in str(differs.value)


def test_container_args_rbac_and_webhook_rules_come_through_values(
    chart_objects: dict[str, list[dict[str, Any]]],
) -> None:
    """What the operator and webhook are started with, and may do, is the kustomize base's (spelled out)."""
    base = kube_objects.render(ROOT / "manifests" / "base")
    chart = chart_objects["external"]
    for kind, name in [("Deployment", "deviceshare-operator"), ("Deployment", "deviceshare-webhook")]:
        ours, theirs = kube_objects.one(chart, kind, name), kube_objects.one(base, kind, name)
        assert ours["spec"]["template"]["spec"]["containers"] == theirs["spec"]["template"]["spec"]["containers"]
    for kind in ("ClusterRole", "Role"):
        assert ({o["metadata"]["name"]: o["rules"] for o in kube_objects.select(chart, kind)}
                == {o["metadata"]["name"]: o["rules"] for o in kube_objects.select(base, kind)})
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert kube_objects.one(chart, kind, "deviceshare")["webhooks"] == kube_objects.one(
            base, kind, "deviceshare")["webhooks"]


MONITORING = {"metrics.serviceMonitor.enabled": "true", "metrics.prometheusRule.enabled": "true",
              "metrics.grafanaDashboard.enabled": "true"}


def _monitoring_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "monitoring"]


def test_the_chart_installs_what_monitoring_manifests_install() -> None:
    """The rules, dashboards and scrape objects: the same sources (monitoring/alerts.yaml, dashboards/*.json),
    the same objects as `kubectl apply -k monitoring/manifests`, each valid; none unless asked for."""
    assert not _monitoring_objects(rendering.objects(rendering.template_text()))
    chart = _monitoring_objects(rendering.objects(rendering.template_text(MONITORING)))
    kustomize = kube_objects.render(ROOT / "monitoring" / "manifests")
    assert _by_ref(chart) == _by_ref(kustomize)
    for obj in chart:
        validate_monitoring(obj)
    for name, value in MONITORING.items():
        only = _monitoring_objects(rendering.objects(rendering.template_text({name: value})))
        assert {o["kind"] for o in only} == {"metrics.serviceMonitor.enabled": {"PodMonitor"},
                                             "metrics.prometheusRule.enabled": {"PrometheusRule"},
                                             "metrics.grafanaDashboard.enabled": {"ConfigMap"}}[name]


def test_every_dashboard_and_the_rules_reach_the_chart() -> None:
    copies = CHART / "files" / "monitoring"
    for source in [ROOT / "monitoring" / "alerts.yaml", *sorted((ROOT / "monitoring" / "dashboards").glob("*.json"))]:
        copy = copies / source.relative_to(ROOT / "monitoring")
        assert copy.read_text() == source.read_text(), f"run `make manifests`: {copy} differs from {source}"


def test_the_chart_holds_no_symbolic_link() -> None:
    """Helm logs `found symbolic link in path` for each link it follows, on every command a user runs."""
    assert not [p for p in CHART.rglob("*") if p.is_symlink()]


def test_runbook_urls_get_the_base_url_a_user_gives() -> None:
    def runbooks(values: dict[str, str]) -> list[str]:
        (rule,) = [o for o in rendering.objects(rendering.template_text(values)) if o["kind"] == "PrometheusRule"]
        return [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]

    relative = runbooks({"metrics.prometheusRule.enabled": "true"})
    assert relative and all(url.startswith("docs/troubleshooting.md#") for url in relative)
    base = "https://github.com/example/deviceshare/blob/v0.1.0/"
    assert runbooks({"metrics.prometheusRule.enabled": "true", "metrics.prometheusRule.runbookBaseURL": base}) == [
        base + url for url in relative]
