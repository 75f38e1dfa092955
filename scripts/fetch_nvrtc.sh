#!/usr/bin/env bash
# Installs NVIDIA's run-time compiler (NVRTC, from the Python package registry) into
# models/.venv so the CUDA kernels can be compiled without a GPU or a CUDA toolkit, and prints
# the library's path (for RUNIT_NVRTC_LIB). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=models/.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
lib=$(find "$venv" -name 'libnvrtc.so.13' 2>/dev/null | head -n 1)
if [ -z "$lib" ]; then
  "$venv/bin/python" -m pip install --quiet "nvidia-cuda-nvrtc==13.*" >&2
  lib=$(find "$venv" -name 'libnvrtc.so.13' | head -n 1)
fi
[ -n "$lib" ] || { echo "libnvrtc.so.13 not found after installing nvidia-cuda-nvrtc" >&2; exit 1; }
realpath "$lib"
