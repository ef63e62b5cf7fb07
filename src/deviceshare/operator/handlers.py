"""Kopf, all of it: the handlers (login, start-up, clean-up) and :func:`run`, Kopf's main loop.

Everything that names ``kopf`` lives here (and the flags in ``command.py``); the rest of the operator never sees
it. Handlers are thin on purpose, and ``async`` on purpose: Kopf runs sync handlers in a thread pool, and our
state is owned by the event loop. Handlers are registered on a registry passed in, so tests can run several
isolated operators (e.g. two replicas electing a leader) in one process. Only ``on.event`` handlers are used:
Kopf then keeps no progress annotations on our objects, and our own finalizer (not Kopf's) guards group
deletion. Nodes, groups and pods come through the intake's own reflectors instead (see
``intake.Intake.watch``): Kopf's per-event machinery cost more than the decisions, and our watches resume from
the rebuild's lists at each leadership term, which Kopf's cannot.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s

from deviceshare.api import names
from deviceshare.kube import connecting

from . import startup as startup_
from .config import OperatorConfig
from .metrics import Metrics
from .runtime import Runtime

logger = logging.getLogger(__name__)

# The bag Kopf hands every handler; start-up keeps the ``runtime`` in it (``process.py`` and the tests read it).
Memo = kopf.Memo


async def run(
    config: OperatorConfig,
    *,
    memo: Memo,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run Kopf with our handlers until ``stop_flag`` is set (or forever)."""
    registry = kopf.OperatorRegistry()
    register(registry, config)
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        # Kopf's peering only pauses lower-priority peers; it is not leader election. Our replicas
        # elect one leader on a Lease themselves (leadership.py), so Kopf runs standalone.
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        memo=memo,
    )


def connection_info(cfg: k8s.Configuration) -> kopf.ConnectionInfo:
    """Kopf's credentials from the same client configuration our own API client uses."""
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme = None
    if token and " " in token:
        scheme, token = token.split(" ", 1)
    return kopf.ConnectionInfo(
        server=str(cfg.host),
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        scheme=scheme or ("Bearer" if token else None),
        token=token or None,
        certificate_path=cfg.cert_file or None,
        private_key_path=cfg.key_file or None,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: we register ``on.event`` handlers only, which get no diff, yet Kopf builds one
    (a deep copy of the body, then a comparison) for every event; while pods came through Kopf that was
    the largest single cost in the operator's profile. There is nothing to store either."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register every handler of the operator on ``registry``."""

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(await connecting.configuration(config.kubeconfig, context=config.context))

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 30
        settings.queueing.idle_timeout = config.worker_idle_timeout
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.peering.standalone = True  # one leader is elected on a Lease instead (leadership.py)
        # No handler of ours is on a resource (the intake's reflectors watch): Kopf need not discover resources,
        # nor watch CRDs for changes, and the operator's RBAC gives it no customresourcedefinitions (issue 32).
        settings.scanning.disabled = True
        # Retried here with capped backoff until the API answers (Kopf would wait 60 s between tries).
        metrics: Metrics | None = getattr(memo, "metrics", None)
        memo.runtime = await startup_.start_runtime(config, metrics if metrics is not None else Metrics())

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = getattr(memo, "runtime", None)
        if runtime is not None:
            await runtime.stop()
            await runtime.ctx.api.close()

    # Nodes, groups and pods come through the intake's own reflectors (see intake.Intake.watch): each term's
    # watches resume from the rebuild's lists, so nothing that happens during a rebuild is lost.
