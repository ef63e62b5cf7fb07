"""The node agent's NVML readings on a real GPU node, beside what nvidia-smi prints (issue 23's GPU check).

Needs the NVIDIA driver and `pip install 'deviceshare[nodeagent]'`; not part of `make test` or `make bench`
(no GPU there). Prints JSON: per GPU the UUID and memory both ways, every pair's link both ways, and
whether they agree. Run: python -m benchmarks.gpu.agent_check
"""

from __future__ import annotations

import json
import subprocess

from deviceshare.api import names
from deviceshare.nodeagent import nvmlsource


def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


def main() -> None:
    source = nvmlsource.NvmlSource(nvmlsource.load())
    source.start()
    gpus = source.read().resources[names.NVIDIA_GPU_RESOURCE]
    rows = [line.split(", ") for line in smi("--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits")
            .strip().splitlines()]
    matrix = [line.split() for line in smi("topo", "-m").splitlines() if line.startswith("GPU")]
    links = {}
    for i, a in enumerate(gpus.devices):
        for j, b in enumerate(gpus.devices):
            if i < j:
                agent = gpus.links.get((a, b)) or gpus.links.get((b, a))
                links[f"{i}-{j}"] = {"agent": agent, "nvidia-smi": matrix[i][j + 1] if i < len(matrix) else None}
    report = {
        "uuids_agree": list(gpus.devices) == [r[0] for r in rows],
        "memory_mib": {"agent": (gpus.memory_bytes or 0) // 2**20, "nvidia-smi": [int(r[1]) for r in rows]},
        "links_agree": all(v["agent"] == v["nvidia-smi"] for v in links.values()),
        "links": links,
        "numa": gpus.numa,
        "unhealthy": sorted(gpus.unhealthy),
    }
    print(json.dumps(report, indent=2))
    source.stop()


if __name__ == "__main__":
    main()
