"""Kubeconfig files as users stack them: ``KUBECONFIG=a:b``, both setting a current context."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

# b's cluster: nothing listens on port 1, so a command that connects there fails at once.
NOWHERE = "https://127.0.0.1:1"


def first_of_two(kubeconfig: Path, folder: Path, *, namespace: str | None = None) -> str:
    """The value of ``KUBECONFIG`` listing ``kubeconfig`` (copied as ``a``, its context's namespace set to
    ``namespace`` when given) before a ``b`` whose current context points at :data:`NOWHERE` in namespace ``team-b``.
    kubectl (client-go) connects with a's current context: the first file that sets one decides it; kubernetes_asyncio's
    own merge lets the last one win."""
    first = yaml.safe_load(kubeconfig.read_text())
    if namespace is not None:
        first["contexts"][0]["context"]["namespace"] = namespace
    second = {
        "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
        "clusters": [{"name": "elsewhere", "cluster": {"server": NOWHERE}}],
        "users": [{"name": "elsewhere", "user": {"token": "x"}}],
        "contexts": [{"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "elsewhere",
                                                        "namespace": "team-b"}}],
    }
    (folder / "a").write_text(yaml.safe_dump(first))
    (folder / "b").write_text(yaml.safe_dump(second))
    return f"{folder / 'a'}{os.pathsep}{folder / 'b'}"
