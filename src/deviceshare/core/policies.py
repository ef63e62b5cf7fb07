"""Node and GPU choice policies for GPU-sharing pods: random, best-fit, packing, FGD, and ours.

A policy rates one node *state* (a :data:`fragmentation.Signature`) for one pod shape; it never
sees node names, so the replay engine can rate each distinct state once and let equal scores go
to the node that comes first in a fixed order (the artifact's tie-break). ``evaluate`` returns
``None`` when the pod does not fit the state (CPU, GPU model, GPU count), else a
:class:`Choice`: the integer score and, for a GPU-sharing pod, the free values (milli) of the
GPUs it prefers; the node's first GPU with one of those values gets the pod. CPU and memory are
hard filters (memory is checked by the engine, per node), never part of a score.

Scores follow the artifact's plugins (``best_fit_score.go``, ``gpu_packing_score.go``,
``fgd_score.go``); FGD and ours are the FGD engine's (:mod:`fgd`), the one the operator decides with.
The GPU inside a node follows the artifact's GPU selection: the tightest GPU that fits for best-fit
and packing, the first GPU with the best score for FGD, a random fitting GPU for random; whole-GPU
pods take fully free GPUs as the operator does (a contiguous run where one exists: the same free
counts as the artifact's lowest indices, so the same figures).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from deviceshare.core import fgd
from deviceshare.core.fragmentation import MILLI, Shape, Signature


@dataclass(frozen=True, slots=True)
class Choice:
    score: int
    gpu_values: tuple[int, ...] = ()  # GPU-sharing pods: free milli of the preferred GPUs


class Policy(Protocol):
    name: str
    randomized: bool  # True: any feasible node, uniformly (scores are ignored)

    def evaluate(self, signature: Signature, shape: Shape) -> Choice | None: ...


fits = fgd.fits  # CPU, GPU model and GPU count (memory is per node, checked by the engine)


def tightest(gpus: Sequence[int], milli: int) -> int:
    """The smallest free value that still holds ``milli`` (``gpus`` must hold one)."""
    return min(free for free in gpus if free >= milli)


def pick_gpus(gpus: Sequence[int], shape: Shape, choice: Choice, rng: random.Random | None = None) -> tuple[int, ...]:
    """GPU indices on a node (``gpus`` in index order) for a pod the node was chosen for: the FGD engine's
    rule (:func:`fgd.device_indices`), or, for the random policy (``rng``), a random fitting GPU for a share."""
    if rng is not None and shape.num_gpu == 1 and shape.gpu_milli < MILLI:
        return (rng.choice([i for i, g in enumerate(gpus) if g >= shape.gpu_milli]),)
    return fgd.device_indices(gpus, shape, choice.gpu_values)


class RandomPolicy:
    """Any node that fits, uniformly at random; a random fitting GPU inside it."""

    name = "random"
    randomized = True

    def evaluate(self, signature: Signature, shape: Shape) -> Choice | None:
        return Choice(0) if fits(signature, shape) else None


class BestFitPolicy:
    """Least CPU and GPU left over after placement (half weight each, over 128 cores / 8 GPUs)."""

    name = "bestfit"
    randomized = False

    def evaluate(self, signature: Signature, shape: Shape) -> Choice | None:
        if not fits(signature, shape):
            return None
        _, cpu_free, gpus = signature
        left = (cpu_free - shape.cpu_milli) / 128_000 * 0.5 + (sum(gpus) - shape.total_gpu_milli) / 8_000 * 0.5
        values = (tightest(gpus, shape.gpu_milli),) if shape.is_share else ()
        return Choice(int((1.0 - left) * 100), values)


class PackingPolicy:
    """Shared GPUs first (fullest first), then free GPUs on used nodes, then empty nodes (fewest GPUs)."""

    name = "packing"
    randomized = False

    def evaluate(self, signature: Signature, shape: Shape) -> Choice | None:
        if not fits(signature, shape):
            return None
        if shape.num_gpu == 0:
            return Choice(0)
        gpus = signature[2]
        values = (tightest(gpus, shape.gpu_milli),) if shape.is_share else ()
        fully_free = sum(1 for g in gpus if g == MILLI)
        if fully_free == len(gpus):
            return Choice(max(100 // 3 - fully_free, fully_free), values)
        used = sorted(g for g in gpus if g >= shape.gpu_milli)[: shape.num_gpu]  # tightest first
        whole_used = sum(1 for g in used if g == MILLI)
        if whole_used:
            return Choice(max(100 // 2 - whole_used, 100 // 3), values)
        ratio = sum(g * 100 // MILLI for g in used)
        return Choice(max(100 - ratio // 10, 100 // 2), values)


class FGDPolicy:
    """Fragmentation gradient descent and our variants: the FGD engine's rating (:class:`fgd.Measure`)."""

    name = "fgd"
    randomized = False

    def __init__(self, measure: fgd.Measure, name: str = "fgd") -> None:
        self.measure = measure
        self.name = name

    def evaluate(self, signature: Signature, shape: Shape) -> Choice | None:
        got = self.measure.rate(signature, shape)
        return None if got is None else Choice(*got)
