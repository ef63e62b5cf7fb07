"""The webhook's HTTPS server: routes, readiness, metrics, and an in-process starter.

Stateless apart from caches, so any number of replicas can serve behind one Service. The routes:

- ``POST /mutate-pods``: AdmissionReview in, AdmissionReview out (:mod:`admission` decides);
- ``POST /validate-groups``: a SharedDeviceGroup CREATE/UPDATE against its namespace's device
  budget (:mod:`budgets` decides);
- ``GET /healthz``: the process is up; ``GET /readyz``: the group caches have synced and the server
  is not draining; ``GET /metrics``: Prometheus text.

An opted-in pod that arrives before the caches have synced waits for them a bounded time
(``warmup_timeout_s``, default 2 s) and is then denied with a message that asks for a retry.

Bodies are bounded (:class:`limits.Limits`): over ``max_body_bytes`` is a 413 before anything is
read when the length is declared, or as soon as the limit is passed when it is not; a body that
does not arrive within ``body_timeout_s`` is a 408; large bodies are read a few at a time; JSON
nested past Python's recursion limit, or JSON that is no object, is a 400. Connections are capped
and must send a request within a deadline (:mod:`limits`).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from deviceshare.kube import connecting
from deviceshare.webhooks import admission, budgets, groups, limits, metrics, mpsclients, tls

logger = logging.getLogger(__name__)

MUTATE_PATH = "/mutate-pods"
VALIDATE_GROUPS_PATH = "/validate-groups"
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
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.exposition)
        return app

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._mutation)

    async def validate_groups(self, request: web.Request) -> web.Response:
        return await self._answer(request, self._group_validation)

    async def _answer(
        self, request: web.Request, decide: Callable[[dict[str, Any]], Awaitable[admission.Decision]]
    ) -> web.Response:
        """Read the AdmissionReview, decide, answer and count the outcome; a body that is not a review
        is a 400, counted as ``malformed``."""
        started = time.perf_counter()
        try:
            body = await self._review(request)
            decision = await decide(body)
            answer = admission.respond(body, decision)
        except (ValueError, admission.MalformedReview) as e:
            self.metrics.observe("malformed", time.perf_counter() - started)
            return web.json_response({"error": f"not an AdmissionReview: {e}"}, status=400)
        self.metrics.observe(decision.outcome, time.perf_counter() - started)
        return web.json_response(answer, dumps=_dumps)

    async def _mutation(self, body: dict[str, Any]) -> admission.Decision:
        if _opted_in(body):
            if not self.lookup.synced:
                await self.lookup.wait_synced(self.settings.warmup_timeout_s)
            await self._refresh_on_miss(body)
        try:
            return admission.decide(
                body, self.lookup, self.settings.env_names, self.settings.scheduler_name, self.settings.mps
            )
        except admission.MalformedReview:
            raise
        except Exception as e:
            # A pod shape the engine did not foresee: deny it with the reason rather than
            # answer 500, which the API server would report as "failed calling webhook".
            logger.exception("admission failed")
            decision = admission.deny(f"deviceshare webhook could not process this pod: {e!r}", code=500)
            return dataclasses.replace(decision, outcome="error")

    async def _group_validation(self, body: dict[str, Any]) -> admission.Decision:
        if self.budget_view is None:
            return admission.Decision(allowed=True, outcome="skipped")
        if not self.budget_view.budget_synced:
            await self.lookup.wait_synced(self.settings.warmup_timeout_s)
        return budgets.decide(body, self.budget_view)

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
                        return _parse(await request.read())
                return _parse(await request.read())
        except TimeoutError:
            raise web.HTTPRequestTimeout(text="the request body did not arrive in time") from None

    async def _refresh_on_miss(self, body: Any) -> None:
        """A group created a moment before its pods (one ``kubectl apply -f``) may not have reached the
        watch yet: before denying "does not exist", ask the API once (bounded)."""
        request = body.get("request") if isinstance(body, dict) else None
        if not isinstance(request, dict) or not isinstance(request.get("object"), dict):
            return
        pod = request["object"]
        name = admission.group_name_of(pod)
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
        if name and self.lookup.synced and self.lookup.group(namespace, name) is None:
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


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except RecursionError:  # nesting deeper than the parser's stack: no AdmissionReview is like that
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise ValueError(f"the body is a JSON {type(body).__name__}, not an object")
    return body


def _opted_in(body: Any) -> bool:
    obj = ((body or {}).get("request") or {}).get("object") if isinstance(body, dict) else None
    return isinstance(obj, dict) and admission.group_name_of(obj) is not None


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
