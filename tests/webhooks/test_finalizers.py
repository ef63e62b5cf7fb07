"""The group finalizer mutation, without HTTP: which reviews are patched, and what the patch leaves.

The end-to-end path (the sandbox calling the webhook on a group CREATE, the operator then sending no
finalizer write of its own) is in ``test_group_finalizer_e2e.py``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.api import names
from deviceshare.webhooks import admission, finalizers, reviews

F = names.GROUP_FINALIZER


def review(group: dict[str, Any] | None, *, operation: str = "CREATE", kind: str = names.KIND,
           api_group: str = names.GROUP, **request: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"uid": "u", "kind": {"group": api_group, "version": names.VERSION, "kind": kind},
                            "operation": operation, "namespace": "ml", "name": "g", "object": group, **request}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def patched(group: dict[str, Any]) -> dict[str, Any]:
    """The group as the API server stores it after applying the webhook's answer."""
    answer = admission.respond(review(group), finalizers.decide(review(group)))["response"]
    assert answer["allowed"] is True
    if "patch" not in answer:
        return group
    assert answer["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(group, json.loads(base64.b64decode(answer["patch"])))  # type: ignore[no-any-return]


def test_a_new_group_gets_the_finalizer() -> None:
    decision = finalizers.decide(review({"metadata": {"name": "g"}, "spec": {}}))
    assert (decision.allowed, decision.outcome) == (True, "patched")
    assert patched({"metadata": {"name": "g"}, "spec": {}})["metadata"]["finalizers"] == [F]


def test_other_finalizers_are_kept_and_ours_is_added_once() -> None:
    group = {"metadata": {"name": "g", "finalizers": ["example.com/keep"]}}
    assert patched(group)["metadata"]["finalizers"] == ["example.com/keep", F]
    again = {"metadata": {"name": "g", "finalizers": ["example.com/keep", F]}}
    decision = finalizers.decide(review(again))
    assert (decision.patch, decision.outcome) == ([], "unchanged")


@pytest.mark.parametrize("request_", [
    {"operation": "UPDATE"}, {"operation": "DELETE"}, {"kind": "Pod", "api_group": ""},
    {"subResource": "status"}, {"kind": "SharedDeviceGroup", "api_group": "example.com"},
], ids=["update", "delete", "pod", "status", "other-group"])
def test_anything_but_a_group_create_passes_untouched(request_: dict[str, Any]) -> None:
    decision = finalizers.decide(review({"metadata": {"name": "g"}}, **request_))
    assert (decision.allowed, decision.patch, decision.outcome) == (True, [], "skipped")


@pytest.mark.parametrize(("group", "field"), [
    ({"metadata": {"finalizers": "deviceshare.io/release-devices"}}, "metadata.finalizers is a string"),
    ({"metadata": {"finalizers": [1]}}, "metadata.finalizers is an array"),
    ({"metadata": "g"}, "metadata is a string"),
    (None, "request.object is missing"),
])
def test_a_malformed_group_is_a_400_naming_the_field(group: dict[str, Any] | None, field: str) -> None:
    with pytest.raises(reviews.MalformedReview, match=field):
        finalizers.decide(review(group))


@given(st.lists(st.sampled_from([F, "a.io/x", "b.io/y", "c.io/z"]), max_size=4, unique=True),
       st.booleans())
def test_after_the_patch_the_finalizer_is_there_exactly_once_and_nothing_else_moved(
    present: list[str], has_field: bool
) -> None:
    meta: dict[str, Any] = {"name": "g"}
    if present or has_field:
        meta["finalizers"] = present
    after = patched({"metadata": meta})["metadata"]["finalizers"]
    assert after.count(F) == 1
    assert [f for f in after if f != F] == [f for f in present if f != F]
