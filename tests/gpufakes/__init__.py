"""Stand-ins for a GPU node's NVIDIA software, used only to rehearse benchmarks/gpu/chain_check.py on a machine
without a GPU (tests/test_gpu_check.py). What they answer is made up to look like one H200 and is never a
measurement: hardware results come only from running the script on a GPU node (docs/benchmarks.md).

- :mod:`fakepynvml`: the fake NVML of tests.nodeagent (one GPU) under the name ``pynvml``;
- :mod:`nvidia_smi`: the two queries the script makes;
- :mod:`mps_control`: ``nvidia-cuda-mps-control`` serving the real daemon's SEQPACKET sockets (fakempsdaemon);
- :mod:`probe`: mps_probe.py's JSON, from the limits in its env (no CUDA).
"""

from tests.nodeagent import servers

# One GPU as the H200 virtual machine of NOTES.md (2026-11-27) showed it: 143771 MiB, no links.
H200_VM = servers.Server(
    name="h200-vm", source="made up for the rehearsal", model="NVIDIA H200", memory_mib=143771, numa=(0,),
    matrix=(("X",),), pcie=(("X",),),
)
SMS = 132  # an H200's SMs
