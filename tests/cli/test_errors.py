"""The console script as a user meets it: fatal settings end at once with one line, help is light and complete.

Every command runs as a real process (``python -m deviceshare``) with a clean environment: no KUBECONFIG,
an empty HOME, not in a cluster. "At once" is checked as "without a retry" (no retry line, the process
ended by itself); how many seconds these take is measured in ``make bench`` (benchmarks/bench_startup.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deviceshare import cli
from deviceshare.sandbox import Sandbox
from deviceshare.webhooks import certs
from tests import waiting

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("kopf", "aiohttp", "kubernetes_asyncio", "kmock", "pydantic", "prometheus_client", "cryptography", "celpy")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items()
             if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    return {**clean, "HOME": str(home), "PYTHONPATH": str(SRC)}


def deviceshare(
    env: dict[str, str], *argv: str, timeout: float = waiting.HANG_GUARD
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deviceshare", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def assert_one_line(result: subprocess.CompletedProcess[str], *, code: int, names: tuple[str, ...]) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def kubeconfig(path: Path, server: str = "http://127.0.0.1:1") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "here", "cluster": {"server": server}}],
        "users": [{"name": "here", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": {"cluster": "here", "user": "here"}}],
    }))
    return path


@pytest.fixture
def taken_port() -> object:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_webhook_with_unreadable_tls_files(env: dict[str, str]) -> None:
    result = deviceshare(env, "webhook", "--tls-cert", "/nope.crt", "--tls-key", "/nope.key")
    assert_one_line(result, code=2, names=("/nope.crt", "--tls-cert", "deviceshare certs"))


def test_webhook_without_kubeconfig(env: dict[str, str], tmp_path: Path) -> None:
    _, cert, key = certs.generate(["127.0.0.1"]).write(tmp_path)
    result = deviceshare(env, "webhook", "--tls-cert", str(cert), "--tls-key", str(key))
    assert_one_line(result, code=2, names=("no kubeconfig", "--kubeconfig"))


def test_webhook_on_a_taken_port(env: dict[str, str], tmp_path: Path, taken_port: int) -> None:
    _, cert, key = certs.generate(["127.0.0.1"]).write(tmp_path)
    result = deviceshare(env, "webhook", "--tls-cert", str(cert), "--tls-key", str(key), "--host", "127.0.0.1",
                         "--port", str(taken_port), "--kubeconfig", str(kubeconfig(tmp_path / "k")))
    assert_one_line(result, code=2, names=(str(taken_port), "--port"))


def test_inspect_with_a_context_that_does_not_exist(env: dict[str, str], tmp_path: Path) -> None:
    result = deviceshare(env, "inspect", "--context", "nosuch", "--kubeconfig", str(kubeconfig(tmp_path / "k")))
    assert_one_line(result, code=2, names=("'nosuch'", "--context"))
    result = deviceshare(env, "inspect", "--context", "nosuch")  # and with no kubeconfig at all
    assert_one_line(result, code=2, names=("'nosuch'",))


def test_operator_with_a_missing_kubeconfig_exits_without_retrying(env: dict[str, str]) -> None:
    result = deviceshare(env, "operator", "--kubeconfig", "/nope/config")
    assert_one_line(result, code=2, names=("/nope/config", "--kubeconfig"))  # one line: no "cannot start yet"


def test_operator_with_a_missing_context(env: dict[str, str], tmp_path: Path) -> None:
    result = deviceshare(env, "operator", "--kubeconfig", str(kubeconfig(tmp_path / "k")), "--context", "nosuch")
    assert_one_line(result, code=2, names=("'nosuch'", "--context"))


def test_operator_on_a_taken_metrics_port(env: dict[str, str], tmp_path: Path, taken_port: int) -> None:
    result = deviceshare(env, "operator", "--kubeconfig", str(kubeconfig(tmp_path / "k")),
                         "--metrics-host", "127.0.0.1", "--metrics-port", str(taken_port))
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot start yet" not in result.stderr  # no retry: a port held by another process stays held
    assert str(taken_port) in line and "--metrics-port" in line


def test_a_bad_flag_prints_the_subcommands_own_usage(env: dict[str, str]) -> None:
    result = deviceshare(env, "inspect", "--bogus")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: deviceshare inspect")
    assert "unrecognized arguments: --bogus" in result.stderr


def test_debug_shows_the_traceback(env: dict[str, str]) -> None:
    result = deviceshare(env, "--debug", "operator", "--kubeconfig", "/nope/config")
    assert result.returncode == 2 and "Traceback" in result.stderr


async def test_a_closed_pipe_ends_quietly(env: dict[str, str], tmp_path: Path) -> None:
    async with Sandbox(nodes=40, gpus=8, kubeconfig_path=tmp_path / "kubeconfig", kubelet_delay=None) as cluster:
        proc = await asyncio.create_subprocess_shell(
            f"{sys.executable} -m deviceshare inspect --kubeconfig {cluster.kubeconfig} | head -5",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), waiting.HANG_GUARD)
    assert len(out.decode().splitlines()) == 5
    assert err.decode() == ""


def test_help_imports_nothing_heavy(env: dict[str, str]) -> None:
    """What keeps ``--help`` fast (each of these costs a fraction of a second to import); its time is benched."""
    probe = (
        "import sys\nfrom deviceshare import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert result.stderr.strip() == "[]"
    assert "operator" in result.stdout


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return cli._build(None)[1]


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_every_flag_has_help_and_a_shown_default(name: str) -> None:
    parser = _subcommands()[name]
    text = "".join(parser.format_help().split())  # wrapping may split a default anywhere
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(
            action, argparse._HelpAction
        ):
            continue
        flag = max(action.option_strings, key=len)
        assert action.help, f"{name} {flag} has no help"
        if action.default not in (None, False):
            assert "default" in (action.help or "") or f"(default:{action.default!s})".replace(" ", "") in text, (
                f"{name} {flag} does not show its default {action.default!r}"
            )


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_context_wherever_kubeconfig_is_accepted(name: str) -> None:
    flags = {f for a in _subcommands()[name]._actions for f in a.option_strings}
    if "--kubeconfig" in flags and name not in ("sandbox", "demo"):  # those two write a kubeconfig
        assert "--context" in flags, name


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_subcommand_help_loads_no_client_library(env: dict[str, str], name: str) -> None:
    slow = {"kopf", "aiohttp", "kubernetes_asyncio", "kmock"}  # each costs about a second to import
    probe = (
        "import sys\nfrom deviceshare import cli\n"
        f"try:\n    cli.main([{name!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {slow!r}), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert result.stderr.strip() == "[]", f"deviceshare {name} --help imports {result.stderr.strip()}"


def test_without_the_certs_extra_certs_names_it_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    # The operator/webhook image: cryptography is the optional extra deviceshare[certs].
    hidden = tmp_path / "hidden" / "cryptography"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named cryptography')\n")
    env = {**env, "PYTHONPATH": f"{hidden.parent}{os.pathsep}{SRC}"}
    result = deviceshare(env, "certs", "--out", str(tmp_path / "out"))
    assert result.returncode == cli.EXIT_CONFIG
    assert result.stderr.splitlines() == [
        "deviceshare certs: certificates need the optional extra: pip install 'deviceshare[certs]' "
        "(missing: cryptography)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["sandbox", "demo"])
def test_without_the_sandbox_extra_sandbox_and_demo_name_it_in_one_line(
    env: dict[str, str], tmp_path: Path, command: str
) -> None:
    # An image without the extra: kmock and jsonpatch cannot be imported (cel-python is a main dependency).
    hidden = tmp_path / "hidden"
    for module in ("kmock", "jsonpatch"):
        (hidden / module).mkdir(parents=True)
        (hidden / module / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    env = {**env, "PYTHONPATH": f"{hidden}{os.pathsep}{SRC}"}
    result = deviceshare(env, command, "--kubeconfig", str(tmp_path / "kubeconfig"))
    assert result.returncode == cli.EXIT_CONFIG
    assert result.stderr.splitlines() == [
        f"deviceshare {command}: the sandbox needs the optional extra: pip install 'deviceshare[sandbox]' "
        "(missing: kmock, jsonpatch)"
    ]
    assert not (tmp_path / "kubeconfig").exists()
