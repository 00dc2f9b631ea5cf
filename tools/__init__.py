"""The project's tools, run from the repository root as `python -m tools.NAME` (or with the root on
PYTHONPATH); only tests and tools import them, never host/, plan/ or staging/.

  build_ptx         kernels_ptx/ from the kernels (--check: a rebuild compared byte for byte;
                    --report: the cost model of the update)
  cost/             the H200 cost model of a launch list (python -m tools.cost)
  gpu_check/        the device check (bash tools/gpu_check.sh, i.e. python -m tools.gpu_check)
  fake_driver       a CPU stand-in for cuda.bindings.driver (the tests' and the dry run's);
                    fake_graphs its launches, captures and graph launches
  cpu_cuda/         a cuda run computed on the CPU: the CPU drivers' kernel executor
                    (python -m tools.cpu_cuda run --profile tiny --backend cuda ...)
  make_golden       tests/golden/ from the interpret backend (--check: reproduced bit for bit)
  bench_torch       Coppelius beside the same model and learner in PyTorch
  bench_checkpoint  checkpoint publish and load against dd + sha256sum
  proxy_train       a PyTorch proxy of the model trained on the embedded stream
  train_tokenizer   the shipped tokenizer from Python's standard library
  checkout          the checkout as the `coppelius` command with nothing installed
                    (python3 -m tools.checkout COMMAND)
  shim              `import coppelius` from the checkout's folders where no install provides it
                    (mounted here, so every tool runs from a bare checkout)
"""
from tools import shim

shim.mount()
