"""Client CPU per small TLS PATCH: kube/http1 as it is now, as it was before issue 32, and aiohttp, side by side.

Issue 32 gave http1 liveness (idle limit, keepalive, silent-connection detection), the fence's window asked at the
moment of sending, and stricter framing (1xx, leftovers, content codings). None of that may slow the write path,
the reason http1 exists (about half of aiohttp's CPU per request). Each client runs in its own process (uvloop, as
the operator) against one TLS server process answering a small JSON document with Content-Length, and reports
``time.process_time()`` per request over sequential PATCHes on a kept-alive connection; the clients run in turn,
``--rounds`` times, so a busy machine's drift shows as spread rather than as a difference.

*now* sends as ``storage.Transport`` does today (the fence asked through ``send_window``); *before* is the
``kube/http1.py`` of :data:`BEFORE` with the query built by the caller, as its Transport did.

    python -m benchmarks.bench_http1 --requests 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import baseline

BEFORE = "19c9b80"  # main when issue 32 began
ROOT = Path(__file__).resolve().parent.parent

SERVER = r"""
import asyncio, ssl, sys, uvloop
ANSWER = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"12345"}}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)
async def serve(reader, writer):
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(HEAD + ANSWER)
async def main():
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(sys.argv[1], sys.argv[2])
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""

CLIENT = r"""
import asyncio, ssl, sys, time, uvloop
url, ca, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
BODY = b'{"metadata":{"annotations":{"deviceshare.io/selected-devices":"{\\"nvidia.com/gpu\\":\\"0\\"}"}}}'
HEADERS = {"Content-Type": "application/merge-patch+json", "Accept": "application/json",
           "Authorization": "Bearer token", "User-Agent": "bench"}
PATH = "/api/v1/namespaces/ns/pods/p"
async def main():
    context = ssl.create_default_context(cafile=ca)
    if mode == "aiohttp":
        import aiohttp
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), trust_env=False)
        timeout = aiohttp.ClientTimeout(total=5)
        async def once():
            async with session.request("PATCH", url + PATH + "?timeout=1000ms", data=BODY, headers=HEADERS,
                                       timeout=timeout) as resp:
                await resp.read()
    else:
        from deviceshare.kube import http1
        conns = http1.Connections(url, ssl_context=context)
        if mode == "now":
            window = lambda: 1.0
            async def once():
                await conns.request("PATCH", PATH, HEADERS, BODY, timeout=6.0, send_window=window)
        else:
            async def once():
                await conns.request("PATCH", f"{PATH}?timeout={int(1.0 * 1000)}ms", HEADERS, BODY, timeout=2.0)
    for _ in range(300):
        await once()
    started = time.process_time()
    for _ in range(n):
        await once()
    print((time.process_time() - started) / n * 1e6)
uvloop.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before = baseline.source(BEFORE)
    if before is None:
        sys.exit(f"cannot extract the source of {BEFORE} (git archive)")
    from deviceshare.webhooks import certs

    with tempfile.TemporaryDirectory() as folder:
        ca, cert, key = certs.generate(["127.0.0.1"]).write(Path(folder))
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(cert), str(key)], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert server.stdout is not None
            url = f"https://127.0.0.1:{server.stdout.readline().strip()}"
            results: dict[str, list[float]] = {"now": [], "before": [], "aiohttp": []}
            for _ in range(args.rounds):
                for mode in results:
                    src = before if mode == "before" else ROOT / "src"
                    env = {**os.environ, "PYTHONPATH": str(src)}
                    out = subprocess.run([sys.executable, "-c", CLIENT, url, str(ca), str(args.requests), mode],
                                         capture_output=True, text=True, env=env, check=True, timeout=600)
                    results[mode].append(float(out.stdout.strip()))
        finally:
            server.kill()
    print(f"client CPU per TLS PATCH, µs ({args.requests} sequential requests, {args.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d')})")
    # The least of the rounds is the truest (other work on the machine only adds to a process's CPU time).
    print("| client | least | median | rounds | least vs before |")
    print("|---|---|---|---|---|")
    reference = min(results["before"])
    for mode, values in results.items():
        least, median = min(values), statistics.median(values)
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {mode} | {least:.0f} | {median:.0f} | {rounds} | {least / reference:.2f}x |")


if __name__ == "__main__":
    main()
