#!/usr/bin/env bash
# Two 50% sharers of one GPU through an MPS daemon laid out as manifests/overlays/mps lays it out
# (pipe, log, shm under one root), each client with the env the operator and webhook give a member of a
# {compute: 500m, memory: 8Gi} share. Needs a GPU node with the driver, nvidia-cuda-mps-control and a
# python3 with PyTorch; not part of `make test` or `make bench`. Prints each client's JSON (mps_probe.py).
set -euo pipefail
P="$(dirname "$0")/mps_probe.py"
ROOT=$(mktemp -d /tmp/deviceshare-mps.XXXX)
mkdir -p "$ROOT/pipe" "$ROOT/log"
export CUDA_MPS_PIPE_DIRECTORY="$ROOT/pipe" CUDA_MPS_LOG_DIRECTORY="$ROOT/log"
nvidia-cuda-mps-control -d
trap 'echo quit | nvidia-cuda-mps-control' EXIT
until echo get_default_active_thread_percentage | nvidia-cuda-mps-control >/dev/null 2>&1; do sleep 0.2; done
for who in a b; do
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M python3 "$P" > "$ROOT/$who.json" &
done
wait
cat "$ROOT/a.json" "$ROOT/b.json"
