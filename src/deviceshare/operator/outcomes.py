"""What one scheduling cycle answers (:class:`Outcome`), for the workers to route (``deciding.py``).

A cycle (``scheduler.py``) ends bound, unschedulable (the pod's condition says why; parked until a change could
help), skipped (not ours, or nothing to do), to be retried (a transient API failure: ``retry_after``) or refused
(the API server refused a write: said on the pod, retried with backoff).
"""

from __future__ import annotations

import dataclasses
import enum

from . import state as state_


class Result(enum.Enum):
    BOUND = "bound"
    UNSCHEDULABLE = "unschedulable"
    SKIPPED = "skipped"  # not ours, already bound, deleted: nothing to do
    RETRY = "retry"  # transient API failure
    REFUSED = "refused"  # the API server refused a write (400/403/422): say so on the pod, retry with backoff


@dataclasses.dataclass(frozen=True)
class Outcome:
    result: Result
    message: str = ""
    node: str | None = None
    retry_after: float = 0.0
    also_bound: tuple[state_.PodKey, ...] = ()  # other members bound in the same cycle (a gang's)
