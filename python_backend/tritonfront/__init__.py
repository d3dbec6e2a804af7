"""tritonfront: the serving logic behind the Triton models in model_repository/.

Each module has one job and runs without a server; the model.py files only move tensors
between Triton and these modules.
"""
