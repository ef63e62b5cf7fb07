"""The webhook's TLS context, reloaded in place when cert-manager rotates the certificate.

New handshakes take the certificate from the ``SSLContext`` as it is at handshake time, so
loading a new chain into the same context switches every later connection over while connections
already open keep going: no restart, no dropped request. A rotation writes two files, and a reader
can catch them half-way (new certificate, old key). The pair is therefore copied once, checked in a
scratch context, and only then loaded into the live one; a mismatched pair leaves the old
certificate serving and is retried at the next poll.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

Fingerprint = tuple[tuple[int, int, int], ...]


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2+) serving the given chain and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def _fingerprint(*paths: Path) -> Fingerprint:
    # stat() follows the symlinks a Secret volume swaps atomically, so a rotation changes the inode.
    out = []
    for p in paths:
        st = p.stat()
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class CertificateReloader:
    """Polls the certificate and key files and reloads ``context`` when they change."""

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        interval_s: float = 5.0,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.context = context
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.interval_s = interval_s
        self.generation = 1  # bumped on every successful reload
        self._on_reload = on_reload
        self._seen = self._stat()

    def _stat(self) -> Fingerprint | None:
        try:
            return _fingerprint(self.cert_file, self.key_file)
        except OSError:
            return None

    def check(self) -> bool:
        """Reload if the files changed since the last successful load; whether it reloaded."""
        seen = self._stat()
        if seen is None or seen == self._seen:
            return False
        if self.reload():
            self._seen = seen
            return True
        return False

    def reload(self) -> bool:
        """Load the current files into the live context if they form a valid pair."""
        try:
            cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
            with tempfile.TemporaryDirectory(prefix="deviceshare-tls-") as tmp:
                cert_copy, key_copy = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                cert_copy.write_bytes(cert)
                key_copy.touch(mode=0o600)
                key_copy.write_bytes(key)
                server_context(cert_copy, key_copy)  # raises on a mismatched or partial pair
                self.context.load_cert_chain(str(cert_copy), str(key_copy))
        except (OSError, ssl.SSLError) as e:
            logger.warning("TLS certificate not reloaded (will retry): %s", e)
            self._notify(False)
            return False
        self.generation += 1
        logger.info("TLS certificate reloaded from %s (generation %d)", self.cert_file, self.generation)
        self._notify(True)
        return True

    def _notify(self, ok: bool) -> None:
        if self._on_reload is not None:
            self._on_reload(ok)

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except Exception:
                logger.exception("TLS certificate check failed")
