"""Prometheus metrics of the operator (names prefixed ``deviceshare_``) and the /metrics + /healthz server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from deviceshare.core.ledger import DeviceLedger

logger = logging.getLogger(__name__)


class _LedgerCollector(Collector):
    """Free and allocated devices, and the compute and memory given to sharing groups, per node and
    resource, read from the ledger at scrape time."""

    def __init__(self) -> None:
        self.ledger: DeviceLedger | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        free = GaugeMetricFamily("deviceshare_devices_free", "Devices no group holds", labels=["node", "resource"])
        used = GaugeMetricFamily(
            "deviceshare_devices_allocated", "Devices held by a group", labels=["node", "resource"]
        )
        compute = GaugeMetricFamily(
            "deviceshare_shared_compute_allocated",
            "Device compute given to sharing groups, in devices (0.25 = a quarter of one)", labels=["node", "resource"],
        )
        memory = GaugeMetricFamily(
            "deviceshare_shared_memory_allocated_bytes", "Device memory given to sharing groups",
            labels=["node", "resource"],
        )
        if self.ledger is not None:
            for node in self.ledger.nodes():
                for resource in node.devices:
                    n_free = len(self.ledger.free_devices(node.name, resource))
                    free.add_metric([node.name, resource], n_free)
                    used.add_metric([node.name, resource], self.ledger.capacity(node.name, resource) - n_free)
                    milli, nbytes = self.ledger.shared_usage(node.name, resource)
                    compute.add_metric([node.name, resource], milli / 1000)
                    memory.add_metric([node.name, resource], nbytes)
        yield free
        yield used
        yield compute
        yield memory


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.placements = Counter(
            "deviceshare_placements", "Scheduling cycles by result", ["result"], registry=r
        )
        self.placement_seconds = Histogram(
            "deviceshare_placement_duration_seconds",
            "From taking a pod off the queue to its binding",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.api_conflicts = Counter(
            "deviceshare_api_conflicts", "409 Conflict answers from the API server", registry=r
        )
        self.api_retries = Counter(
            "deviceshare_api_retries", "Writes retried after a transient API error", registry=r
        )
        self.device_conflicts = Counter(
            "deviceshare_device_conflicts",
            "Devices found claimed by two groups when the ledger was rebuilt",
            registry=r,
        )
        self.missed_deletions = Counter(
            "deviceshare_missed_deletions",
            "Pods and groups found deleted by reading them again, their DELETED watch event never seen",
            ["kind"],
            registry=r,
        )
        self.rebuild_seconds = Gauge(
            "deviceshare_ledger_rebuild_seconds", "Duration of the last ledger rebuild", registry=r
        )
        self.queue_pending = Gauge("deviceshare_queue_pending", "Pods waiting for a decision", registry=r)
        self.queue_parked = Gauge("deviceshare_queue_parked", "Pods parked as unschedulable", registry=r)
        self._ledger = _LedgerCollector()
        r.register(self._ledger)

    def bind_ledger(self, ledger: DeviceLedger) -> None:
        self._ledger.ledger = ledger

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves /metrics and /healthz (liveness: the event loop answers and the operator is started)."""

    def __init__(self, metrics: Metrics, healthy: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._healthy = healthy
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        logger.info("metrics and health on http://%s:%s", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.exposition(), content_type="text/plain", charset="utf-8",
                            headers={"X-Generated": str(time.time())})

    async def _serve_health(self, request: web.Request) -> web.Response:
        if self._healthy():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready")
