"""The sandbox's hooks for fault tests: scripted request failures (``faults.py``) and watch streams dropped, stalled
or compacted. A mixin of :class:`~deviceshare.sandbox.cluster.Sandbox`, whose API server and store they act on."""

from __future__ import annotations

import re

from deviceshare.sandbox import apiserver, faults, store


class FaultHooks:
    api: apiserver.ApiServer
    store: store.ObjectStore

    def inject_fault(
        self,
        method: str | None,
        path: str,
        *,
        status: int | None = None,
        times: int | None = 1,
        retry_after: float | None = None,
        delay: float = 0.0,
        message: str = "injected fault",
        applied: bool = False,
        drop: bool = False,
        every: int = 1,
        hold: bool = False,
        interim: bool = False,
        cut: bool = False,
    ) -> faults.Fault:
        """Make the next ``times`` requests of ``method`` whose path matches ``path`` fail or wait; with
        ``applied``, carry them out and then answer ``status`` (or, with ``drop``, close the connection);
        with ``every=n``, only each n-th matching request; with ``hold``, each waits in flight until
        ``fault.release()`` (or ``clear_faults()``) and is then carried out, its client there or not; with
        ``interim``, a ``100 Continue`` comes first; with ``cut`` (and ``applied``), half the answer, then a close."""
        return self.api.faults.add(
            faults.Fault(
                method.upper() if method else None,
                re.compile(path),
                status,
                times,
                retry_after,
                delay,
                message,
                applied=applied,
                drop=drop,
                every=every,
                hold=hold,
                interim=interim,
                cut=cut,
            )
        )

    def clear_faults(self) -> None:
        """Remove every fault; the requests held by one go through."""
        self.api.faults.clear()

    def open_watches(self, kind_or_plural: str | None = None) -> int:
        """Watch streams open now (of one resource type, or all): what a test waits for before it
        changes something a watcher must see on its stream rather than in its first list."""
        key = None if kind_or_plural is None else self.store.rtype(kind_or_plural).key
        return self.store.open_watches(key)

    def drop_watches(self) -> int:
        """Close every open watch stream; clients must re-watch (from their last resourceVersion)."""
        return self.store.close_watches()

    def stall_watches(self) -> None:
        """Open watch streams stay open but deliver nothing (a stuck apiserver) until resumed."""
        self.api.flowing.clear()

    def resume_watches(self) -> None:
        self.api.flowing.set()

    def compact(self) -> None:
        """Forget the watch history: a resume from any older resourceVersion gets 410 Gone."""
        self.store.compact()
