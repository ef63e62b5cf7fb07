"""Renderings of the install manifests, made once per session (kubectl takes a moment each)."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.manifests import kube_objects

ROOT = Path(__file__).resolve().parents[2]
SERVICE_DNS = "deviceshare-webhook.deviceshare-system.svc"


def _render(path: Path) -> list[kube_objects.KubeObject]:
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations (install kubectl >= 1.27)")
    return kube_objects.render(path)


@pytest.fixture(scope="session")
def base_objects() -> list[kube_objects.KubeObject]:
    return _render(ROOT / "manifests" / "base")


@pytest.fixture(scope="session")
def cert_manager_objects() -> list[kube_objects.KubeObject]:
    return _render(ROOT / "manifests" / "overlays" / "cert-manager")


class SelfSignedRendering:
    def __init__(self, objects: list[kube_objects.KubeObject], ca_pem: bytes, certs_dir: Path) -> None:
        self.objects = objects
        self.ca_pem = ca_pem
        self.certs_dir = certs_dir


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> SelfSignedRendering:
    """The self-signed overlay rendered from a copy of the repo with throwaway certificates,
    laid out as ``deviceshare certs --out manifests/overlays/self-signed/certs`` leaves them."""
    if kube_objects.kubectl() is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations (install kubectl >= 1.27)")
    work = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "manifests", work / "manifests")
    shutil.copytree(ROOT / "crds", work / "crds")
    certs = work / "manifests" / "overlays" / "self-signed" / "certs"
    ca_pem, tls_crt, tls_key = _throwaway_certs(SERVICE_DNS)
    (certs / "ca.crt").write_bytes(ca_pem)
    (certs / "tls.crt").write_bytes(tls_crt)
    (certs / "tls.key").write_bytes(tls_key)
    objects = kube_objects.render(work / "manifests" / "overlays" / "self-signed")
    return SelfSignedRendering(objects, ca_pem, certs)


def _throwaway_certs(dns_name: str) -> tuple[bytes, bytes, bytes]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (
        ca.public_bytes(serialization.Encoding.PEM),
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()),
    )
