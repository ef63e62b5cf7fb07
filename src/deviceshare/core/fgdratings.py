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
placements thus all see one measure, whichever path (indexed or naive) takes them. With nothing
pending the same turns catch the active ratings up, so that a shape seldom seen does not meet a
pile of classes unrated on its next decision (the replay's :meth:`nodeclasses.Cluster._tidy`).

The price: a new mix weighs in a few hundred placements late at most (it is rebuilt every
``REFRESH`` placements anyway), and a shape new to the mix counts in the measure once the pending
pass is over, not on the next decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from deviceshare.core import fgdindex
from deviceshare.core import fragmentation as frag

Rating = tuple[int, tuple[int, ...]]  # (score, free values of the preferred devices)
RateFn = Callable[[frag.Fragmentation, frag.Signature, frag.Shape], Rating | None]
BUDGET = 12  # (shape, class) ratings done per decision for the pending measure (or the active one's catch-up)
_SHAPES_PER_TURN = 3  # shapes scanned per decision at most: a scan over rated classes costs too


@dataclass(slots=True)
class Book:
    """One measure and what it has rated: shape -> class id -> rating (None: does not fit)."""

    workload: tuple[frag.WeightedShape, ...]
    measure: frag.Fragmentation
    ratings: dict[frag.Shape, dict[int, Rating | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, workload: tuple[frag.WeightedShape, ...]) -> Book:
        return cls(workload, frag.Fragmentation(workload))


class Ratings:
    """The active measure's ratings, and the pending measure's being filled in a few per decision."""

    def __init__(self, rate: RateFn, budget: int = BUDGET) -> None:
        if budget < 1:
            raise ValueError(f"budget must be at least 1, got {budget}")
        self._rate = rate
        self.budget = budget
        self.active: Book | None = None
        self.pending: Book | None = None
        self._shapes: list[frag.Shape] = []  # the shapes the turns visit, heaviest first
        self._turn = 0  # index into _shapes; for a pending book, == len(_shapes) once every shape had its turn

    def activate(self, workload: tuple[frag.WeightedShape, ...]) -> Book:
        """Replace the measure now, every rating dropped (the first decision: nothing to serve meanwhile)."""
        self.active, self.pending, self._turn = Book.of(workload), None, 0
        return self.active

    def propose(self, workload: tuple[frag.WeightedShape, ...], shapes: Iterable[frag.Shape]) -> None:
        """The mix moved: rate ``workload``'s measure in the background, then switch (no-op if unchanged).

        ``shapes`` are those to rate ahead (the ones expected to arrive); a pending measure under way
        is left to finish, so that a steady stream of changes cannot keep it from ever taking over.
        """
        if self.pending is not None:
            return
        self._shapes = [s for s in shapes if s.num_gpu > 0]
        self._turn = 0
        if self.active is None:
            self.activate(workload)
        elif workload != self.active.workload:
            self.pending = Book.of(workload)

    @property
    def ready(self) -> bool:
        return self.pending is not None and self._turn >= len(self._shapes)

    def swap_if_ready(self) -> bool:
        """Between placements: the pending measure takes over once every shape had its turn."""
        if self.pending is None or not self.ready:
            return False
        self.active, self.pending, self._turn = self.pending, None, 0
        return True

    def clear(self) -> None:
        """Class ids were reassigned (the index started over): no rating holds, pending ones included."""
        for book in (self.active, self.pending):
            if book is not None:
                book.ratings.clear()
        if self.pending is not None:
            self._turn = 0

    def tend(self, indexes: Mapping[str, fgdindex.SignatureClasses]) -> int:
        """Rate up to ``budget`` (shape, open class) pairs not rated yet, shape after shape; how many were.

        For the pending book while there is one (its pass ends when the last shape is done), else the
        active book's catch-up in rotation. A shape's resource is its ``gpu_spec`` (:func:`shape_of`).
        """
        book = self.pending if self.pending is not None else self.active
        if book is None or not self._shapes:
            return 0
        pending, left = book is self.pending, self.budget
        for _ in range(_SHAPES_PER_TURN):
            if pending and self._turn >= len(self._shapes):
                break
            shape = self._shapes[self._turn % len(self._shapes)]
            index = indexes.get(shape.gpu_spec)
            if index is not None:
                ratings = book.ratings.setdefault(shape, {})
                signatures, rate, measure = index.signatures, self._rate, book.measure
                for cid in index.classes:
                    if cid not in ratings:
                        if not left:
                            return self.budget
                        ratings[cid] = rate(measure, signatures[cid], shape)
                        left -= 1
            self._turn = self._turn + 1 if pending else (self._turn + 1) % len(self._shapes)
        return self.budget - left
