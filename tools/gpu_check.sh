#!/usr/bin/env bash
# One command for a lent GPU machine: builds nothing, runs the GPU checks and the benchmark, and writes
# every log plus a report.md summary under $OUT.  Finishes within about 8 minutes on an H200.
#
#   bash tools/gpu_check.sh            # on the device machine (carry .whl: see below)
#   bash tools/gpu_check.sh --dry-run  # anywhere: print the steps it would take
#
# The device image has python3 with torch, triton, numpy, cuda-bindings, rich, pytest and hypothesis
# but not cffi: the driver wrapper then maps staging through ctypes (equally zero-copy).  Any other
# missing package can travel as wheels in .whl/ (the device tool's README); the first step installs
# them when the folder is there.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-/tmp/coppelius-gpu-check}
PROD_STEPS=${PROD_STEPS:-10000}
BENCH_STEPS=${BENCH_STEPS:-200}
PY=${PY:-python3}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/coppelius-gpu.XXXXXX)
REPORT="$OUT/report.md"
steps=()
step() { steps+=("$1|$2|$3"); }   # name | log file | command

step "wheels"       wheels.log      "[ -d .whl ] && $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || true"
step "doctor"       doctor.log      "$PY -m host.cli doctor --profile coppelius"
step "gpu tests"    gpu-tests.log   "$PY -m pytest -q -m gpu tests -p no:cacheprovider"
step "tiny cuda a"  tiny-cuda-a.log "$PY -m host.cli run --profile tiny --backend cuda --quiet --directory $W/a --checkpoint $W/a.ckpt --result $W/a.bin"
step "tiny cuda b"  tiny-cuda-b.log "$PY -m host.cli run --profile tiny --backend cuda --quiet --directory $W/b --checkpoint $W/b.ckpt --result $W/b.bin"
step "tiny interp"  tiny-interp.log "$PY -m host.cli run --profile tiny --backend interpret --quiet --directory $W/i --checkpoint $W/i.ckpt --result $W/i.bin"
step "diff cuda×2"  diff-cuda.log   "$PY -m host.cli diff $W/a.bin $W/b.bin"
step "diff cuda×interp" diff-interp.log "$PY -m host.cli diff $W/a.bin $W/i.bin --atol 5e-2 --rtol 1e-2"
step "production"   production.log  "$PY -m host.cli run --profile coppelius --backend cuda --quiet --steps $PROD_STEPS --directory $W/p --checkpoint $W/p.ckpt --result $W/p.bin"
step "inspect"      inspect.json    "$PY -m host.cli inspect $W/p.bin --json"
step "verify"       verify.log      "$PY -m host.cli verify $W/p.bin --steps 2 --directory $W/p"
step "benchmark"    bench.log       "$PY tools/bench_torch.py --profile coppelius --steps $BENCH_STEPS --json $OUT/bench.json"

if [ $DRY -eq 1 ]; then
  echo "gpu_check.sh would run, writing logs under \$OUT ($OUT):"
  i=1; for s in "${steps[@]}"; do IFS='|' read -r name log cmd <<<"$s"; printf '%2d. %-17s > %-16s %s\n' $i "$name" "$log" "$cmd"; i=$((i+1)); done
  echo "then write $REPORT (each step's exit code and wall time, the inspect figures, the benchmark table)"
  rm -rf "$W"; exit 0
fi

export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  echo "# GPU check — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | sed 's/^/    /'
  echo; echo "| step | exit | seconds | log |"; echo "|---|---|---|---|"
} > "$REPORT"
for s in "${steps[@]}"; do
  IFS='|' read -r name log cmd <<<"$s"
  t0=$(date +%s.%N)
  bash -c "$cmd" > "$OUT/$log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  printf '| %s | %s | %.1f | %s |\n' "$name" "$rc" "$(echo "$t1 - $t0" | bc)" "$log" >> "$REPORT"
  echo "$name: exit $rc"
done
{
  echo; echo "## Production run (timestamp table)"
  $PY - "$OUT/inspect.json" <<'PYEOF' 2>&1
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"inspect JSON unreadable: {e}"); sys.exit(0)
for k in ("outcome", "steps_completed", "size", "expected_size"):
    print(f"- {k}: {j.get(k)}")
for k in ("device_ms_per_step", "host_gap_ms", "timing"):
    if k in j: print(f"- {k}: {j[k]}")
l = j.get("losses") or []
if l: print(f"- loss first {l[0]:.4f}, last {l[-1]:.4f}")
PYEOF
  echo; echo "## Benchmark"; echo '```'; tail -n 20 "$OUT/bench.log"; echo '```'
  echo; echo "## Diffs"; echo '```'; tail -n 8 "$OUT/diff-cuda.log"; tail -n 8 "$OUT/diff-interp.log"; echo '```'
} >> "$REPORT"
rm -rf "$W"
cat "$REPORT"
