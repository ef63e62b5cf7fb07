"""The ``deviceshare`` console script (CONTRACT §5).

Each subcommand lives with the package that implements it, as a module exposing
``add_arguments(parser)`` and ``run(args) -> int``; this module only wires them up, importing
each lazily so ``deviceshare --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from deviceshare import __version__

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("deviceshare.operator.command", "run the Kopf operator (scheduler + group reconciler)"),
    "webhook": ("deviceshare.webhooks.command", "serve the mutating admission webhook over TLS"),
    "sandbox": ("deviceshare.sandbox.command", "start the embedded local cluster and print a kubeconfig path"),
    "demo": ("deviceshare.cli.demo", "sandbox + operator + webhook in one process, with the examples"),
    "inspect": ("deviceshare.cli.inspect", "per-node device map: which group holds which device"),
    "explain": ("deviceshare.cli.explain", "why a pod is pending, in plain words"),
    "certs": ("deviceshare.webhooks.certs", "generate a self-signed CA and webhook serving certificate"),
    "simulate": ("deviceshare.cli.simulate", "replay a node and pod list through the placement policies"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deviceshare",
        description="Share the same accelerator devices between the pods of a group.",
    )
    parser.add_argument("--version", action="version", version=f"deviceshare {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
