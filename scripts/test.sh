#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: creates the virtual environment if needed,
# installs the project with its test dependencies, checks style and types, runs every test (slow ones
# included). Extra arguments go to pytest.
#
#   ./scripts/test.sh            everything (what CI runs, through .ci/run)
#   ./scripts/test.sh --fast     the same checks, but the tests marked slow are left out
#   ./scripts/test.sh --gpu      the GPU lane (scripts/gpu_lane.sh, its own virtual environment):
#                                on an NVIDIA GPU machine only, docs/gpu.md
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--gpu" ]; then
  shift
  exec scripts/gpu_lane.sh "$@"
fi

selection=()
if [ "${1:-}" = "--fast" ]; then
  shift
  # Processes, brokers, benchmarks and training runs: each takes more than ~5 s (pyproject.toml).
  selection=(-m "not slow")
fi

venv="${IOTGW_VENV:-.venv}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3

# The MQTT tests run a real Mosquitto broker (Debian's, MQTT 5 with shared subscriptions); the
# README's MQTT example, run by the doc tests, is Debian's mosquitto_rr (mosquitto-clients).
if { ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; } ||
  ! command -v mosquitto_rr >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -q mosquitto mosquitto-clients >/dev/null 2>&1 || {
    $sudo apt-get update -q >/dev/null &&
      $sudo apt-get install -y -q mosquitto mosquitto-clients >/dev/null
  }
fi

# The dashboard test drives a real headless browser: Debian's chromium and its chromedriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
    $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium chromium-driver >/dev/null
  }
fi

# The benchmarks' closed loops run C load generators, their quick runs included: Debian's wrk
# (HTTP) and h2load (gRPC, from nghttp2-client).
for tool in wrk:wrk h2load:nghttp2-client; do
  if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y -q "${tool#*:}" >/dev/null 2>&1 || {
      $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${tool#*:}" >/dev/null
    }
  fi
done

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# TF Serving's gRPC client for tests/gateway/test_grpc_*.py. Without its dependencies: it names
# the tensorflow package, which would install a second TensorFlow beside the tensorflow-cpu of
# the [tf] extra; what it needs (tensorflow, grpcio, protobuf) is installed already.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  "tensorflow-serving-api==2.21.*"

# deploy/prometheus/prometheus.yml is checked by promtool, and the compose stack's test
# (tests/deploy/test_stack.py) runs a Prometheus server, both from Debian's prometheus package.
# Only the binaries are taken out of the package, into the virtual environment: installing the
# package would also install (and on most machines start) a Prometheus server as a service.
missing=()
for tool in promtool prometheus; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "$venv/bin/$tool" ] || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  debs="$(mktemp -d)"
  (cd "$debs" && { apt-get download -q prometheus >/dev/null 2>&1 || {
    $sudo apt-get update -q >/dev/null && apt-get download -q prometheus >/dev/null 2>&1
  }; })
  # One pass over the archive for both (each pass decompresses all of it).
  dpkg-deb --fsys-tarfile "$debs"/prometheus_*.deb | tar -x -C "$debs" "${missing[@]/#/./usr/bin/}"
  for tool in "${missing[@]}"; do install -m 755 "$debs/usr/bin/$tool" "$venv/bin/$tool"; done
  rm -rf "$debs"
fi

"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" gateway rrl models device_sim benchmarks tests
# The images' Dockerfiles (no container engine here): hadolint from the test extra's wheel.
"$venv/bin/hadolint" --config .hadolint.yaml Dockerfile Dockerfile.gpu
# Two pytest-xdist workers unless IOTGW_TEST_WORKERS says otherwise (0: one process). The tests
# that load the cores (the benchmarks' quick runs, the agent's live tests) take turns in one
# worker while the other runs the rest a module at a time, and the agent's live tests run alone
# (tests/workers.py): about 14 minutes instead of 32 in one process on 2 cores.
workers="${IOTGW_TEST_WORKERS:-2}"
exec "$venv/bin/python" -m pytest -q -ra -n "$workers" --dist loadscope "${selection[@]}" "$@"
