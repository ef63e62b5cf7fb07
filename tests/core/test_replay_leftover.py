"""What a replay leaves idle, split the way a capacity planner reads it: worked by hand on two nodes."""

from __future__ import annotations

from deviceshare.core import nodeclasses, policies, replay
from deviceshare.core.fragmentation import Shape

NODES = [
    nodeclasses.Node("a", 8000, 16384, 4, "T4"),
    nodeclasses.Node("b", 8000, 16384, 1, "V100"),
    nodeclasses.Node("c", 8000, 16384, 1, "P100"),
]
PODS = [
    nodeclasses.Pod(Shape(2000, 500, 1), 1024),  # half a GPU, 2 cores
    nodeclasses.Pod(Shape(1000, 160, 1), 1024),  # a sliver, 1 core
    nodeclasses.Pod(Shape(1000, 1000, 1, "T4|V100"), 1024),  # a whole T4 or V100
    nodeclasses.Pod(Shape(4000, 1000, 2), 1024),  # two whole GPUs: not a one-GPU pod, judged by none
]


def state(a_gpus: list[int], a_cpu: int, b_gpus: list[int], b_cpu: int, b_mem: int) -> nodeclasses.Cluster:
    cluster = nodeclasses.Cluster(NODES, policies.BestFitPolicy(), [0, 1, 2])
    cluster.gpu[0], cluster.cpu[0] = a_gpus, a_cpu
    cluster.gpu[1], cluster.cpu[1], cluster.mem[1] = b_gpus, b_cpu, b_mem
    cluster.gpu[2] = [0]
    return cluster


def test_whole_gpus_crumbs_stranded_and_unfit_are_told_apart() -> None:
    # a: one whole GPU, a 0.19 crumb (the sliver fits), a 0.10 crumb (nothing fits), a full GPU; 8 cores.
    # b: a 0.6 crumb on a node with 0.5 cores left: the half and the sliver fit its GPU, not its CPU.
    got = replay.leftover(state([1000, 190, 100, 0], 8000, [600], 500, 16384), PODS)
    assert (got.whole_milli, got.crumb_milli) == (1000, 890)
    assert dict(got.crumbs) == {600: 1, 190: 1, 100: 1}
    assert [free for free, _ in got.crumbs] == [600, 190, 100]  # by idle milli, largest first
    assert got.stranded_milli == 600
    assert got.unfit_milli == 100


def test_memory_strands_too_and_a_model_no_pod_may_use_fits_nothing() -> None:
    cluster = state([0, 0, 0, 0], 8000, [1000], 8000, 512)  # b: CPU to spare, 512 MiB left (pods need 1 GiB)
    cluster.gpu[2] = [1000]  # c's P100: only the unconstrained half and sliver may use it
    got = replay.leftover(cluster, PODS)
    assert got.whole_milli == 2000
    assert got.stranded_milli == 1000  # b's GPU
    assert got.unfit_milli == 0  # c's GPU takes the half or the sliver
    only_t4 = [p for p in PODS if p.shape.gpu_spec]
    assert replay.leftover(cluster, only_t4).unfit_milli == 1000  # c: no pod of this list may use a P100
