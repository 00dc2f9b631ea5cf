#!/usr/bin/env bash
# The device check (issue 12): one budgeted command for a lent GPU machine.  Phases in priority
# order under a total budget; the report ($OUT/report.md, report.json, logs.tar.gz and at most five
# more files) is rewritten after every phase; the last lines of stdout are a short table.
#
#   bash tools/gpu_check.sh                 # on the GPU machine: budget 300 s
#   bash tools/gpu_check.sh --budget 240    # a smaller budget: the lowest-priority phases skip
#   bash tools/gpu_check.sh --dry-run       # anywhere: every phase, fake driver / interpreter / CPU
#
# The device tool's call: run(command="bash tools/gpu_check.sh", timeout_s=420) — the budget plus
# the slack a running phase may take (60 s) plus start-up, inside one command's 10 minutes.
# Everything is in tools/gpu_check.py; this wrapper only picks the Python and the import path.
# Packages missing on the GPU image can travel as wheels in .whl/ (the device tool's README).
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
exec "$PY" tools/gpu_check.py "$@"
