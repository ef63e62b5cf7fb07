"""Env-var names for device resources (CONTRACT §4)."""

import pytest

from deviceshare.api import envnames


@pytest.mark.parametrize(
    ("resource", "expected"),
    [
        ("nvidia.com/gpu", ("NVIDIA_VISIBLE_DEVICES",)),
        ("nvidia.com/mig-1g.5gb", ("NVIDIA_VISIBLE_DEVICES",)),
        ("amd.com/gpu", ("AMD_VISIBLE_DEVICES",)),
        ("huawei.com/Ascend910", ("ASCEND_VISIBLE_DEVICES",)),
        ("gpu.intel.com/i915", ("ZE_AFFINITY_MASK",)),
        ("habana.ai/gaudi", ("HABANA_VISIBLE_DEVICES",)),
        ("example.com/fpga", ("EXAMPLE_FPGA_VISIBLE_DEVICES",)),
        ("xilinx.com/fpga-u250", ("XILINX_FPGA_U250_VISIBLE_DEVICES",)),
    ],
)
def test_default_mapping(resource: str, expected: tuple[str, ...]) -> None:
    assert envnames.EnvNames().for_resource(resource) == expected


def test_override_adds_cuda_visible_devices_and_exact_key_beats_prefix() -> None:
    names = envnames.EnvNames.from_mapping(
        {"envNames": {"nvidia.com/": ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"],
                      "nvidia.com/mig-1g.5gb": "MIG_IDS"}}
    )
    assert names.for_resource("nvidia.com/gpu") == ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    assert names.for_resource("nvidia.com/mig-1g.5gb") == ("MIG_IDS",)
    assert names.for_resource("amd.com/gpu") == ("AMD_VISIBLE_DEVICES",)


def test_override_from_configmap_json_string(tmp_path) -> None:
    f = tmp_path / "env.yaml"
    f.write_text('envNames: \'{"example.com/": ["EX_IDS"]}\'\n')
    assert envnames.EnvNames.from_file(f).for_resource("example.com/tpu") == ("EX_IDS",)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"nvidia.com/": ["1BAD"]}, "not a valid env var name"),
        ({"nvidia.com/": []}, "non-empty list"),
        ({"gpu": ["X"]}, "prefix ending in '/'"),
        (["nvidia.com/"], "must be a mapping"),
    ],
)
def test_bad_override_names_the_problem(data: object, problem: str) -> None:
    with pytest.raises(envnames.EnvNameConfigError, match=problem):
        envnames.EnvNames.from_mapping(data)
