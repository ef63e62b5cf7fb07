"""A device file that says something the agent cannot publish is refused with the field at fault."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.nodeagent import filesource

R = "gpu.intel.com/i915"


@pytest.mark.parametrize(("data", "words"), [
    ([], 'expected an object with "resources"'),
    ({"resources": {}, "extra": 1}, "unknown field(s) extra"),
    ({"resources": {}, "mps": "yes"}, '"mps" may only be "ready"'),
    ({"resources": {"i915": {"devices": ["a"]}}}, "not an extended resource name"),
    ({"resources": {R: {"devices": ["a", "a"]}}}, f"resources[{R}].devices: lists a device twice"),
    ({"resources": {R: {"devices": ["a"], "memory": "lots"}}}, f"resources[{R}].memory"),
    ({"resources": {R: {"devices": ["a"], "numa": {"b": 0}}}}, "names unlisted device(s) b"),
    ({"resources": {R: {"devices": ["a", "b"], "links": {"a": {"a": "PIX"}}}}}, "'a' is no other listed device"),
    ({"resources": {R: {"devices": ["a"], "unhealthy": ["z"]}}}, "expected a list of listed devices"),
])
def test_a_wrong_device_file_names_the_field(data: Any, words: str) -> None:
    with pytest.raises(filesource.FileSourceError) as refused:
        filesource.parse(data, "devices.json")
    assert words in str(refused.value) and str(refused.value).startswith("devices.json")


def test_a_missing_file_says_so(tmp_path: Any) -> None:
    with pytest.raises(filesource.FileSourceError, match=r"cannot read device file .*nothing\.json"):
        filesource.FileSource(tmp_path / "nothing.json").read()
