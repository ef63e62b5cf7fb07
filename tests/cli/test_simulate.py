"""`deviceshare simulate` on tiny CSV pairs: JSON shape, determinism, and errors that name the line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from deviceshare import cli
from deviceshare.core import experiment, replay, traces

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,4,A
n1,32000,131072,4,A
n2,64000,262144,2,B
n3,16000,65536,1,B
"""


def pods_csv(count: int = 60, seed: int = 3) -> str:
    rng = random.Random(seed)
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    for i in range(count):
        kind = rng.random()
        if kind < 0.2:
            lines.append(f"p{i},{rng.choice([1000, 4000])},2048,0,0,")
        elif kind < 0.7:
            lines.append(f"p{i},{rng.choice([1000, 2000])},4096,1,{rng.choice([250, 500, 810])},")
        else:
            lines.append(f"p{i},{rng.choice([2000, 8000])},8192,{rng.choice([1, 2])},1000,{rng.choice(['', 'A', 'B'])}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(pods_csv())
    return nodes, pods


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_reports_every_policy_at_100_and_130_percent(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    args = ["--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,bestfit,random", "--seeds", "3", "--jobs", "1"]
    code, out, err = simulate(capsys, *args, "--json")
    assert code == 0, err
    assert err == ""  # no progress bar when stderr is not a terminal
    got = json.loads(out)["policies"]
    assert list(got) == ["fgd", "bestfit", "random"]
    for policy in got.values():
        for load in ("100", "130"):
            spread = policy["allocated"][load]
            assert 0 < spread["min"] <= spread["median"] <= spread["max"] <= 100
        assert policy["decisions_per_second"] > 0
        idle = policy["idle"]
        assert idle["whole_gpus"] >= 0 and idle["crumbs"] >= 0
        assert 0 <= idle["commonest_crumb"]["share"] <= idle["crumbs"] + 0.01
        assert 0 <= idle["commonest_crumb"]["free_milli"] < 1000
        assert idle["stranded_by_cpu_or_memory"] >= 0 and idle["fits_no_pod"] >= 0
    again = json.loads(simulate(capsys, *args, "--json")[1])["policies"]
    assert {p: v["allocated"] for p, v in again.items()} == {p: v["allocated"] for p, v in got.items()}


def test_table_names_the_policies(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    code, out, _ = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd-fill,packing",
                            "--seeds", "1", "--load", "0.8")  # fmt: skip
    assert code == 0
    assert "at 80% load" in out and "at 100% load" not in out
    assert "fgd-fill" in out and "packing" in out
    assert "idle: whole" in out and "crumbs" in out


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "fgd-fill-share", "fgd-balance", "fgd-scarce"])
def test_what_is_left_idle_and_what_is_allocated_add_up_to_the_cluster(policy: str) -> None:
    nodes = traces.parse_nodes(NODES.splitlines(keepends=True))
    pods = traces.parse_pods(pods_csv(120, seed=9).splitlines(keepends=True))
    for seed in (42, 43, 44):
        got = replay.replay(nodes, pods, experiment.POLICIES[policy](nodes, pods), seed, 1.3)
        assert got.capacity_milli == 11_000  # 11 GPUs in NODES
        assert got.allocated[-1] + got.left.whole_milli + got.left.crumb_milli == got.capacity_milli
        assert got.left.whole_milli % 1000 == 0
        assert got.left.stranded_milli + got.left.unfit_milli <= got.left.whole_milli + got.left.crumb_milli
        assert got.left.crumb_milli == sum(free * n for free, n in got.left.crumbs)
        assert all(0 < free < 1000 and n > 0 for free, n in got.left.crumbs)
        sizes = [free * n for free, n in got.left.crumbs]
        assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    ("which", "text", "message"),
    [
        ("pods", "cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,2048,1,500\n1,lots,1,500\n", "pods.csv:3: memory_mib"),
        ("pods", "cpu_milli,memory_mib,num_gpu\n1000,2048,1\n", "pods.csv:1: missing column(s) gpu_milli"),
        ("pods", "cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,2048,2,500\n", "pods.csv:2: a GPU share"),
        ("pods", "cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,2048,1,500,7\n", "pods.csv:2: expected 4 fields"),
        ("nodes", "sn,cpu_milli,memory_mib,gpu,model\nn0,-5,1024,1,A\n", "nodes.csv:2: cpu_milli must be at least 0"),
        ("nodes", "", "nodes.csv: empty file"),
    ],
)
def test_bad_csv_is_exit_2_naming_file_and_line(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str], which: str, text: str, message: str
) -> None:
    nodes, pods = trace
    (nodes if which == "nodes" else pods).write_text(text)
    code, out, err = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1")
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_missing_file_and_unknown_policy_are_exit_2(
    trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace
    code, _, err = simulate(capsys, "--nodes", str(nodes.with_name("nope.csv")), "--pods", str(pods))
    assert code == 2 and "nope.csv" in err
    code, _, err = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,best")
    assert code == 2 and "unknown policy best" in err


def test_plot_writes_a_png(trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    nodes, pods = trace
    out = tmp_path / "alloc.png"
    code, _, _ = simulate(
        capsys, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--jobs", "1", "--plot", str(out)
    )
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_is_deterministic_per_seed_and_differs_between_seeds() -> None:
    nodes = traces.parse_nodes(NODES.splitlines(keepends=True))
    pods = traces.parse_pods(pods_csv(200, seed=9).splitlines(keepends=True))
    for policy in experiment.POLICIES:
        a, b = (experiment.run_seed(nodes, pods, policy, 42, 1.3) for _ in range(2))
        assert (a.curve, a.placed, a.decisions) == (b.curve, b.placed, b.decisions), policy
    curves = {tuple(sorted(experiment.run_seed(nodes, pods, "fgd", s, 1.3).curve.items())) for s in range(42, 47)}
    assert len(curves) > 1


def test_plot_without_matplotlib_is_refused_before_simulating(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # `import matplotlib` fails as if absent
    nodes, pods = trace
    code, out, err = simulate(capsys, "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--jobs", "1",
                              "--plot", str(tmp_path / "alloc.png"))
    assert code == 2 and "--plot needs matplotlib" in err
    assert out == "" and not (tmp_path / "alloc.png").exists()  # no table: nothing was simulated


def test_nodes_and_pods_are_asked_for_when_no_trace_sits_beside_the_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    assert "[--nodes NODES] [--pods PODS]" in " ".join(capsys.readouterr().out.split())
    code, _, err = simulate(capsys, "--seeds", "1")
    assert code == 2 and "--nodes is needed: no openb trace at" in err
