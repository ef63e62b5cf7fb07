"""``inspect`` and ``explain`` say how each bound member pod was handed its devices (CONTRACT §12): by CDI on the
node labelled ``deviceshare.io/handover=cdi``, by env var elsewhere."""

from __future__ import annotations

import asyncio
import json

import pytest

from deviceshare import cli
from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.operator.conftest import RunningOperator
from tests.operator.kube import Kube

GPU = "nvidia.com/gpu"


@pytest.fixture
def sandbox_options() -> dict[str, object]:
    return {"nodes": 1, "gpus": 2}


async def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, list(argv)) == 0
    return capsys.readouterr().out


async def test_inspect_and_explain_show_each_bound_pods_handover(
    cluster: Sandbox, kube: Kube, operator: RunningOperator, capsys: pytest.CaptureFixture[str]
) -> None:
    # Added with its label (one event): the operator never sees the node unlabelled.
    cluster.add_node("gpu-node-1", gpus=2, labels={names.NODE_HANDOVER_LABEL: "cdi"})
    await kube.create_group("ml", "a", {GPU: 2})
    await kube.create_pod("ml", "a-0", "a")
    first = await kube.wait_bound("ml", "a-0")
    await kube.create_group("ml", "b", {GPU: 2})
    await kube.create_pod("ml", "b-0", "b")
    second = await kube.wait_bound("ml", "b-0")
    by_node = {first["spec"]["nodeName"]: "a-0", second["spec"]["nodeName"]: "b-0"}
    on_cdi, on_env = by_node["gpu-node-1"], by_node["gpu-node-0"]
    cdi_ids = json.loads((await kube.pod("ml", on_cdi))["metadata"]["annotations"][  # type: ignore[index]
        names.POD_SELECTED_DEVICES_ANNOTATION])[GPU].split(",")
    expected = "cdi " + ",".join(f"{GPU}={i}" for i in cdi_ids)

    kubeconfig = ("--kubeconfig", str(cluster.kubeconfig))
    table = await _main(capsys, "inspect", *kubeconfig)
    assert f"  ml/{on_cdi}  gpu-node-1  {expected}\n" in table
    assert f"  ml/{on_env}  gpu-node-0  env\n" in table
    shown = json.loads(await _main(capsys, "inspect", *kubeconfig, "-o", "json"))["handovers"]
    assert {(h["name"], h["handover"]) for h in shown} == {(on_cdi, expected), (on_env, "env")}

    assert f"Hand-over: {expected}." in await _main(capsys, "explain", on_cdi, "-n", "ml", *kubeconfig)
    assert "Hand-over: env." in await _main(capsys, "explain", on_env, "-n", "ml", *kubeconfig)
