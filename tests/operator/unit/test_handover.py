"""The hand-over in the Binding (CONTRACT §12), against an in-memory API: a cdi node's members carry the CDI
annotation for every container and init container in the very Binding that places them; env nodes are unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from deviceshare.api import handovers, names
from deviceshare.operator.scheduler import Result
from tests.operator.unit.fakeapi import GPU, Harness, node

CDI = {names.NODE_HANDOVER_LABEL: "cdi"}
ENV = {names.NODE_HANDOVER_LABEL: "env"}


def _pod_with_init(h: Harness, name: str, group: str) -> dict[str, Any]:
    body = h.api.add_pod(name, group)
    body["spec"]["initContainers"] = [{"name": "fetch-weights", "image": "x"}]
    body["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    h.api.pods[("ns", name)]["spec"] = body["spec"]
    return body


def _bindings(h: Harness) -> list[dict[str, Any]]:
    return [w.body for w in h.api.writes if w.verb == "bind"]


async def test_a_cdi_node_gets_the_annotation_for_every_container_in_the_binding() -> None:
    h = Harness(node("n1", 4, labels=CDI))
    h.see(h.api.add_group("g", resources={GPU: 2}))
    h.see(_pod_with_init(h, "p", "g"))

    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND

    [binding] = _bindings(h)
    want = "nvidia.com/gpu=0,nvidia.com/gpu=1"
    assert {k: v for k, v in binding["annotations"].items() if k.startswith("nvidia.cdi.k8s.io/")} == {
        "nvidia.cdi.k8s.io/container.fetch-weights": want,
        "nvidia.cdi.k8s.io/container.main": want,
        "nvidia.cdi.k8s.io/container.sidecar": want,
    }
    # The env annotations are written on cdi nodes too (the MPS limits stay env vars).
    assert binding["annotations"][names.env_annotation("NVIDIA_VISIBLE_DEVICES")] == "0,1"


@pytest.mark.parametrize(("labels", "default", "cdi"), [
    ({}, "env", False), (ENV, "env", False), (CDI, "env", True),
    ({}, "cdi", True), (ENV, "cdi", False), ({names.NODE_HANDOVER_LABEL: "bogus"}, "cdi", True),
])
async def test_the_node_label_chooses_and_unlabelled_nodes_follow_the_default(
    labels: dict[str, str], default: handovers.HandoverName, cdi: bool
) -> None:
    h = Harness(node("n1", 4, labels=labels), handovers=handovers.Handovers(default))
    h.see(h.api.add_group("g", resources={GPU: 1}))
    h.see(h.api.add_pod("p", "g"))

    assert (await h.scheduler.schedule(("ns", "p"))).result is Result.BOUND
    [binding] = _bindings(h)
    carried = handovers.carried(binding["annotations"])
    assert carried == ({"main": "nvidia.com/gpu=0"} if cdi else {})


async def test_every_member_of_a_group_names_the_same_devices_with_the_configured_kind() -> None:
    h = Harness(node("n1", 4, labels=CDI),
                handovers=handovers.Handovers().with_overrides(None, ["nvidia.com/gpu=example.com/gpu"]))
    h.see(h.api.add_group("g", resources={GPU: 2}))
    for name in ("a", "b"):
        h.see(h.api.add_pod(name, "g"))
        assert (await h.scheduler.schedule(("ns", name))).result is Result.BOUND
    values = [handovers.carried(b["annotations"]) for b in _bindings(h)]
    assert values == [{"main": "example.com/gpu=0,example.com/gpu=1"}] * 2
