"""One FGD engine: the simulator and the operator decide the same node and devices on the same state.

``deviceshare simulate`` decides through :mod:`nodeclasses` (GPU free milli per index), the operator
through the ledger and :mod:`fgdplacement`'s indexed walk; both rate with :mod:`fgd`. Each state here is
held by both (``benchmarks/fgd_agreement.Twin``): random nodes partly taken by whole GPUs and shares,
CPU and memory partly used, a random target workload and a random group, for every FGD variant; then a
sample of the openb experiment replayed through both, decision by decision.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from benchmarks import fgd_agreement

from deviceshare.core import fgd, nodeclasses, traces
from deviceshare.core import fragmentation as frag

GPU = fgd_agreement.GPU
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "openb"
STATES = 1000


def _shape(rng: random.Random) -> frag.Shape:
    num = rng.choice([1, 1, 1, 2, 4, 8])
    milli = rng.choice([100, 250, 300, 470, 500, 810, 1000, 1000]) if num <= 2 else 1000
    return frag.Shape(rng.choice([0, 1000, 2000, 4000, 8000, 12_000, 24_000]), milli, num, GPU)


def _state(seed: int) -> tuple[fgd_agreement.Twin, nodeclasses.Pod]:
    """Random nodes (up to 6, 1..8 GPUs), partly held; a random workload and the pod to place."""
    rng = random.Random(seed)
    nodes = [
        nodeclasses.Node(f"n{i}", rng.choice([8, 16, 32, 64, 96]) * 1000, rng.choice([16, 64, 256]) * 1024,
                         rng.choice([1, 2, 4, 8]), GPU)
        for i in range(rng.randint(1, 6))
    ]  # fmt: skip
    expected = [_shape(rng) for _ in range(rng.randint(1, 12))]
    twin = fgd_agreement.Twin(nodes, expected, rng.choice(list(fgd.VARIANTS)))
    for i, node in enumerate(nodes):
        free = [frag.MILLI] * node.gpus
        for _ in range(rng.randint(0, 2 * node.gpus)):
            gpu = rng.randrange(node.gpus)
            if not free[gpu]:
                continue
            whole = free[gpu] == frag.MILLI and rng.random() < 0.4
            milli = frag.MILLI if whole else rng.randint(1, free[gpu] // 50) * 50
            cpu = min(rng.choice([0, 1000, 4000]), twin.cluster.cpu[i])
            mem = min(rng.choice([0, 1024, 8192]), twin.cluster.mem[i])
            twin.hold(i, nodeclasses.Pod(frag.Shape(cpu, milli, 1, GPU), mem), [gpu])
            free[gpu] -= milli
    return twin, nodeclasses.Pod(_shape(rng), rng.choice([0, 1024, 16_384, 100_000]))


def test_on_a_thousand_random_states_the_operator_decides_as_the_simulator() -> None:
    placed = 0
    for seed in range(STATES):
        twin, pod = _state(seed)
        simulated, operated = twin.decide(pod)
        assert operated == simulated, f"state {seed}: simulator {simulated}, operator {operated} for {pod}"
        assert twin.operator.measure().value == twin.measure.value  # the same node types, seen by both
        placed += simulated is not None
    assert STATES // 4 < placed < STATES  # the states both place and refuse: the comparison is not vacuous


@pytest.mark.skipif(not (DATA / "openb_node_list_gpu_node.csv").exists(), reason="the openb trace is not here")
def test_an_openb_sample_replays_the_same_through_both_engines() -> None:
    rng = random.Random(7)
    nodes = traces.parse_nodes((DATA / "openb_node_list_gpu_node.csv").open())
    pods = traces.parse_pods((DATA / "openb_pod_list_default.csv").open())
    sample = sorted(rng.sample(range(len(nodes)), 60))
    decisions, wrong = fgd_agreement.replay_both([nodes[i] for i in sample], rng.sample(pods, 600), seed=42)
    assert decisions > 300 and wrong == []
