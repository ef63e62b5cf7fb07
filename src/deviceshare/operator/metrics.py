"""Prometheus metrics of the operator (names prefixed ``deviceshare_``) and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import prometheus_client
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from deviceshare.kube import serving

from . import fleetmetrics, nodemetrics

if TYPE_CHECKING:
    from deviceshare.core.ledger import DeviceLedger

    from .state import ClusterState, GroupRecord

logger = logging.getLogger(__name__)
# No `_created` series: one more sample per counter and histogram that no dashboard or alert reads.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


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
        self.preemptions = Counter(
            "deviceshare_preemptions",
            "Preemptions carried out, by result: evicted (every victim pod evicted), refused (a "
            "PodDisruptionBudget refused one), failed (an eviction's outcome is unknown)", ["result"], registry=r,
        )
        self.preemption_victims = Counter(
            "deviceshare_preemption_victims", "Groups chosen as victims of a preemption", registry=r
        )
        self.nominations = Gauge(
            "deviceshare_nominations", "Preemptors with room kept for them while their victims leave", registry=r
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
        self.rebuilds = Counter("deviceshare_rebuilds", "Ledger rebuilds from the API (start, election)", registry=r)
        self.rebuild_objects = Gauge(
            "deviceshare_rebuild_objects", "Objects the last ledger rebuild read, by kind", ["kind"], registry=r
        )
        self.rebuild_untrusted = Gauge(
            "deviceshare_rebuild_untrusted_claims",
            "Pods the last rebuild found claiming devices no record of the operator backs (ignored, reported)",
            registry=r,
        )
        self.time_to_bound = Histogram(
            "deviceshare_group_time_to_bound_seconds",
            "From a group's creation to its status turning Bound",
            buckets=fleetmetrics.TIME_TO_BOUND_BUCKETS,
            registry=r,
        )
        self.fleet = fleetmetrics.FleetCollector()
        r.register(self.fleet)

        # Per node and resource: rendered as text per changed node, outside the registry (see nodemetrics).
        self.nodes = nodemetrics.NodeGauges(active=lambda: self.fleet.leading is None or self.fleet.leading())

    def group_on_unhealthy(self, group: tuple[str, str], holds: bool) -> None:
        """Whether ``group`` holds a device its node reports unhealthy (the reconciler says, group by group)."""
        if holds:
            self.fleet.on_unhealthy.add(group)
        else:
            self.fleet.on_unhealthy.discard(group)

    def api_write(self, verb: str, resource: str, result: str) -> None:
        self.api_writes.labels(verb, resource, result).inc()

    def bind_ledger(self, ledger: DeviceLedger) -> None:
        self.nodes.bind(ledger)
        self.fleet.track(ledger)

    def bind_context(self, source: fleetmetrics.FleetSource) -> None:
        """The groups, reasons and workload the fleet gauges read (a Context: its properties follow rebuilds)."""
        self.fleet.source = source

    def bind_state(self, state: ClusterState) -> None:
        """Hear the groups' phase changes (time-to-bound) of ``state``, the one a rebuild just made current."""
        state.groups.on_change = self._group_changed

    def bind_leader(self, leading: Callable[[], bool]) -> None:
        """``leading()`` says whether this replica schedules: ``deviceshare_leader``, and what a standby hides."""
        self.fleet.leading = leading

    def rebuilt(self, seconds: float, nodes: int, groups: int, pods: int, *, untrusted: int = 0) -> None:
        self.rebuild_seconds.set(seconds)
        self.rebuilds.inc()
        self.rebuild_untrusted.set(untrusted)
        for kind, count in (("nodes", nodes), ("groups", groups), ("pods", pods)):
            self.rebuild_objects.labels(kind).set(count)

    def _group_changed(self, old: GroupRecord | None, new: GroupRecord | None) -> None:
        waited = fleetmetrics.time_to_bound(old, new, time.time())
        if waited is not None:
            self.time_to_bound.observe(waited)

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + self.nodes.text().encode()


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
        routes = {"/metrics": self._serve_metrics, "/healthz": self._serve_health, "/readyz": self._serve_ready}
        self._runner, self.port = await serving.start(routes, host, port, "--metrics-port, --metrics-host")
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
