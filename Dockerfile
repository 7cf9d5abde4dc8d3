# iotgw gateway, CPU image (amd64 and arm64).
#   docker build -t iotgw .                                   # ONNX Runtime + TensorFlow + tuner
#   docker build --build-arg EXTRAS=quant,tune -t iotgw:onnx .  # ONNX only (TF models UNAVAILABLE)
# The builder stage installs the gateway into a virtual environment and builds the bundled demo
# repository; the runtime stage copies both onto a slim Python with mosquitto and nothing else.
# It runs as a non-root user and with a read-only root filesystem: everything it writes goes to
# /tmp (mount a tmpfs there): the managed mosquitto's config and persistence
# (IOTGW_SERVING__CACHE_DIR), checkpoint graphs handed to ONNX Runtime, matplotlib's and Keras'
# caches.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# Extras of the runtime environment (pyproject.toml): tf needs tensorflow-cpu on amd64 and
# tensorflow on arm64, both chosen by the extra's markers.
ARG EXTRAS=tf,quant,tune
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY models ./models
COPY rrl ./rrl
COPY device_sim ./device_sim
COPY benchmarks ./benchmarks
# Two environments sharing pip's cache (no second download): the runtime one, and a throwaway
# one with the demo extra that builds the demo repository (TF SavedModels, ONNX files,
# checkpoints) at build time, so that the container serves without writing anything.
RUN python -m venv /opt/iotgw/venv \
    && /opt/iotgw/venv/bin/pip install ".[${EXTRAS}]" \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install ".[demo]" \
    && /opt/build/bin/python -c "from pathlib import Path; \
from models.demo import ensure_demo_repository; \
ensure_demo_repository(Path('/opt/iotgw/demo-repo-v1'))"

FROM ${PYTHON_IMAGE}
# Debian's mosquitto: the managed broker the gateway starts as its embedded default (MQTT 5,
# shared subscriptions), bound to 127.0.0.1 inside the container.
RUN apt-get update \
    && apt-get install -y --no-install-recommends mosquitto \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /tmp iotgw
COPY --from=builder /opt/iotgw /opt/iotgw
# The container listens on every interface, which the gateway refuses while /admin has no token;
# the image allows it so that it starts as it is. Operators mount a token and set
# IOTGW_HTTP__ADMIN_TOKEN_FILE (and the inference and metrics tokens): see README "Container".
ENV PATH=/opt/iotgw/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    KERAS_HOME=/tmp/keras \
    XDG_CACHE_HOME=/tmp/cache \
    IOTGW_SERVING__MODEL_REPO=/opt/iotgw/demo-repo-v1 \
    IOTGW_SERVING__CACHE_DIR=/tmp/iotgw \
    IOTGW_HTTP__HOST=0.0.0.0 \
    IOTGW_HTTP__ALLOW_UNAUTHENTICATED_ADMIN=true
USER 10001:10001
# HTTP (and /metrics) on 8080; gRPC (KServe v2, TF Serving, grpc.health.v1) on 8001, on the same
# interfaces (grpc.port; --no-grpc turns it off).
EXPOSE 8080 8001
# Readiness, not liveness: healthy once every model is loaded and MQTT is connected.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/v2/health/ready', timeout=2)"]
ENTRYPOINT ["iotgw", "serve"]
