"""``deviceshare webhook``: serve the admission webhook over TLS until SIGTERM (CONTRACT §5).

SIGHUP reloads the certificate at once (it is also polled). SIGTERM first turns ``/readyz``
to 503 so the Service stops routing here, waits ``--drain-seconds``, then lets in-flight requests
finish: with several replicas, a rolling update drops no admission.

What no retry can fix ends the command at once, as a one-line :class:`~deviceshare.errors.ConfigError`:
certificate files that cannot be loaded, a kubeconfig or context that does not exist, a port that is taken.
The server modules are imported when the command runs, so ``deviceshare --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import ssl
from typing import TYPE_CHECKING

from deviceshare import errors
from deviceshare.api import names

if TYPE_CHECKING:
    from deviceshare.api.envnames import EnvNames


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-cert", metavar="FILE", required=True, help="serving certificate (PEM); reloaded when it changes"
    )
    parser.add_argument("--tls-key", metavar="FILE", required=True, help="private key (PEM); reloaded when it changes")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument(
        "--env-config",
        metavar="FILE",
        help="env-name mapping (YAML/JSON, e.g. a mounted ConfigMap key): {envNames: {PREFIX/: [ENV, ...]}}",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig path (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")
    parser.add_argument(
        "--reload-interval", type=float, default=5.0, help="seconds between certificate checks"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=3.0,
        help="seconds /readyz answers 503 before shutdown on SIGTERM",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level")
    parser.add_argument(
        "--mps-root", metavar="DIR", default=None,
        help="shares are enforced by NVIDIA MPS: give members of compute/memory shares the MPS daemon's pipe "
        "directory (DIR/pipe), its /dev/shm (DIR/shm) and CUDA_MPS_PIPE_DIRECTORY, as the MPS overlay runs it "
        "(default: off; the overlay sets /run/deviceshare/mps)",
    )


def run(args: argparse.Namespace) -> int:
    from deviceshare.api import envnames
    from deviceshare.kube import loops

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(_serve(args, env_names))
    return 0


async def _serve(args: argparse.Namespace, env_names: EnvNames) -> None:
    from deviceshare.kube import connecting
    from deviceshare.webhooks import mpsclients, server, tls

    try:
        tls.server_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise errors.ConfigError(
            f"cannot load the certificate {args.tls_cert} and key {args.tls_key}: {e.strerror or e} "
            "(--tls-cert, --tls-key; `deviceshare certs --out DIR` makes a pair)"
        ) from e
    api = await connecting.api_client(args.kubeconfig, context=args.context)
    try:
        try:
            _check_port(args.host, args.port)  # before the group watch starts, so a taken port is all it says
            running = await server.start_webhook(
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                api_client=api,
                host=args.host,
                port=args.port,
                env_names=env_names,
                scheduler_name=os.environ.get(names.ENV_SCHEDULER_NAME) or names.DEFAULT_SCHEDULER_NAME,
                reload_interval_s=args.reload_interval,
                mps=mpsclients.MpsMount(args.mps_root) if args.mps_root else None,
            )
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                raise errors.ConfigError(
                    f"cannot listen on {args.host}:{args.port}: {e.strerror} (--port, --host)"
                ) from e
            raise
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
    finally:
        await api.close()


def _check_port(host: str, port: int) -> None:
    """Bind and release ``host:port`` as the server will (SO_REUSEADDR): OSError if another process holds it."""
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
