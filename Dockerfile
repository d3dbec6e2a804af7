# GPU image: the official Triton image, with its own tritonserver and Python backend, set up by the
# same scripts/setup.sh and served by the same scripts/serve.sh (the one place for the server's
# flags) as a machine without Docker. For the TensorRT-LLM engine build FROM
# nvcr.io/nvidia/tritonserver:<release>-trtllm-python-py3 and pass --engine tensorrt_llm to
# scripts/configure.py.
#
# NOT BUILT HERE: the project machines have no Docker engine. tests/unit/test_scripts.py checks offline
# that the image's pins resolve for the Python and glibc below, that it serves through serve.sh
# under tini, and that README's `docker run` publishes every EXPOSEd port (README: Docker).
#
#   docker build -t tritonfront .
#   docker run --gpus all --rm --shm-size=2g -e BIND_ADDRESS=0.0.0.0 \
#     -p 127.0.0.1:8000:8000 -p 127.0.0.1:8001:8001 -p 127.0.0.1:8002:8002 -p 127.0.0.1:9000:9000 tritonfront
# The test suite needs the development set: docker build --build-arg TRITONFRONT_DEV=1 ...
ARG TRITON_RELEASE=26.07
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3

# constraints-image.txt is resolved for this Python and glibc (Ubuntu 24.04): stop here if the base
# image has moved on.
ARG PYTHON_VERSION=3.12
ARG GLIBC_VERSION=2.39
RUN test "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PYTHON_VERSION" \
 && test "$(getconf GNU_LIBC_VERSION)" = "glibc $GLIBC_VERSION"

# The venv keeps the pins apart from the base image's own Python packages (and Ubuntu's
# externally managed system Python). tini is PID 1 (ENTRYPOINT): it forwards `docker stop`'s
# SIGTERM to serve.sh, which stops tritonserver and its companions, and reaps orphans; bash as
# PID 1 ignores SIGTERM when no trap is set yet, and Kubernetes has no `docker run --init`.
# The base image's release pins Ubuntu's packages closely enough; exact apt versions would break
# the build at each Ubuntu security update.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv tini \
 && rm -rf /var/lib/apt/lists/*

# Serving runs as this user, not root; it owns only the caches it writes at run time.
ARG UID=10001
RUN groupadd --gid "$UID" tritonfront \
 && useradd --uid "$UID" --gid "$UID" --no-create-home --home-dir /opt/tritonfront --shell /usr/sbin/nologin tritonfront

WORKDIR /opt/tritonfront
# The base image's server and Python backend, not the nvidia-pytriton wheel: scripts/env.sh reads
# TRITONFRONT_TRITON_HOME and picks requirements-image.txt + constraints-image.txt.
# TRITONFRONT_DEV=0: the serving set only (requirements.txt + requirements-image.txt); 1 adds
# requirements-dev.txt (tests, benchmarks). HF_HOME: a Hugging Face id in TRITONFRONT_*_MODEL is
# fetched into the cache (mount a volume there to keep it across containers).
ARG TRITONFRONT_DEV=0
ENV TRITONFRONT_TRITON_HOME=/opt/tritonserver \
    TRITONFRONT_CACHE=/opt/tritonfront/.cache \
    TRITONFRONT_DEV=$TRITONFRONT_DEV \
    HF_HOME=/opt/tritonfront/.cache/huggingface

# Dependencies in a layer of their own, so that a code change does not reinstall torch.
COPY requirements*.txt constraints*.txt ./
COPY scripts ./scripts
RUN bash scripts/setup.sh --dependencies-only

COPY . .
RUN bash scripts/setup.sh

# Encoder and one llm DP rank on GPU 0, engine hf. More GPUs: scripts/configure.py --out DIR --gpus 0,1
# and TRITONFRONT_REPOSITORIES=DIR/model_repository:DIR/ensembles. deploy-cpu: the committed CPU
# configs with engine hf (the committed llama_cpp needs llama-cpp-python, which this image does not
# build: scripts/setup.sh), served by deploy/kubernetes/base.
RUN scripts/configure.py --out /opt/tritonfront/deploy --gpus 0 --engine hf \
 && scripts/configure.py --out /opt/tritonfront/deploy-cpu --engine hf \
 && mkdir -p "$HF_HOME" && chown -R "$UID:$UID" "$TRITONFRONT_CACHE"
ENV TRITONFRONT_REPOSITORIES=/opt/tritonfront/deploy/model_repository:/opt/tritonfront/deploy/ensembles \
    VIRTUAL_ENV=/opt/tritonfront/.venv \
    PATH=/opt/tritonfront/.venv/bin:$PATH

# One's own model folder: mount it read-only under /models and name it (README: Docker), e.g.
#   -v /srv/models/my-llm:/models/llm:ro -e TRITONFRONT_LLM_MODEL=/models/llm
USER $UID:$UID
# KServe HTTP, gRPC, Prometheus metrics, the OpenAI API (serve.sh's defaults).
EXPOSE 8000 8001 8002 9000
# Healthy once every model is ready and the OpenAI front reaches Triton; loading the GPU
# deployment's models takes minutes (start period as the Kubernetes overlay's startup probe).
HEALTHCHECK --start-period=600s --interval=15s --timeout=5s --retries=3 CMD ["python3", "scripts/healthcheck.py"]
ENTRYPOINT ["/usr/bin/tini", "--"]
# Loopback unless BIND_ADDRESS says otherwise, as on any machine (README: Exposing the server).
CMD ["bash", "scripts/serve.sh"]
