"""`deviceshare operator`: run the Kopf operator (scheduler + group reconciler)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import socket

import kopf

from deviceshare.api import envnames, names

from . import handlers
from .config import OperatorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--env-config", help="YAML/JSON file overriding the resource -> env var mapping")
    parser.add_argument("--metrics-port", type=int, default=8080, help="port for /metrics and /healthz (0: any)")
    parser.add_argument("--metrics-host", default="0.0.0.0")
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
    parser.add_argument("-v", "--verbose", action="store_true")


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    env_names = envnames.EnvNames.from_file(args.env_config) if args.env_config else envnames.EnvNames()
    return OperatorConfig.from_env(
        env_names=env_names,
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else (
            secrets.randbelow(1_000_000) + 1 if args.peering else 0
        ),
        workers=args.workers,
    )


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    memo: kopf.Memo | None = None,
) -> None:
    """Run until ``stop_flag`` is set (or forever): the in-process entry used by the CLI, demo and tests.

    ``memo`` receives the runtime objects (``runtime``, ``metrics_server``) once started.
    """
    if config.identity is None:
        config = dataclasses.replace(
            config, identity=f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=config.peering_name is None,
        peering_name=config.peering_name,
        priority=config.priority,
        identity=config.identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        memo=memo if memo is not None else kopf.Memo(),
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(run_operator(config_from_args(args)))
    except envnames.EnvNameConfigError as e:
        logging.error("%s", e)
        return 2
    return 0
