"""The overlays give the webhook a serving certificate the API server trusts.

cert-manager: a CA chain whose serving certificate lands in the Secret the webhook mounts and
whose CA is injected into the MutatingWebhookConfiguration. Self-signed: the files
``deviceshare certs`` writes become that Secret, and its CA becomes the caBundle.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.manifests import kube_objects

NS = "deviceshare-system"
SECRET = "deviceshare-webhook-tls"


def _mounted_secret(objects: list[kube_objects.KubeObject]) -> str:
    deployment = kube_objects.one(objects, "Deployment", "deviceshare-webhook")
    (name,) = {v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    return str(name)


def _service_dns_names(objects: list[kube_objects.KubeObject]) -> set[str]:
    config = kube_objects.one(objects, "MutatingWebhookConfiguration", "deviceshare")
    target = config["webhooks"][0]["clientConfig"]["service"]
    return {f"{target['name']}.{target['namespace']}.svc"}


def test_cert_manager_chain_ends_in_the_secret_the_webhook_mounts(
    cert_manager_objects: list[kube_objects.KubeObject],
) -> None:
    objects = cert_manager_objects
    issuers = {i["metadata"]["name"]: i for i in kube_objects.select(objects, "Issuer")}
    certificates = {c["metadata"]["name"]: c for c in kube_objects.select(objects, "Certificate")}

    serving = [c for c in certificates.values() if c["spec"]["secretName"] == _mounted_secret(objects)]
    assert len(serving) == 1
    serving_spec = serving[0]["spec"]
    assert not serving_spec.get("isCA")
    assert _service_dns_names(objects) <= set(serving_spec["dnsNames"])
    assert "server auth" in serving_spec["usages"]

    # serving cert <- CA issuer <- CA certificate <- self-signed issuer, all in our namespace
    ca_issuer = issuers[serving_spec["issuerRef"]["name"]]
    ca_cert = [c for c in certificates.values()
               if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert len(ca_cert) == 1 and ca_cert[0]["spec"]["isCA"] is True
    root = issuers[ca_cert[0]["spec"]["issuerRef"]["name"]]
    assert "selfSigned" in root["spec"]
    for obj in [*issuers.values(), *certificates.values()]:
        assert obj["metadata"]["namespace"] == NS
        assert obj["spec"].get("issuerRef", {}).get("kind", "Issuer") == "Issuer"


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_cert_manager_injects_the_serving_certificates_ca(
    cert_manager_objects: list[kube_objects.KubeObject], kind: str
) -> None:
    config = kube_objects.one(cert_manager_objects, kind, "deviceshare")
    namespace, _, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    certificate = kube_objects.one(cert_manager_objects, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert certificate["spec"]["secretName"] == _mounted_secret(cert_manager_objects)
    # cert-manager owns the Secret: the overlay must not also ship one.
    assert kube_objects.select(cert_manager_objects, "Secret") == []


def test_self_signed_secret_is_what_the_webhook_mounts(self_signed: Any) -> None:
    objects = self_signed.objects
    secret = kube_objects.one(objects, "Secret", SECRET)  # no name-suffix hash
    assert _mounted_secret(objects) == SECRET
    assert secret["metadata"]["namespace"] == NS
    assert secret["type"] == "kubernetes.io/tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        assert base64.b64decode(secret["data"][key]) == (self_signed.certs_dir / key).read_bytes()


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_self_signed_ca_bundle_is_the_generated_ca(self_signed: Any, kind: str) -> None:
    config = kube_objects.one(self_signed.objects, kind, "deviceshare")
    for webhook in config["webhooks"]:
        bundle = base64.b64decode(webhook["clientConfig"]["caBundle"])
        assert bundle == self_signed.ca_pem
        x509.load_pem_x509_certificate(bundle)
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})


def test_self_signed_overlay_says_what_to_run_when_the_certs_are_missing(tmp_path: Path) -> None:
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed")
    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "manifests", tmp_path / "manifests",
                    ignore=shutil.ignore_patterns("*.crt", "*.key"))
    shutil.copytree(root / "crds", tmp_path / "crds")
    with pytest.raises(kube_objects.RenderError, match=r"certs/tls\.crt"):
        kube_objects.render(tmp_path / "manifests" / "overlays" / "self-signed")
    text = (root / "manifests" / "overlays" / "self-signed" / "kustomization.yaml").read_text()
    assert "deviceshare certs --service deviceshare-webhook --namespace deviceshare-system" in text


def test_users_can_point_the_install_at_their_own_image(tmp_path: Path) -> None:
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed")
    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "manifests", tmp_path / "manifests")
    shutil.copytree(root / "crds", tmp_path / "crds")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "resources: [../manifests/overlays/cert-manager]\n"
        "images:\n- name: ghcr.io/deviceshare/deviceshare\n"
        "  newName: registry.example.com/deviceshare\n  newTag: dev\n")
    objects = kube_objects.render(mine)
    images = {c["image"] for _, t in kube_objects.pod_templates(objects) for c in t["spec"]["containers"]}
    assert images == {"registry.example.com/deviceshare:dev"}
