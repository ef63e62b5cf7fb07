"""A small HTTP server of GET routes bound to ``host:port``: the operator's and the node agent's /metrics and
probes. A port that cannot be bound is a :class:`~deviceshare.errors.ConfigError` naming the flags to change."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from deviceshare import errors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def start(routes: Mapping[str, Handler], host: str, port: int, flags: str) -> tuple[web.AppRunner, int]:
    """Serves ``routes`` (path -> handler); returns the runner (``cleanup()`` stops it) and the bound port (the
    one the OS chose when ``port`` is 0)."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise errors.ConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror or e} ({flags})") from e
    # aiohttp's public view of the bound sockets: each one's getsockname(), (host, port[, ...]).
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port
