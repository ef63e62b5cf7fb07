"""`deviceshare operator`: not built yet (issue 4)."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print("deviceshare operator: not available yet (issue 4)", file=sys.stderr)
    return 2
