#!/usr/bin/env bash
# Data-parallel scaling of a preset (issue #27's speed target), from each run's own step times: a
# run's `--log` records when every step ended, and the median of the differences is its step
# time in the steady state (start-up, evaluations and the odd step the machine takes away from
# the run drop out). Per round, one after the other:
#   one process     the global batch, `--threads 1`;
#   N ranks         `mpiexec -n N ... --distributed`, `--threads 1` per rank (rank 0's log);
#   ceiling         N processes at once, each on batch/N and no communication: N ranks cannot be
#                   faster than these, since they run the same work on the same cores.
#   lock-step       the same N processes' step times paired by step number, the slowest of each
#                   step, then the median: what the ceiling becomes when every step waits for the
#                   slowest rank, as a data-parallel step does (so per-step jitter counts).
# Prints one line per round: the medians and the ratios of one process to N ranks, to the
# ceiling and to the lock-step ceiling. Needs a release build with `--features mpi` and python3.
# Usage: bench/ranks.sh cnn|gpt|mlp [RANKS] [ROUNDS] [STEPS]   (defaults: 2 ranks, 3 rounds,
# 1000 steps for cnn and mlp, 40 for gpt). TAPEGRAD=path/to/binary measures another build.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:?usage: bench/ranks.sh cnn|gpt|mlp [RANKS] [ROUNDS] [STEPS]}
ranks=${2:-2}
rounds=${3:-3}
case "$preset" in
  cnn) run=(train --model cnn) batch=32 steps=${4:-1000} ;;
  mlp) run=(train --model mlp) batch=32 steps=${4:-1000} ;;
  gpt) run=(train gpt) batch=32 steps=${4:-40} ;;
  *) echo "bench/ranks.sh: unknown preset '$preset' (cnn, gpt or mlp)" >&2; exit 2 ;;
esac
T=${TAPEGRAD:-target/release/tapegrad}
# A build without the feature still lists --distributed, and refuses it when asked to run.
if ! command -v mpiexec >/dev/null || ! "$T" train --model mlp --steps 0 --distributed >/dev/null 2>&1; then
  echo "bench/ranks.sh: needs mpiexec and a build with MPI: cargo build --release --features mpi" >&2
  exit 2
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
common=(--steps "$steps" --eval-every "$steps" --threads 1 --quiet)
median() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
ends = [json.loads(l)["seconds"] for l in open(sys.argv[1]) if '"split":"train"' in l]
print(f"{statistics.median(b - a for a, b in zip(ends, ends[1:])) * 1e3:.3f}")
EOF
}
lockstep_median() {
  python3 - "$@" <<'EOF'
import json, statistics, sys
def steps(path):
    ends = [json.loads(l)["seconds"] for l in open(path) if '"split":"train"' in l]
    return [b - a for a, b in zip(ends, ends[1:])]
runs = [steps(p) for p in sys.argv[1:]]
print(f"{statistics.median(max(s) for s in zip(*runs)) * 1e3:.3f}")
EOF
}
echo "# $preset, $ranks ranks, global batch $batch, $steps steps; $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
for r in $(seq "$rounds"); do
  "$T" "${run[@]}" "${common[@]}" --batch-size "$batch" --log "$logs/one.json" > /dev/null
  mpiexec -n "$ranks" "$T" "${run[@]}" "${common[@]}" --batch-size "$batch" --distributed \
    --log "$logs/ranks.json" > /dev/null
  for k in $(seq "$ranks"); do
    "$T" "${run[@]}" "${common[@]}" --batch-size $((batch / ranks)) --seed "$k" \
      --log "$logs/part$k.json" > /dev/null &
  done
  wait
  one=$(median "$logs/one.json")
  dist=$(median "$logs/ranks.json")
  parts=$(for k in $(seq "$ranks"); do median "$logs/part$k.json"; done | sort -n | tail -1)
  lockstep=$(lockstep_median "$logs"/part*.json)
  python3 -c "print(f'round $r: one process $one ms, $ranks ranks $dist ms ({$one / $dist:.2f}x), \
ceiling (slowest of $ranks processes at once on batch $((batch / ranks))) $parts ms ({$one / $parts:.2f}x), \
lock-step ceiling $lockstep ms ({$one / $lockstep:.2f}x)')"
done
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
