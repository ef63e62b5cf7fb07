"""The operator's target workload for FGD: a decaying histogram of the group shapes it has placed.

FGD measures fragmentation against the shapes expected to arrive. The replay takes them from its
trace; a running operator has no trace, so it learns them: every group placed adds one to its
shape's weight after all weights decayed by a factor (a half-life counted in placements), so the
mix follows a cluster whose workload changes while a burst of one shape cannot erase the others at
once. At start the histogram is seeded from the groups that exist (all weighted alike).

A shape is (CPU of a member pod, compute share per device, device count, device resource): the
resource stands in for FGD's GPU model, so a shape of another resource counts a node's idle
devices as fragment, as FGD counts a shape that may not use the node's GPU model. Shares measured
only in memory or tiles have no compute share to weigh and are not recorded.
"""

from __future__ import annotations

from collections.abc import Iterable

from deviceshare.core import fragmentation as frag

DEFAULT_HALF_LIFE = 500.0  # placements after which a shape's weight has halved
_FLOOR = 1e-3  # weights below this are dropped: the histogram stays as small as the live mix
_RESOLUTION = 256  # workload weights are rounded to 1/256, so tiny drifts keep the measure's memo


class ShapeHistogram:
    """Decaying counts of group shapes; :meth:`workload` is the normalised target workload."""

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE, coverage: float = 0.95) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.decay = 0.5 ** (1.0 / half_life)
        self.coverage = coverage
        self._weights: dict[frag.Shape, float] = {}

    @classmethod
    def seeded(cls, shapes: Iterable[frag.Shape], half_life: float = DEFAULT_HALF_LIFE) -> ShapeHistogram:
        """A histogram of the groups that exist now, each counted once and none decayed."""
        made = cls(half_life)
        for shape in shapes:
            made._weights[shape] = made._weights.get(shape, 0.0) + 1.0
        return made

    def observe(self, shape: frag.Shape) -> None:
        """One more group of ``shape`` placed: older weights decay, this one gains 1."""
        decay = self.decay
        for known in list(self._weights):
            weight = self._weights[known] * decay
            if weight < _FLOOR:
                del self._weights[known]
            else:
                self._weights[known] = weight
        self._weights[shape] = self._weights.get(shape, 0.0) + 1.0

    def __contains__(self, shape: object) -> bool:
        return shape in self._weights

    def weights(self) -> dict[frag.Shape, float]:
        return dict(self._weights)

    def workload(self) -> tuple[frag.WeightedShape, ...]:
        """The heaviest shapes covering ``coverage`` of the weight (FGD's 95%), renormalised to sum 1.

        Equal weights go to the larger shape first (as the artifact sorts); weights are rounded to
        1/256 so that the fragmentation measure built on them changes only when the mix does.
        """
        total = sum(self._weights.values())
        if total <= 0:
            return ()
        ordered = sorted(
            self._weights.items(),
            key=lambda kv: (kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].num_gpu, kv[0].gpu_spec),
            reverse=True,
        )
        chosen: list[tuple[frag.Shape, float]] = []
        covered = 0.0
        for shape, weight in ordered:
            if covered >= self.coverage * total:
                break
            chosen.append((shape, weight))
            covered += weight
        return tuple(
            frag.WeightedShape(shape, round(weight / covered * _RESOLUTION) / _RESOLUTION)
            for shape, weight in chosen
        )
