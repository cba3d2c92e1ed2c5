# ratelimit-sidecar: runs beside Envoy; mount rules at /etc/ratelimit/config.

# The wheel, its request path compiled with mypyc (setup.py), where a C compiler is at hand.
# deploy/image-wheel.sh holds both steps, build and install: tests/integration/test_image_build.py
# runs it as this file does.
FROM python:3.11 AS wheel
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY tools ./tools
COPY ratelimit_sidecar ./ratelimit_sidecar
COPY deploy/image-wheel.sh ./deploy/
RUN PIP_NO_CACHE_DIR=1 bash deploy/image-wheel.sh build /wheels

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RLS_GRPC_ADDRESS=0.0.0.0:8081 \
    RLS_METRICS_ADDRESS=0.0.0.0:9090 \
    RLS_CONFIG=/etc/ratelimit/config

COPY --from=wheel /wheels /wheels
COPY deploy/image-wheel.sh /tmp/
# /bin/ratelimit: the reference's command, reading its variables (docs/REFERENCE.md), so its
# manifests (Istio's sample, Envoy Gateway) run this image unchanged.
RUN bash /tmp/image-wheel.sh install /wheels python \
    && rm -r /wheels /tmp/image-wheel.sh \
    && ln -s "$(command -v ratelimit)" /bin/ratelimit \
    && useradd --system --uid 10001 --no-create-home ratelimit \
    && mkdir -p /etc/ratelimit/config

COPY envoy/rules/gateway.yaml /etc/ratelimit/config/gateway.yaml

USER 10001
EXPOSE 8081 9090
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:9090/healthz', timeout=1)" || exit 1

STOPSIGNAL SIGTERM
ENTRYPOINT ["ratelimit-sidecar"]
CMD ["serve", "--config", "/etc/ratelimit/config"]
