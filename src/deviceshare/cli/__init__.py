"""The ``deviceshare`` console script (CONTRACT §5).

Each subcommand lives with the package that implements it, as a module exposing
``add_arguments(parser)`` and ``run(args) -> int``. Adding one is one line in :data:`SUBCOMMANDS`.

Only the chosen subcommand's module is imported (``deviceshare --help`` imports none), and those
modules import their heavy dependencies (Kopf, kubernetes_asyncio, aiohttp) inside ``run``, so help
is instant. Errors end the same way everywhere: a :class:`~deviceshare.errors.ConfigError` is one line
on stderr and exit 2, any other failure one line and exit 1 (``--debug`` shows the traceback), a closed
stdout (``deviceshare inspect | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from deviceshare import __version__, errors

# subcommand -> (module with add_arguments/run, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("deviceshare.operator.command", "run the Kopf operator (scheduler + group reconciler)"),
    "webhook": ("deviceshare.webhooks.command", "serve the mutating admission webhook over TLS"),
    "sandbox": ("deviceshare.sandbox.command", "start the embedded local cluster and print a kubeconfig path"),
    "demo": ("deviceshare.cli.demo", "sandbox + operator + webhook in one process, with the examples"),
    "inspect": ("deviceshare.cli.inspect", "per-node device map: which group holds which device"),
    "explain": ("deviceshare.cli.explain", "why a pod is pending, in plain words"),
    "certs": ("deviceshare.webhooks.certs", "generate a self-signed CA and webhook serving certificate"),
    "simulate": ("deviceshare.cli.simulate", "replay a node and pod list through the placement policies"),
    "node-agent": ("deviceshare.nodeagent.command", "publish this node's devices, links, health and MPS state"),
}

EXIT_CONFIG = 2  # a setting the user must fix (also argparse's exit code for a bad flag)
EXIT_SIGPIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``(default: X)`` after every option that has a default its help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser. With ``argv``, only the subcommand it names gets its arguments (its module is
    imported); without, every subcommand does (tests use that to see every flag)."""
    return _build(argv)[0]


def _build(argv: Sequence[str] | None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each subcommand's own parser by name (see :func:`build_parser`)."""
    parser = argparse.ArgumentParser(
        prog="deviceshare",
        description="Share the same accelerator devices between the pods of a group.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"deviceshare {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback when a command fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        parsers[name] = p
        if chosen is None or chosen == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser, parsers


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = _build(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage, not the top-level one
        parsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    prefix = f"deviceshare {args.command}"
    try:
        code = int(args._run(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (``head``) has what it wanted; further writes, and the flush at exit, go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE
    except errors.ConfigError as e:
        _report(prefix, str(e), args.debug)
        return EXIT_CONFIG
    except Exception as e:
        _report(prefix, f"{_describe(e)} (--debug shows the traceback)", args.debug)
        return 1


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _report(prefix: str, message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    print(f"{prefix}: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
