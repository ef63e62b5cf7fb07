"""`deviceshare certs`: not built yet (issue 5)."""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print("deviceshare certs: not available yet (issue 5)", file=sys.stderr)
    return 2
