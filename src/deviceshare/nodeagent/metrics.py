"""The node agent's /metrics (Prometheus text) and /healthz, on a small aiohttp server of its own."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from deviceshare.kube import serving

logger = logging.getLogger("deviceshare.nodeagent.metrics")


class MetricsServer:
    """Serves ``registry`` at /metrics; /healthz answers 200 while the event loop runs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        routes = {"/metrics": self._metrics, "/healthz": self._health}
        self._runner, self.port = await serving.start(routes, host, port, "--metrics-port")
        logger.info("metrics on http://%s:%s/metrics", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), content_type="text/plain", charset="utf-8")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")
