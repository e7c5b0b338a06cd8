#!/usr/bin/env bash
# The GPT preset's training step (issue #23's speed targets), ours and PyTorch's one after the
# other on the same machine, as JSON lines on stdout: per thread count, `bench peak`, our step
# eager and compiled, then bench/pytorch_gpt.py eager and torch.compile. Read the lines with
# bench/gpt_compare.py; run this several times, since a shared VM's timings drift.
# Usage: bench/gpt_pair.sh [THREADS...]   (default: 1 2; REPS=N sets the repetitions, default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tapegrad
T=target/release/tapegrad
reps=${REPS:-20}
threads=("${@:-1 2}")
if ! python3 -c "import torch" 2>/dev/null; then
  echo "bench/gpt_pair.sh: torch is not importable (pip install torch in a virtual environment)" >&2
  exit 2
fi
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
for t in ${threads[@]}; do
  $T bench peak --threads "$t" --json
  $T bench gpt --threads "$t" --reps "$reps" --json
  $T bench gpt --threads "$t" --reps "$reps" --backend compiled --json
  python3 bench/pytorch_gpt.py --threads "$t" --reps "$reps" --compile --json
done
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
