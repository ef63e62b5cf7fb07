"""``deviceshare webhook``: serve the admission webhook over TLS until SIGTERM (CONTRACT §5).

SIGHUP reloads the certificate at once (it is also polled). SIGTERM first turns ``/readyz``
to 503 so the Service stops routing here, waits ``--drain-seconds``, then lets in-flight requests
finish: with several replicas, a rolling update drops no admission.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from deviceshare.api import envnames, names
from deviceshare.kube import loops
from deviceshare.webhooks import server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert", required=True, help="serving certificate (PEM); reloaded when it changes"
    )
    parser.add_argument("--tls-key", required=True, help="private key (PEM); reloaded when it changes")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (%(default)s)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (%(default)s)")
    parser.add_argument(
        "--env-config",
        metavar="FILE",
        help="env-name mapping (YAML/JSON, e.g. a mounted ConfigMap key): {envNames: {PREFIX/: [ENV, ...]}}",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig path (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument(
        "--reload-interval", type=float, default=5.0, help="seconds between certificate checks (%(default)s)"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=3.0,
        help="unready time before shutdown on SIGTERM (%(default)s)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (%(default)s)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(_serve(args, env_names))
    return 0


async def _serve(args: argparse.Namespace, env_names: envnames.EnvNames) -> None:
    running = await server.start_webhook(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        kubeconfig=args.kubeconfig,
        host=args.host,
        port=args.port,
        env_names=env_names,
        scheduler_name=os.environ.get(names.ENV_SCHEDULER_NAME) or names.DEFAULT_SCHEDULER_NAME,
        reload_interval_s=args.reload_interval,
    )
    server.freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, running.reloader.reload)
    try:
        await stop.wait()
        running.webhook.draining = True
        await asyncio.sleep(args.drain_seconds)
    finally:
        await running.stop()
