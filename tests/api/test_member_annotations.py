"""What a member pod of a sharing group sees (CONTRACT §7): limits and tiles as env annotations."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import envnames, models, podannotations

GPU = "nvidia.com/gpu"
I915 = "gpu.intel.com/i915"
ENV = "deviceshare.io/env."


def share(**entry: Any) -> models.DeviceShare:
    return models.DeviceShare.model_validate(entry)


@pytest.mark.parametrize(
    ("devices", "shares", "tiles", "expected"),
    [
        (  # whole devices: exactly as before
            {GPU: ["2", "3"]}, {}, {},
            {"selected-devices": '{"nvidia.com/gpu":"2,3"}', "NVIDIA_VISIBLE_DEVICES": "2,3"},
        ),
        (  # the contract's example: 460m and 12Gi on two devices, ordinals as the container sees them
            {GPU: ["2", "3"]}, {GPU: share(compute="460m", memory="12Gi")}, {},
            {
                "selected-devices": '{"nvidia.com/gpu":"2,3"}',
                "NVIDIA_VISIBLE_DEVICES": "2,3",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "46",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M,1=12288M",
            },
        ),
        (  # ceil(compute x 100): 0.255 -> 26, and memory alone gives no percentage
            {GPU: ["5"]}, {GPU: share(compute="255m")}, {},
            {"selected-devices": '{"nvidia.com/gpu":"5"}', "NVIDIA_VISIBLE_DEVICES": "5",
             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "26"},
        ),
        (
            {GPU: ["0"]}, {GPU: share(memory="1.5Gi")}, {},
            {"selected-devices": '{"nvidia.com/gpu":"0"}', "NVIDIA_VISIBLE_DEVICES": "0",
             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1536M"},
        ),
        (  # tiles: ZE_AFFINITY_MASK becomes <ordinal>.<tile>
            {I915: ["0", "1"]}, {I915: share(tiles=1)}, {I915: ["0.1", "1.0"]},
            {"selected-devices": '{"gpu.intel.com/i915":"0,1"}', "ZE_AFFINITY_MASK": "0.1,1.0"},
        ),
    ],
)
def test_member_annotations(
    devices: dict[str, list[str]], shares: dict[str, Any], tiles: dict[str, list[str]], expected: dict[str, str]
) -> None:
    got = podannotations.member_annotations(devices, envnames.EnvNames(), shares, tiles)
    want = {
        (f"deviceshare.io/{k}" if k == "selected-devices" else ENV + k): v for k, v in expected.items()
    }
    assert got == want


def test_tile_ordinals_follow_the_node_inventory() -> None:
    got = podannotations.member_annotations(
        {I915: ["card-b"]}, envnames.EnvNames(), {I915: share(tiles=2)}, {I915: ["card-b.0", "card-b.1"]},
        node_devices={I915: ["card-a", "card-b"]},
    )
    assert got[ENV + "ZE_AFFINITY_MASK"] == "1.0,1.1"


def test_hami_core_names_and_format_are_configurable() -> None:
    env = envnames.EnvNames.from_mapping({"limitEnvNames": {"nvidia.com/": "hami-core"}})
    got = podannotations.member_annotations({GPU: ["1"]}, env, {GPU: share(compute="0.5", memory="12Gi")})
    assert got[ENV + "CUDA_DEVICE_SM_LIMIT"] == "50"
    assert got[ENV + "CUDA_DEVICE_MEMORY_LIMIT"] == "12288m"
    assert ENV + "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in got


def test_env_names_a_group_must_not_set() -> None:
    spec = models.GroupSpec.model_validate({
        "resources": {GPU: 1, I915: 1},
        "share": {GPU: {"compute": "250m", "memory": "4Gi"}, I915: {"tiles": 1}},
    })
    assert envnames.EnvNames().for_group(spec) == [
        "ZE_AFFINITY_MASK", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ]
    whole = models.GroupSpec.model_validate({"resources": {GPU: 1}})
    assert envnames.EnvNames().for_group(whole) == ["NVIDIA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"limitEnvNames": {"nvidia.com/": "nope"}}, "is none of"),
        ({"limitEnvNames": {"nvidia.com/": {"compute": "1BAD"}}}, "is not a valid env var name"),
        ({"limitEnvNames": {"nvidia.com/": {"memoryFormat": "bytes"}}}, "memoryFormat must be mps or hami"),
        ({"limitEnvNames": {"gpu": "mps"}}, "must be a resource prefix"),
        ({"limitEnvNames": ["x"]}, "must be a mapping"),
    ],
)
def test_bad_limit_config_names_the_problem(data: object, problem: str) -> None:
    with pytest.raises(envnames.EnvNameConfigError, match=problem):
        envnames.EnvNames.from_mapping(data)
