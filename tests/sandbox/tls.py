"""A throwaway CA and serving certificate for the webhook tests (what caBundle verifies).

Built with the product's own generator (``deviceshare certs``), so the tests exercise the certificates
users get.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from deviceshare.webhooks import certs


def make_ca_and_server(folder: Path, dns_names: list[str]) -> tuple[bytes, ssl.SSLContext]:
    """(CA certificate PEM, server SSL context for 127.0.0.1 and ``dns_names``)."""
    bundle = certs.generate(["127.0.0.1", *dns_names], days=1)
    _, cert_file, key_file = bundle.write(folder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return bundle.ca_pem, context
