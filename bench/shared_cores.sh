#!/usr/bin/env bash
# The MLP step with and without a busy process beside it (`while True: pass` in Python: one more
# runnable thread than cores on a 2-core machine), ours and PyTorch's, alternating quiet and busy
# runs so both see the same phases of the machine. Prints one line per run: the mode, then our
# and PyTorch's median and best step in ms.
# Usage: bench/shared_cores.sh [ROUNDS] [BATCH] [THREADS]   (default: 3 256 2; needs torch)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; batch=${2:-256}; threads=${3:-2}
cargo build --release --quiet --bin tapegrad
T=target/release/tapegrad
hog= step_py=
# A busy process left behind would skew every later measurement.
cleanup() { if [ -n "$hog" ]; then kill "$hog" 2>/dev/null || true; fi; rm -f "$step_py"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
step_py=$(mktemp)
cat > "$step_py" <<'PY'
import sys, time, statistics, torch
threads, batch = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads); torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                            torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.0)
x = torch.rand(batch, 784) * 2 - 1; y = torch.randint(0, 10, (batch,))
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(20): step()
out = []; start = time.perf_counter()
while len(out) < 50 or time.perf_counter() - start < 1.0:
    t0 = time.perf_counter(); step(); out.append(time.perf_counter() - t0)
print(f"{statistics.median(out) * 1e3:.3f} {min(out) * 1e3:.3f}")
PY
torch_step() { python3 "$step_py" "$threads" "$batch" 2>/dev/null; }
ours_step() {
  $T bench mlp --batch "$batch" --threads "$threads" --json |
    python3 -c "import sys, json; d = json.loads(sys.stdin.readline()); print(f\"{d['ms_per_step']:.3f} {d['ms_min']:.3f}\")"
}
echo "# batch $batch, $threads threads: mode, ours median best, PyTorch median best (ms)"
for _ in $(seq "$rounds"); do
  for mode in quiet busy busy quiet; do
    hog=
    if [ "$mode" = busy ]; then python3 -c 'while True: pass' & hog=$!; sleep 0.3; fi
    line="$mode ours $(ours_step) torch $(torch_step)"
    [ -n "$hog" ] && kill "$hog"
    hog=
    echo "$line"
  done
done
