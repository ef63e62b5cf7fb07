"""FGD's ratings of node classes per group shape, re-rated a little per decision when the mix moves.

The ``fgd`` strategy rates a class of nodes (:mod:`fgdindex`) for a group shape once and keeps the
rating for as long as the fragmentation measure holds. The measure follows the learned target
workload (:mod:`workloadmix`), and every time it changes every rating is void: re-rating all
classes for a shape on its next decision cost milliseconds at 5,000 nodes, once per shape per
change, and that was the strategy's whole p99. So a changed mix does not replace the measure at
once. It becomes *pending*: each decision rates a few (shape, class) pairs for it, shape after
shape in the order of the mix, and only when every known shape has had its turn over the classes
of the day does the pending measure replace the active one, between two placements
(:meth:`Ratings.swap_if_ready`, called when a placement is observed). Decisions between two
placements thus all see one measure, whichever path (indexed or naive) takes them. Once the pass
is over, the same turns catch each shape up on the classes that appeared since it was last rated
(class ids only grow, so a watermark per shape finds them without a scan): a shape seldom seen
does not meet a pile of classes unrated on its next decision (the replay's
:meth:`nodeclasses.Cluster._tidy`). Whether a shape fits a state does not depend on the measure,
so a pass carries the misses over and rates the fits only. The work per decision is counted in
units, a rating that fits costing more (its after-states are measured) than one that does not.

The price: a moved mix weighs in once its pass is over (30 to 65 decisions in the 5,000-node
bench, where it is looked at every 200 placements anyway), so a shape new to the mix counts in the
measure that much later, not on the next decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from deviceshare.core import fgd, fgdindex
from deviceshare.core import fragmentation as frag

Rating = fgd.Rating  # (score, free values of the preferred devices)
RateFn = Callable[[fgd.Measure, frag.Signature, frag.Shape], Rating | None]
BUDGET = 40  # work units per decision for the background ratings
_FITS, _MISSES, _SCANS = 12, 1, 16  # units: a rating that fits, one that does not; classes scanned per unit


Inputs = tuple[tuple[frag.WeightedShape, ...], tuple[tuple[fgd.NodeType, tuple[int, int]], ...]]  # workload, types


@dataclass(slots=True)
class Book:
    """One measure and what it has rated: shape -> class id -> rating (None: does not fit).

    ``inputs``: what the measure was built from (the target workload and the node types, sorted).
    ``marks[shape]``: every open class with a lower id had been rated for the shape (at the time).
    """

    inputs: Inputs
    measure: fgd.Measure
    ratings: dict[frag.Shape, dict[int, Rating | None]] = field(default_factory=dict)
    marks: dict[frag.Shape, int] = field(default_factory=dict)

    @classmethod
    def of(cls, variant: fgd.Variant, inputs: Inputs) -> Book:
        workload, types = inputs
        return cls(inputs, fgd.Measure(variant, workload, dict(types)))


class Ratings:
    """The active measure's ratings, and the pending measure's being filled in a few per decision."""

    def __init__(self, rate: RateFn, budget: int = BUDGET, variant: fgd.Variant | None = None) -> None:
        if budget < 1:
            raise ValueError(f"budget must be at least 1, got {budget}")
        self._rate = rate
        self.variant = variant if variant is not None else fgd.VARIANTS[fgd.BEST]
        self.budget = budget
        self.active: Book | None = None
        self.pending: Book | None = None
        self._shapes: list[frag.Shape] = []  # the shapes the turns visit, heaviest first
        self._turn = 0  # the pending pass: index into _shapes, len(_shapes) once every shape had its turn
        self._tidy = 0  # the catch-up rotation: index into _shapes
        self._clean: tuple[int, int] | None = None  # (book id, class ids in all indexes) when nothing was left

    def activate(self, inputs: Inputs) -> Book:
        """Replace the measure now, every rating dropped (the first decision: nothing to serve meanwhile)."""
        self.active, self.pending, self._clean = Book.of(self.variant, inputs), None, None
        return self.active

    def propose(self, inputs: Inputs, shapes: Iterable[frag.Shape]) -> None:
        """The mix moved: rate the measure of ``inputs`` in the background, then switch (no-op if unchanged).

        ``shapes`` are those to rate ahead (the ones expected to arrive); a pending measure under way
        is left to finish, so that a steady stream of changes cannot keep it from ever taking over.
        """
        if self.pending is not None:
            return
        self._shapes = [s for s in shapes if s.num_gpu > 0]
        if self.active is None:
            self.activate(inputs)
        elif inputs != self.active.inputs:
            self.pending, self._turn = Book.of(self.variant, inputs), 0

    @property
    def ready(self) -> bool:
        return self.pending is not None and self._turn >= len(self._shapes)

    def swap_if_ready(self) -> bool:
        """Between placements: the pending measure takes over once every shape had its turn."""
        if self.pending is None or not self.ready:
            return False
        self.active, self.pending, self._clean = self.pending, None, None
        return True

    def clear(self) -> None:
        """Class ids were reassigned (the index started over): no rating holds, pending ones included."""
        for book in (self.active, self.pending):
            if book is not None:
                book.ratings.clear()
                book.marks.clear()
        self._turn, self._clean = 0, None

    def tend(self, indexes: Mapping[str, fgdindex.SignatureClasses]) -> int:
        """Spend up to ``budget`` units rating (shape, open class) pairs ahead of decisions; the units spent.

        The pending book's pass first (every open class, shape after shape), then catch-up turns on
        the book decisions will use next (classes new since the shape's mark). A shape's resource is
        its ``gpu_spec`` (:func:`fgdplacement.shape_of`).
        """
        left = self.budget
        if self.pending is not None and not self.ready:
            left = self._pass(self.pending, indexes, left)
        book = self.pending if self.pending is not None else self.active
        if left > 0 and book is not None and self._shapes and (self.pending is None or self.ready):
            left = self._catch_up(book, indexes, left)
        return self.budget - left

    def _pass(self, book: Book, indexes: Mapping[str, fgdindex.SignatureClasses], left: int) -> int:
        while left > 0 and self._turn < len(self._shapes):
            shape = self._shapes[self._turn]
            index = indexes.get(shape.gpu_spec)
            if index is not None:
                ratings = book.ratings.setdefault(shape, {})
                # whether a shape fits a state does not depend on the measure: misses carry over
                before = self.active.ratings.get(shape, {}) if self.active is not None else {}
                signatures, rate, measure = index.signatures, self._rate, book.measure
                for cid in index.classes:
                    if cid not in ratings:
                        if cid in before and before[cid] is None:
                            ratings[cid] = None
                            continue
                        if left <= 0:
                            return left
                        got = ratings[cid] = rate(measure, signatures[cid], shape)
                        left -= _MISSES if got is None else _FITS
                book.marks[shape] = len(signatures)
                left -= 1 + len(index.classes) // _SCANS  # a turn costs its lookups (charged after: progress)
            self._turn += 1
        return left

    def _catch_up(self, book: Book, indexes: Mapping[str, fgdindex.SignatureClasses], left: int) -> int:
        # no class new since every shape was caught up: skip the rotation (it hashes every shape)
        state = (id(book), sum(len(index.signatures) for index in indexes.values()))
        if self._clean == state:
            return left
        visited, moved = 0, False
        for _ in range(len(self._shapes)):
            if left <= 0:
                break
            visited += 1
            shape = self._shapes[self._tidy % len(self._shapes)]
            index = indexes.get(shape.gpu_spec)
            if index is not None:
                ratings = book.ratings.setdefault(shape, {})
                signatures, rate, measure, classes = index.signatures, self._rate, book.measure, index.classes
                start = cid = book.marks.get(shape, 0)
                end = len(signatures)
                while cid < end:
                    if cid in classes and cid not in ratings:
                        if left <= 0:
                            break
                        got = ratings[cid] = rate(measure, signatures[cid], shape)
                        left -= _MISSES if got is None else _FITS
                    cid += 1
                    if not cid % _SCANS:
                        left -= 1
                book.marks[shape] = cid
                moved |= cid != start
                if cid < end:
                    return left  # out of units: this shape goes on next time
            self._tidy += 1
            left -= 1  # with many shapes known, their turns alone must not take the decision's time
        if visited == len(self._shapes) and not moved:
            self._clean = state
        return left


def rate(measure: fgd.Measure, sig: frag.Signature, shape: frag.Shape) -> Rating | None:
    """The FGD engine's rating of a node in state ``sig`` (:meth:`fgd.Measure.rate`); None if the shape does not fit."""
    return measure.rate(sig, shape)
