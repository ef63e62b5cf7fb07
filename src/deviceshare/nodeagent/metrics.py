"""The node agent's /metrics (Prometheus text) and /healthz, on a small aiohttp server of its own."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from deviceshare import errors

logger = logging.getLogger("deviceshare.nodeagent.metrics")


class MetricsServer:
    """Serves ``registry`` at /metrics; /healthz answers 200 while the event loop runs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await self.stop()
            raise errors.ConfigError(
                f"cannot serve metrics on {host}:{port}: {e.strerror or e} (--metrics-port)"
            ) from e
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        logger.info("metrics on http://%s:%s/metrics", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), content_type="text/plain", charset="utf-8")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")
