"""The webhook's HTTPS server: routes, readiness, metrics, and an in-process starter.

Stateless apart from caches, so any number of replicas can serve behind one Service. The routes:

- ``POST /mutate-pods``: AdmissionReview in, AdmissionReview out (:mod:`admission` decides);
- ``POST /validate-groups``: a SharedDeviceGroup CREATE/UPDATE against its namespace's device
  budget (:mod:`budgets` decides);
- ``POST /mutate-groups``: a SharedDeviceGroup CREATE gets the operator's finalizer (:mod:`finalizers`);
- ``GET /healthz``: the process is up; ``GET /readyz``: the group caches have synced and the server
  is not draining; ``GET /metrics``: Prometheus text.

An opted-in pod that arrives before the caches have synced waits for them a bounded time
(``warmup_timeout_s``, default 2 s) and is then denied with a message that asks for a retry.

Bodies are bounded (:class:`limits.Limits`): over ``max_body_bytes`` is a 413 before anything is
read when the length is declared, or as soon as the limit is passed when it is not; a body that
does not arrive within ``body_timeout_s`` is a 408; large bodies are read a few at a time. Connections
are capped and must send a request within a deadline (:mod:`limits`).

A malformed body is a 400, never a 500, on every admission path (:meth:`Webhook._answer`). Which
kind of 400 depends on whether the API server could act on it (docs/security.md, "Malformed
reviews"): a review with a ``request.uid`` is answered as a review, ``allowed: false`` with
``status.code`` 400 naming the field, because that is the only answer kube-apiserver passes on to
the user as a 400 with our message, whatever the failurePolicy (an HTTP error status it turns into
"failed calling webhook": a 500 under ``Fail``, an unmutated admission under ``Ignore``). A body
with no uid (not JSON, not a review) cannot be answered as a review, since the API server would
reject a response whose uid differs; it gets HTTP 400 with a ``Status``. A bug of ours is a denial
with code 500 and a plain message; the details go to the log only.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from kubernetes_asyncio import client

from deviceshare.api import envnames, names
from deviceshare.core import members as member_rules
from deviceshare.kube import connecting
from deviceshare.webhooks import admission, budgets, finalizers, groups, limits, metrics, mpsclients, reviews, tls

logger = logging.getLogger(__name__)

MUTATE_PATH = "/mutate-pods"
VALIDATE_GROUPS_PATH = "/validate-groups"
MUTATE_GROUPS_PATH = "/mutate-groups"
DEFAULT_WARMUP_TIMEOUT_S = 2.0


class CachedGroups(admission.GroupView, Protocol):
    """A GroupView that may still be loading."""

    @property
    def synced(self) -> bool: ...

    async def wait_synced(self, timeout_s: float) -> bool: ...

    async def refresh(self, namespace: str, name: str, timeout_s: float) -> None:
        """Look one group up in the API, for a cache miss that may only be watch lag."""


@dataclass
class Settings:
    env_names: envnames.EnvNames = field(default_factory=envnames.EnvNames)
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    warmup_timeout_s: float = DEFAULT_WARMUP_TIMEOUT_S
    limits: limits.Limits = field(default_factory=limits.Limits)
    mps: mpsclients.MpsMount | None = None  # --mps-root: shares are enforced by the nodes' MPS daemons


class Webhook:
    """The request handlers over one group view."""

    def __init__(
        self,
        lookup: CachedGroups,
        settings: Settings,
        webhook_metrics: metrics.WebhookMetrics,
        budget_view: budgets.BudgetView | None = None,
    ) -> None:
        self.lookup = lookup
        self.settings = settings
        self.metrics = webhook_metrics
        self.budget_view = budget_view  # None: groups are not checked against quotas
        self.draining = False
        self._large_bodies = asyncio.Semaphore(settings.limits.large_bodies_at_once)

    def app(self, guard: limits.ConnectionGuard | None = None) -> web.Application:
        app = web.Application(
            client_max_size=self.settings.limits.max_body_bytes, middlewares=[limits.deadline_middleware]
        )
        if guard is not None:
            app[limits.GUARD_KEY] = guard
        app.router.add_post(MUTATE_PATH, self.mutate)
        app.router.add_post(VALIDATE_GROUPS_PATH, self.validate_groups)
        app.router.add_post(MUTATE_GROUPS_PATH, self.mutate_groups)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.exposition)
        return app

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._mutation)

    async def validate_groups(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._group_validation)

    async def mutate_groups(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._group_mutation)

    async def _answer(
        self, request: web.Request, decide: Callable[[dict[str, Any]], Awaitable[admission.Decision]]
    ) -> web.Response:
        """Read the AdmissionReview, decide, answer and count the outcome; a malformed body is a 400
        counted as ``malformed`` (see the module docstring for which 400)."""
        started = time.perf_counter()
        body: dict[str, Any] = {}
        try:
            body = await self._review(request)
            decision = await decide(body)
        except reviews.NotAReview as e:
            self.metrics.observe(request.path, "malformed", time.perf_counter() - started)
            return web.json_response(_status(400, "BadRequest", f"not an AdmissionReview: {e}"), status=400)
        except reviews.MalformedReview as e:
            decision = admission.deny(f"malformed AdmissionReview: {e}", code=400, outcome="malformed")
        except web.HTTPException:  # 408, 413: already the answer
            raise
        except Exception:
            # A bug of ours: the details go to the log, never into the answer.
            logger.exception("admission of review %r failed", _uid(body))
            decision = admission.deny(
                "deviceshare webhook failed on this request (internal error); its log has the details",
                code=500,
                outcome="error",
            )
        try:
            answer = admission.respond(body, decision)
        except reviews.NotAReview:  # the error came before the body was read: no review to answer
            self.metrics.observe(request.path, "error", time.perf_counter() - started)
            return web.json_response(_status(500, "InternalError", decision.message), status=500)
        self.metrics.observe(request.path, decision.outcome, time.perf_counter() - started)
        return web.json_response(answer, dumps=_dumps)

    async def _mutation(self, body: dict[str, Any]) -> admission.Decision:
        create = admission.pod_create(body)  # checks the pod's shape before anything reads it
        if create is not None and create.group_name is not None:
            if not self.lookup.synced:
                await self.lookup.wait_synced(self.settings.warmup_timeout_s)
            await self._refresh_on_miss(create.namespace, create.group_name)
        return admission.decide_create(
            create, self.lookup, self.settings.env_names, self.settings.scheduler_name, self.settings.mps
        )

    async def _group_validation(self, body: dict[str, Any]) -> admission.Decision:
        if self.budget_view is None:
            return admission.Decision(allowed=True, outcome="skipped")
        if not self.budget_view.budget_synced:
            await self.lookup.wait_synced(self.settings.warmup_timeout_s)
        return budgets.decide(body, self.budget_view)

    async def _group_mutation(self, body: dict[str, Any]) -> admission.Decision:
        return finalizers.decide(body)  # needs no cache: answered at once, also while the caches warm up

    async def _review(self, request: web.Request) -> dict[str, Any]:
        """The request body as a JSON object, within the size and time limits (see the module doc)."""
        bounds = self.settings.limits
        length = request.content_length
        if length is not None and length > bounds.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=bounds.max_body_bytes, actual_size=length)
        large = length is None or length > bounds.large_body_bytes
        try:
            async with asyncio.timeout(bounds.body_timeout_s):
                if large:
                    async with self._large_bodies:  # parsing a big body costs several times its size
                        return reviews.parse(await request.read())
                return reviews.parse(await request.read())
        except TimeoutError:
            raise web.HTTPRequestTimeout(text="the request body did not arrive in time") from None

    async def _refresh_on_miss(self, namespace: str, name: str) -> None:
        """A group created a moment before its pods (one ``kubectl apply -f``) may not have reached the
        watch yet: before denying "does not exist", ask the API (bounded; the cache rate-limits it).
        A name that cannot be a group's is denied without asking."""
        if member_rules.group_name_problem(name) is not None or not self.lookup.synced:
            return
        if self.lookup.group(namespace, name) is None:
            await self.lookup.refresh(namespace, name, self.settings.warmup_timeout_s)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.Response(status=503, text="draining")
        if not self.lookup.synced:
            return web.Response(status=503, text="group caches not synced yet")
        return web.Response(text="ok")

    async def exposition(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": metrics.CONTENT_TYPE})


def freeze_startup_heap() -> None:
    """Move everything allocated at startup (client libraries, models) out of the garbage
    collector's reach: a full collection over that heap costs tens of milliseconds, which would
    land on some admission's latency. For a long-running server process, called once it serves."""
    gc.collect()
    gc.freeze()


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status, which client-go (in the API server too) reads the message of."""
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def _uid(body: dict[str, Any]) -> str:
    request = body.get("request")
    return str(request.get("uid"))[:100] if isinstance(request, dict) else ""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class RunningWebhook:
    """A webhook serving in this process; ``await stop()`` shuts it down and closes what it opened."""

    url: str  # https://HOST:PORT, no trailing slash; the mutate endpoint is url + MUTATE_PATH
    port: int
    webhook: Webhook
    reloader: tls.CertificateReloader
    runner: web.AppRunner
    guard: limits.ConnectionGuard
    index: groups.GroupIndex | None
    _tasks: list[asyncio.Task[None]]
    _owned_client: client.ApiClient | None

    @property
    def mutate_url(self) -> str:
        return self.url + MUTATE_PATH

    async def stop(self) -> None:
        self.webhook.draining = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.cleanup()
        if self.index is not None:
            await self.index.stop()
        if self._owned_client is not None:
            await self._owned_client.close()


async def start_webhook(
    *,
    tls_cert: str | Path,
    tls_key: str | Path,
    api_client: client.ApiClient | None = None,
    kubeconfig: str | None = None,
    lookup: CachedGroups | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    env_names: envnames.EnvNames | None = None,
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME,
    warmup_timeout_s: float = DEFAULT_WARMUP_TIMEOUT_S,
    reload_interval_s: float = 5.0,
    watch_timeout_s: int = 300,
    bounds: limits.Limits | None = None,
    mps: mpsclients.MpsMount | None = None,
) -> RunningWebhook:
    """Serve the webhook over TLS on ``host:port`` (0 picks a free port) until ``stop()``.

    Groups come from ``lookup`` if given (tests, benchmarks), else from a watch-backed
    :class:`groups.GroupIndex` over ``api_client`` (kept open; the caller owns it) or over a client
    built from ``kubeconfig`` / ``KUBECONFIG`` / in-cluster config (closed by ``stop()``).
    """
    owned: client.ApiClient | None = None
    index: groups.GroupIndex | None = None
    if lookup is None:
        if api_client is None:
            api_client = owned = await connecting.api_client(kubeconfig)
        index = groups.GroupIndex()
        index.start(api_client, watch_timeout_s=watch_timeout_s)
        lookup = index
    webhook_metrics = metrics.WebhookMetrics(synced=lambda: bool(lookup.synced))
    settings = Settings(
        env_names=env_names or envnames.EnvNames(),
        scheduler_name=scheduler_name,
        warmup_timeout_s=warmup_timeout_s,
        limits=bounds or limits.Limits(),
        mps=mps,
    )
    budget_view = index if index is not None else (lookup if isinstance(lookup, budgets.BudgetView) else None)
    webhook = Webhook(lookup, settings, webhook_metrics, budget_view)
    context = tls.server_context(tls_cert, tls_key)
    reloader = tls.CertificateReloader(
        context,
        tls_cert,
        tls_key,
        interval_s=reload_interval_s,
        on_reload=webhook_metrics.certificate_reloaded,
    )
    guard = limits.ConnectionGuard(settings.limits)
    runner = web.AppRunner(webhook.app(guard), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = limits.GuardedSite(runner, host, port, ssl_context=context, guard=guard)
    await site.start()
    bound_port = int(runner.addresses[0][1])
    url_host = f"[{host}]" if ":" in host else host
    tasks = [asyncio.create_task(reloader.run(), name="tls reload")]
    logger.info("deviceshare webhook serving on https://%s:%d%s", url_host, bound_port, MUTATE_PATH)
    return RunningWebhook(
        url=f"https://{url_host}:{bound_port}",
        port=bound_port,
        webhook=webhook,
        reloader=reloader,
        runner=runner,
        guard=guard,
        index=index,
        _tasks=tasks,
        _owned_client=owned,
    )
