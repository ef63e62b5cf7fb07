"""Kopf, all of it: the handlers (login, start-up, clean-up, and the SharedDeviceGroups' events) and :func:`run`.

Everything that names ``kopf`` lives here (and the flags in ``command.py``); the rest of the operator never sees
it. Handlers are thin on purpose, and ``async`` on purpose: Kopf runs sync handlers in a thread pool, and our
state is owned by the event loop. Handlers are registered on a registry passed in, so tests can run several
isolated operators (e.g. two replicas electing a leader) in one process.

Nodes, groups and pods come through the intake's own reflectors (``intake.Intake.watch``): Kopf's per-event
machinery costs more than the decisions, and our watches resume from the rebuild's lists at each leadership term.
With ``--groups-through-kopf`` the SharedDeviceGroup lifecycle comes through Kopf instead: creation, spec changes,
deletion (the ``deletionTimestamp`` our finalizer holds the group at, then its DELETED) and resume after a restart
(Kopf's first list) are all one ``on.event`` handler, :func:`group_event`, handing the raw event to the intake's gate
(``groupfeed.py``), which applies it only while this replica leads a term, and holds what comes during a rebuild.
It is off by default: it cost 1.6x the operator CPU per bound pod on one-pod groups (docs/architecture.md).
``on.event`` only, on purpose: Kopf then keeps no progress or last-handled annotations on our objects and adds no
finalizer of its own; ours guards deletion. Kopf's cluster-wide CRD observer is off (``settings.scanning.disabled``):
the groups' CRD, when Kopf watches them, is found once at start.
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


KOPF_FINALIZER_NONE = "deviceshare.io/no kopf finalizer"  # spaces: never a valid finalizer (IsQualifiedName)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: we register ``on.event`` handlers only, which get no diff, yet Kopf builds one (a deep copy
    of the body, then a comparison) for every event (``kopf/_core/reactor/processing.py``, ``_detect_causes``);
    while pods came through Kopf that was the largest single cost in the operator's profile. Nothing is stored."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """No progress storage: ``on.event`` handlers keep no progress, yet Kopf asks the storage to strip its marks
    from a (deep-copied) essence of every event's body (``_detect_causes``); with no diff base there is nothing
    to strip, and nothing is ever stored or purged."""

    def fetch(self, *, key: Any, body: kopf.Body) -> None:
        return None

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        return None

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return essence


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register every handler of the operator on ``registry``."""
    started: list[Runtime] = []  # the runtime once started: the group handler's (Kopf copies the memo per object)

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
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.persistence.progress_storage = NoProgress()
        # Kopf takes its finalizer off any object it watches that no changing handler needs, on every replica and
        # outside our fence; a tenant can put it on a group. A name the API refuses as a finalizer (not a qualified
        # name) is on no object, so Kopf never writes one.
        settings.persistence.finalizer = KOPF_FINALIZER_NONE
        settings.peering.standalone = True  # one leader is elected on a Lease instead (leadership.py)
        # No CRD (or namespace) watch: the groups' resource is discovered once, here at start.
        settings.scanning.disabled = True
        # "Handler 'group_event' succeeded." at INFO for every group event is noise; its failures still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        # Retried here with capped backoff until the API answers (Kopf would wait 60 s between tries).
        metrics: Metrics | None = getattr(memo, "metrics", None)
        memo.runtime = await startup_.start_runtime(config, metrics if metrics is not None else Metrics())
        started.append(memo.runtime)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = getattr(memo, "runtime", None)
        if runtime is not None:
            await runtime.stop()
            await runtime.ctx.api.close()

    if not config.groups_through_kopf:
        # Nodes, groups and pods come through the intake's own reflectors (see intake.Intake.watch): each term's
        # watches resume from the rebuild's lists, so nothing that happens during a rebuild is lost.
        return

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry)
    async def group_event(event: kopf.RawEvent, **_: Any) -> None:
        """A group created, changed, being deleted, deleted, or listed at (re)start (type None)."""
        if started:
            started[0].intake.groups.event(event["type"], event["object"])

    # Nodes and pods come through the intake's own reflectors (see intake.Intake.watch).
