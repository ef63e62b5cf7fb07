"""A real Prometheus server (Debian's ``prometheus`` package) for the tests: started on a free port with short
scrape and evaluation intervals, queried over its HTTP API, stopped with its process.

Nothing here sleeps "long enough": every wait polls the server's API for the event it needs (a target up,
a rule evaluated, an alert firing) and fails naming it, with Prometheus's own log, when it does not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests import waiting

INTERVAL = "500ms"  # scrape and rule evaluation: the test waits for a few of each
INSTALL = "apt-get install prometheus (Debian/Ubuntu: the server and promtool), or put both on PATH"


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; a CI run without it fails, a developer's skips, both saying so."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed: {INSTALL}; .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    scheme: str = "http"
    ca_file: str | None = None


@dataclass
class Prometheus:
    url: str
    http: aiohttp.ClientSession
    log: Path

    async def api(self, path: str, **params: str) -> Any:
        """``data`` of a GET on the HTTP API; a status other than success fails with Prometheus's error."""
        async with self.http.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else [data]
        return result

    async def until(self, probe: Callable[[], Awaitable[Any]], what: str, timeout: float = waiting.HANG_GUARD) -> Any:
        """Poll ``probe`` until it returns something truthy; fail naming ``what``, with the server's log."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            got = await probe()
            if got:
                return got
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.log.read_text()[-3000:]}")
            await asyncio.sleep(0.1)  # the poll's pause (a hang guard above)


def config(targets: list[Target], rule_files: list[Path]) -> dict[str, Any]:
    jobs = []
    for t in targets:
        job: dict[str, Any] = {"job_name": t.job, "scheme": t.scheme, "static_configs": [{"targets": [t.address]}]}
        if t.ca_file is not None:
            job["tls_config"] = {"ca_file": t.ca_file}
        jobs.append(job)
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }


def _prepare(workdir: Path, targets: list[Target], rule_files: list[Path]) -> tuple[Path, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(targets, rule_files)))
    return config_file, workdir / "prometheus.log"


@contextlib.asynccontextmanager
async def running(workdir: Path, targets: list[Target], rule_files: list[Path]) -> AsyncIterator[Prometheus]:
    """A Prometheus scraping ``targets`` with ``rule_files`` loaded, ready (``/-/ready``) when entered."""
    executable = binary("prometheus")
    config_file, log = _prepare(workdir, targets, rule_files)
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            executable, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            server = Prometheus(f"http://127.0.0.1:{port}", http, log)

            async def ready() -> bool:
                if process.returncode is not None:
                    raise AssertionError(f"prometheus exited {process.returncode}:\n{log.read_text()[-3000:]}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{server.url}/-/ready") as resp:
                        return resp.status == 200
                return False

            await server.until(ready, "Prometheus to be ready")
            yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def with_for(rules: Mapping[str, Any], alert: str, duration: str) -> dict[str, Any]:
    """The rule file with ``alert``'s ``for:`` replaced (the override a chart's values would make)."""
    groups = []
    found = False
    for group in rules["groups"]:
        copied = []
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule, found = {**rule, "for": duration}, True
            copied.append(rule)
        groups.append({**group, "rules": copied})
    assert found, f"no alert {alert} in the rules"
    return {"groups": groups}
