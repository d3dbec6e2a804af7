"""tritonfront: the serving logic behind the Triton models in model_repository/, one package per
process or role, importing downward only (tests/unit/test_layering.py):

- tritonfront.stubs     runs inside Triton's Python-backend stubs: the glue the model.py adapters use
- tritonfront.watchdog  its own process beside tritonserver: reloads a model whose stub died; its
                        drain module is the process serve.sh runs on SIGTERM, until nothing is in flight
- tritonfront.openai    its own process: the OpenAI-compatible HTTP front, a gRPC client of Triton
- tritonfront.triton    the Triton glue the stubs and the watchdog share (placement from Triton's model
                        args, tritonserver's flags and queue metric); imports no Triton module
- tritonfront.core      the library the stubs run (and the front's tokenizer): no Triton, no HTTP
- tritonfront.engines   generation engines under the core (transformers, llama.cpp, TensorRT-LLM)
- tritonfront.errors, tritonfront.threads   the few definitions every room shares
"""
