#!/bin/bash
# Coppelius fleet job array: the same invocation on every node, each task in node-local scratch
# from a fresh checkpoint, its result file named after the Slurm node ($SLURMD_NODENAME, not
# `hostname`: several nodes may share a host name).  One task per node:
#
#   sbatch --array=0-$((NODES - 1)) coppelius-array.sh RESULTS_DIR [RUN ARGUMENTS ...]
#
# RESULTS_DIR must be on a file system every node sees.  Two tasks that land on one node (an
# array does not pin tasks to distinct nodes; --exclusive only keeps them apart in time) write
# the same name: the second is refused (exit 2) rather than overwriting the first, and the gather
# step counts the nodes.  COPPELIUS names the command (default `coppelius`; e.g.
# "/shared/coppelius/.venv/bin/coppelius" or "python3 -m tools.checkout" in a checkout).
# Exit: coppelius run's (0 completed, 1 device error, 2 refused, 3 interrupted, 4 host error).
#SBATCH --job-name=coppelius-fleet
#SBATCH --nodes=1 --ntasks=1 --exclusive --gres=gpu:1
#SBATCH --output=coppelius-%A_%a.log
set -uo pipefail
results=${1:?usage: sbatch --array=0-N coppelius-array.sh RESULTS_DIR [RUN ARGUMENTS ...]}
shift
node=${SLURMD_NODENAME:?not inside a Slurm job: SLURMD_NODENAME is unset}
read -r -a coppelius <<< "${COPPELIUS:-coppelius}"
work=$(mktemp -d "${TMPDIR:-/tmp}/coppelius-$node.XXXXXX") || exit 4
trap 'rm -rf "$work"' EXIT
mkdir -p "$results" || exit 4
echo "coppelius-array: node $node task ${SLURM_ARRAY_TASK_ID:-?} gpu ${CUDA_VISIBLE_DEVICES:-?} -> $results/$node.bin"
"${coppelius[@]}" run --quiet --directory "$work" --result "$results/$node.bin" "$@"
