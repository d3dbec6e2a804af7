"""The core library: what every Triton model of the repository does, without Triton.

Runs inside the Python-backend stubs (each model.py hands it numpy arrays through
tritonfront.stubs.glue) and, for tokenization and model sources, inside the OpenAI front. Nothing
here imports Triton or speaks HTTP, so all of it is tested without a server. Modules import
downward only (tests/unit/test_layering.py holds the layers); the engines are below. One module
works for scripts/configure.py rather than for a model: config_tensors, which writes the committed
configs' tensors from the declarations here (trtllm_contract).
"""
