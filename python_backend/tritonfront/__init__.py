"""tritonfront: the serving logic behind the Triton models in model_repository/.

Each module has one job and runs without a server: nothing here imports Triton. The model.py
adapters and python_backend/triton_glue.py move tensors between Triton and these modules.
Modules import downward only (tests/unit/test_layering.py holds the layers).
"""
