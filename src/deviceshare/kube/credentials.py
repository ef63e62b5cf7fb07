"""Credentials and the way to the API server as client-go keeps them over a long run, where kubernetes_asyncio does not.

- **Exec plugins** (EKS, GKE, AKS kubeconfigs): kubernetes_asyncio runs the plugin once, when the kubeconfig is
  loaded, and never again; the token expires after 15-60 min and every request then answers 401. client-go's exec
  authenticator (``k8s.io/client-go/plugin/pkg/client/auth/exec``) runs it again once the credential's
  ``expirationTimestamp`` has passed, and after a 401 (the credential is dropped and the request's next try gets a
  fresh one). :class:`ExecCredentials` does both, and renews a little before expiry, so no request carries a
  token about to lapse.
- **Certificate files** (a client certificate, a CA bundle: cert-manager or a kubelet rotates them in place):
  :class:`TlsFiles` builds the SSL context again when one of the files changed, for the next new connection, as
  client-go's ``dynamicClientCert`` and CA reloading do.
- **Proxies from the environment**: client-go uses Go's ``http.ProxyFromEnvironment`` (``HTTPS_PROXY``,
  ``HTTP_PROXY``, ``NO_PROXY``, upper or lower case) unless the kubeconfig names a ``proxy-url``.
  :func:`proxy_from_environment` reads them the same way once, at start-up (aiohttp's own ``trust_env`` would
  look them and netrc up in a thread on every request).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

RENEW_BEFORE = 60.0  # s before an exec credential's expiry that it is renewed (at most half its lifetime)

logger = logging.getLogger(__name__)


class ExecCredentials:
    """The configuration's ``refresh_api_key_hook`` for a kubeconfig user with an exec plugin: asked before every
    request (kubernetes_asyncio's ``get_api_key_with_prefix``), it re-runs the plugin when the credential is
    about to expire or a 401 said it is no good (:meth:`invalidate`)."""

    def __init__(self, loader: Any, *, clock: Callable[[], float] = time.time) -> None:
        self._loader, self._clock = loader, clock
        self._lock = asyncio.Lock()
        self._stale = False
        self.runs = 0  # the plugin's runs after the first (for tests and logs)
        self._renew_at = self._renewal_time()

    def _renewal_time(self) -> float:
        expiry = getattr(self._loader, "exec_plugin_expiry", None)  # set by load_from_exec_plugin, if it said
        if expiry is None:
            return float("inf")  # no expiry given: good until a 401
        lifetime = expiry.timestamp() - self._clock()
        return float(expiry.timestamp() - min(RENEW_BEFORE, max(lifetime, 0.0) / 2))

    def _due(self) -> bool:
        return self._stale or self._clock() >= self._renew_at

    def invalidate(self) -> None:
        """A 401: the credential is no good; the next request runs the plugin again."""
        self._stale = True

    async def __call__(self, configuration: Any) -> None:
        if not self._due():
            return
        async with self._lock:  # requests waiting here get the one new credential
            if not self._due():
                return
            if hasattr(self._loader, "exec_plugin_expiry"):
                del self._loader.exec_plugin_expiry  # or the library keeps the old one until it has expired
            await self._loader.load_from_exec_plugin()
            configuration.api_key["BearerToken"] = self._loader.token
            if getattr(self._loader, "cert_file", None):  # a plugin may give a client certificate instead
                configuration.cert_file, configuration.key_file = self._loader.cert_file, self._loader.key_file
            self.runs += 1
            self._stale = False
            self._renew_at = self._renewal_time()


def invalidate(configuration: Any) -> bool:
    """After a 401: drop the credential if it can be renewed (an exec plugin's); whether a retry may help."""
    hook = getattr(configuration, "refresh_api_key_hook", None)
    if isinstance(hook, ExecCredentials):
        hook.invalidate()
        return True
    return False


class TlsFiles:
    """An SSL context built from a configuration's CA, client certificate and key files, built again for the next
    connection once one of them changes (size or modification time); the files are looked at no more than once a
    second."""

    def __init__(self, configuration: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg, self._clock = configuration, clock
        self._stamp: tuple[Any, ...] | None = None
        self._checked = -1.0
        self._context: ssl.SSLContext | None = None
        self.builds = 0

    def _files(self) -> tuple[str | None, ...]:
        return (self._cfg.ssl_ca_cert, self._cfg.cert_file, self._cfg.key_file)

    def _stamps(self) -> tuple[Any, ...]:
        stamps: list[Any] = []
        for path in self._files():
            try:
                info = os.stat(path) if path else None
            except OSError:
                info = None
            stamps.append((path, info.st_mtime_ns, info.st_size) if info else (path, None, None))
        return tuple(stamps)

    def context(self) -> ssl.SSLContext:
        now = self._clock()
        if self._context is not None and now - self._checked < 1.0:
            return self._context
        self._checked = now
        stamp = self._stamps()
        if self._context is None or stamp != self._stamp:
            try:
                built = self._build()
            except (OSError, ssl.SSLError) as e:
                if self._context is None:
                    raise
                # Caught halfway through a rotation (a new certificate beside the old key): the files as they were
                # serve until they make a context again.
                logger.warning("certificate files not usable yet, keeping the previous ones: %s", e)
                return self._context
            self._context, self._stamp = built, stamp
            self.builds += 1
        return self._context

    def _build(self) -> ssl.SSLContext:
        cfg = self._cfg
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if getattr(cfg, "disable_strict_ssl_verification", False):
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        return context


def proxy_from_environment(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy Go's ``http.ProxyFromEnvironment`` would use for ``url``: ``HTTPS_PROXY`` for https (``HTTP_PROXY``
    for http), upper case first, unless ``NO_PROXY`` names the host: ``*``, a host or domain (``example.com``
    and ``.example.com`` both cover its subdomains), an IP address or a CIDR, each with an optional port."""
    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host or host == "localhost":
        return None
    names = ("HTTPS_PROXY", "https_proxy") if parts.scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), None)
    if proxy is None:
        return None
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry and _bypasses(entry, host, address, port):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _bypasses(
    entry: str, host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None, port: int
) -> bool:
    if entry == "*":
        return True
    if "/" in entry:  # a CIDR
        try:
            return address is not None and address in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    if entry_port and entry_port != str(port):
        return False
    name = name.strip("[]")
    if address is not None:
        try:
            return ipaddress.ip_address(name) == address
        except ValueError:
            return False
    name = name.lstrip(".")
    return host == name or host.endswith("." + name)
