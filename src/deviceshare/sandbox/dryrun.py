"""Server-side dry run (``dryRun=All``): which request asks for it, and the undo around a store write.

The write runs every check and answers as if stored, then is undone, with no watch event sent and
no resourceVersion used (what ``kubectl apply --dry-run=server`` relies on). The flag is a context
variable set per request by the API server, so in-process writers such as the kubelet, running in
other tasks, are never affected.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("deviceshare_sandbox_dry_run", default=False)
_P = ParamSpec("_P")
_R = TypeVar("_R")


class Undoable(Protocol):
    def begin_dry_run(self) -> Callable[[], None] | None:
        """Start a dry-run write and return what undoes it; None when one is under way already."""


_S = TypeVar("_S", bound=Undoable)


def undone_when_dry(write: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """The write as it is, or under ``dryRun=All`` run and then undone (one undo for nested writes)."""

    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        undo = self.begin_dry_run() if DRY_RUN.get() else None
        if undo is None:
            return write(self, *args, **kwargs)
        try:
            return write(self, *args, **kwargs)
        finally:
            undo()

    return wrapper
