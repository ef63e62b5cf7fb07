"""The node agent against the sandbox's real HTTP API: what it publishes, when it writes, and what it does
when a GPU falls ill, when an answer is lost, and when the device file is wrong."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from deviceshare.api import names
from deviceshare.core import inventory
from deviceshare.nodeagent import agent, filesource, publishing, xids
from deviceshare.sandbox import Sandbox
from tests.nodeagent import fakempsdaemon, servers
from tests.nodeagent.conftest import MakeAgent, count_node_writes, until

GPU = names.NVIDIA_GPU_RESOURCE


def annotations(cluster: Sandbox, node: str = "gpu-node-0") -> dict[str, str]:
    body = cluster.get("nodes", node)
    assert body is not None
    return dict(body["metadata"].get("annotations") or {})


async def test_publishes_devices_memory_and_links_then_writes_nothing_while_nothing_changes(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    writes = count_node_writes(cluster)
    probe = make_agent(server=servers.DGX1_V100)
    assert await probe.agent.sync() is True
    info = inventory.node_from_object(cluster.get("nodes", "gpu-node-0") or {})
    uuids = [probe.nvml.uuid_at(i) for i in range(8)]
    assert info.devices[GPU] == tuple(uuids) and not info.problems
    assert info.device_memory[GPU] == 32768 * 2**20
    assert info.topology[GPU].link(uuids[0], uuids[3]) == "NV2"
    assert info.topology[GPU].link(uuids[0], uuids[5]) == "SYS"
    assert names.NODE_HEALTH_ANNOTATION not in annotations(cluster)  # no unhealthy GPU: no annotation
    assert writes.total == 1

    for _ in range(3):
        assert await probe.agent.sync() is False
    assert writes.total == 1 and probe.writes("ok") == 1


async def test_an_annotation_someone_removed_is_put_back_at_the_next_resync(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    probe = make_agent(resync=0.001)  # every sync reads the Node again
    await probe.agent.sync()
    cluster.patch("nodes", "gpu-node-0", {"metadata": {"annotations": {names.NODE_TOPOLOGY_ANNOTATION: None}}})
    assert await probe.agent.sync() is True
    assert names.NODE_TOPOLOGY_ANNOTATION in annotations(cluster)


async def test_an_xid_error_is_published_at_once_and_application_xids_are_not(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    probe = make_agent(interval=3600.0)  # only a GPU falling ill can start the next sync
    writes = count_node_writes(cluster)
    watch = xids.XidWatch(probe.nvml, probe.agent.mark_unhealthy)
    watch.start()
    stop = asyncio.Event()
    running = asyncio.create_task(probe.agent.run(stop))
    try:
        await until(lambda: names.NODE_DEVICES_ANNOTATION in annotations(cluster), "the first publication")
        probe.nvml.xid(2, 13)  # a graphics engine exception: the application's fault, the GPU is fine
        probe.nvml.xid(6, 79)  # "GPU has fallen off the bus"
        health = await until(lambda: annotations(cluster).get(names.NODE_HEALTH_ANNOTATION), "the XID published")
        assert json.loads(health) == {GPU: [probe.nvml.uuid_at(6)]}
        assert writes.total == 2  # the first publication, then the health: the ignored XID wrote nothing
    finally:
        stop.set()
        await running
        watch.stop()


async def test_a_lost_gpu_is_reported_unhealthy_and_kept_in_the_inventory(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    probe = make_agent(server=servers.DGX_H100)
    await probe.agent.sync()
    probe.nvml.lose(4)
    assert await probe.agent.sync() is True
    info = inventory.node_from_object(cluster.get("nodes", "gpu-node-0") or {})
    assert info.unhealthy == {GPU: frozenset({probe.nvml.uuid_at(4)})}
    assert probe.nvml.uuid_at(4) in info.devices[GPU]


@pytest.mark.parametrize("lie", [{"status": 504}, {"drop": True}], ids=["504", "dropped"])
async def test_a_write_that_landed_but_whose_answer_was_lost_is_resolved_by_reading_the_node_back(
    cluster: Sandbox, make_agent: MakeAgent, lie: dict[str, Any]
) -> None:
    probe = make_agent()
    fault = cluster.inject_fault("PATCH", r"^/api/v1/nodes/gpu-node-0$", applied=True, **lie)
    writes = count_node_writes(cluster)
    assert await probe.agent.sync() is True
    assert fault.fired == 1 and writes.total == 1  # one write, not a second "to be sure"
    assert probe.writes("uncertain_resolved") == 1 and probe.writes("failed") == 0
    assert names.NODE_DEVICES_ANNOTATION in annotations(cluster)
    assert await probe.agent.sync() is False


async def test_a_write_lost_before_it_landed_fails_and_the_next_sync_writes_it(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    probe = make_agent()
    fault = cluster.inject_fault("PATCH", r"^/api/v1/nodes/gpu-node-0$", status=504)
    with pytest.raises(publishing.WriteFailed, match="did not land"):
        await probe.agent.sync()
    assert fault.fired == 1 and probe.writes("failed") == 1
    assert names.NODE_DEVICES_ANNOTATION not in annotations(cluster)
    assert await probe.agent.sync() is True
    assert probe.writes("ok") == 1 and names.NODE_DEVICES_ANNOTATION in annotations(cluster)


async def test_a_write_whose_client_timed_out_is_read_back_before_it_is_tried_again(
    cluster: Sandbox, make_agent: MakeAgent
) -> None:
    probe = make_agent(timeout=0.3)
    fault = cluster.inject_fault("PATCH", r"^/api/v1/nodes/", delay=1.0)  # no answer before the client gives up
    with pytest.raises(publishing.WriteFailed, match="TimeoutError"):
        await probe.agent.sync()
    assert fault.fired == 1 and probe.writes("failed") == 1  # read back: not there
    assert await probe.agent.sync() is True
    assert probe.writes("ok") == 1 and names.NODE_DEVICES_ANNOTATION in annotations(cluster)


def _device_file(path: Path, **resource: Any) -> None:
    body = {"devices": ["card0", "card1"], "memory": "48Gi", "links": {"card0": {"card1": "SYS"}}, **resource}
    path.write_text(json.dumps({"resources": {"gpu.intel.com/i915": body}}))


async def test_a_device_file_feeds_the_same_annotations_and_a_typo_changes_nothing(
    cluster: Sandbox, make_agent: MakeAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = make_agent()
    device_file = tmp_path / "devices.json"
    _device_file(device_file, unhealthy=["card1"])
    probe.agent.sources = [filesource.FileSource(device_file)]
    await probe.agent.sync()
    info = inventory.node_from_object(cluster.get("nodes", "gpu-node-0") or {})
    assert info.devices["gpu.intel.com/i915"] == ("card0", "card1")
    assert info.unhealthy == {"gpu.intel.com/i915": frozenset({"card1"})}
    assert info.topology["gpu.intel.com/i915"].link("card0", "card1") == "SYS"
    before = annotations(cluster)
    _device_file(device_file, links={"card0": {"card1": "QPI"}})
    with pytest.raises(filesource.FileSourceError, match=r"links\[card0\]\[card1\]: 'QPI' is not NV<n>"):
        await probe.agent.sync()
    assert annotations(cluster) == before


async def test_mps_ready_follows_the_control_daemon(cluster: Sandbox, make_agent: MakeAgent, tmp_path: Path) -> None:
    probe = make_agent(mps_pipe_directory=tmp_path)
    await probe.agent.sync()
    assert names.NODE_MPS_ANNOTATION not in annotations(cluster)
    daemon = fakempsdaemon.FakeMpsDaemon(tmp_path)
    await probe.agent.sync()
    assert annotations(cluster)[names.NODE_MPS_ANNOTATION] == "ready"
    daemon.stop()  # the socket file stays behind, nobody listens: not ready
    await probe.agent.sync()
    assert names.NODE_MPS_ANNOTATION not in annotations(cluster)


def test_mps_ready_connects_as_the_real_daemon_requires(tmp_path: Path) -> None:
    """The daemon's control socket is SEQPACKET: a stream connect is refused with EPROTOTYPE, as measured on a
    real ``nvidia-cuda-mps-control -d``; readiness must still be seen (the agent before the fix reported none)."""
    daemon = fakempsdaemon.FakeMpsDaemon(tmp_path)
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(OSError) as refused:
        stream.connect(str(tmp_path / "control"))
    stream.close()
    assert refused.value.errno == errno.EPROTOTYPE
    assert agent.mps_ready(tmp_path) is True
    daemon.stop()
    assert agent.mps_ready(tmp_path) is False
    assert agent.mps_ready(tmp_path / "absent") is False
