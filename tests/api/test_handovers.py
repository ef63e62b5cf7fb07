"""The hand-over seam (CONTRACT §12): what each way writes, how the node chooses, and its settings' errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceshare.api import envnames, handovers, names

IDS = st.lists(st.from_regex(r"GPU-[0-9a-f]{4}|[0-9]", fullmatch=True), min_size=1, max_size=4, unique=True)
RESOURCES = st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "example.com/fpga"])
CONTAINER = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


@given(st.dictionaries(RESOURCES, IDS, min_size=1), st.lists(CONTAINER, min_size=1, max_size=5, unique=True))
def test_every_container_names_exactly_the_group_devices_that_have_a_cdi_kind_in_group_order(
    devices: dict[str, list[str]], containers: list[str]
) -> None:
    kinds = {"nvidia.com/gpu": "nvidia.com/gpu", "example.com/fpga": "example.com/fpga"}
    made = handovers.CdiHandover(kinds).pod_annotations(devices, containers)
    want = [f"{kinds[r]}={i}" for r in sorted(devices) if r in kinds for i in devices[r]]
    if not want:  # only resources without a kind: the env hand-over alone
        assert made == {}
        return
    assert made == {f"nvidia.cdi.k8s.io/container.{c}": ",".join(want) for c in containers}
    assert handovers.carried(made) == {c: ",".join(want) for c in containers}


def test_the_env_way_adds_nothing_to_the_env_annotations() -> None:
    assert handovers.EnvHandover().pod_annotations({"nvidia.com/gpu": ["0"]}, ["main"]) == {}


def test_describe_says_which_way_a_pod_got() -> None:
    assert handovers.describe({names.POD_SELECTED_DEVICES_ANNOTATION: "{}"}) == "env"
    assert handovers.describe({"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0"}) == "cdi nvidia.com/gpu=0"


def test_settings_from_the_file_then_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("handover: cdi\ncdiKinds: {amd.com/gpu: amd.com/gpu}\nenvNames: {example.com/: [EX]}\n")
    chosen = handovers.Handovers.from_file(str(config))
    assert chosen.default == "cdi"
    assert chosen.cdi_kinds == {"nvidia.com/gpu": "nvidia.com/gpu", "amd.com/gpu": "amd.com/gpu"}
    # The same file still gives the env-name mapping (its other sections).
    assert envnames.EnvNames.from_file(config).for_resource("example.com/x") == ("EX",)
    overridden = chosen.with_overrides("env", ["nvidia.com/gpu=example.com/gpu"])
    assert overridden.default == "env" and overridden.cdi_kinds["nvidia.com/gpu"] == "example.com/gpu"
    assert handovers.Handovers().default == "env"


@pytest.mark.parametrize(("default", "kinds", "message"), [
    ("dra", [], "--handover: 'dra' is no hand-over; expected one of env, cdi"),
    (None, ["nvidia.com/gpu"], "--cdi-kind 'nvidia.com/gpu': expected RESOURCE=KIND"),
    (None, ["gpu=nvidia.com/gpu"], "--cdi-kind 'gpu=nvidia.com/gpu': expected RESOURCE=KIND"),
    (None, ["nvidia.com/gpu=gpu"], "the CDI kind 'gpu' is not vendor.tld/class"),
])
def test_bad_settings_name_the_problem(default: str | None, kinds: list[str], message: str) -> None:
    with pytest.raises(handovers.HandoverConfigError, match=message.replace(".", r"\.")):
        handovers.Handovers().with_overrides(default, kinds)


def test_a_bad_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("handover: CDI\n")
    with pytest.raises(handovers.HandoverConfigError, match=f"{config}: handover: 'CDI' is no hand-over"):
        handovers.Handovers.from_file(str(config))
    config.write_text("cdiKinds: [nvidia.com/gpu]\n")
    with pytest.raises(handovers.HandoverConfigError, match="cdiKinds must be a mapping"):
        handovers.Handovers.from_file(str(config))
