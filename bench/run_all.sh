#!/usr/bin/env bash
# Runs every `tapegrad bench` workload of issue #7 and then the PyTorch baseline, one after the
# other on the same machine, as JSON lines (one object per workload) on stdout.
# Usage: bench/run_all.sh [THREADS...]   (default: 1 2)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin tapegrad
T=target/release/tapegrad
threads=("${@:-1 2}")
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
for t in ${threads[@]}; do
  $T bench peak --threads "$t" --json
  for b in 1 32 256; do
    $T bench mlp --batch "$b" --threads "$t" --json
    $T bench mlp --batch "$b" --threads "$t" --backend compiled --json
  done
  $T bench chain --numel 1 --threads "$t" --json
  $T bench chain --numel 16 --threads "$t" --json
  $T bench matmul --n 512 --threads "$t" --json
  $T bench matmul --n 1024 --threads "$t" --json
  $T bench conv --threads "$t" --json
  $T bench conv --stride 2 --threads "$t" --json
  if python3 -c "import torch" 2>/dev/null; then
    python3 bench/pytorch_baseline.py --threads "$t" --json 2>/dev/null
  else
    echo "# torch is not importable: no PyTorch baseline" >&2
  fi
done
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
