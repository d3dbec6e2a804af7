"""The Triton glue the stub processes and the watchdog share: what Triton tells a model instance
about its placement (devices) and what tritonserver's command line says about its metrics endpoint
(flags). Importing no Triton module itself, it sits between the process rooms (stubs, watchdog, the
model.py adapters) and the core, which knows nothing of Triton (tests/unit/test_layering.py)."""
