# syntax=docker/dockerfile:1
# phasegate image: one image for `phasegate worker`, `orchestrator`, `migrate` and `relay`.
#
# Stage 1 builds a virtualenv from the repository's own package (the same `pip install .`
# the tests use, with the same constraints file). Stage 2 copies only that virtualenv onto a
# clean slim base: no compiler, no pip, no build cache.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml requirements-constraints.txt README.md ./
# phasegate/ holds the shared core and the links phasegate/worker -> ../worker and
# phasegate/orchestrator -> ../orchestrator; the build copies the planes through them.
COPY phasegate ./phasegate
COPY worker ./worker
COPY orchestrator ./orchestrator
RUN /opt/venv/bin/pip install -c requirements-constraints.txt . \
 && /opt/venv/bin/pip uninstall -y pip setuptools wheel \
 && /opt/venv/bin/phasegate --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
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
