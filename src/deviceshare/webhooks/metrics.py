"""The webhook's Prometheus metrics, each app with its own registry (no process-wide globals).

Own registries keep several webhooks in one process (tests, the demo) from colliding, and keep
the exposition limited to what this component does.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client

from deviceshare.api import names

# No `_created` series: one more sample per counter and histogram that no dashboard or alert reads.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

PREFIX = f"{names.METRICS_PREFIX}webhook_"
# Admission has a 5 s budget at most; the interesting range is well under 10 ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class WebhookMetrics:
    def __init__(self, *, synced: Callable[[], bool] | None = None) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.admissions = prometheus_client.Counter(
            f"{PREFIX}admission_requests",
            "AdmissionReview requests answered, by path and result "
            "(skipped, unchanged, patched, denied, warming, error, malformed).",
            ["path", "result"],
            registry=self.registry,
        )
        self.latency = prometheus_client.Histogram(
            f"{PREFIX}admission_duration_seconds",
            "Time from reading an AdmissionReview to answering it, including any wait for the cache, by path.",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.certificate_reloads = prometheus_client.Counter(
            f"{PREFIX}certificate_reloads",
            "TLS certificate reload attempts, by result (ok, failed).",
            ["result"],
            registry=self.registry,
        )
        self.cache_synced = prometheus_client.Gauge(
            f"{PREFIX}cache_synced",
            "1 once the group and member caches have finished their first list.",
            registry=self.registry,
        )
        if synced is not None:
            self.cache_synced.set_function(lambda: float(synced()))

    def observe(self, path: str, outcome: str, seconds: float) -> None:
        """One review answered on ``path`` (a route: bounded) with ``outcome``, in ``seconds``."""
        self.admissions.labels(path=path, result=outcome).inc()
        self.latency.labels(path=path).observe(seconds)

    def certificate_reloaded(self, ok: bool) -> None:
        self.certificate_reloads.labels(result="ok" if ok else "failed").inc()

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
