#!/usr/bin/env bash
# What the MPS limit env vars that deviceshare writes (CONTRACT §7) do on a real NVIDIA GPU.
# Needs a GPU node with the driver, nvidia-cuda-mps-control and a python3 with PyTorch; not part of
# `make test` or `make bench` (CI has no GPU). Results are quoted in docs/comparison.md.
set -x
P="$(dirname "$0")/mps_probe.py"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "== A: no MPS daemon, limit env set"
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M python3 "$P"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d; sleep 2
echo "== B: MPS, no limits"; python3 "$P"
echo "== C: MPS, 25% + 0=2048M"
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M python3 "$P"
echo "== D: MPS, 50%"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 python3 "$P"
echo quit | nvidia-cuda-mps-control
