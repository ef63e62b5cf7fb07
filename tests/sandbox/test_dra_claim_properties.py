"""Whatever status writes a scheduler makes to a ResourceClaim, in any order, the stored claim never holds a
reservation without an allocation, and an allocation is only ever written onto none or cleared, never swapped
for another: the rules every deviceshare writer relies on (a device in an allocation stays taken)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import errors, store
from tests.sandbox.dra_objects import MERGE, allocation, claim

UIDS = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(4)]
allocations = st.one_of(st.none(), st.sampled_from([allocation("gpu-node-0", "gpu-0"),
                                                    allocation("gpu-node-1", "gpu-2", "gpu-3")]))
reservations = st.lists(st.sampled_from(UIDS), max_size=3).map(
    lambda uids: [{"resource": "pods", "name": f"p{u[-1]}", "uid": u} for u in uids])
writes = st.lists(st.tuples(st.booleans(), allocations, st.booleans(), reservations), max_size=12)


def _allowed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The rules of validation.go, stated once more from the outside."""
    uids = [r["uid"] for r in new.get("reservedFor") or []]
    if len(uids) != len(set(uids)):
        return False
    if uids and new.get("allocation") is None:
        return False
    return not (old.get("allocation") is not None and new.get("allocation") is not None
                and old["allocation"] != new["allocation"])


@settings(max_examples=150, deadline=None)
@given(writes)
def test_status_writes_keep_the_claims_invariants(steps: list[tuple[bool, Any, bool, Any]]) -> None:
    objects = store.ObjectStore()
    objects.create(objects.catalog.lookup("namespaces"), None, {"metadata": {"name": "default"}})
    claims = objects.catalog.lookup("resourceclaims")
    objects.create(claims, "default", claim())
    for set_allocation, new_allocation, set_reserved, reserved in steps:
        old = dict(objects.get(claims, "default", "group-devices").get("status") or {})
        patch: dict[str, Any] = {}
        if set_allocation:
            patch["allocation"] = new_allocation
        if set_reserved:
            patch["reservedFor"] = reserved or None
        wanted = {k: v for k, v in {**old, **patch}.items() if v is not None}
        try:
            objects.patch(claims, "default", "group-devices", MERGE, {"status": patch}, "status")
            accepted = True
        except errors.ApiError as e:
            assert e.code == 422, e.message
            accepted = False
        assert accepted == _allowed(old, wanted), (old, patch)
        stored = objects.get(claims, "default", "group-devices").get("status") or {}
        assert stored == (wanted if accepted else old)
        assert not stored.get("reservedFor") or stored.get("allocation") is not None
