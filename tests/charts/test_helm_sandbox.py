"""The chart installed by a real Helm 4, with Helm's defaults (server-side apply), on the sandbox.

Install, status, upgrade, rollback and uninstall exit 0 and do what a user expects of them; then the
operator and the webhook are started from the container commands and args the chart installed (their
mounts laid out as files, ports made free ones), and a group created through kubectl is admitted by that
webhook — whose serving certificate and caBundle the chart made — and bound by that operator.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceshare.sandbox import Sandbox, identity
from deviceshare.sandbox.store import WatchEvent
from tests.charts import helm_binary, rendering

NS = "deviceshare-system"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(cluster: Sandbox, *command: str) -> subprocess.CompletedProcess[str]:
    """A helm or kubectl command against the sandbox, as a user types it."""
    binary = str(helm_binary.ensure()) if command[0] == "helm" else command[0]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return await asyncio.to_thread(subprocess.run, [binary, *command[1:]], cwd=rendering.ROOT, env=env,
                                   capture_output=True, text=True, timeout=300, check=False)


async def until(cluster: Sandbox, found: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Wait for the write after which ``found()`` holds (checked at once and on every watch event)."""
    changed = asyncio.Event()

    def listener(_: WatchEvent) -> None:
        changed.set()

    cluster.store.listeners.append(listener)
    try:
        async with asyncio.timeout(timeout):
            while not (result := found()):
                changed.clear()
                await changed.wait()
            return result
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
    finally:
        cluster.store.listeners.remove(listener)


@pytest.fixture
async def fresh(tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A sandbox as a new cluster is: no deviceshare CRD yet; the webhook Service served on a local port."""
    (tmp_path / "no-crds").mkdir()
    port = free_port()
    async with Sandbox(nodes=2, gpus=4, crds=tmp_path / "no-crds", kubeconfig_path=tmp_path / "kubeconfig",
                       kubelet_delay=0.01, service_endpoints={(NS, "deviceshare-webhook"): f"https://127.0.0.1:{port}"},
                       ) as cluster:
        cluster.webhook_port = port  # type: ignore[attr-defined]
        yield cluster


def _helm_owned(obj: dict[str, Any]) -> bool:
    return any(e["manager"] == "helm" and e["operation"] == "Apply" for e in obj["metadata"].get("managedFields", []))


async def test_install_and_uninstall_with_helm_defaults(fresh: Sandbox) -> None:
    installed = await run(fresh, "helm", "install", "deviceshare", "charts/deviceshare", "-n", NS, "--create-namespace")
    assert installed.returncode == 0, installed.stderr
    assert "STATUS: deployed" in installed.stdout and "kubectl get sdg -A" in installed.stdout  # NOTES.txt
    assert "symbolic link" not in installed.stderr  # the chart is plain files: Helm has no link to report
    assert "restartPolicy: Never" in installed.stdout  # the notes' first pod lists its GPUs once, then is done
    operator = fresh.get("deployments", "deviceshare-operator", NS)
    assert operator is not None and _helm_owned(operator)  # applied server-side, by the field manager "helm"
    assert fresh.get("customresourcedefinitions", "shareddevicegroups.deviceshare.io") is not None
    status = await run(fresh, "helm", "status", "deviceshare", "-n", NS)
    assert status.returncode == 0 and "STATUS: deployed" in status.stdout
    removed = await run(fresh, "helm", "uninstall", "deviceshare", "-n", NS)
    assert removed.returncode == 0, removed.stderr
    assert fresh.get("deployments", "deviceshare-operator", NS) is None
    assert fresh.get("mutatingwebhookconfigurations", "deviceshare") is None
    assert not [s for s in fresh.list("secrets", NS) if s["metadata"]["name"].startswith("sh.helm.release")]
    assert fresh.get("customresourcedefinitions", "shareddevicegroups.deviceshare.io") is not None  # kept


async def test_upgrade_and_rollback_change_the_install_and_keep_its_certificate(fresh: Sandbox) -> None:
    chart = ("charts/deviceshare", "-n", NS)
    first = await run(fresh, "helm", "install", "deviceshare", *chart, "--create-namespace",
                      "--set", "operator.replicas=1")
    assert first.returncode == 0, first.stderr
    secret = fresh.get("secrets", "deviceshare-webhook-tls", NS)
    bundle = fresh.get("mutatingwebhookconfigurations", "deviceshare")["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])

    upgraded = await run(fresh, "helm", "upgrade", "deviceshare", *chart, "--set", "operator.replicas=2")
    assert upgraded.returncode == 0, upgraded.stderr
    assert fresh.get("deployments", "deviceshare-operator", NS)["spec"]["replicas"] == 2
    assert fresh.get("secrets", "deviceshare-webhook-tls", NS)["data"] == secret["data"]  # not a new CA
    assert fresh.get("mutatingwebhookconfigurations", "deviceshare")["webhooks"][0]["clientConfig"][
        "caBundle"] == bundle

    rolled = await run(fresh, "helm", "rollback", "deviceshare", "1", "-n", NS)
    assert rolled.returncode == 0, rolled.stderr
    assert fresh.get("deployments", "deviceshare-operator", NS)["spec"]["replicas"] == 1
    history = await run(fresh, "helm", "history", "deviceshare", "-n", NS, "-o", "yaml")
    assert [(r["revision"], r["status"]) for r in yaml.safe_load(history.stdout)] == [
        (1, "superseded"), (2, "superseded"), (3, "deployed")]
    removed = await run(fresh, "helm", "uninstall", "deviceshare", "-n", NS)
    assert removed.returncode == 0, removed.stderr


def _container(cluster: Sandbox, name: str) -> dict[str, Any]:
    deployment = cluster.get("deployments", name, NS)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _mounted(tmp: Path, mounts: dict[str, Path], args: list[str]) -> list[str]:
    """The container's args with its mount paths replaced by the folders holding those files here."""
    out = []
    for arg in args:
        for mount, folder in mounts.items():
            if arg.startswith(mount + "/"):
                arg = str(folder / arg[len(mount) + 1:])
        out.append(arg)
    return out


def _env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace":
            env[var["name"]] = NS
    return env


async def test_the_operator_and_webhook_the_chart_installs_bind_a_group(fresh: Sandbox, tmp_path: Path) -> None:
    installed = await run(fresh, "helm", "install", "deviceshare", "charts/deviceshare", "-n", NS, "--create-namespace")
    assert installed.returncode == 0, installed.stderr
    config, tls = tmp_path / "config", tmp_path / "tls"
    config.mkdir(), tls.mkdir()
    for key, text in fresh.get("configmaps", "deviceshare-env-names", NS)["data"].items():
        (config / key).write_text(text)
    for key, data in fresh.get("secrets", "deviceshare-webhook-tls", NS)["data"].items():
        (tls / key).write_bytes(base64.b64decode(data))
    mounts = {"/config": config, "/tls": tls}

    processes, drains = [], []
    try:
        for name, kubeconfig, extra in [
            ("deviceshare-webhook", fresh.kubeconfig, ["--host", "127.0.0.1"]),
            ("deviceshare-operator", fresh.kubeconfig_as(identity.OPERATOR_TOKEN),
             ["--metrics-host", "127.0.0.1", "--metrics-port", "0"]),
        ]:
            container = _container(fresh, name)
            command = [str(BIN / container["command"][0]), *container["command"][1:]]
            args = _mounted(tmp_path, mounts, container["args"])
            if "--port" in args:  # the Service's target, served here on the port the sandbox calls
                args[args.index("--port") + 1] = str(fresh.webhook_port)  # type: ignore[attr-defined]
            proc = await asyncio.create_subprocess_exec(
                *command, *args, *extra, "--kubeconfig", str(kubeconfig), env={**os.environ, **_env(container)},
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )
            processes.append(proc)
            assert proc.stderr is not None
            if name == "deviceshare-webhook":  # wait for the line that says it serves, then keep reading
                async with asyncio.timeout(60):
                    while b"deviceshare webhook serving on" not in (line := await proc.stderr.readline()):
                        assert line, "the webhook exited before serving"
            drains.append(asyncio.create_task(proc.stderr.read()))
        manifest = tmp_path / "group.yaml"
        manifest.write_text(yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
            {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
             "metadata": {"name": "trainer", "namespace": "ml"}, "spec": {"resources": {"nvidia.com/gpu": 2}}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "trainer-0", "namespace": "ml",
                          "annotations": {"deviceshare.io/device-group": "trainer"}},
             "spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        ]))
        applied = await run(fresh, "kubectl", "apply", "--server-side", "-f", str(manifest))
        assert applied.returncode == 0, applied.stderr
        group = await until(fresh, lambda: (g := fresh.get("sdg", "trainer", "ml")) and g.get("status", {}).get(
            "phase") == "Bound" and g, "group ml/trainer to be Bound")
        bound = await until(fresh, lambda: (p := fresh.get("pods", "trainer-0", "ml")) and p["spec"].get(
            "nodeName") and p, "pod ml/trainer-0 to be bound")
        devices = ",".join(group["status"]["allocatedDevices"]["nvidia.com/gpu"])
        assert bound["spec"]["nodeName"] == group["status"]["nodeName"]
        assert bound["metadata"]["annotations"]["deviceshare.io/env.NVIDIA_VISIBLE_DEVICES"] == devices
        assert bound["spec"]["schedulerName"] == "deviceshare-scheduler"  # the webhook's mutation
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in bound["spec"]["containers"][0]["env"]}
        assert env == {"NVIDIA_VISIBLE_DEVICES": "metadata.annotations['deviceshare.io/env.NVIDIA_VISIBLE_DEVICES']"}
    finally:
        for proc in processes:
            if proc.returncode is None:
                proc.terminate()
        for proc in processes:
            await proc.wait()
        await asyncio.gather(*drains)


async def test_a_kustomize_install_moves_to_the_chart(fresh: Sandbox) -> None:
    """docs/install.md's move: adopt with --take-ownership; kubectl still co-owns what it applied, so the
    first upgrade that changes such a field is refused naming kubectl, and passes with --force-conflicts."""
    kustomized = await run(fresh, "kubectl", "apply", "--server-side", "-k", "manifests/base")
    assert kustomized.returncode == 0, kustomized.stderr
    chart = ("charts/deviceshare", "-n", NS, "--set", "webhook.certificates=external")  # the base's certificates
    adopted = await run(fresh, "helm", "install", "deviceshare", *chart, "--take-ownership")
    assert adopted.returncode == 0, adopted.stderr
    operator = fresh.get("deployments", "deviceshare-operator", NS)
    assert operator["metadata"]["annotations"]["meta.helm.sh/release-name"] == "deviceshare"
    assert {("kubectl", "Apply"), ("helm", "Apply")} <= {
        (e["manager"], e["operation"]) for e in operator["metadata"]["managedFields"]}
    refused = await run(fresh, "helm", "upgrade", "deviceshare", *chart, "--set", "operator.replicas=3")
    assert refused.returncode == 1
    assert 'conflict with "kubectl": .spec.replicas' in refused.stderr
    forced = await run(fresh, "helm", "upgrade", "deviceshare", *chart, "--set", "operator.replicas=3",
                       "--force-conflicts")
    assert forced.returncode == 0, forced.stderr
    later = await run(fresh, "helm", "upgrade", "deviceshare", *chart, "--set", "operator.replicas=2")
    assert later.returncode == 0, later.stderr  # replicas is Helm's alone now
    assert fresh.get("deployments", "deviceshare-operator", NS)["spec"]["replicas"] == 2


@pytest.fixture
async def preloaded(tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A sandbox as `deviceshare sandbox` starts it: the CRD already there, without Helm's ownership metadata."""
    async with Sandbox(nodes=2, gpus=4, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=0.01) as cluster:
        yield cluster


CRD = "shareddevicegroups.deviceshare.io"


async def test_the_documented_install_on_the_sandbox_leaves_its_crd_alone(preloaded: Sandbox) -> None:
    """docs/install.md's command on the documented sandbox: install, upgrade and uninstall exit 0; the CRD
    another owner put there stays as it was (Helm would refuse to import it), and the notes say so."""
    before = preloaded.get("customresourcedefinitions", CRD)
    assert before is not None and "meta.helm.sh/release-name" not in (before["metadata"].get("annotations") or {})
    chart = ("charts/deviceshare", "-n", NS)
    installed = await run(preloaded, "helm", "install", "deviceshare", *chart, "--create-namespace")
    assert installed.returncode == 0, installed.stderr
    assert "STATUS: deployed" in installed.stdout and "already in the cluster" in installed.stdout
    assert "kubectl apply --server-side -f crds/" in installed.stdout
    upgraded = await run(preloaded, "helm", "upgrade", "deviceshare", *chart, "--set", "operator.replicas=1")
    assert upgraded.returncode == 0, upgraded.stderr
    assert preloaded.get("customresourcedefinitions", CRD)["metadata"] == before["metadata"]
    removed = await run(preloaded, "helm", "uninstall", "deviceshare", "-n", NS)
    assert removed.returncode == 0, removed.stderr
    assert preloaded.get("customresourcedefinitions", CRD) is not None


async def test_a_crd_given_helms_ownership_metadata_is_adopted_by_the_next_upgrade(preloaded: Sandbox) -> None:
    """docs/install.md's adoption: label and annotate the CRD as Helm's, and `helm upgrade` manages it."""
    chart = ("charts/deviceshare", "-n", NS)
    installed = await run(preloaded, "helm", "install", "deviceshare", *chart, "--create-namespace")
    assert installed.returncode == 0, installed.stderr
    for command in (("kubectl", "label", "crd", CRD, "app.kubernetes.io/managed-by=Helm"),
                    ("kubectl", "annotate", "crd", CRD, "meta.helm.sh/release-name=deviceshare",
                     f"meta.helm.sh/release-namespace={NS}")):
        done = await run(preloaded, *command)
        assert done.returncode == 0, done.stderr
    upgraded = await run(preloaded, "helm", "upgrade", "deviceshare", *chart)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "managed by this release, kept on uninstall" in upgraded.stdout
    crd = preloaded.get("customresourcedefinitions", CRD)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # the chart's template applied
    assert _helm_owned(crd)


@pytest.mark.parametrize(("setting", "crd", "what"), [
    ("metrics.serviceMonitor.enabled=true", "podmonitors.monitoring.coreos.com", "the Prometheus Operator"),
    ("metrics.prometheusRule.enabled=true", "prometheusrules.monitoring.coreos.com", "the Prometheus Operator"),
    ("webhook.certificates=cert-manager", "certificates.cert-manager.io", "cert-manager"),
])
async def test_a_value_whose_crd_the_cluster_lacks_is_refused_naming_what_to_install(
    fresh: Sandbox, setting: str, crd: str, what: str
) -> None:
    refused = await run(fresh, "helm", "install", "deviceshare", "charts/deviceshare", "-n", NS, "--create-namespace",
                        "--set", setting)
    assert refused.returncode == 1
    assert f"needs the CustomResourceDefinition {crd}, which this cluster does not have: install {what}" in (
        refused.stderr), refused.stderr
    assert fresh.get("deployments", "deviceshare-operator", NS) is None  # nothing half-installed
