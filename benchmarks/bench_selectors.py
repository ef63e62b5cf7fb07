"""CEL device selectors at fleet scale: how many devices per second ``Selectors.matches`` answers.

A fleet of NVIDIA-shaped DRA devices (5,000 nodes x 8 GPUs: H100, A100 and L4 nodes, each GPU its own uuid, as
the driver publishes them), checked against the DeviceClass ``gpu.nvidia.com`` selector plus a request selector,
as the allocator checks every candidate:

- **cached**: the engine as the allocator uses it; the verdict cache is keyed by what the expressions read
  (product name, type, driver, memory), so the fleet costs a handful of evaluations — first pass (cold) and a
  second pass (warm);
- **per device**: a selector that reads the uuid, so every device is a cache miss: cel-python's own rate;
- **uncached**: the same program run directly, bypassing the cache, on a sample: the ratio the cache buys.
"""

from __future__ import annotations

import statistics
import time

from deviceshare.core import deviceselectors, dradevices

NV = "gpu.nvidia.com"
PRODUCTS = (("NVIDIA H100 80GB HBM3", "80Gi", "9.0.0"), ("NVIDIA A100-SXM4-40GB", "40Gi", "8.0.0"),
            ("NVIDIA L4", "24Gi", "8.9.0"))
CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
REQUEST = ("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H') && "
           "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0")
PER_DEVICE = "device.attributes['gpu.nvidia.com'].uuid.startsWith('GPU-node-1')"


def fleet(nodes: int, gpus: int) -> list[dradevices.SliceDevice]:
    devices = []
    for n in range(nodes):
        product, memory, cc = PRODUCTS[n % len(PRODUCTS)]
        for minor in range(gpus):
            devices.append(dradevices.parse_slice_device(NV, f"node-{n}", {
                "name": f"gpu-{minor}",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-node-{n}-{minor}"},
                               "productName": {"string": product}, "cudaComputeCapability": {"version": cc},
                               "driverVersion": {"version": "580.95.5"}},
                "capacity": {"memory": {"value": memory}},
            }))
    return devices


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}"


def run(quick: bool) -> str:
    nodes, gpus, sample = (200, 8, 100) if quick else (5000, 8, 1000)
    devices = fleet(nodes, gpus)

    started = time.perf_counter()
    deviceselectors.compile_selectors(["device.driver != 'warm-up'"])  # loads celpy and builds its parser
    first_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    selectors = deviceselectors.compile_selectors([CLASS]) + deviceselectors.compile_selectors([REQUEST])
    per_device = deviceselectors.compile_selectors([PER_DEVICE])
    compile_ms = (time.perf_counter() - started) * 1000 / 3

    timings = {}
    for label in ("cold", "warm"):
        started = time.perf_counter()
        matched = sum(selectors.matches(d) for d in devices)
        timings[label] = time.perf_counter() - started
    evaluations = sum(p.evaluations for p in selectors.programs)

    started = time.perf_counter()
    for d in devices[:sample]:
        per_device.matches(d)
    per_device_s = time.perf_counter() - started

    runner = selectors.programs[1].runner
    from deviceshare.core import dracel

    laps = []
    for d in devices[:sample]:
        lap = time.perf_counter()
        runner.evaluate({"device": dracel.device_value(d)})
        laps.append(time.perf_counter() - lap)
    uncached_rate = len(laps) / sum(laps)
    warm_rate = len(devices) / timings["warm"]

    return "\n".join([
        f"## Allocation core: CEL device selectors ({nodes:,} nodes x {gpus} GPUs)",
        "",
        "`benchmarks/bench_selectors.py`. NVIDIA-shaped DRA devices (H100, A100 and L4 nodes in turn, each GPU its "
        "own uuid) checked against the DeviceClass `gpu.nvidia.com` selector and a request selector "
        "(product name and memory), as the allocator checks candidates. The verdict cache keys on what an "
        "expression reads, so the fleet costs a few evaluations; a selector reading the uuid misses on every "
        "device and shows cel-python's own rate; **uncached** runs the compiled program directly on a sample. "
        "One process; the machine was shared with other engineers' test runs, so read the ratios.",
        "",
        "| path | devices | seconds | devices per second |",
        "|---|---:|---:|---:|",
        f"| cached, first pass ({evaluations} evaluations, {matched:,} matched) | {len(devices):,} | "
        f"{timings['cold']:.3f} | {_rate(len(devices), timings['cold'])} |",
        f"| cached, second pass | {len(devices):,} | {timings['warm']:.3f} | {_rate(len(devices), timings['warm'])} |",
        f"| per device (uuid selector: every device a miss) | {sample:,} | {per_device_s:.3f} | "
        f"{_rate(sample, per_device_s)} |",
        f"| uncached program, one selector (p50 {statistics.median(laps) * 1000:.2f} ms) | {sample:,} | "
        f"{sum(laps):.3f} | {uncached_rate:,.0f} |",
        "| **cache speedup** (warm pass, two selectors, beside one uncached) | | | "
        f"{warm_rate / uncached_rate:,.0f}x |",
        "",
        f"Compiling: {compile_ms:.1f} ms per expression (parse, checks, program; cached per expression after); "
        f"the first compile of the process also loads cel-python and builds its parser: {first_ms:.0f} ms.",
    ])


if __name__ == "__main__":
    print(run(quick=False))
