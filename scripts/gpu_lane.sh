#!/usr/bin/env bash
# The GPU lane, run as ./scripts/test.sh --gpu (docs/gpu.md): on a machine with an NVIDIA GPU,
# its own virtual environment with the GPU builds only (.[gpu-test]: onnxruntime-gpu without the
# CPU onnxruntime, tensorflow[and-cuda], onnx, pytest), the GPU tests (tests/gpu, which fail
# instead of skipping here: a skip would mean the GPU was not tested), then the short GPU
# benchmark (iotgw bench gpu --quick: bench http and bench quant on CUDA against the same on the
# CPU), which writes benchmarks/results/gpu.quick.json. Extra arguments go to pytest.
#
# Without a GPU it stops at once, before installing anything, with one line that says why.
#
#   IOTGW_GPU_VENV   the virtual environment (default .venv-gpu; never the CPU suite's .venv)
#   PYTHON           the interpreter that creates it (default python3.11, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! gpus="$(scripts/gpu_check.sh)"; then
  echo "./scripts/test.sh --gpu: $gpus; the GPU lane needs one (nothing was installed)" >&2
  exit 2
fi

started=$SECONDS
stage() { echo "[gpu lane $((SECONDS - started)) s] $*"; }
stage "GPU: $(printf '%s\n' "$gpus" | head -n 1)"

venv="${IOTGW_GPU_VENV:-.venv-gpu}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stage "installing .[gpu-test] into $venv"
"${pip[@]}" install --quiet --upgrade pip >/dev/null
"${pip[@]}" install --quiet -e ".[gpu-test]"
# onnxruntime-gpu and the base dependencies' CPU onnxruntime install into the same package
# folder, and an extra cannot remove a dependency: remove both and put back the GPU build alone
# (from pip's cache: no second download). docs/gpu.md.
if "${pip[@]}" show --quiet onnxruntime >/dev/null 2>&1; then
  ort="$("$venv/bin/python" -c \
    'import importlib.metadata as m; print(m.version("onnxruntime-gpu"))')"
  "${pip[@]}" uninstall --quiet -y onnxruntime onnxruntime-gpu
  "${pip[@]}" install --quiet --no-deps "onnxruntime-gpu==$ort"
fi
stage "installed: $("$venv/bin/python" -c 'import onnxruntime, tensorflow as tf
print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers(), "/",
      "tensorflow", tf.__version__, [d.name for d in tf.config.list_physical_devices("GPU")])' \
  2>/dev/null)"

stage "GPU tests"
IOTGW_REQUIRE_GPU=1 "$venv/bin/python" -m pytest -q -ra -m gpu tests/gpu "$@"

stage "GPU benchmark"
"$venv/bin/iotgw" bench gpu --quick
stage "done"
