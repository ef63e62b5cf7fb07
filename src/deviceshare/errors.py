"""Errors a user must fix, shared by every command so the CLI can end them the same way.

A :class:`ConfigError` means retrying cannot help: a missing kubeconfig or context, a port another process
holds, a certificate file that cannot be read. The console script prints it as one line (the problem and
the flag that fixes it) and exits 2, without a traceback; a long-running command raises it before it starts
serving, so a misconfigured Deployment crash-loops visibly instead of retrying for ever.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A setting the user must change; the message names the problem and the flag (or variable) to fix."""
