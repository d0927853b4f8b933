# syntax=docker/dockerfile:1
# phasegate image: one image for `phasegate worker`, `orchestrator`, `migrate` and `relay`.
#
# Stage 1 builds a virtualenv from requirements/image.lock (every dependency pinned with its
# sha256, resolved inside the lock the tests run with; scripts/lock.sh regenerates both) and
# then the repository's own package without dependencies and without build isolation, so
# nothing unpinned is downloaded. Stage 2 copies only that virtualenv onto a clean slim base:
# no compiler, no pip, no build cache.
#
# The base is pinned by digest so a rebuild gets the same bytes; bump tag and digest together.
# Where Docker Hub cannot be reached, scripts/image-test.sh passes a stand-in base built from
# Debian packages with --build-arg PYTHON_IMAGE=... (python and pip in /usr/local/bin, as here).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements/image.lock ./requirements/
RUN /opt/venv/bin/pip install --require-hashes -r requirements/image.lock
COPY pyproject.toml README.md LICENSE ./
# phasegate/ holds the shared core and the links phasegate/worker -> ../worker and
# phasegate/orchestrator -> ../orchestrator; the build copies the planes through them.
COPY phasegate ./phasegate
COPY worker ./worker
COPY orchestrator ./orchestrator
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
 && /opt/venv/bin/pip uninstall -y pip setuptools wheel \
 && /opt/venv/bin/phasegate --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="phasegate" \
      org.opencontainers.image.description="Queue-driven, scale-to-zero worker fleet: phasegate worker, orchestrator, migrate, relay" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="https://github.com/phasegate/phasegate" \
      org.opencontainers.image.url="https://github.com/phasegate/phasegate" \
      org.opencontainers.image.documentation="https://github.com/phasegate/phasegate/tree/main/docs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# The uid/gid are fixed so Kubernetes runAsUser (chart value securityContext.runAsUser) and
# the image agree; runAsNonRoot can verify a numeric USER.
ARG PHASEGATE_UID=10001
ARG PHASEGATE_GID=10001
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid ${PHASEGATE_GID} phasegate \
 && useradd --system --uid ${PHASEGATE_UID} --gid ${PHASEGATE_GID} --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin phasegate \
 && python -m pip uninstall -y pip setuptools wheel
COPY --from=build /opt/venv /opt/venv
# The root filesystem is mounted read-only in Kubernetes; /tmp is an emptyDir.
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080 9100
ENTRYPOINT ["phasegate"]
CMD ["worker"]
