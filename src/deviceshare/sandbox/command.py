"""`deviceshare sandbox`: not built yet (issue 3)."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print("deviceshare sandbox: not available yet (issue 3)", file=sys.stderr)
    return 2
