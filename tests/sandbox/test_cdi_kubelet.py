"""The sandbox's kubelet gives containers their devices as the node's NVIDIA container toolkit would (CONTRACT §12):
on a ``cdi`` node by the ``nvidia.cdi.k8s.io/`` annotations alone (a container's own NVIDIA_VISIBLE_DEVICES gets
nothing), on an ``env`` node by NVIDIA_VISIBLE_DEVICES; a CDI device the node lacks fails the container."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deviceshare.api import names
from deviceshare.sandbox import Sandbox
from tests.waiting import until

CDI = {names.NODE_HANDOVER_LABEL: "cdi"}


def _pod(name: str, node: str, annotations: dict[str, str], env: dict[str, str] | None = None,
         init: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda",
                                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if init:
        spec["initContainers"] = [{"name": "setup", "image": "cuda"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations}, "spec": spec}


async def _started(box: Sandbox, name: str) -> dict[str, tuple[str, ...]]:
    assert box.kubelet is not None
    devices: dict[str, tuple[str, ...]] = await until(
        lambda: box.kubelet.started_devices.get(("default", name)) if box.kubelet else None, f"{name} started")
    return devices


async def test_a_cdi_node_hands_over_what_the_annotation_names_and_ignores_the_env_var(tmp_path: Path) -> None:
    async with Sandbox(kubeconfig_path=tmp_path / "kc", nodes=2, gpus=4, kubelet_delay=0.01, labels=CDI) as box:
        box.create(_pod("annotated", "gpu-node-0", {
            "nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=1,nvidia.com/gpu=3",
            "nvidia.cdi.k8s.io/container.setup": "nvidia.com/gpu=1,nvidia.com/gpu=3",
        }, env={"NVIDIA_VISIBLE_DEVICES": "all"}, init=True))
        box.create(_pod("own-env", "gpu-node-0", {}, env={"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}))
        box.create(_pod("pod-wide", "gpu-node-1", {"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=2"}))

        assert await _started(box, "annotated") == {"setup": ("nvidia.com/gpu=1", "nvidia.com/gpu=3"),
                                                   "main": ("nvidia.com/gpu=1", "nvidia.com/gpu=3")}
        assert await _started(box, "own-env") == {"main": ()}  # a tenant's own env var gets nothing there
        assert await _started(box, "pod-wide") == {"main": ("nvidia.com/gpu=2",)}  # the plugin's fallback key


async def test_an_env_node_hands_over_by_the_env_var(tmp_path: Path) -> None:
    async with Sandbox(kubeconfig_path=tmp_path / "kc", nodes=1, gpus=4, kubelet_delay=0.01) as box:
        box.create(_pod("by-env", "gpu-node-0", {"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=3"},
                        env={"NVIDIA_VISIBLE_DEVICES": "0,1"}))
        assert await _started(box, "by-env") == {"main": ("nvidia.com/gpu=0", "nvidia.com/gpu=1")}


async def test_a_cdi_device_the_node_lacks_fails_the_container_with_an_event(tmp_path: Path) -> None:
    async with Sandbox(kubeconfig_path=tmp_path / "kc", nodes=1, gpus=2, kubelet_delay=0.01, labels=CDI) as box:
        stale = {"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0,nvidia.com/gpu=GPU-gone"}
        box.create(_pod("stale", "gpu-node-0", stale))

        def event() -> dict[str, Any] | None:
            listed = box.list("events", "default")
            return next((e for e in listed if e["involvedObject"]["name"] == "stale"), None)

        failed = await until(event, "the kubelet's Failed event")
        assert (failed["type"], failed["reason"], failed["source"]["component"]) == ("Warning", "Failed", "kubelet")
        assert failed["message"] == ("Error: failed to create containerd container: CDI device injection failed: "
                                     "unresolvable CDI devices nvidia.com/gpu=GPU-gone")
        pod = box.get("pods", "stale", "default")
        assert pod is not None and pod["status"]["phase"] == "Pending"
        [status] = pod["status"]["containerStatuses"]
        assert status["state"]["waiting"]["reason"] == "CreateContainerError"
        assert box.kubelet is not None and ("default", "stale") not in box.kubelet.started_devices
