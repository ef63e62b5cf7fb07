"""The merge patch ``deviceshare.kube.applying`` sends on re-apply turns the last applied object into the new one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.kube import applying

ROOT = Path(__file__).resolve().parents[2]

_leaf = st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=3))
_json_objects = st.recursive(
    st.dictionaries(st.sampled_from("abcde"), _leaf, max_size=4),
    lambda children: st.dictionaries(st.sampled_from("abcde"), st.one_of(_leaf, children), max_size=4),
    max_leaves=12,
)


def _apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, section 2, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply_merge_patch(result.get(key), value)
    return result


@settings(deadline=None)
@given(_json_objects, _json_objects)
def test_the_patch_turns_before_into_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    patch = applying.merge_patch(before, after)
    assert json.dumps(_apply_merge_patch(before, patch), sort_keys=True) == json.dumps(after, sort_keys=True)
    assert (patch == {}) == (json.dumps(before, sort_keys=True) == json.dumps(after, sort_keys=True))


@settings(deadline=None)
@given(_json_objects, _json_objects, _json_objects)
def test_fields_the_file_never_named_survive(before: dict[str, Any], after: dict[str, Any],
                                             others: dict[str, Any]) -> None:
    # What another writer added under keys the file never had is left alone.
    live = {**{f"x-{k}": v for k, v in others.items()}, **before}
    patched = _apply_merge_patch(live, applying.merge_patch(before, after))
    assert {k: v for k, v in patched.items() if k.startswith("x-")} == {f"x-{k}": v for k, v in others.items()}


def test_load_keeps_file_order_and_flattens_lists(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text("---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n"
                    "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n"
                    "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n")
    assert [o["metadata"]["name"] for o in applying.load(path)] == ["a", "b", "c"]
    kinds = [o["kind"] for o in applying.load(ROOT / "examples" / "trainer-evaluator.yaml")]
    assert kinds[:2] == ["Namespace", "SharedDeviceGroup"]
