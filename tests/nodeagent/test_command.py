"""`deviceshare node-agent` fails in one line, saying what to fix, before it touches the API."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from deviceshare import cli
from deviceshare.api import names
from deviceshare.nodeagent import command
from deviceshare.sandbox import Sandbox
from tests.nodeagent import fakenvml, servers
from tests.nodeagent.conftest import until


@pytest.mark.parametrize(("argv", "env", "words"), [
    ([], {}, r"no node name: pass --node-name or set \$NODE_NAME"),
    (["--node-name", "n1"], {}, r"NVML library \(libnvidia-ml.so.1\) not found"),
    (["--source", "file"], {"NODE_NAME": "n1"}, "--source file needs --device-file FILE"),
    (["--ignore-xids", "79,x"], {"NODE_NAME": "n1"}, "--ignore-xids must be comma-separated numbers"),
])
def test_a_missing_piece_is_one_line_and_exit_code_2(
    argv: list[str], env: dict[str, str], words: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["node-agent", "--metrics-port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("deviceshare node-agent: ")
    assert re.search(words, err), err


async def test_the_command_wires_nvml_the_xid_watch_and_the_loop_to_the_api(tmp_path: Path) -> None:
    """`serve` as the DaemonSet runs it, on the sandbox, with the fake NVML in place of the driver's."""
    async with Sandbox(nodes=1, gpus=8, kubelet_delay=None, kubeconfig_path=tmp_path / "kubeconfig") as cluster:
        nvml = fakenvml.FakeNvml(servers.TWO_ISLANDS_8)
        settings = command.AgentSettings(node_name="gpu-node-0", interval=3600.0, metrics_port=None,
                                         kubeconfig=str(cluster.kubeconfig))
        stop = asyncio.Event()
        running = asyncio.create_task(command.serve(settings, stop, nvml=nvml))
        try:
            await until(lambda: _annotation(cluster, names.NODE_TOPOLOGY_ANNOTATION), "the first publication")
            nvml.xid(3, 94)  # contained ECC error
            health = await until(lambda: _annotation(cluster, names.NODE_HEALTH_ANNOTATION), "the XID published")
            assert nvml.uuid_at(3) in health
        finally:
            stop.set()
            await running
        assert not nvml.initialized  # nvmlShutdown on the way out


def _annotation(cluster: Sandbox, key: str) -> str | None:
    body = cluster.get("nodes", "gpu-node-0") or {}
    return (body["metadata"].get("annotations") or {}).get(key)
