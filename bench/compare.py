#!/usr/bin/env python3
"""Ratios of tapegrad to PyTorch from `bench/run_all.sh` output, checked against issue #7's targets.

Usage: bench/run_all.sh 1 2 > run1.jsonl; ... ; python3 bench/compare.py run1.jsonl [run2.jsonl ...]
Each file is one run (ours and PyTorch one after the other, so each ratio compares like with like);
with several files every cell lists one figure per run, because timings on a shared VM drift.
Standard library only.
"""

import json
import sys

# Targets of issue #7, as ours / PyTorch's time: MLP by (batch, threads), and the chain per op.
MLP_TARGETS = {(1, 1): 0.35, (32, 1): 0.5, (256, 1): 0.65, (256, 2): 0.7}
CHAIN_TARGET = 0.02
SIZE_KEY = {"mlp": "batch", "chain": "numel", "matmul": "n", "conv": "stride"}
# The size a row without its key has: conv rows from before `--stride` are stride 1.
SIZE_DEFAULT = {"conv": 1}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def find(rows, workload, size, threads, backend):
    key = SIZE_KEY.get(workload)
    for r in rows:
        if (
            r["workload"] == workload
            and r["threads"] == threads
            and r["backend"] == backend
            and (key is None or r.get(key, SIZE_DEFAULT.get(workload)) == size)
        ):
            return r
    return None


def figure(r):
    """The figure to compare: time (lower is better) or GFLOP/s (higher is better)."""
    if r is None:
        return None
    if "ms_per_step" in r:
        return r["ms_per_step"]
    if "us_per_op" in r:
        return r["us_per_op"]
    return r.get("gflops")


def ratio_cell(runs, workload, size, threads, backend, target, higher_is_better=False):
    ratios = []
    for rows in runs:
        ours = figure(find(rows, workload, size, threads, backend))
        torch = figure(find(rows, workload, size, threads, "pytorch"))
        if ours is None or not torch:
            ratios.append(None)
            continue
        ratios.append(torch / ours if higher_is_better else ours / torch)
    shown = " ".join("-" if r is None else "%.2f" % r for r in ratios)
    if target is None or any(r is None for r in ratios):
        return shown, ""
    met = all((r >= target) if higher_is_better else (r <= target) for r in ratios)
    some = any((r >= target) if higher_is_better else (r <= target) for r in ratios)
    verdict = "met" if met else ("met in some runs" if some else "missed")
    return shown, verdict


def floor_cell(peak_gflops, flops, ours, torch_ms, digits=3):
    """The peak, the share of it `ours` (a step's record) reaches, the floor (`flops` at the peak)
    and, when PyTorch's median step is known, the best ratio to it that the floor allows."""
    floor_ms = flops / (peak_gflops * 1e9) * 1e3
    cell = "peak %.0f GFLOP/s, ours at %.0f%% of it (best rep %.0f%%), floor %.*f ms" % (
        peak_gflops,
        100 * floor_ms / ours["ms_per_step"],
        100 * floor_ms / ours["ms_min"],
        digits,
        floor_ms,
    )
    if torch_ms:
        cell += ", best ratio %.2f" % (floor_ms / torch_ms)
    return cell


def ceiling_cell(rows, batch, threads):
    """Peak GFLOP/s, our MLP step's share of it, the floor time and the best ratio it allows."""
    peak = find(rows, "peak", None, threads, "eager")
    ours = find(rows, "mlp", batch, threads, "eager")
    torch = figure(find(rows, "mlp", batch, threads, "pytorch"))
    if peak is None or ours is None or "gemm_flops" not in ours:
        return "-"
    return floor_cell(peak["gflops"], ours["gemm_flops"], ours, torch)


def main(paths):
    runs = [load(p) for p in paths]
    threads = sorted({r["threads"] for rows in runs for r in rows})
    print("| workload | threads | eager / PyTorch | compiled / PyTorch | target | verdict |")
    print("|---|---|---|---|---|---|")
    for t in threads:
        for batch in (1, 32, 256):
            target = MLP_TARGETS.get((batch, t))
            e, ev = ratio_cell(runs, "mlp", batch, t, "eager", target)
            c, cv = ratio_cell(runs, "mlp", batch, t, "compiled", target)
            verdict = "eager %s, compiled %s" % (ev, cv) if target else ""
            shown = "<= %.2f" % target if target else ""
            print(f"| mlp batch {batch} | {t} | {e} | {c} | {shown} | {verdict} |")
        for numel in (1, 16):
            e, ev = ratio_cell(runs, "chain", numel, t, "eager", CHAIN_TARGET)
            print(f"| chain numel {numel}, per op | {t} | {e} | | <= {CHAIN_TARGET} | {ev} |")
        for n in (512, 1024):
            # Figures are GFLOP/s here, so the plain quotient is ours / PyTorch's speed. The issue's
            # sgemm target is against the Rust GEMM crates: bench/gemm_peers measures that.
            e, _ = ratio_cell(runs, "matmul", n, t, "eager", None)
            print(f"| sgemm {n} (GFLOP/s ours / PyTorch) | {t} | {e} | | | |")
        for stride in (1, 2):
            e, _ = ratio_cell(runs, "conv", stride, t, "eager", None)
            print(f"| conv2d stride {stride} fwd + bwd | {t} | {e} | | | |")
    print()
    print("Vector instruction sets (one per run, ours / PyTorch's):")
    for rows in runs:
        ours = sorted({r.get("simd", "?") for r in rows if r["backend"] != "pytorch"})
        torch = sorted({r.get("simd", "?") for r in rows if r["backend"] == "pytorch"})
        print(f"  {','.join(ours) or '-'} / {','.join(torch) or '-'}")
    print()
    print("The ceiling: this machine's f32 FMA peak (`tapegrad bench peak`) and what it allows, per run.")
    print("'floor' is the step's matrix products at that peak with nothing else (gemm_flops / peak);")
    print("'best ratio' is floor / PyTorch's median: no code reaches a lower ratio on this machine.")
    for t in threads:
        for batch in (1, 32, 256):
            target = MLP_TARGETS.get((batch, t))
            cells = []
            for rows in runs:
                cells.append(ceiling_cell(rows, batch, t))
            shown = " target <= %.2f:" % target if target else ":"
            print(f"  threads {t} batch {batch}{shown} {'; '.join(cells)}")
    print()
    print("Compiled against eager (median ms per step, one figure per run):")
    for t in threads:
        for batch in (1, 32, 256):
            cells = []
            for rows in runs:
                e = figure(find(rows, "mlp", batch, t, "eager"))
                c = figure(find(rows, "mlp", batch, t, "compiled"))
                cells.append("-" if e is None or c is None else "%.3f/%.3f" % (c, e))
            print(f"  threads {t} batch {batch}: compiled/eager {' '.join(cells)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
