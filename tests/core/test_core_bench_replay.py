"""The openb replay's arithmetic, on a tiny trace written here (the real one is a benchmark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import bench_core_openb

NODES = """sn,cpu_milli,memory_mib,gpu,model
a,8000,16384,2,T4
b,8000,16384,4,V100M16
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,1000,1024,1,1000,T4
p1,1000,1024,2,1000,
p2,1000,1024,1,460,
p3,99000,1024,1,1000,
p4,1000,1024,1,1000,T4|V100M16
"""


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def test_only_whole_gpu_pods_are_replayed_and_infeasible_ones_left_out(trace: tuple[Path, Path]) -> None:
    nodes = bench_core_openb.load_nodes(trace[0])
    pods = bench_core_openb.load_pods(trace[1])
    assert [p.name for p in pods] == ["p0", "p1", "p3", "p4"]  # p2 shares a GPU
    assert pods[-1].models == ("T4", "V100M16")
    assert [p.name for p in bench_core_openb.feasible(nodes, pods)] == ["p0", "p1", "p4"]  # p3: 99 cores


@pytest.mark.parametrize(
    ("strategy", "placed", "share", "failed"),
    [
        # binpack: p0->a, p1->b, p4->a (the fuller fit); a is full, so p0 fails on the second pass
        ("binpack", 3, 4 / 6, "p0"),
        # spread: p0->a, p1->b, p4->b (the emptier), p0->a; then p1 needs 2 and no node has them
        ("spread", 4, 5 / 6, "p1"),
    ],
)
def test_replay_wraps_until_the_first_failure(
    trace: tuple[Path, Path], strategy: str, placed: int, share: float, failed: str
) -> None:
    nodes = bench_core_openb.load_nodes(trace[0])
    pods = bench_core_openb.feasible(nodes, bench_core_openb.load_pods(trace[1]))
    result = bench_core_openb.replay(nodes, pods, strategy)
    assert result.placed == placed and result.decisions == placed + 1
    assert result.share_at_failure == pytest.approx(share)
    assert result.failure.startswith(failed) and "0/2 nodes are available" in result.failure


def test_missing_data_is_skipped_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bench_core_openb, "DATA", tmp_path / "absent")
    section = bench_core_openb.run(quick=True)
    assert section.startswith("## ") and "Skipped" in section and "../shared/data/openb" in section
