"""`deviceshare explain`: not built yet (issue 6)."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print("deviceshare explain: not available yet (issue 6)", file=sys.stderr)
    return 2
