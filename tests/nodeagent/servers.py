"""Recorded GPU topologies of common servers, for the fake NVML (:mod:`tests.nodeagent.fakenvml`).

Each fixture is the GPU block of ``nvidia-smi topo -m`` as the vendor's documentation (or a capture of
the real machine) prints it, plus the PCIe relation hidden under NVLink (``nvidia-smi topo -mp``) where the
fake must answer ``nvmlDeviceGetTopologyCommonAncestor`` too. ``source`` says where each comes from and
what, if anything, was filled in. UUIDs and PCI bus IDs are made up (deterministic per server).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Server:
    name: str
    source: str
    model: str
    memory_mib: int
    numa: tuple[int, ...]
    matrix: tuple[tuple[str, ...], ...]  # nvidia-smi topo -m, GPU block ("X" on the diagonal)
    pcie: tuple[tuple[str, ...], ...]  # the PCIe relation of each pair (topo -mp), same shape
    nvswitch_links: int = 0  # NVLinks from each GPU to NVSwitches (0: NVLinks go GPU to GPU)
    order: tuple[int, ...] = ()  # NVML index -> the row above (default: the same order)

    @property
    def gpus(self) -> int:
        return len(self.numa)

    def uuid(self, row: int) -> str:
        return f"GPU-{zlib.crc32(self.name.encode()):08x}-0000-4000-8000-{row:012d}"

    def bus_id(self, row: int) -> str:
        return f"00000000:{(row * 16 + 7) % 256:02X}:00.0"


def _matrix(text: str) -> tuple[tuple[str, ...], ...]:
    rows = [line.split()[1:] for line in text.strip().splitlines()]
    assert all(len(r) == len(rows) for r in rows), text
    return tuple(tuple(r) for r in rows)


def _by_numa(numa: tuple[int, ...], same: str, other: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if i == j else same if numa[i] == numa[j] else other for j in range(len(numa)))
                 for i in range(len(numa)))


_NV12_ALL = _matrix("\n".join(
    f"GPU{i} " + " ".join("X" if i == j else "NV12" for j in range(8)) for i in range(8)))
_NV18_ALL = _matrix("\n".join(
    f"GPU{i} " + " ".join("X" if i == j else "NV18" for j in range(8)) for i in range(8)))

DGX_A100 = Server(
    name="dgx-a100",
    source=("NVIDIA DGX A100: eight A100 SXM4 GPUs, each with 12 NVLinks to six NVSwitches (DGX A100 system "
            "architecture whitepaper); `nvidia-smi topo -m` on a DGX A100 prints NV12 between every pair and "
            "NUMA affinity 3,3,1,1,7,7,5,5 for GPU0..7 (captures of the machine's output). PCIe under the "
            "NVLinks: the two GPUs of a NUMA node share a PCIe switch tree (PXB, as they do with their NICs "
            "in the same output); other pairs SYS."),
    model="NVIDIA A100-SXM4-80GB", memory_mib=81920,
    numa=(3, 3, 1, 1, 7, 7, 5, 5),
    matrix=_NV12_ALL,
    pcie=_by_numa((3, 3, 1, 1, 7, 7, 5, 5), "PXB", "SYS"),
    nvswitch_links=12,
)

DGX_H100 = Server(
    name="dgx-h100",
    source=("NVIDIA DGX H100: eight H100 SXM5 GPUs, 18 NVLinks each into four NVSwitches; `nvidia-smi topo -m` "
            "prints NV18 between every pair, GPU0-3 on NUMA node 0 and GPU4-7 on NUMA node 1 (the output as "
            "reproduced in kubernetes.recipes' 'DGX H100 nvidia-smi topo -m guide'). PCIe under the NVLinks "
            "is not in that output: NODE within a socket and SYS across were filled in."),
    model="NVIDIA H100 80GB HBM3", memory_mib=81559,
    numa=(0, 0, 0, 0, 1, 1, 1, 1),
    matrix=_NV18_ALL,
    pcie=_by_numa((0, 0, 0, 0, 1, 1, 1, 1), "NODE", "SYS"),
    nvswitch_links=18,
)

DGX1_V100 = Server(
    name="dgx-1-v100",
    source=("NVIDIA DGX-1 with Tesla V100: the 'hybrid cube-mesh' of NVIDIA's DGX-1 system architecture "
            "whitepaper, six NVLinks per GPU, as `nvidia-smi topo -m` prints it (NV1/NV2; SYS where no NVLink "
            "joins two GPUs); GPU0-3 on socket 0, GPU4-7 on socket 1. PCIe (same output's NIC columns): pairs "
            "0-1, 2-3, 4-5, 6-7 share a PCIe switch (PIX), the others of a socket meet at the host bridge (PHB)."),
    model="Tesla V100-SXM2-32GB", memory_mib=32768,
    numa=(0, 0, 0, 0, 1, 1, 1, 1),
    matrix=_matrix("""
        GPU0  X    NV1  NV1  NV2  NV2  SYS  SYS  SYS
        GPU1  NV1  X    NV2  NV1  SYS  NV2  SYS  SYS
        GPU2  NV1  NV2  X    NV2  SYS  SYS  NV1  SYS
        GPU3  NV2  NV1  NV2  X    SYS  SYS  SYS  NV1
        GPU4  NV2  SYS  SYS  SYS  X    NV1  NV1  NV2
        GPU5  SYS  NV2  SYS  SYS  NV1  X    NV2  NV1
        GPU6  SYS  SYS  NV1  SYS  NV1  NV2  X    NV2
        GPU7  SYS  SYS  SYS  NV1  NV2  NV1  NV2  X
    """),
    pcie=_matrix("""
        GPU0  X    PIX  PHB  PHB  SYS  SYS  SYS  SYS
        GPU1  PIX  X    PHB  PHB  SYS  SYS  SYS  SYS
        GPU2  PHB  PHB  X    PIX  SYS  SYS  SYS  SYS
        GPU3  PHB  PHB  PIX  X    SYS  SYS  SYS  SYS
        GPU4  SYS  SYS  SYS  SYS  X    PIX  PHB  PHB
        GPU5  SYS  SYS  SYS  SYS  PIX  X    PHB  PHB
        GPU6  SYS  SYS  SYS  SYS  PHB  PHB  X    PIX
        GPU7  SYS  SYS  SYS  SYS  PHB  PHB  PIX  X
    """),
)

PCIE_2SOCKET_4 = Server(
    name="pcie-2socket-4gpu",
    source=("A two-socket PCIe server with four GPUs, two per CPU, each GPU on its own CPU root port and no "
            "PCIe switch, as vendors document their 2U GPU servers (e.g. Dell PowerEdge R750xa: two GPUs per "
            "processor). `nvidia-smi topo -m`'s legend then gives NODE within a socket (host bridges of one "
            "NUMA node) and SYS across sockets; no NVLink bridges."),
    model="NVIDIA A100 80GB PCIe", memory_mib=81920,
    numa=(0, 0, 1, 1),
    matrix=_by_numa((0, 0, 1, 1), "NODE", "SYS"),
    pcie=_by_numa((0, 0, 1, 1), "NODE", "SYS"),
)

NVLINK_PAIRS_2X2 = Server(
    name="nvlink-pairs-2x2",
    source=("Four A100 PCIe GPUs joined in two pairs by NVLink bridges: three bridges per pair give the 12 "
            "NVLinks (600 GB/s) of NVIDIA's A100 PCIe product brief, so `nvidia-smi topo -m` prints NV12 "
            "within a pair; one pair per socket (NODE within, SYS across)."),
    model="NVIDIA A100 80GB PCIe", memory_mib=81920,
    numa=(0, 0, 1, 1),
    matrix=_matrix("""
        GPU0  X    NV12 SYS  SYS
        GPU1  NV12 X    SYS  SYS
        GPU2  SYS  SYS  X    NV12
        GPU3  SYS  SYS  NV12 X
    """),
    pcie=_by_numa((0, 0, 1, 1), "NODE", "SYS"),
)

_ISLANDS = _matrix("\n".join(
    f"GPU{i} " + " ".join("X" if i == j else "NV4" if i // 4 == j // 4 else "SYS" for j in range(8))
    for i in range(8)))

TWO_ISLANDS_8 = Server(
    name="two-nvlink-islands-8gpu",
    source=("Synthetic, built from NVIDIA HGX A100 4-GPU boards: four A100s fully joined by NVLink, 12 links each "
            "split over three peers (NV4), one board per socket (SYS between the boards). No vendor ships this "
            "exact box; its NVML index order alternates between the boards (order below), which is the one "
            "thing made up here, so that the device order and the links disagree."),
    model="NVIDIA A100-SXM4-80GB", memory_mib=81920,
    numa=(0, 0, 0, 0, 1, 1, 1, 1),
    matrix=_ISLANDS,
    pcie=_by_numa((0, 0, 0, 0, 1, 1, 1, 1), "NODE", "SYS"),
    order=(0, 4, 1, 5, 2, 6, 3, 7),
)

ALL = (DGX_A100, DGX_H100, DGX1_V100, PCIE_2SOCKET_4, NVLINK_PAIRS_2X2, TWO_ISLANDS_8)
