"""The device check: one budgeted command (`bash tools/gpu_check.sh`, i.e. `python -m
tools.gpu_check`) that turns a GPU machine into every verdict it can, or runs the same phases
without a GPU (`--dry-run`).

  check.py        the modes (GPU, dry run), the time plan, the phases in order, the command line
  runner.py       phases under one budget, each command in its own process group
  commands.py     the command lines a phase runs, per mode
  phases.py       the product's phases: doctor, tiny, production, the full run, the GPU tests
  device.py       the measurements: per-launch timing, experiments, calibration, sanitizer,
                  torch
  launches.py     per-launch device time beside the cost model (`python -m tools.gpu_check.launches`)
  experiments.py  the capture variants and what the plan should keep
  calibrate.py    the cost model's inputs measured by hand-written kernels (ptx/), beside the model
                  (`python -m tools.gpu_check.calibrate`)
  figures.py      figures read from result files (numpy only)
  report.py       report.md, the summary table, the machine's description
  out.py          $OUT: at most 8 files, the log archive
  fake.py         a command with tools/fake_driver.py as the driver (the dry run's cuda steps)
  ptx/            the calibration's hand-written PTX (the driver JIT-loads it; never a run's)
"""
