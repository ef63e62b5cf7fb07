"""Self-signed certificates for the webhook, and the ``deviceshare certs`` command.

The API server only calls webhooks over TLS and checks the serving certificate against the
``caBundle`` of the webhook configuration. In production cert-manager issues and rotates the
certificate; for the sandbox, the demo, tests and clusters without cert-manager this module makes a
throwaway CA and a serving certificate for ``SERVICE.NAMESPACE.svc`` (plus any extra names or IPs).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deviceshare import errors
from deviceshare.api import names

if TYPE_CHECKING:
    from cryptography import x509

DEFAULT_SERVICE = "deviceshare-webhook"


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA certificate, and of a serving certificate and key it signed."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        """The CA as base64, the form ``clientConfig.caBundle`` takes."""
        return base64.b64encode(self.ca_pem).decode()

    def write(self, directory: str | Path) -> tuple[Path, Path, Path]:
        """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (key readable by the owner only)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        ca, cert, key = out / "ca.crt", out / "tls.crt", out / "tls.key"
        ca.write_bytes(self.ca_pem)
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return ca, cert, key


def service_hosts(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may use to reach a service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def generate(
    hosts: Sequence[str],
    *,
    days: int = 365,
    ca_name: str = "deviceshare webhook CA",
    now: datetime.datetime | None = None,
) -> CertBundle:
    """A fresh CA and a serving certificate for ``hosts`` (DNS names or IP addresses; the first is the CN)."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    # cryptography is the optional extra ``deviceshare[certs]`` (also in ``[sandbox]``, for the demo): the
    # operator and webhook image runs without it. Its x509 builder API here has not changed since 3.x; the
    # range in pyproject.toml is the one tested (tests/webhooks/test_tls.py on 41.0.7 and the newest).
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertBundle(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _san(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


# -- deviceshare certs ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="the webhook's Service name (%(default)s)")
    parser.add_argument(
        "--namespace", default=names.DEFAULT_NAMESPACE, help="the webhook's namespace (%(default)s)"
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="extra DNS name or IP for the certificate, e.g. 127.0.0.1 (repeatable)",
    )
    parser.add_argument("--days", type=int, default=365, help="validity in days (%(default)s)")
    parser.add_argument("--out", required=True, help="directory to write ca.crt, tls.crt and tls.key into")


def run(args: argparse.Namespace) -> int:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise errors.ConfigError(
            "certificates need the optional extra: pip install 'deviceshare[certs]' (missing: cryptography)"
        ) from None
    bundle = generate([*service_hosts(args.service, args.namespace), *args.host], days=args.days)
    ca, cert, key = bundle.write(args.out)
    print(f"# wrote {ca}, {cert}, {key}")
    print("# caBundle for the MutatingWebhookConfiguration:")
    print(bundle.ca_bundle)
    return 0
