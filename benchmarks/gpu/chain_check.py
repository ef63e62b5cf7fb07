"""The whole chain on a real NVIDIA GPU node, in one bounded run (issue 31): a real MPS control daemon, the
node agent reading NVML, the operator with ``--mps``, the webhook with ``--mps-root``, the sandbox as API server;
a share placed with no hand-written annotation; then a CUDA process with exactly the env the pod got.

What it checks, as a results table (exit 0 when every row holds, 1 when one does not, 2 when a prerequisite is
missing):
- the agent's ``deviceshare.io/devices`` / ``device-memory`` equal nvidia-smi's UUIDs and memory.total;
- the agent publishes ``deviceshare.io/mps: ready`` while ``nvidia-cuda-mps-control -d`` runs (CONTRACT §9, §12);
- a group with ``share: {compute, memory}`` and its pod are placed by the operator (``--mps``) on that node;
- the pod's env (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
  ``CUDA_MPS_PIPE_DIRECTORY``), given to a PyTorch process under the same daemon: its SMs and bf16 TFLOP/s
  against the same process without the limits, an allocation under the memory limit held and one over refused;
- the CDI hand-over names the GPU by the UUID the agent published (``--handover cdi``, the default here);
- the XID watch raised no alarm (no ``deviceshare.io/device-health`` entry, no "unhealthy" in the agent's log).

The GPU machine has no network. Carry the wheels of benchmarks/gpu/requirements.txt (downloaded where there is
network, for the node's Python, e.g. 3.12)::

    python -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \\
        -d wheels -r benchmarks/gpu/requirements.txt
    # on the GPU node, in the repository root (PyTorch and the driver come with the node's image):
    python -m pip install --no-index --no-deps --target /tmp/ds-site wheels/*.whl
    python benchmarks/gpu/chain_check.py --site /tmp/ds-site            # --dry-run: prerequisites only

Not part of ``make test`` or ``make bench`` (no GPU there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("mps_probe.py")
MODULES = ("kopf", "kubernetes_asyncio", "aiohttp", "pydantic", "yaml", "orjson", "cryptography", "prometheus_client",
           "kmock", "jsonschema", "jsonpatch", "celpy", "pynvml")
EXECUTABLES = ("nvidia-smi", "nvidia-cuda-mps-control")
NS, GROUP, POD, NODE = "gpu-check", "quarter", "quarter-0", "gpu-node-0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="chain_check.py")
    parser.add_argument("--dry-run", action="store_true", help="check the prerequisites only, then stop")
    parser.add_argument("--site", type=Path, help="a folder of installed wheels (pip install --target) to import from")
    parser.add_argument("--compute", default="250m", help="the share's compute (default: %(default)s)")
    parser.add_argument("--memory-gib", type=int, default=4, help="the share's memory in GiB (default: %(default)s)")
    parser.add_argument("--handover", choices=("cdi", "env"), default="cdi", help="the operator's --handover")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on the whole run, seconds")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--probe", type=Path, default=PROBE,
                        help="the CUDA client run with the pod's env (default: mps_probe.py, PyTorch)")
    args = parser.parse_args(argv)
    if not args.compute.endswith("m") or not 0 < int(args.compute[:-1] or 0) <= 1000:
        parser.error(f"--compute must be a milli-quantity in (0, 1000m], got {args.compute!r}")
    if args.memory_gib < 1:
        parser.error("--memory-gib must be at least 1")
    return args


def prerequisites(site: Path | None, probe: Path = PROBE) -> list[tuple[str, str]]:
    """(what, problem) for everything missing; empty when the run can start."""
    missing: list[tuple[str, str]] = []
    if site is not None and not site.is_dir():
        missing.append((f"--site {site}", "no such folder"))
    for exe in EXECUTABLES:
        if shutil.which(exe) is None:
            missing.append((exe, "not on PATH (the NVIDIA driver's utilities)"))
    for module in MODULES:
        if importlib.util.find_spec(module) is None:
            missing.append((module, "not importable: install the wheels of benchmarks/gpu/requirements.txt"))
    if probe == PROBE and importlib.util.find_spec("torch") is None:
        missing.append(("torch", "not importable: the CUDA probe needs PyTorch"))
    if shutil.which("nvidia-smi") is not None:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        if listed.returncode != 0 or "GPU" not in listed.stdout:
            missing.append(("a GPU", f"nvidia-smi -L: {(listed.stderr or listed.stdout).strip()[:200]}"))
    return missing


def smi_gpus() -> list[tuple[str, int]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [(u.strip(), int(m)) for u, m in (line.split(",") for line in out.strip().splitlines())]


class MpsDaemon:
    """``nvidia-cuda-mps-control -d`` with its pipe and log under ``root`` (as the chart's overlay lays them out)."""

    def __init__(self, root: Path) -> None:
        self.pipe, self.log = root / "pipe", root / "log"
        self.env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}

    def ask(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nvidia-cuda-mps-control"], input=command, env=self.env, capture_output=True,
                              text=True, timeout=20, check=False)

    def start(self, deadline: float) -> None:
        self.pipe.mkdir(parents=True)
        self.log.mkdir(parents=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=20)
        while self.ask("get_default_active_thread_percentage").returncode != 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the MPS control daemon never answered get_default_active_thread_percentage")
            time.sleep(0.2)

    def stop(self) -> None:
        self.ask("quit")


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A ``deviceshare`` command as an admin runs it, its output in ``log_path``."""
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, env=env, stdout=log, stderr=log)


def probe(program: Path, env: dict[str, str], sizes: list[float], timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(program), *map(str, sizes)], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the CUDA probe failed: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def until(what: str, check: Any, deadline: float) -> Any:
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def chain(args: argparse.Namespace, root: Path, deadline: float) -> list[tuple[str, str, str, bool]]:
    """Runs everything; returns (check, expected, observed, held) rows."""
    from deviceshare.api import handovers, models, names
    from deviceshare.kube import applying, connecting
    from deviceshare.sandbox import Sandbox
    from deviceshare.webhooks import certs, configuration, mpsclients, server

    rows: list[tuple[str, str, str, bool]] = []
    gpus = smi_gpus()
    daemon = MpsDaemon(root)
    await asyncio.to_thread(daemon.start, deadline)
    procs: list[subprocess.Popen[bytes]] = []
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        async with contextlib.AsyncExitStack() as stack:
            box = await stack.enter_async_context(Sandbox(
                nodes=1, gpus=len(gpus), gpu_memory_mib=None, kubelet_delay=0.2, kubeconfig_path=root / "kubeconfig"))
            kubeconfig = str(box.kubeconfig)
            bundle = certs.generate(["127.0.0.1"])
            _, cert, key = bundle.write(root / "tls")
            hook = await server.start_webhook(tls_cert=str(cert), tls_key=str(key), kubeconfig=kubeconfig,
                                              host="127.0.0.1", mps=mpsclients.MpsMount(str(root)))
            stack.push_async_callback(hook.stop)
            box.create(configuration.build(ca_bundle=bundle.ca_pem, url=hook.url))
            deviceshare = [sys.executable, "-m", "deviceshare"]
            for name, argv in (
                ("agent", ["node-agent", "--source", "nvml", "--mps-pipe-directory", str(daemon.pipe),
                           "--node-name", NODE, "--interval", "2", "--metrics-port", "0", "--kubeconfig", kubeconfig]),
                ("operator", ["operator", "--mps", "--handover", args.handover, "--metrics-port", "0",
                              "--kubeconfig", kubeconfig]),
            ):
                procs.append(spawn([*deviceshare, *argv], child_env, root / f"{name}.log"))

            def annotations() -> dict[str, str]:
                return dict(((box.get("nodes", NODE) or {}).get("metadata") or {}).get("annotations") or {})

            started = time.monotonic()
            await until("deviceshare.io/mps: ready on the node",
                        lambda: annotations().get(names.NODE_MPS_ANNOTATION) == names.NODE_MPS_READY, deadline)
            published = annotations()
            rows.append(("MPS readiness published", "ready", f"ready after {time.monotonic() - started:.1f} s", True))
            devices = json.loads(published.get(names.NODE_DEVICES_ANNOTATION, "{}")).get(names.NVIDIA_GPU_RESOURCE)
            want_ids = [u for u, _ in gpus]
            rows.append(("devices (NVML) = nvidia-smi UUIDs", ",".join(want_ids), ",".join(devices or []),
                         devices == want_ids))
            memory = json.loads(published.get(names.NODE_DEVICE_MEMORY_ANNOTATION, "{}")).get(names.NVIDIA_GPU_RESOURCE)
            rows.append(("device-memory = nvidia-smi memory.total", f"{gpus[0][1]}Mi", str(memory),
                         memory == f"{gpus[0][1]}Mi"))

            api = await connecting.api_client(kubeconfig)
            stack.push_async_callback(api.close)
            await applying.apply(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            share = {"compute": args.compute, "memory": f"{args.memory_gib}Gi"}
            await applying.apply(api, {"apiVersion": names.API_VERSION, "kind": names.KIND,
                                       "metadata": {"name": GROUP, "namespace": NS},
                                       "spec": {"resources": {names.NVIDIA_GPU_RESOURCE: 1},
                                                "share": {names.NVIDIA_GPU_RESOURCE: share}}})
            await until("the webhook to see the group",
                        lambda: hook.index is not None and isinstance(hook.index.group(NS, GROUP), models.GroupSpec),
                        deadline)
            await applying.apply(api, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": POD, "namespace": NS, "annotations": {names.POD_GROUP_ANNOTATION: GROUP}},
                "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04"}]}})
            assert box.kubelet is not None
            kubelet = box.kubelet
            pod_env = await until("the pod to be bound and started",
                                  lambda: kubelet.started_env.get((NS, POD), {}).get("main"), deadline)
            pod = box.get("pods", POD, NS) or {}
            rows.append(("share placed, no hand-written annotation", f"bound to {NODE}",
                         f"bound to {(pod.get('spec') or {}).get('nodeName')}",
                         (pod.get("spec") or {}).get("nodeName") == NODE))
            percent = -(-int(args.compute[:-1]) // 10)
            limit = f"0={args.memory_gib * 1024}M"
            want_env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limit,
                        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe)}
            got = {k: pod_env.get(k) for k in want_env}
            rows.append(("pod env: MPS limits and pipe", ", ".join(want_env.values()),
                         ", ".join(str(v) for v in got.values()), got == want_env))
            handed = handovers.describe((pod.get("metadata") or {}).get("annotations"))
            want_handover = f"cdi nvidia.com/gpu={devices[0]}" if args.handover == "cdi" and devices else "env"
            rows.append(("hand-over names the agent's device", want_handover, handed, handed == want_handover))

            base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
            sizes = [0.75 * args.memory_gib, 1.5 * args.memory_gib]
            # In a thread: the sandbox serves the agent and the operator meanwhile (its XID watch keeps running).
            limited = await asyncio.to_thread(probe, args.probe, {**base, **pod_env}, sizes,
                                              max(deadline - time.monotonic(), 10))
            no_limits = {**base, "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe)}
            unlimited = await asyncio.to_thread(probe, args.probe, no_limits, sizes,
                                                max(deadline - time.monotonic(), 10))
            ratio = limited["bf16_tflops"] / unlimited["bf16_tflops"] if unlimited["bf16_tflops"] else 0.0
            rows.append(("SMs with the pod's env", f"<= ceil({percent}% of {unlimited['sms']})",
                         f"{limited['sms']} of {unlimited['sms']}",
                         limited["sms"] <= -(-unlimited["sms"] * percent // 100)))
            rows.append(("bf16 TFLOP/s, limited / unlimited", f"about {percent / 100:.2f} (a soft cap)",
                         f"{limited['bf16_tflops']} / {unlimited['bf16_tflops']} = {ratio:.2f}", ratio < 0.75))
            under, over = (f"alloc_{s:g}GiB" for s in sizes)
            rows.append(("allocation under the memory limit", "ok", str(limited[under]), limited[under] == "ok"))
            rows.append(("allocation over the memory limit", "refused", str(limited[over])[:60], limited[over] != "ok"))
            rows.append(("same allocation without the limit", "ok", str(unlimited[over])[:60], unlimited[over] == "ok"))

            health = annotations().get(names.NODE_HEALTH_ANNOTATION)
            sick = json.loads(health).get(names.NVIDIA_GPU_RESOURCE, []) if health else []
            agent_log = (root / "agent.log").read_text(errors="replace")
            alarms, unwatched = agent_log.count("unhealthy"), agent_log.count("not watched")  # agent.py, xids.py
            rows.append(("XID watch on every GPU, no false alarm", "watched, no unhealthy GPU",
                         f"{unwatched} unwatched, {len(sick)} listed, {alarms} alarms in the log",
                         not sick and alarms == 0 and unwatched == 0))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        daemon.stop()
    return rows


def render(rows: list[tuple[str, str, str, bool]]) -> str:
    table = [("CHECK", "EXPECTED", "OBSERVED", "RESULT"), *((c, e, o, "ok" if h else "FAILED") for c, e, o, h in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.site is not None:
        sys.path.insert(0, str(args.site))
    sys.path.insert(0, str(ROOT / "src"))
    missing = prerequisites(args.site, args.probe)
    for what, problem in missing:
        print(f"missing: {what}: {problem}", file=sys.stderr)
    if missing:
        print("chain_check: prerequisites missing (see above); nothing was run", file=sys.stderr)
        return 2
    if args.dry_run:
        print("chain_check: every prerequisite is present (dry run: nothing was run)")
        return 0
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory(prefix="deviceshare-gpu-") as tmp:
        rows = asyncio.run(asyncio.wait_for(chain(args, Path(tmp), deadline), args.timeout + 30))
    print(render(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([dict(zip(("check", "expected", "observed", "held"), r, strict=True))
                                         for r in rows], indent=2) + "\n")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
