"""Did a write land? Pure answers from the object read back after an uncertain outcome.

kube-apiserver can apply a write and still answer ``504 Timeout`` ("the server ... may still be processing the
request"), and a connection can drop after the request was sent; a ``409`` on a Binding can be our own earlier
Binding that landed. Such an outcome is never guessed: :mod:`.storage` reads the object back and asks one of
these functions what the API shows. Each answer is one of:

- ``LANDED``: the object carries what we wrote: the write (or an earlier copy of it) succeeded;
- ``NOT_YET``: the object is as it was: the write has not landed (it may still, unless it was conditional on a
  resourceVersion that is still current, in which case sending it again is safe: one of the two gets a 409);
- ``OVERTAKEN``: someone else changed the object: decide again from what it shows now (a conflict);
- ``GONE``: the object no longer exists (or another object has its name).

Kept apart from the I/O so each rule is a table test.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from deviceshare.api import names


class Seen(enum.Enum):
    LANDED = "landed"
    NOT_YET = "not-yet"
    OVERTAKEN = "overtaken"
    GONE = "gone"


def _meta(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (body or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def binding(
    pod: Mapping[str, Any] | None, *, uid: str, node: str, annotations: Mapping[str, str]
) -> Seen:
    """A Binding of pod ``uid`` to ``node`` carrying ``annotations``: did it land?

    Bound to ``node`` with every annotation we sent: ours (a Binding copies its annotations in the same write,
    and only the operator may write device annotations). Bound anywhere else, or without them: someone else's
    binding (OVERTAKEN). Not bound: NOT_YET — a Binding can land late, so the caller keeps its devices held and
    binds again; a second Binding of the same pod is refused with a 409 if the first one landed meanwhile.
    """
    meta = _meta(pod)
    if pod is None or meta.get("uid") != uid:
        return Seen.GONE
    bound_to = (pod.get("spec") or {}).get("nodeName")
    if not bound_to:
        return Seen.GONE if meta.get("deletionTimestamp") else Seen.NOT_YET
    carried = meta.get("annotations") or {}
    if bound_to == node and all(carried.get(k) == v for k, v in annotations.items()):
        return Seen.LANDED
    return Seen.OVERTAKEN


def status(group: Mapping[str, Any] | None, *, uid: str, written: Mapping[str, Any], precondition: str) -> Seen:
    """A merge patch of the group's ``status`` with ``written``, conditional on resourceVersion ``precondition``.

    LANDED when every field we wrote shows as written (``None``: absent). NOT_YET when the group is still at
    ``precondition``: the write cannot have landed, and since it was conditional it can only land on that very
    version, so sending it again is safe. Anything else: someone wrote in between (OVERTAKEN)."""
    meta = _meta(group)
    if group is None or meta.get("uid") != uid:
        return Seen.GONE
    shown = group.get("status") or {}
    if all(shown.get(k) == v for k, v in written.items()):
        return Seen.LANDED
    if str(meta.get("resourceVersion", "")) == precondition:
        return Seen.NOT_YET
    return Seen.OVERTAKEN


def finalizers(
    group: Mapping[str, Any] | None, *, uid: str, written: Sequence[str], precondition: str
) -> Seen:
    """The group's finalizer list replaced by ``written``, conditional on ``precondition``.

    A deleting group whose last finalizer we removed is deleted by the API server: gone counts as LANDED
    when we were removing ours (no one holds its claim any more), and as GONE when we were adding it."""
    meta = _meta(group)
    if group is None or meta.get("uid") != uid:
        return Seen.GONE if names.GROUP_FINALIZER in written else Seen.LANDED
    if list(meta.get("finalizers") or []) == list(written):
        return Seen.LANDED
    if str(meta.get("resourceVersion", "")) == precondition:
        return Seen.NOT_YET
    return Seen.OVERTAKEN


def pod_annotations(pod: Mapping[str, Any] | None, *, uid: str, written: Mapping[str, str | None]) -> Seen:
    """A merge patch of a pod's annotations (``None`` removes one): idempotent, so NOT_YET means "send again"."""
    meta = _meta(pod)
    if pod is None or meta.get("uid") != uid:
        return Seen.GONE
    carried = meta.get("annotations") or {}
    if all(carried.get(k) == v for k, v in written.items()):
        return Seen.LANDED
    return Seen.NOT_YET


def eviction(pod: Mapping[str, Any] | None, *, uid: str) -> Seen:
    """An eviction of pod ``uid``: it landed once the pod is gone or being deleted (the Eviction API deletes
    gracefully); still running as it was: NOT_YET (an eviction is idempotent: asking again is safe)."""
    meta = _meta(pod)
    if pod is None or meta.get("uid") != uid or meta.get("deletionTimestamp"):
        return Seen.LANDED
    return Seen.NOT_YET


def _claim_results(allocation: Any) -> list[tuple[str, str, str, str, str]] | None:
    if not isinstance(allocation, Mapping):
        return None
    results = (allocation.get("devices") or {}).get("results") or []
    return sorted((str(r.get("request")), str(r.get("driver")), str(r.get("pool")), str(r.get("device")),
                   str(r.get("shareID") or "")) for r in results if isinstance(r, Mapping))


def claim_status(
    claim: Mapping[str, Any] | None, *, uid: str, written: Mapping[str, Any], precondition: str
) -> Seen:
    """A merge patch of a ResourceClaim's ``status`` (``allocation``, ``reservedFor``), conditional on
    ``precondition``: LANDED when the claim shows the allocation's results (``None``: none) and exactly the
    consumers (by uid) we wrote; the API server may add fields of its own (``allocationTimestamp``)."""
    meta = _meta(claim)
    if claim is None or meta.get("uid") != uid:
        return Seen.GONE
    shown = claim.get("status") or {}
    landed = True
    if "allocation" in written:
        landed = _claim_results(shown.get("allocation")) == _claim_results(written["allocation"])
    if "reservedFor" in written:
        uids = sorted(str(c.get("uid")) for c in (written["reservedFor"] or []))
        landed = landed and sorted(str(c.get("uid")) for c in (shown.get("reservedFor") or [])) == uids
    if landed:
        return Seen.LANDED
    if str(meta.get("resourceVersion", "")) == precondition:
        return Seen.NOT_YET
    return Seen.OVERTAKEN
