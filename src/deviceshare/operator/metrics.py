"""Prometheus metrics of the operator (names prefixed ``deviceshare_``) and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from deviceshare import errors
from deviceshare.core import capacity

if TYPE_CHECKING:
    from deviceshare.core.inventory import NodeInfo
    from deviceshare.core.ledger import DeviceLedger

logger = logging.getLogger(__name__)


class _LedgerCollector(Collector):
    """Free and allocated devices per node and resource, read from the ledger at scrape time.

    With sharing (CONTRACT §7) a device may be partly given out, so the compute (in devices, a
    whole-held device counting 1) and the device memory (bytes, where the node declares it) handed
    out per node and resource are exported beside the device counts.
    """

    def __init__(self) -> None:
        self.ledger: DeviceLedger | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "resource"]
        free = GaugeMetricFamily("deviceshare_devices_free", "Devices no group holds", labels=labels)
        used = GaugeMetricFamily("deviceshare_devices_allocated", "Devices held by a group", labels=labels)
        compute = GaugeMetricFamily(
            "deviceshare_compute_allocated",
            "Device compute given out, in devices (a whole-held device counts 1, a 460m share 0.46)",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "deviceshare_device_memory_allocated_bytes",
            "Device memory given out (whole-held devices count their declared memory)", labels=labels,
        )
        memory_cap = GaugeMetricFamily(
            "deviceshare_device_memory_bytes", "Device memory the node declares, over its devices", labels=labels
        )
        tiles = GaugeMetricFamily("deviceshare_tiles_allocated", "Device tiles held by groups", labels=labels)
        if self.ledger is not None:
            for node in self.ledger.nodes():
                for resource, ids in node.devices.items():
                    key = [node.name, resource]
                    n_free = len(self.ledger.free_devices(node.name, resource))
                    free.add_metric(key, n_free)
                    used.add_metric(key, len(ids) - n_free)
                    milli, mem, n_tiles = self._given_out(node, resource, ids)
                    compute.add_metric(key, milli / 1000)
                    per_device = node.device_memory.get(resource)
                    if per_device is not None:
                        memory.add_metric(key, mem)
                        memory_cap.add_metric(key, per_device * len(ids))
                    if node.device_tiles.get(resource):
                        tiles.add_metric(key, n_tiles)
        yield free
        yield used
        yield compute
        yield memory
        yield memory_cap
        yield tiles

    def _given_out(self, node: NodeInfo, resource: str, ids: Sequence[str]) -> tuple[int, int, int]:
        """(compute milli, memory bytes, tiles) held on the node's devices of ``resource``."""
        assert self.ledger is not None
        per_device = node.device_memory.get(resource, 0)
        milli = mem = tiles = 0
        for device in ids:
            use = self.ledger.use(node.name, resource, device)
            if use is not None:
                milli, mem, tiles = milli + use.compute_milli, mem + use.memory_bytes, tiles + len(use.tiles)
            elif self.ledger.holder(node.name, resource, device) is not None:
                milli, mem = milli + capacity.COMPUTE_FULL, mem + per_device
        return milli, mem, tiles


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
        self.api_writes = Counter(
            "deviceshare_api_writes",
            "API writes by verb, resource and result: ok, conflict (409), uncertain_resolved (the answer was lost "
            "and the object read back told the outcome), failed, fenced (not sent: this replica is not the leader)",
            ["verb", "resource", "result"], registry=r,
        )
        self.api_retries = Counter(
            "deviceshare_api_retries", "Writes retried after a transient API error", registry=r
        )
        self.device_conflicts = Counter(
            "deviceshare_device_conflicts",
            "Devices found claimed by two groups when the ledger was rebuilt",
            registry=r,
        )
        self.untrusted_claims = Counter(
            "deviceshare_untrusted_claims",
            "Pods found claiming devices (selected-devices) that no record of the operator backs, at a rebuild",
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

    def api_write(self, verb: str, resource: str, result: str) -> None:
        self.api_writes.labels(verb, resource, result).inc()

    def bind_ledger(self, ledger: DeviceLedger) -> None:
        self._ledger.ledger = ledger

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """Serves /metrics and the probes, from before the operator first reaches the API until it exits.

    ``/healthz`` (liveness) answers 200 whenever the event loop answers at all: an API server that is down
    is no reason to restart the operator, which waits it out by itself. ``/readyz`` (readiness) answers 200
    only once ``ready()`` says the operator is connected and serving (see ``startup.ready``).
    """

    def __init__(self, metrics: Metrics, ready: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        """Bind ``host:port``; a port that is taken is a :class:`~deviceshare.errors.ConfigError`."""
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        app.router.add_get("/readyz", self._serve_ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await self.stop()
            raise errors.ConfigError(
                f"cannot serve metrics on {host}:{port}: {e.strerror or e} (--metrics-port, --metrics-host)"
            ) from e
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        logger.info("metrics and probes on http://%s:%s (/metrics, /healthz, /readyz)", host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.exposition(), content_type="text/plain", charset="utf-8",
                            headers={"X-Generated": str(time.time())})

    async def _serve_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _serve_ready(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready: not yet connected to the API server")
