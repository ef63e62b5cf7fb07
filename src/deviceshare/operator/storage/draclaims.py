"""The reads and writes of a DRA group's ResourceClaim object itself (CONTRACT §13): create, finalizers, delete.

(Its ``status`` — allocation and reservedFor — is the allocation's to write.) Every write follows the rules of the
rest of :mod:`..storage`: fenced (a replica that is not the leader sends nothing), and a lost answer (``504``, a
timeout, a dropped connection) is read back, never guessed:

- a create is idempotent by name: the claim read back (ours, whoever's, or a create that landed and answers ``409
  AlreadyExists`` the second time) is returned for the caller to judge by its owner; absent: sent again;
- a finalizer write is conditional on the resourceVersion it was computed from (as the group's finalizers);
- a delete carries the uid and resourceVersion as preconditions, so it never deletes a claim that changed since it
  was read (an allocation written meanwhile); read back, a claim gone or being deleted is a delete that landed.

Kept apart from ``cluster.py`` (a mixin of :class:`~.cluster.ClusterApi`, like ``eventwrites.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceshare.api import names

from ..readback import Seen
from .errors import READ_BACK_TRIES, Conflict, Gone, Uncertain
from .transport import MERGE_PATCH, Transport, _segment

ClaimKey = tuple[str, str]  # namespace, name
RESOURCE = "resourceclaims"  # as the writes are counted (the paths spell it out: the RBAC test reads them)


def claim_path(key: ClaimKey) -> str:
    return f"/apis/{names.DRA_API_VERSION}/namespaces/{_segment(key[0])}/resourceclaims/{_segment(key[1])}"


def _collection(namespace: str) -> str:
    return f"/apis/{names.DRA_API_VERSION}/namespaces/{_segment(namespace)}/resourceclaims"


def _meta(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (body or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def finalizers_seen(claim: Mapping[str, Any] | None, *, uid: str, written: Sequence[str], precondition: str) -> Seen:
    """The claim's finalizer list replaced by ``written``: did it land? Gone after removing ours counts as landed
    (a deleting claim whose last finalizer went is deleted)."""
    meta = _meta(claim)
    if claim is None or meta.get("uid") != uid:
        return Seen.GONE if names.GROUP_FINALIZER in written else Seen.LANDED
    if list(meta.get("finalizers") or []) == list(written):
        return Seen.LANDED
    return Seen.NOT_YET if str(meta.get("resourceVersion", "")) == precondition else Seen.OVERTAKEN


def delete_seen(claim: Mapping[str, Any] | None, *, uid: str, precondition: str) -> Seen:
    """A delete of claim ``uid`` conditional on ``precondition``: landed once it is gone or being deleted."""
    meta = _meta(claim)
    if claim is None or meta.get("uid") != uid or meta.get("deletionTimestamp"):
        return Seen.LANDED
    return Seen.NOT_YET if str(meta.get("resourceVersion", "")) == precondition else Seen.OVERTAKEN


class ClaimWrites(Transport):
    async def read_claim(self, key: ClaimKey) -> dict[str, Any] | None:
        """The claim as the API shows it now; None if it does not exist."""
        try:
            data: dict[str, Any] = await self._call("GET", claim_path(key), f"get resourceclaim {names.key_text(key)}")
        except Gone:
            return None
        return data

    async def create_claim(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create the claim, or return the one already under its name (whoever made it: the caller judges its
        owner). A lost answer is read back: present, it is returned; absent, the create is sent again."""
        meta = _meta(body)
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        what = f"create resourceclaim {names.key_text(key)}"
        for _ in range(READ_BACK_TRIES):
            try:
                data: dict[str, Any] = await self._write(
                    "POST", _collection(key[0]), what, dict(body), verb="create", resource=RESOURCE,
                    resolved_by_caller=True,
                )
                return data
            except Conflict:  # AlreadyExists: an earlier create of ours that landed, or someone else's claim
                shown = await self.read_claim(key)
            except Uncertain:
                shown = await self.read_claim(key)
                self.on_write("create", RESOURCE, "uncertain_resolved")
            if shown is not None:
                return shown
        raise Uncertain(f"{what}: neither created nor found after {READ_BACK_TRIES} tries")

    async def set_claim_finalizers(
        self, key: ClaimKey, finalizers: Sequence[str], *, uid: str, resource_version: str
    ) -> dict[str, Any] | None:
        """Replace the finalizer list, conditional on resourceVersion; the claim as it is now (None: deleted, when
        our finalizer was its last and it was being deleted)."""
        what = f"patch finalizers of resourceclaim {names.key_text(key)}"
        body = {"metadata": {"uid": uid, "finalizers": list(finalizers), "resourceVersion": resource_version}}
        return await self._claim_write(
            claim_path(key), key, what, body, RESOURCE,
            lambda c: finalizers_seen(c, uid=uid, written=finalizers, precondition=resource_version),
        )

    async def _claim_write(
        self, path: str, key: ClaimKey, what: str, body: Mapping[str, Any], resource: str,
        judge: Callable[[dict[str, Any] | None], Seen],
    ) -> dict[str, Any] | None:
        """A conditional merge patch of the claim at ``path`` (the claim's, or its ``/status``), its lost answer
        resolved by ``judge`` on the claim read back: sent again while the claim still shows the version it was
        conditional on (only one of two such copies can land), until it shows what we wrote. The claim as it is
        now (None: deleted meanwhile, when that is what landing means)."""
        for _ in range(READ_BACK_TRIES):
            try:
                data: dict[str, Any] = await self._write(
                    "PATCH", path, what, dict(body), verb="patch", resource=resource,
                    content_type=MERGE_PATCH, resolved_by_caller=True,
                )
                return data
            except Uncertain:
                seen, shown = await self._resolve(what, "patch", resource, lambda: self.read_claim(key), judge)
            if seen is Seen.LANDED:
                return shown
            if seen is Seen.GONE:
                raise Gone(f"{what}: the claim no longer exists")
            if seen is Seen.OVERTAKEN:
                raise Conflict(f"{what}: the claim changed while our write's answer was lost")
        raise Uncertain(f"{what}: the answer was lost {READ_BACK_TRIES} times")

    async def delete_claim(self, key: ClaimKey, *, uid: str, resource_version: str) -> None:
        """Delete the claim as it was read (uid and resourceVersion preconditions: ``Conflict`` if it changed).
        A claim already gone is fine; a lost answer is read back."""
        what = f"delete resourceclaim {names.key_text(key)}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": uid, "resourceVersion": resource_version}}
        for _ in range(READ_BACK_TRIES):
            try:
                await self._write("DELETE", claim_path(key), what, body, verb="delete", resource=RESOURCE,
                                  resolved_by_caller=True)
                return
            except Gone:
                return
            except Uncertain:
                seen, _ = await self._resolve(
                    what, "delete", RESOURCE, lambda: self.read_claim(key),
                    lambda c: delete_seen(c, uid=uid, precondition=resource_version),
                )
            if seen is Seen.LANDED:
                return
            if seen is Seen.OVERTAKEN:
                raise Conflict(f"{what}: the claim changed while our delete's answer was lost")
        raise Uncertain(f"{what}: the answer was lost {READ_BACK_TRIES} times")
