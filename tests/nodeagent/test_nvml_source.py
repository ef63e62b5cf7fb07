"""The NVML reader against recorded servers: it names every link as `nvidia-smi topo -m` does.

The fake NVML is checked against NVIDIA's real binding first (same names, values and error classes), so
what passes here is what the agent does with the real ``pynvml`` on a GPU node; without a GPU that is as
close as this suite gets (docs/comparison.md says so).
"""

from __future__ import annotations

import inspect

import pynvml
import pytest

from deviceshare.api import names
from deviceshare.errors import ConfigError
from deviceshare.nodeagent import nvmlsource
from tests.nodeagent import fakenvml, servers


def test_the_fake_uses_the_real_bindings_names_values_and_errors() -> None:
    fake = fakenvml.FakeNvml(servers.DGX_A100)
    checked = 0
    for name in dir(fakenvml):
        if name.startswith(("NVML_", "nvmlEventType")):
            assert getattr(pynvml, name) == getattr(fakenvml, name), name
            checked += 1
        elif name.startswith("NVMLError"):
            real, ours = getattr(pynvml, name), getattr(fakenvml, name)
            assert issubclass(real, pynvml.NVMLError)
            if name != "NVMLError":
                assert real(ours.value).__class__ is real, f"{name}: value {ours.value} maps elsewhere"
            checked += 1
    functions = [n for n, _ in inspect.getmembers(fake, callable) if n.startswith("nvml")]
    for name in functions:
        assert callable(getattr(pynvml, name)), f"pynvml has no {name}"
    assert checked >= 25 and len(functions) >= 20


def _read(server: servers.Server) -> tuple[fakenvml.FakeNvml, nvmlsource.NvmlSource]:
    fake = fakenvml.FakeNvml(server)
    source = nvmlsource.NvmlSource(fake)
    source.start()
    return fake, source


@pytest.mark.parametrize("server", servers.ALL, ids=lambda s: s.name)
def test_every_pair_is_named_as_nvidia_smi_names_it(server: servers.Server) -> None:
    fake, source = _read(server)
    gpus = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    assert gpus.devices == tuple(fake.uuid_at(i) for i in range(server.gpus))
    for i in range(server.gpus):
        for j in range(server.gpus):
            if i == j:
                continue
            a, b = fake.uuid_at(i), fake.uuid_at(j)
            got = gpus.links.get((a, b)) or gpus.links.get((b, a))
            assert got == server.matrix[fake.order[i]][fake.order[j]], (i, j)
            assert gpus.numa[a] == server.numa[fake.order[i]]
    assert gpus.memory_bytes == server.memory_mib * 2**20
    assert gpus.unhealthy == frozenset()


def test_links_are_read_once_while_the_gpus_stay_the_same() -> None:
    fake, source = _read(servers.DGX1_V100)
    source.read()
    first = fake.link_queries
    assert first >= 8 * 6 + 12  # six NVLinks per V100, and the PCIe relation of the 12 pairs NVLink does not join
    source.read()
    assert fake.link_queries == first  # a poll asks for the devices, not for their links again
    fake.lose(3)
    source.read()
    assert fake.link_queries > first  # the set of GPUs changed: links are read again


def test_a_lost_gpu_stays_listed_and_is_unhealthy() -> None:
    fake, source = _read(servers.DGX_H100)
    before = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    fake.lose(5)
    after = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    assert after.devices == before.devices
    assert after.unhealthy == {fake.uuid_at(5)}


def test_a_gpu_in_mig_mode_is_not_offered_whole() -> None:
    fake = fakenvml.FakeNvml(servers.PCIE_2SOCKET_4)
    fake.mig.add(2)
    source = nvmlsource.NvmlSource(fake)
    source.start()
    gpus = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    assert fake.server.uuid(2) not in gpus.devices and len(gpus.devices) == 3


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"library": False}, r"NVML library \(libnvidia-ml.so.1\) not found"),
    ({"driver": False}, "kernel driver is not loaded"),
])
def test_missing_nvml_is_one_clear_line(kwargs: dict[str, bool], words: str) -> None:
    source = nvmlsource.NvmlSource(fakenvml.FakeNvml(servers.DGX_A100, **kwargs))
    with pytest.raises(nvmlsource.NvmlUnavailable, match=words) as caught:
        source.start()
    assert isinstance(caught.value, ConfigError)


def test_the_real_binding_without_a_driver_says_what_is_missing() -> None:
    """This machine has no NVIDIA driver: NVIDIA's own binding fails as it would on a misconfigured node."""
    source = nvmlsource.NvmlSource(nvmlsource.load())
    with pytest.raises(nvmlsource.NvmlUnavailable, match="NVIDIA driver installed on this node"):
        source.start()


def test_the_example_device_file_is_one_the_agent_publishes() -> None:
    from pathlib import Path

    from deviceshare.nodeagent import filesource

    example = Path(__file__).resolve().parents[2] / "examples" / "node-devices.json"
    reading = filesource.FileSource(example).read()
    assert reading.resources["gpu.intel.com/i915"].devices == ("card0", "card1")


def test_the_topology_annotation_is_the_one_the_core_writes_and_reads() -> None:
    from deviceshare.core import topology
    from deviceshare.nodeagent import readings

    fake, source = _read(servers.DGX1_V100)
    gpus = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    text = readings.to_annotations(source.read())[names.NODE_TOPOLOGY_ANNOTATION]
    assert text == topology.annotation({names.NVIDIA_GPU_RESOURCE: topology.from_links(
        gpus.devices, gpus.links, gpus.numa)})
    parsed, error = topology.parse(text or "")
    assert error == "" and parsed[names.NVIDIA_GPU_RESOURCE].link(fake.uuid_at(0), fake.uuid_at(3)) == "NV2"


def test_the_xid_watch_starts_with_a_gpu_already_lost_and_reports_the_others() -> None:
    import threading

    from deviceshare.nodeagent import xids

    fake = fakenvml.FakeNvml(servers.DGX_A100)
    fake.nvmlInit()
    fake.lose(2)
    reported: list[tuple[str, str]] = []
    seen = threading.Event()
    watch = xids.XidWatch(fake, lambda uuid, why: (reported.append((uuid, why)), seen.set()))
    watch.start()
    try:
        fake.xid(5, 79)
        assert seen.wait(10), "the XID was not reported"
    finally:
        watch.stop()
    assert reported == [(fake.uuid_at(5), "XID 79")]
