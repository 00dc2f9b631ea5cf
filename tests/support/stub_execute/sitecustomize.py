"""Attach the CPU executor to the C stub libcuda.so.1 in every Python process started with this
folder on PYTHONPATH (tests/support/stub_driver.py `env(..., execute=True)`): a `coppelius node`
child then computes its cuda run on the CPU through the real cuda-bindings, and the product knows
nothing of it.  Python imports `sitecustomize` at start-up when one is on the path; this one
imports the executor (Triton, torch) and loads the stub only where COPPELIUS_STUB_EXECUTE is 1.
"""
import os

if os.environ.get("COPPELIUS_STUB_EXECUTE") == "1":
    from tools.cpu_cuda import stub_hook

    stub_hook.attach()
