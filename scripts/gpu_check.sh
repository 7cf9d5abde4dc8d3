#!/usr/bin/env bash
# Whether this machine has an NVIDIA GPU that the GPU lane (./scripts/test.sh --gpu) can use.
# Exit 0 and print nvidia-smi's line for each GPU; otherwise exit 1 and print one line that says
# why not. Installs nothing and takes at most a few seconds.
#
# The test is `nvidia-smi -L` succeeding and listing at least one "GPU <n>: ..." line: it asks the
# driver itself (through NVML), so it fails where the device nodes exist but the driver cannot be
# reached (/dev/nvidia0 and /proc/driver/nvidia are there in a container started without the
# driver's libraries), and in a container it lists only the GPUs given to it. nvidia-smi comes
# with the driver, which CUDA needs anyway: the CUDA libraries themselves come from the wheels.
set -uo pipefail

# A driver in a bad state can make nvidia-smi hang: the answer is bounded.
timeout_s="${IOTGW_GPU_CHECK_TIMEOUT_S:-10}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "no NVIDIA GPU: nvidia-smi not found (no NVIDIA driver on this machine)"
  exit 1
fi
listing="$(timeout "$timeout_s" nvidia-smi -L 2>&1)"
status=$?
if [ "$status" -ne 0 ]; then
  reason="$(printf '%s\n' "$listing" | head -n 1)"
  [ "$status" -eq 124 ] && reason="no answer within ${timeout_s} s"
  echo "no NVIDIA GPU: nvidia-smi -L failed (exit $status: ${reason:-no output})"
  exit 1
fi
gpus="$(printf '%s\n' "$listing" | grep -E '^GPU [0-9]+: ' || true)"
if [ -z "$gpus" ]; then
  echo "no NVIDIA GPU: nvidia-smi -L lists none"
  exit 1
fi
printf '%s\n' "$gpus"
