"""Connecting to a cluster the way kubectl does, so every command finds the same cluster.

Precedence follows client-go's loading rules: an explicit ``--kubeconfig`` path, then the
``KUBECONFIG`` environment variable (a ``:``-separated list, merged), then ``~/.kube/config``, and
only when none of those exists the in-cluster service account. Of several files, the first that sets
``current-context`` decides it, and a context's definition comes from the first file naming it, as client-go merges
them (:func:`current_context`); every command connects through :func:`configuration`, which passes that context to
the library (whose own merge would let the last file's ``current-context`` win). ``KUBECONFIG`` is read at call time,
not at import time as ``kubernetes_asyncio.config`` does, so tests and the demo can point a fresh
client at a fresh cluster within one process.

A kubeconfig or context that cannot be found is a :class:`ClusterNotFound` (a
:class:`~deviceshare.errors.ConfigError`): one line naming the flag to fix, never a library traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from deviceshare import errors
from deviceshare.kube import credentials, http1


class ClusterNotFound(errors.ConfigError):
    """Neither a kubeconfig nor an in-cluster service account could be found, or the context is missing."""


def kubeconfig_paths(kubeconfig: str | None = None) -> list[str]:
    """The existing kubeconfig files that kubectl would read, in merge order."""
    if kubeconfig:
        if not Path(kubeconfig).expanduser().exists():
            raise ClusterNotFound(f"kubeconfig {kubeconfig} does not exist (--kubeconfig)")
        return [str(Path(kubeconfig).expanduser())]
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return [
            str(Path(p).expanduser()) for p in env.split(os.pathsep) if p and Path(p).expanduser().exists()
        ]
    default = Path("~/.kube/config").expanduser()
    return [str(default)] if default.exists() else []


def current_context(kubeconfig: str | None = None, context: str | None = None) -> tuple[str | None, str]:
    """The context to connect with and its namespace, as client-go picks them from the kubeconfig files merged in
    order: the first file that sets ``current-context`` decides it (unless ``context`` is given), and a context's
    definition comes from the first file naming it (client-go's ``ClientConfigLoadingRules.Load``: map entries and
    the current context are first-wins). ``(None, "default")`` where no file names one."""
    chosen, contexts = context, dict[str | None, Any]()
    for path in kubeconfig_paths(kubeconfig):
        try:
            with open(path) as f:
                cfg = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ClusterNotFound(f"kubeconfig {path} is not usable: {e} (--kubeconfig)") from e
        if not isinstance(cfg, dict):
            raise ClusterNotFound(f"kubeconfig {path} is not usable: not a mapping (--kubeconfig)")
        chosen = chosen or cfg.get("current-context") or None
        for ctx in cfg.get("contexts") or []:
            if isinstance(ctx, dict):
                contexts.setdefault(ctx.get("name"), ctx.get("context") or {})
    return chosen, str((contexts.get(chosen) or {}).get("namespace") or "default")


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service account (what client-go checks)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and bool(os.environ.get("KUBERNETES_SERVICE_PORT"))


async def configuration(kubeconfig: str | None = None, *, context: str | None = None) -> client.Configuration:
    """A client configuration resolved with kubectl's precedence (see the module docstring)."""
    paths = kubeconfig_paths(kubeconfig)
    cfg = client.Configuration()
    if paths:
        context = current_context(kubeconfig, context)[0]  # the first file's, not the library's last-wins
        try:
            loader = await config.load_kube_config(
                config_file=os.pathsep.join(paths),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except config.ConfigException as e:
            where = ", ".join(paths)
            if context and "context" in str(e).lower():
                raise ClusterNotFound(
                    f"context {context!r} not found in {where} (--context; `kubectl config get-contexts` lists them)"
                ) from e
            raise ClusterNotFound(f"kubeconfig {where} is not usable: {e} (--kubeconfig, --context)") from e
        # The library ran the user's exec plugin once; client-go runs it again before the credential expires
        # and after a 401 (credentials.py). ``_user`` is the loader's current user (the library's own
        # refresh_token reads it the same way; tests/kube/test_credentials.py pins it).
        if "exec" in (getattr(loader, "_user", None) or {}):
            cfg.refresh_api_key_hook = credentials.ExecCredentials(loader)
        _proxy_from_environment(cfg)
        return cfg
    if context:
        raise ClusterNotFound(f"context {context!r} given but no kubeconfig found (--kubeconfig or KUBECONFIG)")
    if in_cluster():
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except config.ConfigException as e:
            raise ClusterNotFound(
                f"in-cluster config unusable: {e} (mount the service account, or --kubeconfig)"
            ) from e
        _proxy_from_environment(cfg)
        return cfg
    raise ClusterNotFound(
        "no kubeconfig found and not running in a cluster (--kubeconfig, KUBECONFIG or ~/.kube/config)"
    )


def _proxy_from_environment(cfg: client.Configuration) -> None:
    """``HTTPS_PROXY`` / ``NO_PROXY`` as client-go reads them, unless the kubeconfig names a ``proxy-url``: requests
    then go through aiohttp, which speaks to proxies (``kube/http1.py`` does not)."""
    if not cfg.proxy:
        cfg.proxy = credentials.proxy_from_environment(str(cfg.host))


async def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """A new ApiClient; the caller owns it and must ``await close()`` it (or use ``async with``)."""
    api = client.ApiClient(configuration=await configuration(kubeconfig, context=context))
    # kubernetes_asyncio makes its session with trust_env=True, which looks up netrc and proxies in a thread on
    # every request (measured: a fifth of the operator's CPU under load): proxies from the environment are read
    # once instead (_proxy_from_environment). Its connector sets no TCP keepalive, so a watch on a connection
    # whose peer vanished would wait on it for ever. Both made again here, with public API only.
    rest_client = api.rest_client
    library_connector = rest_client.pool_manager.connector
    limit = library_connector.limit if library_connector is not None else 100
    await rest_client.pool_manager.close()
    cfg = api.configuration
    tls_files = credentials.TlsFiles(cfg) if str(cfg.host).startswith("https://") else None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=limit, ssl=tls_files.context() if tls_files else True, socket_factory=http1.keepalive_socket
        ),
        trust_env=False,
        read_bufsize=2**21,  # as the library's: watch events of large objects exceed aiohttp's default
    )
    # The library's request() calls only the session's request/close: the wrapper stands in for it (aiohttp warns
    # against subclassing ClientSession).
    rest_client.pool_manager = session if tls_files is None else cast(aiohttp.ClientSession, _ReloadingTls(
        session, tls_files))
    return api


class _ReloadingTls:
    """The aiohttp session of watches and lists, each request given the SSL context of the certificate files as
    they are now (``credentials.TlsFiles``): a rotated CA or client certificate is used from the next connection, as
    http1's are (aiohttp pools connections by their SSL context, so one made with the old files is not reused for a
    request with the new). Everything else is the session's own."""

    def __init__(self, session: aiohttp.ClientSession, files: credentials.TlsFiles) -> None:
        self._session, self._files = session, files

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("ssl", self._files.context())
        return self._session.request(method, url, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
