# deviceshare: the operator, webhook and CLI in one image (`make image`).
# Two stages: the first builds the wheel and a virtualenv with the runtime dependencies only (no extras:
# the sandbox's kmock and jsonpatch are `deviceshare[sandbox]`, not in the image; cel-python is a runtime
# dependency, for DRA device selectors);
# the second copies that virtualenv onto the same slim base, with no compiler, pip cache or source.
# The base is pinned to a full version; pin it by digest too where your registry policy asks.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# The node agent's NVML bindings (nvidia-ml-py, pure Python, imported only by `deviceshare node-agent`);
# build with --build-arg EXTRAS= for an operator/webhook image without them.
ARG EXTRAS=nodeagent
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install "$(ls /wheels/*.whl)${EXTRAS:+[$EXTRAS]}" \
 && /opt/venv/bin/pip uninstall --yes pip setuptools wheel

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="deviceshare" \
      org.opencontainers.image.description="Share the same accelerator devices between the pods of a group" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# 65532: the conventional "nonroot" uid; the manifests run it with a read-only root filesystem.
USER 65532:65532
ENTRYPOINT ["deviceshare"]
CMD ["--help"]
