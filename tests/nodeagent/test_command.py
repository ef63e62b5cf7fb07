"""`deviceshare node-agent` fails in one line, saying what to fix, before it touches the API."""

from __future__ import annotations

import re

import pytest

from deviceshare import cli


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
