"""FGD, one engine: the measure and the choice that ``deviceshare simulate`` and the operator both decide with.

A :class:`Measure` is one policy (a :class:`Variant`: the paper's FGD or one of ours) against one target
workload and one cluster's node types. It rates a node *state* (:data:`fragmentation.Signature`) for a
pod or group shape: whether the shape fits, FGD's integer score of the best placement there, and, for a
share of one GPU, the free values of the GPUs that score best (:meth:`Measure.rate`). Which GPU indices
the shape then takes on the node is :func:`device_indices`. The replay (:mod:`nodeclasses`, through
:class:`policies.FGDPolicy`) and the operator (:mod:`fgdplacement`, whose indexed walk rates classes of
nodes with :meth:`Measure.rate`) hold no rule of their own: the same state gives the same decision, and
``tests/core/test_fgd_agreement.py`` checks it on random states and openb replays.

The variants add terms to the paper's fragment (see :class:`fragmentation.Fragmentation` for the first
three) and, with ``scarcity``, one to its score:

- ``scarcity``: a GPU on a node *type* (GPU model, GPU count) that few workload shapes can use elsewhere
  is worth more than one any shape could use. Each GPU shape's demand (popularity x GPUs) is spread over
  the capacity of the node types an empty node of which could host it (model allowed, enough GPUs and
  CPU); a type's value is the demand per GPU it so receives, relative to the cluster's average
  (:func:`scarcity`). Taking ``g`` GPU milli of a type of value ``v`` costs ``scarcity * (v - 1) * g`` in
  the score, as that much more fragment would: a GPU-model-constrained workload keeps its models'
  GPUs, and the few nodes that alone fit the biggest shapes are kept for them. With every type of
  value 1 (no constrained shapes, one node type) the term is 0 and the variant is its base.

The tuned weights below were chosen on :data:`TUNING_SEEDS` of :data:`TUNING_LISTS` only (``docs/simulate.md``
names the split); ``benchmarks/bench_fgd_heldout.py`` reports the margins on :data:`HELD_OUT_SEEDS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from deviceshare.core import devicechoice
from deviceshare.core import fragmentation as frag
from deviceshare.core.fragmentation import MILLI, Shape, Signature, WeightedShape

Rating = tuple[int, tuple[int, ...]]  # (FGD score, free milli of the preferred GPUs: shares of one GPU)
NodeType = tuple[str, int]  # (GPU model, GPUs per node)
NodeTypes = Mapping[NodeType, tuple[int, int]]  # -> (GPU milli of all such nodes, most CPU milli of one)

# The tuning split: every weight below was chosen on these seeds of these openb lists, and nothing else.
TUNING_SEEDS = tuple(range(42, 52))  # the artifact's seeds, where the paper's figures are reproduced
TUNING_LISTS = ("default", "gpushare60", "gpuspec33", "multigpu50")
HELD_OUT_SEEDS = tuple(range(62, 72))  # never looked at while choosing (52..61 were, in an earlier round)

FILL_AHEAD = 0.25  # fgd-fill: blend of the fill-ahead fragment into the paper's (an earlier round, tuning seeds)
FILL_AHEAD_SHARES = 0.5  # the same for GPU-sharing shapes only (an earlier round: `simulate --seeds 3`, 42..44)
BALANCE = 6.0  # weight of the unfed GPU (an earlier round: among 4, 6, 8 on the tuning seeds)
SCARCITY = 1.0  # weight of a node type's scarcity (among 1, 2, 3 on the tuning seeds: the largest least margin)


@dataclass(frozen=True, slots=True)
class Variant:
    """A fragmentation-aware policy: the paper's FGD with none of the options, else one of ours."""

    fill_ahead: float = 0.0
    shares_only: bool = False
    balance: float = 0.0
    scarcity: float = 0.0
    fill_cpu: bool = True  # the fill ahead limited by the node's CPU too (False: by its GPUs only)


VARIANTS: Mapping[str, Variant] = {
    "fgd": Variant(),
    "fgd-fill": Variant(fill_ahead=FILL_AHEAD),
    "fgd-fill-share": Variant(fill_ahead=FILL_AHEAD_SHARES, shares_only=True),
    "fgd-balance": Variant(fill_ahead=FILL_AHEAD_SHARES, shares_only=True, balance=BALANCE),
    "fgd-scarce": Variant(
        fill_ahead=FILL_AHEAD_SHARES, shares_only=True, balance=BALANCE, scarcity=SCARCITY, fill_cpu=False
    ),
}
BEST = "fgd-scarce"  # the best measured on the openb lists: what ``schedulingStrategy: fgd`` decides with


def node_types(nodes: Iterable[tuple[str, int, int]]) -> dict[NodeType, tuple[int, int]]:
    """(model, GPUs, CPU milli) per node -> per node type: GPU milli in all, and the most CPU of one node."""
    types: dict[NodeType, tuple[int, int]] = {}
    for model, gpus, cpu in nodes:
        if gpus <= 0:
            continue
        milli, most = types.get((model, gpus), (0, 0))
        types[(model, gpus)] = (milli + gpus * MILLI, max(most, cpu))
    return types


def scarcity(workload: Sequence[WeightedShape], types: NodeTypes) -> dict[NodeType, float]:
    """Each node type's demand per GPU milli, relative to the cluster's (1: average; see the module docstring)."""
    total = sum(milli for milli, _ in types.values())
    received = dict.fromkeys(types, 0.0)
    demand = 0.0
    for w in workload:
        shape = w.shape
        if not shape.num_gpu:
            continue
        hosts = [t for t, (_, cpu) in types.items() if shape.allows(t[0]) and t[1] >= shape.num_gpu
                 and cpu >= shape.cpu_milli]  # fmt: skip
        capacity = sum(types[t][0] for t in hosts)
        if not capacity:
            continue
        wanted = w.weight * shape.total_gpu_milli
        demand += wanted
        for t in hosts:
            received[t] += wanted / capacity
    if not demand or not total:
        return {}
    return {t: v * total / demand for t, v in received.items()}


def fits(signature: Signature, shape: Shape) -> bool:
    """CPU, GPU model and GPU count (memory is per node, checked by whoever walks the nodes)."""
    model, cpu_free, gpus = signature
    if cpu_free < shape.cpu_milli:
        return False
    if shape.num_gpu == 0:
        return True
    if len(gpus) < shape.num_gpu or not shape.allows(model):
        return False
    return gpus[shape.num_gpu - 1] >= shape.gpu_milli  # descending: the num_gpu-th most free GPU decides


def after(signature: Signature, shape: Shape, value: int = MILLI) -> Signature:
    """The state once the shape has landed: a share of one GPU on a GPU with ``value`` milli free, a share
    on several GPUs on the tightest that fit, whole GPUs on fully free ones."""
    if shape.num_gpu == 0 or shape.gpu_milli >= MILLI:
        return frag.after_whole(signature, shape)
    if shape.num_gpu == 1:
        return frag.after_share(signature, shape, value)
    model, cpu_free, gpus = signature
    rest = list(gpus)
    for free in sorted(v for v in gpus if v >= shape.gpu_milli)[: shape.num_gpu]:
        rest[rest.index(free)] -= shape.gpu_milli
    return frag.signature_of(model, cpu_free - shape.cpu_milli, rest)


class Measure:
    """One variant's fragmentation against one target workload and cluster, and the ratings built on it."""

    def __init__(self, variant: Variant, workload: Sequence[WeightedShape], types: NodeTypes | None = None,
                 memo: bool = True) -> None:  # fmt: skip
        self.variant = variant
        self.workload = tuple(workload)
        self.types = dict(types or {})
        self.fragmentation = frag.Fragmentation(
            self.workload, fill_ahead=variant.fill_ahead, shares_only=variant.shares_only,
            balance=variant.balance, fill_cpu=variant.fill_cpu, memo=memo,
        )  # fmt: skip
        self.value = scarcity(self.workload, self.types) if variant.scarcity else {}

    def __call__(self, signature: Signature) -> float:
        return self.fragmentation(signature)

    def _cost(self, signature: Signature, shape: Shape) -> float:
        """The scarcity term: fragment-equivalent milli the placement costs (0 without scarcity)."""
        if not self.value:
            return 0.0
        return self.variant.scarcity * (self.value.get((signature[0], len(signature[2])), 1.0) - 1.0) * (
            shape.total_gpu_milli
        )

    def rate(self, signature: Signature, shape: Shape) -> Rating | None:
        """FGD's score of the best placement of ``shape`` on a node in state ``signature``, with the free
        values of the GPUs that give it (a share of one GPU only); None if the shape does not fit."""
        if not fits(signature, shape):
            return None
        before = self(signature)
        cost = self._cost(signature, shape)
        if shape.num_gpu != 1 or shape.gpu_milli >= MILLI:
            return frag.sigmoid_score(before, self(after(signature, shape)) + cost), ()
        scored = {
            value: frag.sigmoid_score(before, self(frag.after_share(signature, shape, value)) + cost)
            for value in set(signature[2])
            if value >= shape.gpu_milli
        }
        top = max(scored.values())
        return top, tuple(sorted(v for v, s in scored.items() if s == top))

    def cpu_horizon(self, devices: int) -> int:
        """Free CPU past which no rating changes, on nodes of at most ``devices`` GPUs, less the rated shape's CPU.

        The measure sees a node's free CPU only by comparing it with workload shapes' CPU (do they fit),
        with how many of a sharing shape the node could host (fill-ahead) and with what its idle GPU
        would need at the workload's CPU per GPU (balance); a rating also measures the state after the
        shape, with its CPU taken. Past this horizon plus the shape's CPU, more free CPU changes no rating:
        the operator counts free CPU up to there only, so nodes that differ beyond it share a class.
        """
        horizon = 0
        for w in self.workload:
            shape = w.shape
            horizon = max(horizon, shape.cpu_milli)
            ahead = self.variant.fill_ahead and self.variant.fill_cpu and not (
                self.variant.shares_only and shape.gpu_milli >= MILLI
            )
            if ahead and shape.num_gpu and shape.cpu_milli:
                hosted = devices * (MILLI // shape.gpu_milli) // shape.num_gpu
                horizon = max(horizon, (hosted + 1) * shape.cpu_milli)
        if self.variant.balance:
            horizon = max(horizon, int(devices * MILLI * self.fragmentation.cpu_per_milli) + 1)
        return horizon


def device_indices(gpus: Sequence[int], shape: Shape, values: Sequence[int] = ()) -> tuple[int, ...]:
    """The GPU indices a shape takes on a node whose GPUs (in index order) have ``gpus`` milli free.

    Whole GPUs: fully free ones, as the operator picks devices (:func:`devicechoice.choose_devices`, a
    contiguous run where one exists). A share of one GPU: the first GPU whose free value is one of
    ``values`` (the rating's best). A share on several GPUs: the tightest that fit (partly used before
    fully free ones, index order among equals), the fully free ones picked as whole GPUs are.
    """
    if shape.num_gpu == 0:
        return ()
    if shape.gpu_milli >= MILLI:
        return _whole(gpus, range(len(gpus)), shape.num_gpu)
    if shape.num_gpu == 1:
        wanted = set(values)
        return (next(i for i, g in enumerate(gpus) if g in wanted and g >= shape.gpu_milli),)
    partial = sorted((g, i) for i, g in enumerate(gpus) if shape.gpu_milli <= g < MILLI)[: shape.num_gpu]
    taken = [i for _, i in partial]
    rest = shape.num_gpu - len(taken)
    return (*taken, *_whole(gpus, range(len(gpus)), rest)) if rest else tuple(taken)


def _whole(gpus: Sequence[int], indices: Iterable[int], count: int) -> tuple[int, ...]:
    free = [str(i) for i in indices if gpus[i] >= MILLI]
    offered = [str(i) for i in range(len(gpus))]
    return tuple(int(d) for d in devicechoice.choose_devices(offered, free, count))
