"""A cuda run on this machine's CPU: the CPU drivers execute what the host hands them.

  python -m tools.cpu_cuda [--order capture|earliest|latest|random:SEED] COMMAND ARGS...

runs `coppelius COMMAND ARGS...` with tools/fake_driver.py as the CUDA driver, executing every
launch it receives (executor.py: Triton's interpreter, from the committed manifest, on the
launch's own parameter values, grid and the driver's memory): `run --profile tiny --backend cuda`
writes the bytes `run --profile tiny --backend interpret` writes, checked launch by launch for
`divisible_by_16` and memory bounds.  stub_hook.py registers the same executor with the C stub
libcuda.so.1 of tests/support/stub_cuda/, so a process that loads the stub through the real
cuda-bindings computes too.  docs/NUMERICS.md ("The CPU twin of a cuda run") says what this proves
and what only a GPU can.
"""
