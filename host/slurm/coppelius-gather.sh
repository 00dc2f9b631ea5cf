#!/bin/bash
# Coppelius gather step, after the job array: the classes of identical results over every file
# gathered (coppelius diff A B C …: one row per class), written as JSON beside them, and, with a
# known-good file, one verdict per node (PASS when its result matches it bit for bit, time and
# environment fields apart).  Runs anywhere (no GPU):
#
#   coppelius-gather.sh RESULTS_DIR [KNOWN_GOOD.bin]
#
# Writes RESULTS_DIR/classes.json (coppelius diff --json) and, with KNOWN_GOOD,
# RESULTS_DIR/verdicts.txt (one line per node).  With COPPELIUS_METRICS set, also the sweep's
# verdicts as Prometheus metrics in that one file (`coppelius metrics`: each node's GPU labelled
# with the node's name; against KNOWN_GOOD, else the majority), e.g. in node exporter's textfile
# directory of the host that runs the gather; one that cannot be written is a log line, never a
# change of the exit status.  Exit 0 one class (and every node PASS), 1 more than one class (or a
# FAIL), 2 nothing to compare or an unreadable file.
set -uo pipefail
results=${1:?usage: coppelius-gather.sh RESULTS_DIR [KNOWN_GOOD.bin]}
expect=${2:-}
read -r -a coppelius <<< "${COPPELIUS:-coppelius}"
shopt -s nullglob
files=("$results"/*.bin)
if [ ${#files[@]} -eq 0 ]; then echo "coppelius-gather: no *.bin in $results"; exit 2; fi
echo "coppelius-gather: ${#files[@]} result file(s) in $results"
"${coppelius[@]}" diff "${files[@]}" --json > "$results/classes.json"
rc=$?
[ ${#files[@]} -gt 1 ] && "${coppelius[@]}" diff "${files[@]}"
if [ -n "$expect" ]; then
  : > "$results/verdicts.txt"
  for f in "${files[@]}"; do
    node=$(basename "$f" .bin)
    if out=$("${coppelius[@]}" diff "$expect" "$f" 2>&1); then
      line="node $node PASS"
    else
      line="node $node FAIL: $(grep -m 1 -i 'first difference' <<< "$out" || tail -n 1 <<< "$out")"
      rc=1
    fi
    echo "$line" | tee -a "$results/verdicts.txt"
  done
fi
if [ -n "${COPPELIUS_METRICS:-}" ]; then
  "${coppelius[@]}" metrics ${expect:+--expect "$expect"} -o "$COPPELIUS_METRICS" "${files[@]}" \
    || echo "coppelius-gather: metrics not written (the verdicts stand)"
fi
exit $rc
