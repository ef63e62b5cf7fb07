"""One CUDA client's view under MPS limits: the SMs it sees, whether 1 and 3 GiB allocations succeed,
and its bf16 matrix-product rate. Run by mps_check.sh on a GPU node (PyTorch needed); prints JSON."""

import json
import os
import time

import torch  # type: ignore[import-not-found]

ENV = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


def main() -> None:
    result: dict[str, object] = {"env": {k: os.environ.get(k) for k in ENV}}
    result["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    for gib in (1, 3):
        try:
            block = torch.empty(gib * 1024**3, dtype=torch.uint8, device="cuda")
            block.fill_(1)
            torch.cuda.synchronize()
            result[f"alloc_{gib}GiB"] = "ok"
            del block
        except Exception as e:  # the OOM is the finding, whatever its class
            result[f"alloc_{gib}GiB"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
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
    main()
