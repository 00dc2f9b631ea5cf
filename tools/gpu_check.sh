#!/usr/bin/env bash
# The device check: one budgeted command for a GPU machine.  Phases in the order of
# what matters most (doctor, tiny, production, full-run, per-launch, experiments, calibration,
# sanitizer, gpu-tests, torch, torch-default) under one budget; the report ($OUT/report.md, report.json,
# logs.tar.gz and the phases' own files, 8 at most with whatever else $OUT holds) is rewritten
# after every phase; the last lines of stdout are a short table.
#
#   bash tools/gpu_check.sh                             # on a GPU machine: wall limit 360 s
#   bash tools/gpu_check.sh --phases a,b --budget 170   # a rerun of what failed: wall limit 210 s
#   bash tools/gpu_check.sh --dry-run                   # anywhere: fake driver / interpreter / CPU
#   bash tools/gpu_check.sh 2>&1 | tee $OUT/check.log   # also keeps the output (one of the 8 files)
#
# Time plan (docs/PERFORMANCE.md, "The device check: its time plan"): the default budget of 320 s is
# the wall limit of 360 s less the 30 s a running phase may overrun it and 10 s of start and last
# report.  A machine's start (up to 2 min) + 360 s + 30 s held idle, then a rerun on a fresh
# machine (2 min + 210 s + 30 s), is 870 s: inside a task's 15 minutes of machine time.
# Every cuda run waits at most 20 s for a fence (a hang costs seconds); GPU tests run under a
# per-test timeout.  --profile P / --tiny-steps N: GPU mode's production phases on another profile
# and the tiny phase on fewer steps.
# Everything is in tools/gpu_check/ (python -m tools.gpu_check); this wrapper only picks the
# Python and the import path.  Nothing is installed: `coppelius` is the checkout itself, through
# the same shim as `python3 -m tools.checkout COMMAND` (tools/shim.py), and every command the
# check runs is `python -m tools.checkout …`.
# Packages missing on the GPU image can travel as wheels in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" -m tools.gpu_check "$@"
