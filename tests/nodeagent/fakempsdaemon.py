"""A fake NVIDIA MPS control daemon: the sockets ``nvidia-cuda-mps-control -d`` creates in its pipe directory.

Where its behaviour comes from:
- The socket type: the real daemon listens on ``<pipe>/control`` and ``<pipe>/control_privileged`` as
  ``SOCK_SEQPACKET`` Unix sockets. A public write-up ("NVIDIA GPU Sharing", ``lsof +c 0 /tmp/nvidia-mps/*``
  of a running daemon) lists both as ``type=SEQPACKET (LISTEN)``; measured on an NVIDIA H200 with driver
  580.159 (docs/benchmarks.md, /work/shared/NOTES.md 2026-11-27): ``/proc/net/unix`` type ``0005`` for both, a
  SEQPACKET connect succeeds, STREAM and DGRAM connects fail with ``EPROTOTYPE`` (errno 91) — as they do on
  this fake, since Linux refuses a connect whose type differs from the listener's.
- The other files (``control_lock``, the ``log`` FIFO) are created as the daemon creates them; nothing here
  reads them. The fake does not speak the daemon's protocol (credentials first, then commands): readiness is
  judged by the connect alone.
- Stopping: the real daemon's socket files stay behind when it is killed; ``stop`` closes the listeners and
  leaves the files, so a stale file must not read as ready.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


class FakeMpsDaemon:
    def __init__(self, pipe_directory: Path) -> None:
        self.pipe_directory = pipe_directory
        pipe_directory.mkdir(parents=True, exist_ok=True)
        self._listeners = [self._listen(pipe_directory / name) for name in ("control", "control_privileged")]
        (pipe_directory / "control_lock").touch()
        if not (pipe_directory / "log").exists():
            os.mkfifo(pipe_directory / "log")

    @staticmethod
    def _listen(path: Path) -> socket.socket:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server.bind(str(path))
        server.listen(16)
        return server

    def accept_forever(self) -> None:
        """Accept clients on ``control`` and hang up at once (the real daemon then waits for credentials)."""
        listener = self._listeners[0]
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            client.close()

    def stop(self) -> None:
        """The daemon dies: nobody listens any more, its socket files stay behind."""
        for listener in self._listeners:
            listener.close()
