# syntax=docker/dockerfile:1
# powerfleet image: `make image` (docker build --target test, then --target runtime).
#   build    builds the powerfleet wheel and installs it with its dependencies into /opt/venv
#   runtime  slim Python, /opt/venv, a non-root user (uid 10001); ENTRYPOINT powerfleet
#   test     the runtime layers plus the test tools: runs the unit tests inside the image
# Only pyproject.toml, README.md, src/ and (in test) tests/ are copied: no credentials, no .git.
# The chart runs everything as uid 10001 except the node agent, which it runs as root
# (NVML's set-power-limit needs it); the NVIDIA runtime injects NVML into that container.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /build
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /dist . \
 && /opt/venv/bin/pip install /dist/powerfleet-*.whl \
 && /opt/venv/bin/python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
RUN groupadd --system --gid 10001 powerfleet \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin powerfleet
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["powerfleet"]
CMD ["--help"]

FROM runtime AS test
USER root
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /dist /dist
# The package's own test extras, against the exact installed powerfleet.
RUN pip install "$(ls /dist/powerfleet-*.whl)[test]"
WORKDIR /src
COPY pyproject.toml ./
COPY tests ./tests
RUN chown -R 10001:10001 /src
USER 10001:10001
RUN python -m pytest -q -p no:cacheprovider tests/unit
