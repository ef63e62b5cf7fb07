"""A DRA group's ResourceClaim as an object (CONTRACT §13): made as soon as the group is seen, let go at release.

The claim ``<group>-devices`` lives in the group's namespace, is owned by the group (``controller: true``) and holds
the finalizer ``deviceshare.io/release-devices``, so it outlives neither the group nor the devices' use: its one
request ``devices`` asks for ``exactly`` the group's ``count`` devices of its DeviceClass, each matching every CEL
selector, with the share's capacity requests. Its ``status`` (allocation, reservedFor) is the allocation's to write.

- **Ensure** (:meth:`GroupClaims.ensure`, for a live group): the claim is read; absent, it is created (a create
  that landed answers 409 the second time: the claim read back is ours); present and ours, our finalizer is put
  back if someone removed it. A claim of that name the group does not own is never adopted: the group says so in
  its ``ClaimProblem`` condition, as does a claim the API server refuses (a CEL selector that does not compile).
One left by an earlier group of the same name (gone: names are unique) is retired
  like our own at release, then ours is made. A spec changed while Pending (the CRD freezes it once Bound) replaces
  an unallocated claim (a claim's spec is immutable). Once a claim is known good for the group's generation, it is
  not read again until the spec changes.
- **Release** (:meth:`GroupClaims.release`, once the group is deleted and no member runs): the claim is deleted
  only while the API shows no allocation and no reservation (the allocation's release clears them first), with the
  uid and resourceVersion read as preconditions, and our finalizer then removed; only once no claim of the group
  remains may the group's own finalizer come off.

Every write goes through :mod:`.storage` (fenced: a replica that is not the leader writes nothing; a lost answer
is read back). A claim's ``Gone`` never escapes as the group's (the reconcile loop would forget the group).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from deviceshare.api import models, names

from . import conditions as conditions_
from . import state as state_
from . import storage
from .context import Context
from .storage.draclaims import ClaimKey

logger = logging.getLogger(__name__)

CONDITION = "ClaimProblem"
RECHECK_S = 1.0  # how soon a claim that is not ready to go (allocated, or being deleted) is looked at again
# A claim the API server refused (its quota full, a selector that does not compile) is asked for again after 1, 2,
# 4 ... seconds, at most this far apart, as a controller's rate-limited workqueue backs off (client-go's
# exponential failure limiter): a full quota is not met by a POST a second per group. A spec change starts over.
REFUSED_RECHECK_MAX_S = 16.0


def claim_key(gkey: state_.GroupKey) -> ClaimKey:
    return (gkey[0], names.claim_name(gkey[1]))


def device_request(spec: models.GroupSpec) -> dict[str, Any]:
    """The claim's one request, with resource.k8s.io/v1's field names (``ExactDeviceRequest``), defaults written
    out so the claim read back compares equal."""
    claim = spec.claim
    assert claim is not None
    exactly: dict[str, Any] = {
        "deviceClassName": claim.device_class_name, "allocationMode": "ExactCount", "count": claim.count,
    }
    if claim.selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in claim.selectors]
    share = spec.share.get(claim.device_class_name)
    if share is not None and share.capacity:
        exactly["capacity"] = {"requests": {k: str(v) for k, v in sorted(share.capacity.items())}}
    return {"name": names.CLAIM_REQUEST_NAME, "exactly": exactly}


def claim_body(group: state_.GroupRecord, spec: models.GroupSpec) -> dict[str, Any]:
    namespace, name = claim_key(group.key)
    return {
        "apiVersion": names.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {names.POD_GROUP_LABEL: group.name},
            "finalizers": [names.GROUP_FINALIZER],
            "ownerReferences": [{
                "apiVersion": names.API_VERSION, "kind": names.KIND, "name": group.name, "uid": group.uid,
                "controller": True,
            }],
        },
        "spec": {"devices": {"requests": [device_request(spec)]}},
    }


def _meta(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    return claim.get("metadata") or {}


def group_owner(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the SharedDeviceGroup that controls the claim, if one does."""
    for ref in _meta(claim).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == names.KIND and str(ref.get("apiVersion", "")).startswith(
            f"{names.GROUP}/"
        ):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


def in_use(claim: Mapping[str, Any]) -> bool:
    """Whether the API shows the claim allocated or reserved for anyone: then it must not go."""
    status = claim.get("status") or {}
    return bool(status.get("allocation") or status.get("reservedFor"))


def _not_owned(key: ClaimKey, group: str) -> str:
    return (f"ResourceClaim {names.key_text(key)} exists and is not this group's (no SharedDeviceGroup {group!r} "
            "controls it); deviceshare does not adopt it: delete or rename it")


def requests_of(claim: Mapping[str, Any]) -> Any:
    return ((claim.get("spec") or {}).get("devices") or {}).get("requests")


def may_have_claim(group: state_.GroupRecord, claims: GroupClaims) -> bool:
    """Whether a deleting group's release must look for its claim: a DRA group, one whose spec cannot be read (it
    may have been one), or one whose claim this reconciler made."""
    return group.spec is None or group.spec.is_dra or claims.known(group.key)


class GroupClaims:
    """The claims of the DRA groups one reconciler looks after; ``request_later(gkey, seconds)`` brings a group back
    when its claim is not ready to go or to be replaced yet."""

    def __init__(self, ctx: Context, request_later: Callable[[state_.GroupKey, float], None]) -> None:
        self.ctx = ctx
        self._request_later = request_later
        self._good: dict[state_.GroupKey, tuple[str, int]] = {}  # (group uid, generation) whose claim is in place
        self._refused: dict[state_.GroupKey, tuple[str, int, int]] = {}  # (uid, generation, refusals in a row)

    def known(self, gkey: state_.GroupKey) -> bool:
        """Whether this reconciler made or saw a claim for the group (its key outlives the group's record)."""
        return gkey in self._good

    async def ensure(self, group: state_.GroupRecord) -> state_.GroupRecord:
        """The group's claim in place, as its spec asks (see the module docstring); the group as last written."""
        spec = group.spec
        if spec is None or not spec.is_dra:
            if self._good.pop(group.key, None) is not None:  # it stopped asking for a claim while Pending
                await self.release(group.key)
            return group
        if self._good.get(group.key) == (group.uid, group.generation):
            return group
        key = claim_key(group.key)
        claim = await self.ctx.api.read_claim(key)
        owner = None if claim is None else group_owner(claim)
        stale = claim is not None and (
            owner != (group.name, group.uid)  # an earlier group of this name's (gone: names are unique)
            or bool(_meta(claim).get("deletionTimestamp"))  # deleted by someone
            or requests_of(claim) != [device_request(spec)]  # spec.claim changed while Pending
        )
        if claim is not None and (owner is None or owner[0] != group.name):
            return await self._problem(group, "ClaimNotOwned", _not_owned(key, group.name))
        if claim is not None and stale:
            claim = await self._replace(key, claim)
            if claim is not None:
                return await self._problem(group, "ClaimInUse", (
                    f"ResourceClaim {names.key_text(key)} must be replaced (an earlier group's, deleted, or no "
                    "longer as spec.claim asks) but is still allocated or held; this group's claim is made once it "
                    "is gone"))
        if claim is None:
            try:
                claim = await self.ctx.api.create_claim(claim_body(group, spec))
            except storage.Invalid as e:  # e.g. a CEL selector the API server cannot compile: the user must fix it
                # or the namespace's ResourceQuota is full (quota admission's own words): tried again on later passes
                hint = "made once the quota has room" if "exceeded quota" in str(e) else "fix spec.claim"
                return await self._problem(group, "ClaimRefused", f"the API server refused ResourceClaim "
                                           f"{names.key_text(key)}: {e}; {hint}")
            if group_owner(claim) != (group.name, group.uid):  # made by someone else just now
                return await self._problem(group, "ClaimNotOwned", _not_owned(key, group.name))
            self.ctx.event(group, "ClaimCreated", f"created ResourceClaim {names.key_text(key)}")
        elif names.GROUP_FINALIZER not in (_meta(claim).get("finalizers") or ()):
            await self._finalizers(key, claim, [*(_meta(claim).get("finalizers") or ()), names.GROUP_FINALIZER])
        self._good[group.key] = (group.uid, group.generation)
        self._refused.pop(group.key, None)
        return await self._clear(group)

    async def release(self, gkey: state_.GroupKey) -> bool:
        """True once no claim of the group remains (the group's finalizer may come off); False while the API shows
        it allocated or reserved (looked at again shortly)."""
        key = claim_key(gkey)
        claim = await self.ctx.api.read_claim(key)
        owner = None if claim is None else group_owner(claim)
        self._refused.pop(gkey, None)
        if claim is None or owner is None or owner[0] != gkey[1]:
            self._good.pop(gkey, None)
            return True  # none, or not a group's of this name: never ours to delete
        if not await self._retire(key, claim):
            return False
        self._good.pop(gkey, None)
        return True

    async def _replace(self, key: ClaimKey, claim: Mapping[str, Any]) -> dict[str, Any] | None:
        """Retire a claim that must make way; the claim if it is still there (None: gone)."""
        if not await self._retire(key, claim):
            return dict(claim)
        return await self.ctx.api.read_claim(key)

    async def _retire(self, key: ClaimKey, claim: Mapping[str, Any]) -> bool:
        """Delete a claim that nothing holds and drop our finalizer: True once nothing of ours keeps it (it may still
        wait on someone else's finalizer); False, and a look later, while the API shows it allocated or reserved."""
        gkey = (key[0], key[1].removesuffix(names.CLAIM_SUFFIX))
        meta = _meta(claim)
        uid = str(meta.get("uid", ""))
        if in_use(claim):  # deleting or not: our finalizer keeps the allocation while anyone holds it
            self._request_later(gkey, RECHECK_S)
            return False
        try:
            if not meta.get("deletionTimestamp"):
                await self.ctx.api.delete_claim(key, uid=uid, resource_version=str(meta.get("resourceVersion", "")))
                shown = await self.ctx.api.read_claim(key)  # still there while a finalizer holds it
                if shown is None or _meta(shown).get("uid") != uid:
                    return True
                meta = _meta(shown)
            finalizers = list(meta.get("finalizers") or ())
            if names.GROUP_FINALIZER in finalizers:
                await self._finalizers(key, {"metadata": meta}, [f for f in finalizers if f != names.GROUP_FINALIZER])
        except storage.Gone:
            return True
        return True

    async def _finalizers(self, key: ClaimKey, claim: Mapping[str, Any], finalizers: list[str]) -> None:
        meta = _meta(claim)
        try:
            await self.ctx.api.set_claim_finalizers(
                key, finalizers, uid=str(meta.get("uid", "")), resource_version=str(meta.get("resourceVersion", ""))
            )
        except storage.Gone:
            return

    async def _problem(self, group: state_.GroupRecord, reason: str, message: str) -> state_.GroupRecord:
        """Say on the group (condition and event) why its claim is not in place, and look again later (a refused
        create later each time in a row, see ``REFUSED_RECHECK_MAX_S``)."""
        self._request_later(group.key, self._recheck(group, reason))
        shown = group.status.condition(CONDITION)
        if shown is not None and shown.status == "True" and shown.reason == reason and shown.message == message:
            return group
        self.ctx.event(group, reason, message, warning=True)
        conditions = conditions_.condition(
            conditions_.wire_conditions(group.status.conditions), CONDITION, "True", reason, message, group.generation
        )
        return await self._write_conditions(group, conditions)

    def _recheck(self, group: state_.GroupRecord, reason: str) -> float:
        if reason != "ClaimRefused":
            return RECHECK_S
        uid, generation, refusals = self._refused.get(group.key, (group.uid, group.generation, 0))
        if (uid, generation) != (group.uid, group.generation):
            refusals = 0
        self._refused[group.key] = (group.uid, group.generation, refusals + 1)
        return min(RECHECK_S * 2.0 ** min(refusals, 16), REFUSED_RECHECK_MAX_S)

    async def _clear(self, group: state_.GroupRecord) -> state_.GroupRecord:
        if group.status.condition(CONDITION) is None:
            return group
        conditions = conditions_.without_condition(conditions_.wire_conditions(group.status.conditions), CONDITION)
        return await self._write_conditions(group, conditions)

    async def _write_conditions(
        self, group: state_.GroupRecord, conditions: list[dict[str, Any]]
    ) -> state_.GroupRecord:
        written = await self.ctx.api.patch_group_status(
            group.key, {"conditions": conditions}, uid=group.uid, resource_version=group.resource_version
        )
        return self.ctx.state.keep(written)
