"""Triton glue: code that runs only inside Triton's Python-backend stub processes.

`glue` is the one module that imports triton_python_backend_utils (the model.py adapters in
model_repository/ build on it); `server_metrics` lets the llm stub read tritonserver's own
/metrics. The Triton glue a stub shares with the watchdog is tritonfront.triton; everything else a
stub runs is the core library below.
"""
