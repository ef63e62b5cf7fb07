"""Start-up that heals: fail fast on what no retry can fix, wait out an API server that is not there yet.

Two kinds of trouble look alike at start and must not be treated alike. A kubeconfig or context that does
not exist, or a metrics port another process holds, will not fix itself: :func:`preflight` (and the metrics
server's bind) raise :class:`~deviceshare.errors.ConfigError` before Kopf starts, and the process exits with
one line. An API server that does not answer yet (the control plane is restarting, the sandbox starts later)
heals by itself: :func:`start_runtime` tries again with a doubling delay capped at
``startup_backoff_max`` (10 s), and each failed try closes everything it opened (its HTTP session, its
tasks) before the next, so nothing from a failed try lingers into a later one.

The metrics server is started once, before any of this, by ``process.run_operator``: ``/healthz`` stays 200
while the operator waits (restarting it would not bring the API back) and ``/readyz`` turns 200 with
:func:`ready`.
"""

from __future__ import annotations

import asyncio
import logging

from deviceshare import errors
from deviceshare.kube import connecting

from . import storage
from .config import OperatorConfig
from .context import Context
from .metrics import Metrics
from .runtime import Runtime

logger = logging.getLogger(__name__)


async def preflight(config: OperatorConfig) -> None:
    """Raise :class:`~deviceshare.errors.ConfigError` now if the kubeconfig or context cannot be found."""
    await connecting.configuration(config.kubeconfig, context=config.context)


async def start_runtime(config: OperatorConfig, metrics: Metrics) -> Runtime:
    """A started :class:`Runtime`, once the API answers; retried with capped backoff until then."""
    delay = config.startup_backoff_initial
    tries = 0
    while True:
        tries += 1
        api = storage.ClusterApi(await connecting.api_client(config.kubeconfig, context=config.context))
        runtime = Runtime(Context(config=config, api=api, metrics=metrics))
        try:
            await runtime.start(identity=config.identity)
        except BaseException as e:
            # Nothing of a failed try survives it: its tasks and its HTTP session are closed here.
            await runtime.stop()
            await api.close()
            if not isinstance(e, Exception) or isinstance(e, errors.ConfigError):
                raise
            logger.warning("cannot start yet (try %d): %s; next try in %.1fs", tries, _describe(e), delay)
        else:
            if tries > 1:
                logger.info("connected to the API server after %d tries", tries)
            return runtime
        await asyncio.sleep(delay)
        delay = min(delay * 2, config.startup_backoff_max)


def ready(runtime: Runtime | None) -> bool:
    """Readiness: started, and (when scheduling) its pod and group feeds have listed the cluster once."""
    if runtime is None or not runtime.started:
        return False
    if not runtime.scheduling:
        # A standby replica is ready while it can reach its Lease: it can take over when that expires.
        return runtime.leadership is not None and runtime.leadership.connected
    return runtime.intake.synced


def _describe(e: Exception) -> str:
    """One short line: ``list nodes: Cannot connect to host ...`` rather than the client error's repr."""
    text = str(e) or type(e).__name__
    if e.__cause__ is not None and str(e.__cause__):
        text = f"{text.split(': ', 1)[0]}: {e.__cause__}"
    return text if len(text) < 300 else text[:300] + "..."
