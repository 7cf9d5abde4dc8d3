# iotgw gateway image: the bundled demo repository is built at image build time, so the
# container starts serving without writing anything.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 iotgw
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY models ./models
COPY rrl ./rrl
COPY device_sim ./device_sim
COPY benchmarks ./benchmarks
RUN pip install . && rm -rf /root/.cache

USER iotgw
# The container listens on every interface, which the gateway refuses while /admin has no token;
# the image allows it so that it starts as it is. Operators should mount a token and set
# IOTGW_HTTP__ADMIN_TOKEN_FILE (and IOTGW_HTTP__INFERENCE_TOKEN_FILE, IOTGW_HTTP__METRICS_TOKEN_FILE).
ENV IOTGW_SERVING__CACHE_DIR=/home/iotgw/.cache/iotgw \
    IOTGW_HTTP__HOST=0.0.0.0 \
    IOTGW_HTTP__ALLOW_UNAUTHENTICATED_ADMIN=true
RUN python -c "from pathlib import Path; from models.demo import ensure_demo_repository; \
ensure_demo_repository(Path('/home/iotgw/.cache/iotgw/demo-repo-v1'))"

EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request,sys; \
sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/v2/health/ready', timeout=2).status == 200 else 1)"
ENTRYPOINT ["iotgw", "serve"]
