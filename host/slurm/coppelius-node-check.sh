#!/bin/bash
# Coppelius node check for a Slurm Prolog or Epilog: a short run on each GPU of this node,
# compared bit for bit (time and environment fields apart) with a known-good result of the same
# invocation.  One log line per GPU; exit 0 when every GPU passes, 1 when one fails (a Prolog
# that exits non-zero makes Slurm drain the node and requeue the job), 2 when the check could not
# run (its line says why).
#
#   slurm.conf:  Prolog=/etc/slurm/coppelius-node-check.sh
#   its settings (environment, or the file named by COPPELIUS_NODE_CHECK_CONF, default
#   /etc/default/coppelius-node-check):
#     COPPELIUS_EXPECT  the known-good result file (required), made once on a healthy GPU with
#                       the same arguments: coppelius run --steps N … --result FILE
#     COPPELIUS_ARGS    the run's arguments (default: --profile tiny --steps 2)
#     COPPELIUS         the command (default `coppelius`)
#     COPPELIUS_GPUS    the GPU ordinals to check (default: every ordinal CUDA_VISIBLE_DEVICES
#                       or SLURM_JOB_GPUS names, else 0)
#     COPPELIUS_METRICS also write the verdicts as Prometheus metrics there (`coppelius metrics`;
#                       e.g. /var/lib/prometheus/node-exporter/coppelius.prom, node exporter's
#                       textfile directory); one that cannot be written is a log line, never a
#                       change of the exit status
set -uo pipefail
conf=${COPPELIUS_NODE_CHECK_CONF:-/etc/default/coppelius-node-check}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"
node=${SLURMD_NODENAME:-$(hostname -s)}
say() { echo "coppelius-node-check: node $node $*"; }
expect=${COPPELIUS_EXPECT:-}
if [ -z "$expect" ] || [ ! -r "$expect" ]; then
  say "could not run: COPPELIUS_EXPECT (the known-good result) is unset or unreadable"; exit 2
fi
read -r -a coppelius <<< "${COPPELIUS:-coppelius}"
read -r -a args <<< "${COPPELIUS_ARGS:---profile tiny --steps 2}"
visible=${CUDA_VISIBLE_DEVICES:-${SLURM_JOB_GPUS:-0}}
count=$(awk -F, '{print NF}' <<< "$visible")
read -r -a gpus <<< "${COPPELIUS_GPUS:-$(seq -s ' ' 0 $((count - 1)))}"
work=$(mktemp -d "${TMPDIR:-/tmp}/coppelius-check.XXXXXX") || { say "could not run: no scratch"; exit 2; }
trap 'rm -rf "$work"' EXIT
rc=0
checked=()
for gpu in "${gpus[@]}"; do
  result="$work/gpu$gpu.bin"
  checked+=(--gpu "$gpu" "$result")
  if ! "${coppelius[@]}" run --quiet --device "$gpu" --directory "$work/run$gpu" \
      --result "$result" "${args[@]}" > "$work/run$gpu.log" 2>&1; then
    say "GPU $gpu FAIL: the run failed: $(tail -n 1 "$work/run$gpu.log")"; rc=1; continue
  fi
  if "${coppelius[@]}" diff "$expect" "$result" > "$work/diff$gpu.log" 2>&1; then
    say "GPU $gpu PASS"
  else
    say "GPU $gpu FAIL: $(grep -m 1 -i 'first difference' "$work/diff$gpu.log" || tail -n 1 "$work/diff$gpu.log")"
    rc=1
  fi
done
if [ -n "${COPPELIUS_METRICS:-}" ]; then
  if out=$("${coppelius[@]}" metrics --host "$node" --expect "$expect" \
      -o "$COPPELIUS_METRICS" "${checked[@]}" 2>&1); then
    say "$out"
  else
    say "metrics not written (the verdicts stand): $(tail -n 1 <<< "$out")"
  fi
fi
exit $rc
