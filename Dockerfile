# syntax=docker/dockerfile:1
# One image for the operator and the sidecar: ENTRYPOINT throttledjob, so a pod runs
# `throttledjob operator ...` (the chart) or `throttledjob sidecar ...` (the operator's
# Job builder). Build: docker build -t ghcr.io/throttledjob/throttledjob:0.1.0 .
# tests/chart/test_image.py lints this file with hadolint and runs the build stage's steps,
# exactly, in a fresh venv. Where no registry is reachable, BASE names a local image with
# Debian's python3.11 instead (tools/k8s/images.py builds one with debootstrap):
#   podman build --build-arg BASE=localhost/throttledjob-base:bookworm -t localhost/throttledjob:dev .

# Both stages use the same base: the venv's interpreter path must exist in the final image.
ARG BASE=python:3.11.11-slim-bookworm

# --- build: a virtualenv with the package and its pinned dependencies --------------------
FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/throttledjob
COPY requirements-dev.txt requirements-run.txt pyproject.toml README.md ./
COPY src/ src/
# The test environment's pins as constraints: only what the extras need is installed, at
# the versions the suite ran. Dependencies come as wheels only, so no compiler is needed
# (and none is in either stage).
RUN /opt/throttledjob/bin/pip install --no-cache-dir --only-binary=:all: \
        --constraint requirements-dev.txt ".[sidecar,operator,node]" \
    && /opt/throttledjob/bin/pip check

# --- final: the same base (the venv's interpreter path), the venv, a non-root user --------
FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="throttledjob" \
      org.opencontainers.image.description="ThrottledJob operator and sidecar: hold CPU and GPU peaks of batch and ML jobs to a target at the least slowdown" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/throttledjob/throttledjob" \
      org.opencontainers.image.documentation="https://github.com/throttledjob/throttledjob/blob/main/docs/install.md"
ENV PATH=/opt/throttledjob/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /opt/throttledjob /opt/throttledjob
# Any UID works (the operator runs the sidecar as the workload's UID); 65532 by default.
USER 65532:65532
# 9400: the sidecar's /metrics, /healthz, /readyz, /status. 8080: the operator's /healthz.
EXPOSE 9400 8080
# Kubernetes ignores HEALTHCHECK; the probes are in the pod specs (the chart's Deployment
# and the sidecar the operator injects), on the /healthz endpoints above.
HEALTHCHECK NONE
ENTRYPOINT ["throttledjob"]
CMD ["--help"]
