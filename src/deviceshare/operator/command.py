"""`deviceshare operator`: run the Kopf operator (scheduler + group reconciler).

Only the flags live here; Kopf and the operator itself are imported when the command runs
(``process.py``), so ``deviceshare --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
from typing import Any

from deviceshare.api import names

from .config import OperatorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the kubeconfig's current context)")
    parser.add_argument(
        "--env-config", metavar="FILE", help="YAML/JSON file overriding the resource -> env var mapping"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=8080, help="port for /metrics, /healthz and /readyz (0: any)"
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics and probe server listens on")
    parser.add_argument(
        "--peering", metavar="NAME", default=None,
        help=f"Kopf peering object for several replicas (only one schedules); in-cluster default: deviceshare. "
        f"Without it the operator runs standalone. The object lives in ${names.ENV_NAMESPACE}.",
    )
    parser.add_argument(
        "--priority", type=int, default=None,
        help="peering priority of this replica (default with --peering: random, so that two replicas never "
        "tie; equal priorities make every replica stand down)",
    )
    parser.add_argument("--workers", type=int, default=32, help="pods in their API-write phase at once")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    from deviceshare.api import envnames

    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    return OperatorConfig.from_env(
        env_names=env_names,
        kubeconfig=args.kubeconfig,
        context=args.context,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (
            secrets.randbelow(1_000_000) + 1 if args.peering else 0
        ),
        workers=args.workers,
    )


def run(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM. Configuration errors propagate as ``ConfigError`` (the CLI prints one line)."""
    from deviceshare.kube import loops

    from . import process

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = config_from_args(args)
    with asyncio.Runner(loop_factory=loops.event_loop_factory()) as runner:
        runner.run(process.run_operator(config))
    return 0


def __getattr__(name: str) -> Any:
    # ``run_operator`` and ``OperatorThread`` moved to process.py; still importable from here, on use.
    if name in ("run_operator", "OperatorThread"):
        from . import process

        return getattr(process, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
