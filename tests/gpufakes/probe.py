"""mps_probe.py's JSON without CUDA, for the rehearsal: SMs and rate cut to the thread percentage, allocations
refused above the pinned-memory limit, when a pipe directory is set (MPS on). Numbers are made up."""

import json
import os
import sys

from tests.gpufakes import H200_VM, SMS


def main(sizes_gib: list[float]) -> None:
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    percent = int(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or 100) if mps else 100
    limit = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "") if mps else ""
    limit_mib = int(limit.split("=", 1)[1].rstrip("M")) if limit else H200_VM.memory_mib
    sms = -(-SMS * percent // 100)
    result: dict[str, object] = {"sms": sms, "uuid": H200_VM.uuid(0)}
    for gib in sizes_gib:
        result[f"alloc_{gib:g}GiB"] = "ok" if gib * 1024 <= limit_mib else "OutOfMemoryError: made up"
    result["bf16_tflops"] = round(800.0 * sms / SMS, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main([float(x) for x in sys.argv[1:]])
