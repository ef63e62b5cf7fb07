"""The CDI hand-over's settings (CONTRACT §12) installed both ways: the chart's ``handover`` values and the
kustomize component ``manifests/overlays/cdi`` give the operator the same flags, which it parses as meant."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from deviceshare.operator import command
from tests.charts import rendering
from tests.charts.test_chart import _assert_same_install
from tests.manifests import kube_objects
from tests.manifests.test_node_agent import _render


def _operator_args(objects: list[dict[str, Any]]) -> list[str]:
    deployment = kube_objects.one(objects, "Deployment", "deviceshare-operator")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _parsed(args: list[str], tmp_path: Path) -> Any:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config = tmp_path / "env-names.yaml"
    config.write_text("{}\n")
    args = [str(config) if a == "/config/env-names.yaml" else a for a in args]
    return command.config_from_args(parser.parse_args(args)).handovers


def test_the_cdi_component_installs_what_handover_default_cdi_installs(tmp_path: Path) -> None:
    chart = rendering.objects(rendering.template_text({"webhook.certificates": "cert-manager",
                                                       "handover.default": "cdi"}))
    kustomized = _render(tmp_path, ["../cdi"])
    _assert_same_install(chart, kustomized)
    chosen = _parsed(_operator_args(kustomized), tmp_path)
    assert chosen.default == "cdi" and chosen.cdi_kinds == {"nvidia.com/gpu": "nvidia.com/gpu"}


def test_the_default_install_hands_over_by_env_and_extra_kinds_reach_the_operator(tmp_path: Path) -> None:
    default = _parsed(_operator_args(rendering.objects(rendering.template_text())), tmp_path)
    assert default.default == "env"
    more = rendering.objects(rendering.template_text({"handover.cdiKinds.amd\\.com/gpu": "amd.com/gpu"}))
    assert _parsed(_operator_args(more), tmp_path).cdi_kinds == {
        "nvidia.com/gpu": "nvidia.com/gpu", "amd.com/gpu": "amd.com/gpu"}


def test_a_mistyped_handover_is_refused_at_install() -> None:
    proc = rendering.helm("template", "x", str(rendering.CHART), "--set=handover.default=CDI", check=False)
    assert proc.returncode != 0 and "handover" in proc.stderr
