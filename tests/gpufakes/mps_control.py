"""``nvidia-cuda-mps-control`` for the rehearsal: ``-d`` starts a daemon in the background serving the real
daemon's SEQPACKET sockets in ``$CUDA_MPS_PIPE_DIRECTORY`` (tests.nodeagent.fakempsdaemon); without arguments it
reads one command on stdin, as the real client does: ``get_default_active_thread_percentage`` answers 100.0 when
the daemon accepts a connection, ``quit`` stops it."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.nodeagent import fakempsdaemon

PIPE = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
PID = PIPE / "nvidia-cuda-mps-control.pid"


def serve() -> None:
    daemon = fakempsdaemon.FakeMpsDaemon(PIPE)
    PID.write_text(str(os.getpid()))


    def stop(*_: object) -> None:
        daemon.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    daemon.accept_forever()


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        serve()
        return 0
    if argv == ["-d"]:
        subprocess.Popen([sys.executable, "-m", "tests.gpufakes.mps_control", "--serve"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The real `nvidia-cuda-mps-control -d` returns once the daemon runs: wait for its pid file, on a busy
        # machine as long as the tests' own hang guard, looking every 50 ms.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if PID.exists():
                return 0
            time.sleep(0.05)
        return 1
    command = sys.stdin.read().strip()
    if command == "quit":
        if PID.exists():
            os.kill(int(PID.read_text()), signal.SIGTERM)
        return 0
    if command == "get_default_active_thread_percentage":
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            client.connect(str(PIPE / "control"))
        except OSError:
            return 1
        finally:
            client.close()
        print("100.0")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
