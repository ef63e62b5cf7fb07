"""GPU fragmentation of a node against a target workload, and the FGD score built on it.

FGD ("Beware of Fragmentation", Weng et al., USENIX ATC'23) measures how much of a node's idle
GPU capacity the *expected* workload could not use, and places each pod where that measure grows
least. The definitions here follow the paper's artifact (hkust-adsl/kubernetes-scheduler-simulator)
exactly, because its published figures depend on them:

- The target workload is the most frequent pod shapes (CPU, GPU share, GPU count, GPU model
  constraint) that together cover 95% of the pods, CPU-only pods included, weights renormalised.
  Memory is not part of a shape.
- For one shape, a node's fragment is all its idle GPU when the shape needs no GPU, may not use
  the node's model, or lacks GPU or CPU there; otherwise only the idle GPU on cards too small for
  it. The node's fragmentation is the popularity-weighted sum over the shapes.
- The score of a placement is ``int(100 * sigmoid((before - after) / 1000))``: an integer, so
  ties are frequent and the tie-break (a fixed node order) is part of the policy.

A node's state here is its *signature* ``(model, cpu_free_milli, gpu_free)``, ``gpu_free`` the
per-GPU free milli (0..1000) sorted from most to least free: every quantity above depends on the
multiset only, so nodes in the same state share one computation.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MILLI = 1000  # one whole GPU

Signature = tuple[str, int, tuple[int, ...]]  # (model, cpu free milli, per-GPU free milli, descending)


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod asks for; ``gpu_milli`` is per GPU (1000 for whole GPUs, 0 for CPU-only)."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: str = ""  # allowed GPU models, ``A|B``; empty: any

    @property
    def models(self) -> frozenset[str]:
        return frozenset(m for m in self.gpu_spec.split("|") if m)

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.num_gpu

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    def allows(self, model: str) -> bool:
        """Whether a node of this GPU model may take the pod (CPU-only pods go anywhere)."""
        if self.gpu_milli == 0 or not self.gpu_spec:
            return True
        return model in self.models


@dataclass(frozen=True, slots=True)
class WeightedShape:
    shape: Shape
    weight: float


def normalized_shape(cpu_milli: int, gpu_milli: int, num_gpu: int, gpu_spec: str) -> Shape:
    """The artifact's view of a pod: no GPU count means no GPU at all (and no model constraint)."""
    if num_gpu <= 0 or gpu_milli <= 0:
        return Shape(cpu_milli, 0, 0, "")
    milli = min(gpu_milli, MILLI)
    return Shape(cpu_milli, milli, num_gpu, "|".join(m for m in gpu_spec.split("|") if m))


def target_workload(shapes: Iterable[Shape], coverage: float = 0.95) -> tuple[WeightedShape, ...]:
    """The most popular shapes covering ``coverage`` of the pods, weights renormalised to sum 1.

    Shapes are taken one at a time in decreasing count (equal counts: the larger shape by CPU, GPU
    share, GPU count, model first, as the artifact sorts) until the running count reaches
    ``coverage`` of all pods.
    """
    counts = collections.Counter(shapes)
    total = sum(counts.values())
    if total == 0:
        return ()
    ordered = sorted(
        counts.items(),
        key=lambda kv: (kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].num_gpu, kv[0].gpu_spec),
        reverse=True,
    )
    chosen: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in ordered:
        if covered >= coverage * total:
            break
        chosen.append((shape, count))
        covered += count
    return tuple(WeightedShape(shape, count / covered) for shape, count in chosen)


# a GPU shape on one GPU state (see Fragmentation._direct_rows)
_DirectRow = tuple[float, int, bool, float, float, int, int, int]


@dataclass(frozen=True, slots=True)
class _CpuTable:
    idle: int
    base: float  # wasted whatever the CPU: CPU-only shapes and shapes of other GPU models
    cpus: list[int]  # the other shapes' CPU, ascending
    weights: list[float]  # prefix sums of their weights
    wasted: list[float]  # prefix sums of their weighted fragment when their CPU is there


class Fragmentation:
    """The fragmentation measure for one target workload, memoised per node signature."""

    def __init__(
        self,
        workload: Sequence[WeightedShape],
        fill_ahead: float = 0.0,
        memo: bool = True,
        shares_only: bool = False,
        balance: float = 0.0,
        fill_cpu: bool = True,
    ) -> None:
        self.workload = tuple(workload)
        self.fill_ahead = fill_ahead  # 0: the paper's measure; see :meth:`compute`
        self.shares_only = shares_only  # fill ahead for GPU-sharing shapes only (``fgd-fill-share``)
        self.balance = balance  # weight of the unfed GPU (``fgd-balance``); see :meth:`unfed`
        self.fill_cpu = fill_cpu  # False: a fill ahead counts the GPUs only (the node's CPU left to ``balance``)
        gpu_milli = sum(w.weight * w.shape.total_gpu_milli for w in self.workload if w.shape.gpu_milli > 0)
        gpu_cpu = sum(w.weight * w.shape.cpu_milli for w in self.workload if w.shape.gpu_milli > 0)
        self._cpu_per_milli = gpu_cpu / gpu_milli if gpu_milli else 0.0
        # CPU-only shapes count every idle GPU as fragment, whatever the node: fold them into one weight.
        self._always = sum(w.weight for w in self.workload if w.shape.gpu_milli == 0)
        self._gpu_shapes = tuple(
            (w.weight, w.shape.cpu_milli, w.shape.gpu_milli, w.shape.num_gpu, w.shape.models)
            for w in self.workload
            if w.shape.gpu_milli > 0
        )
        self._memo: dict[Signature, float] = {}
        self._tables: dict[tuple[str, tuple[int, ...]], _CpuTable] = {}
        self._direct: dict[tuple[str, tuple[int, ...]], tuple[int, float, list[_DirectRow]]] = {}
        self._use_memo = memo  # False: recompute every time (the naive reference in the bench)

    @property
    def cpu_per_milli(self) -> float:
        """The workload's GPU shapes' CPU per milli of GPU, weighted by popularity and GPU size."""
        return self._cpu_per_milli

    def __call__(self, signature: Signature) -> float:
        if not self._use_memo:
            return self.compute(signature)
        got = self._memo.get(signature)
        if got is None:
            if self.fill_ahead:
                got = self.compute_direct(signature)
            else:
                model, cpu_free, gpus = signature
                table = self._tables.get((model, gpus))
                if table is None:
                    table = self._tables[(model, gpus)] = self._table(model, gpus)
                got = self._from_table(table, cpu_free)
            if self.balance:
                got += self.balance * self.unfed(signature)
            self._memo[signature] = got
        return got

    def compute(self, signature: Signature) -> float:
        """The fragment of one node state, without memo (the paper's measure via its CPU table)."""
        extra = self.balance * self.unfed(signature) if self.balance else 0.0
        if self.fill_ahead:
            return self.compute_direct(signature) + extra
        model, cpu_free, gpus = signature
        return self._from_table(self._table(model, gpus), cpu_free) + extra

    def unfed(self, signature: Signature) -> float:
        """Idle GPU milli the node's free CPU could not feed at the workload's CPU per GPU (``fgd-balance``).

        The paper's fragment asks whether each shape fits *once*; a node whose CPU runs out before its
        GPUs strands them all the same, a few placements later. The workload's GPU shapes ask, on
        average (weighted by popularity and GPU size), ``cpu_per_milli`` CPU per milli of GPU: idle GPU
        beyond ``cpu_free / cpu_per_milli`` is counted as fragment too, weighted by ``balance``, so
        CPU-heavy pods go where CPU is plentiful and CPU-light ones where it is scarce.
        """
        _, cpu_free, gpus = signature
        idle = sum(gpus)
        if not self._cpu_per_milli:
            return 0.0
        return max(0.0, idle - cpu_free / self._cpu_per_milli)

    def _table(self, model: str, gpus: tuple[int, ...]) -> _CpuTable:
        """For one GPU state, every shape's fragment as a function of free CPU.

        A shape short of CPU wastes all idle GPU, one with enough CPU wastes its GPU-side fragment;
        with the model's shapes sorted by CPU, the fragment at any free CPU is a bisection plus two
        prefix sums. GPU states repeat far more than (GPU state, CPU) pairs, so this is the cache.
        """
        idle = sum(gpus)
        base = self._always * idle
        rows = []
        split: dict[int, tuple[int, int]] = {}  # share -> (GPUs it fits on, idle on the rest): shapes share a few
        for weight, cpu, milli, num, models in self._gpu_shapes:
            if models and model not in models:
                base += weight * idle
                continue
            got = split.get(milli)
            if got is None:
                got = split[milli] = (
                    sum(1 for free in gpus if free >= milli), sum(free for free in gpus if free < milli)
                )
            fitting, small = got
            rows.append((cpu, weight, weight * (small if fitting >= num else idle)))
        rows.sort(key=lambda r: r[0])
        weights = [0.0]
        wasted = [0.0]
        for _, weight, waste in rows:
            weights.append(weights[-1] + weight)
            wasted.append(wasted[-1] + waste)
        return _CpuTable(idle, base, [r[0] for r in rows], weights, wasted)

    @staticmethod
    def _from_table(table: _CpuTable, cpu_free: int) -> float:
        if table.idle == 0:
            return 0.0
        met = bisect.bisect_right(table.cpus, cpu_free)  # shapes whose CPU the node still has
        short = table.weights[-1] - table.weights[met]
        return table.base + short * table.idle + table.wasted[met]

    def compute_direct(self, signature: Signature) -> float:
        """The weighted fragment shape by shape; with ``fill_ahead`` > 0, our variant (``fgd-fill``).

        The paper's fragment of a shape the node can host ignores what hosting it repeatedly would
        leave: on a node with 8 free GPUs and 24 free cores, a 12-core one-GPU shape fits, so no
        GPU counts as fragment, yet 6 of the GPUs can never be used by it. Filling the node with
        that shape alone (as many as GPUs and CPU allow) and counting the idle GPU left gives the
        fill-ahead fragment; ``fill_ahead`` blends it with the paper's (0: the paper's only). Without
        ``fill_cpu`` the filling counts GPUs only: the node's CPU then reaches the measure through the
        shapes' fit and ``balance`` alone, so free CPU matters up to far less (see ``fgd.Measure.cpu_horizon``).
        With ``shares_only`` the blend applies to GPU-sharing shapes only (whole-GPU shapes keep
        the paper's fragment): sharing shapes are where a node's leftovers are crumbs.
        """
        model, cpu_free, gpus = signature
        rows = self._direct.get((model, gpus)) if self._use_memo else None
        if rows is None:
            rows = self._direct_rows(model, gpus)
            if self._use_memo:
                self._direct[(model, gpus)] = rows
        idle, frag, shapes = rows
        if idle == 0:
            return 0.0
        for whole, cpu, gone, weight, ahead, small, by_gpu, taken in shapes:  # in the workload's order
            if gone or cpu_free < cpu:
                frag += whole
            elif ahead:
                hosted = min(by_gpu, cpu_free // cpu) if cpu and self.fill_cpu else by_gpu
                frag += weight * (ahead * (idle - hosted * taken) + (1 - ahead) * small)
            else:
                frag += weight * small
        return frag

    def _direct_rows(self, model: str, gpus: tuple[int, ...]) -> tuple[int, float, list[_DirectRow]]:
        """For one GPU state, what :meth:`compute_direct` needs of each shape whatever the free CPU.

        (idle, the CPU-only shapes' fragment, per GPU shape: its fragment when it cannot come at all,
        its CPU, whether the GPUs or the model already keep it out, its weight, blend, GPU-side
        fragment, how many the GPUs could host and the milli one takes). GPU states repeat far more
        than (GPU state, CPU) pairs; the sums keep the order of the shape-by-shape definition, so the
        result is the same to the last bit.
        """
        idle = sum(gpus)
        shapes: list[_DirectRow] = []
        for weight, cpu, milli, num, models in self._gpu_shapes:
            ahead = 0.0 if self.shares_only and milli >= MILLI else self.fill_ahead
            fitting = 0
            small = 0
            for free in gpus:
                if free >= milli:
                    fitting += 1
                else:
                    small += free
            gone = bool(models and model not in models) or fitting < num
            by_gpu = sum(free // milli for free in gpus) // num if ahead and not gone else 0
            shapes.append((weight * idle, cpu, gone, weight, ahead, small, by_gpu, milli * num))
        return idle, self._always * idle, shapes


def sigmoid_score(before: float, after: float) -> int:
    """FGD's node score: 50 when fragmentation is unchanged, towards 100 as it shrinks."""
    x = (before - after) / MILLI
    if x < -700:  # math.exp overflows; the score is 0 there anyway
        return 0
    return int(100.0 / (1.0 + math.exp(-x)))


def signature_of(model: str, cpu_free: int, gpus: Iterable[int]) -> Signature:
    return (model, cpu_free, tuple(sorted(gpus, reverse=True)))


def after_whole(signature: Signature, shape: Shape) -> Signature:
    """The state after a whole-GPU or CPU-only pod: CPU taken, ``num_gpu`` fully free GPUs taken."""
    model, cpu_free, gpus = signature
    if shape.num_gpu == 0:
        return (model, cpu_free - shape.cpu_milli, gpus)
    rest = list(gpus)
    taken = 0
    for i, free in enumerate(rest):  # descending: the fully free GPUs come first
        if taken == shape.num_gpu:
            break
        if free == MILLI:
            rest[i] = 0
            taken += 1
    return (model, cpu_free - shape.cpu_milli, tuple(sorted(rest, reverse=True)))


def after_share(signature: Signature, shape: Shape, free_value: int) -> Signature:
    """The state after a GPU-sharing pod lands on a GPU that had ``free_value`` milli free."""
    model, cpu_free, gpus = signature
    rest = list(gpus)
    rest[rest.index(free_value)] = free_value - shape.gpu_milli
    return (model, cpu_free - shape.cpu_milli, tuple(sorted(rest, reverse=True)))
