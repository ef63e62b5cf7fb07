"""One CUDA client's view under MPS limits: the SMs it sees, whether allocations of the given sizes succeed,
and its bf16 matrix-product rate. Run by mps_check.sh and chain_check.py on a GPU node (PyTorch needed);
prints JSON. Usage: python mps_probe.py [GIB ...] (default: 1 3)."""

import json
import os
import sys
import time

import torch  # type: ignore[import-not-found]

ENV = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY")


def main(sizes_gib: list[float]) -> None:
    result: dict[str, object] = {"env": {k: os.environ.get(k) for k in ENV}}
    props = torch.cuda.get_device_properties(0)
    result["sms"] = props.multi_processor_count
    result["uuid"] = str(getattr(props, "uuid", ""))
    for gib in sizes_gib:
        try:
            block = torch.empty(int(gib * 1024**3), dtype=torch.uint8, device="cuda")
            block.fill_(1)
            torch.cuda.synchronize()
            result[f"alloc_{gib:g}GiB"] = "ok"
            del block
        except Exception as e:  # the OOM is the finding, whatever its class
            result[f"alloc_{gib:g}GiB"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        torch.cuda.empty_cache()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    result["bf16_tflops"] = round(20 * 2 * 8192**3 / (time.perf_counter() - started) / 1e12, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main([float(x) for x in sys.argv[1:]] or [1.0, 3.0])
