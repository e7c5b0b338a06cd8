#!/usr/bin/env bash
# The ceiling of a 2-rank run on this machine: one rank's share of the GPT preset's step (batch
# 16 of 32, one thread) timed alone, then two such processes at once, as two ranks run. Their
# ratio says how much the two cores slow each other (shared caches, memory bandwidth) with no
# communication at all: 2 ranks cannot beat 2 x alone / together over one process. Prints one
# line per round: the median ms of one process alone, of each of the two together, and of the
# whole batch in one process.
# Usage: bench/two_processes.sh [ROUNDS]   (default 3; needs a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
cargo build --release --quiet --bin tapegrad
T=target/release/tapegrad
ms() { python3 -c "import sys, json; print(f\"{json.loads(sys.stdin.readline())['ms_per_step']:.1f}\")"; }
half() { $T bench gpt --batch 16 --threads 1 --json | ms; }
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
for r in $(seq "$rounds"); do
  alone=$(half)
  a=$(mktemp) b=$(mktemp)
  half > "$a" & half > "$b" & wait
  whole=$($T bench gpt --batch 32 --threads 1 --json | ms)
  echo "round $r: b16 alone $alone ms; b16 two at once $(cat "$a") and $(cat "$b") ms; b32 alone $whole ms"
  rm -f "$a" "$b"
done
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
