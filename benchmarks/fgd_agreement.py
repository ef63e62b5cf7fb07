"""One cluster held twice, as ``deviceshare simulate`` and as the operator hold it, deciding the same FGD placements.

The simulator keeps a :class:`nodeclasses.Cluster` (GPU free milli per index, free CPU and memory); the
operator a :class:`ledger.DeviceLedger` (whole and shared holdings of device IDs, each pod's CPU and memory
accounted) walked by :class:`fgdplacement.FGDPlacement`. Both measure with the FGD engine
(:mod:`deviceshare.core.fgd`) against the same target workload, so on the same state they must choose the
same node and the same devices: ``tests/core/test_fgd_agreement.py`` checks it on random states and an
openb sample, ``bench_fgd`` on whole openb replays.

The operator knows a device resource, not a GPU model, so the simulator's nodes here are of one model (the
resource) and pods carry no model constraint; a pod without GPUs is not a group FGD places in the
operator (it falls back to binpack), so only GPU pods are compared.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from deviceshare.core import (
    capacity,
    fgd,
    fgdplacement,
    inventory,
    ledger,
    nodeclasses,
    placement,
    policies,
    replay,
    workloadmix,
)
from deviceshare.core import fragmentation as frag

GPU = "nvidia.com/gpu"
MIB = 1 << 20
Decided = tuple[str, tuple[int, ...]] | None  # (node name, GPU indices sorted), None: placed nowhere


def model_blind(nodes: Iterable[nodeclasses.Node], pods: Iterable[nodeclasses.Pod]
                ) -> tuple[list[nodeclasses.Node], list[nodeclasses.Pod]]:  # fmt: skip
    """The nodes as one GPU model (the device resource) and the GPU pods without a model constraint."""
    blind_nodes = [nodeclasses.Node(n.name, n.cpu_milli, n.memory_mib, n.gpus, GPU) for n in nodes]
    blind_pods = [
        nodeclasses.Pod(frag.Shape(p.shape.cpu_milli, p.shape.gpu_milli, p.shape.num_gpu, GPU), p.memory_mib)
        for p in pods
        if p.shape.num_gpu
    ]
    return blind_nodes, blind_pods


class Twin:
    """``nodes`` (one model: :data:`GPU`) held by both engines, measuring against ``expected`` shapes."""

    def __init__(self, nodes: Sequence[nodeclasses.Node], expected: Iterable[frag.Shape], variant: str = fgd.BEST
                 ) -> None:  # fmt: skip
        self.nodes = nodes
        self.book = ledger.DeviceLedger()
        for n in nodes:
            self.book.upsert_node(inventory.NodeInfo(
                name=n.name, labels={"deviceshare.io/mode": "shared"}, shared=True, ready=True,
                unschedulable=False, taints=(), devices={GPU: tuple(str(i) for i in range(n.gpus))},
                cpu_milli=n.cpu_milli, memory_bytes=n.memory_mib * MIB,
            ))  # fmt: skip
        histogram = workloadmix.ShapeHistogram.seeded(expected)
        self.operator = fgdplacement.FGDPlacement(histogram, variant=variant)
        types = fgd.node_types((n.model, n.gpus, n.cpu_milli) for n in nodes)
        self.measure = fgd.Measure(fgd.VARIANTS[variant], histogram.workload(), types)
        order = sorted(range(len(nodes)), key=lambda i: nodes[i].name)  # the operator's tie-break: names
        self.cluster = nodeclasses.Cluster(nodes, policies.FGDPolicy(self.measure, variant), order)
        self._groups = 0

    def hold(self, node: int, pod: nodeclasses.Pod, gpus: Sequence[int]) -> None:
        """Put ``pod`` on ``node``, on GPUs ``gpus``, in both engines (a state to decide from)."""
        self.cluster.bind(pod, nodeclasses.Decision(node, tuple(gpus)))
        self._reserve(self.nodes[node].name, pod, tuple(str(i) for i in gpus))

    def _reserve(self, name: str, pod: nodeclasses.Pod, devices: tuple[str, ...]) -> None:
        self._groups += 1
        key = ("twin", f"g{self._groups}")
        shape = pod.shape
        if devices:
            share = {GPU: capacity.Share(shape.gpu_milli)} if shape.gpu_milli < frag.MILLI else {}
            self.book.reserve(key, name, {GPU: devices}, share)
        self.book.account_pod(key, name, shape.cpu_milli, pod.memory_mib * MIB)

    def request(self, pod: nodeclasses.Pod) -> tuple[placement.GroupRequest, inventory.PodDemand]:
        shape = pod.shape
        share = {GPU: capacity.Share(shape.gpu_milli)} if shape.gpu_milli < frag.MILLI else {}
        request = placement.GroupRequest(("twin", "next"), {GPU: shape.num_gpu}, {}, "fgd", share)
        return request, inventory.PodDemand(cpu_milli=shape.cpu_milli, memory_bytes=pod.memory_mib * MIB)

    def decide(self, pod: nodeclasses.Pod) -> tuple[Decided, Decided]:
        """(the simulator's decision, the operator's) for ``pod`` on the current state; nothing is placed."""
        got = self.cluster.decide(pod)
        simulated = None if got is None else (self.nodes[got.node].name, tuple(sorted(got.gpus)))
        request, demand = self.request(pod)
        chosen = placement.place_by_policy(self.book.snapshot(), request, demand, self.operator.for_pod(demand))
        operated = None
        if isinstance(chosen, placement.Placement):
            operated = (chosen.node, tuple(sorted(int(d) for d in chosen.devices[GPU])))
        return simulated, operated

    def bind(self, pod: nodeclasses.Pod, decided: Decided) -> None:
        if decided is not None:
            name, gpus = decided
            self.hold(next(i for i, n in enumerate(self.nodes) if n.name == name), pod, gpus)


def replay_both(nodes: Sequence[nodeclasses.Node], pods: Sequence[nodeclasses.Pod], seed: int, ratio: float = 1.3,
                variant: str = fgd.BEST) -> tuple[int, list[tuple[int, Decided, Decided]]]:  # fmt: skip
    """One seed of the openb experiment through both engines (model-blind, GPU pods): (decisions, mismatches).

    Arrivals as the replay draws them (:func:`replay.arrivals`); the target workload is the list's 95% of
    shapes (the operator's histogram seeded with every pod). Each decision is taken by both on the same
    state and the simulator's is placed in both.
    """
    nodes, pods = model_blind(nodes, pods)
    twin = Twin(nodes, [p.shape for p in pods], variant)
    rng = random.Random(seed)
    sequence = replay.arrivals(pods, sum(n.gpus for n in nodes) * frag.MILLI, rng, ratio)
    index = {n.name: i for i, n in enumerate(nodes)}
    wrong: list[tuple[int, Decided, Decided]] = []
    for step, i in enumerate(sequence):
        simulated, operated = twin.decide(pods[i])
        if simulated != operated:
            wrong.append((step, simulated, operated))
        if simulated is not None:
            twin.hold(index[simulated[0]], pods[i], simulated[1])
    return len(sequence), wrong
