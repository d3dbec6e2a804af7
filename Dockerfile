# GPU image: the official Triton image, with its own tritonserver and Python backend, set up by the
# same scripts/setup.sh and served by the same scripts/serve.sh (the one place for the server's
# flags) as a machine without Docker. For the TensorRT-LLM engine build FROM
# nvcr.io/nvidia/tritonserver:<release>-trtllm-python-py3 and pass --engine tensorrt_llm to
# scripts/configure.py.
#
# NOT BUILT HERE: the project machines have no Docker engine. tests/unit/test_scripts.py checks offline
# that the image's pins resolve for the Python and glibc below and that it serves through serve.sh.
#
#   docker build -t tritonfront .
#   docker run --gpus all --rm -e BIND_ADDRESS=0.0.0.0 \
#     -p 127.0.0.1:8000:8000 -p 127.0.0.1:8001:8001 -p 127.0.0.1:8002:8002 tritonfront
#   docker run --gpus all --rm -e TRITONFRONT_REPOSITORIES= tritonfront bash scripts/test.sh
ARG TRITON_RELEASE=26.07
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3

# constraints-image.txt is resolved for this Python and glibc (Ubuntu 24.04): stop here if the base
# image has moved on.
ARG PYTHON_VERSION=3.12
ARG GLIBC_VERSION=2.39
RUN test "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PYTHON_VERSION" \
 && test "$(getconf GNU_LIBC_VERSION)" = "glibc $GLIBC_VERSION"

# The venv keeps the pins apart from the base image's own Python packages (and Ubuntu's
# externally managed system Python).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tritonfront
# The base image's server and Python backend, not the nvidia-pytriton wheel: scripts/env.sh reads
# TRITONFRONT_TRITON_HOME and picks requirements-image.txt + constraints-image.txt.
ENV TRITONFRONT_TRITON_HOME=/opt/tritonserver \
    TRITONFRONT_CACHE=/opt/tritonfront/.cache

# Dependencies in a layer of their own, so that a code change does not reinstall torch.
COPY requirements*.txt constraints*.txt ./
COPY scripts ./scripts
RUN bash scripts/setup.sh --dependencies-only

COPY . .
RUN bash scripts/setup.sh

# Encoder and one llm DP rank on GPU 0. More GPUs: scripts/configure.py --out DIR --gpus 0,1 and
# TRITONFRONT_REPOSITORIES=DIR/model_repository:DIR/ensembles.
RUN scripts/configure.py --out /opt/tritonfront/deploy --gpus 0
ENV TRITONFRONT_REPOSITORIES=/opt/tritonfront/deploy/model_repository:/opt/tritonfront/deploy/ensembles \
    VIRTUAL_ENV=/opt/tritonfront/.venv \
    PATH=/opt/tritonfront/.venv/bin:$PATH

EXPOSE 8000 8001 8002
# Loopback unless BIND_ADDRESS says otherwise, as on any machine (README: Exposing the server).
CMD ["bash", "scripts/serve.sh"]
