"""`deviceshare operator`: run the Kopf operator (scheduler + group reconciler).

Only the flags live here; Kopf and the operator itself are imported when the command runs
(``process.py``), so ``deviceshare --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
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
        "--leader-elect", action="store_true",
        help=f"elect one active replica on a coordination.k8s.io/v1 Lease in ${names.ENV_NAMESPACE} (run this "
        "with several replicas); without it the operator schedules at once, as the only replica",
    )
    parser.add_argument(
        "--leader-elect-lease-name", metavar="NAME", default="deviceshare-operator",
        help="name of the Lease (default: %(default)s)",
    )
    parser.add_argument(
        "--leader-elect-lease-duration", type=float, default=15.0, metavar="SECONDS",
        help="how long a standby waits, after it last saw the Lease change, before taking it over "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--leader-elect-renew-deadline", type=float, default=10.0, metavar="SECONDS",
        help="a leader that has not renewed its Lease for this long stops scheduling; must be shorter than "
        "the lease duration (default: %(default)g)",
    )
    parser.add_argument(
        "--leader-elect-retry-period", type=float, default=2.0, metavar="SECONDS",
        help="time between tries to acquire or renew the Lease (default: %(default)g)",
    )
    parser.add_argument("--workers", type=int, default=32, help="pods in their API-write phase at once")
    parser.add_argument(
        "--mps", action="store_true",
        help="shares are enforced by NVIDIA MPS: place compute/memory shares of nvidia.com/ devices only on nodes "
        "annotated deviceshare.io/mps=ready (the node agent publishes it while the MPS overlay's daemon runs)",
    )
    parser.add_argument(
        "--handover", choices=("env", "cdi"), default=None,
        help="how members' containers get their devices on nodes without the label deviceshare.io/handover: env "
        "(NVIDIA_VISIBLE_DEVICES through the downward API) or cdi (the nvidia.cdi.k8s.io/container.<name> "
        "annotation that the NVIDIA container toolkit's NRI plugin reads); default: the --env-config file's "
        "'handover', else env",
    )
    parser.add_argument(
        "--cdi-kind", action="append", default=[], metavar="RESOURCE=KIND",
        help="the CDI kind that names a resource's devices (repeatable; default nvidia.com/gpu=nvidia.com/gpu; "
        "also 'cdiKinds' in the --env-config file); a resource with none keeps the env hand-over",
    )
    parser.add_argument(
        "--groups-through-kopf", action="store_true",
        help="SharedDeviceGroup events come through a Kopf on.event handler instead of the operator's own watch "
        "(about 1.6x the operator CPU per bound pod on one-pod groups: docs/architecture.md)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    from deviceshare.api import envnames, handovers

    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    from_file = handovers.Handovers.from_file(args.env_config) if args.env_config else handovers.Handovers()
    return OperatorConfig.from_env(
        env_names=env_names,
        kubeconfig=args.kubeconfig,
        context=args.context,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        lease_name=args.leader_elect_lease_name if args.leader_elect else None,
        lease_duration=args.leader_elect_lease_duration,
        renew_deadline=args.leader_elect_renew_deadline,
        retry_period=args.leader_elect_retry_period,
        workers=args.workers,
        groups_through_kopf=args.groups_through_kopf,
        mps=args.mps,
        handovers=from_file.with_overrides(args.handover, args.cdi_kind),
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
