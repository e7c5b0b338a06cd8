#!/usr/bin/env python3
"""Ratios of tapegrad's GPT training step to PyTorch's from `bench/gpt_pair.sh` output, checked
against issue #23's targets, with the floor the machine's FMA peak sets.

Usage: bench/gpt_pair.sh 1 2 > run1.jsonl; ... ; python3 bench/gpt_compare.py run1.jsonl [...]
Each file is one run (ours and PyTorch one after the other); with several files every cell lists
one figure per run. Standard library only.
"""

import json
import sys

from compare import floor_cell

# Issue #23, as ours / PyTorch's: eager against eager, compiled against torch.compile, and the
# bytes the compiled backend keeps for its backward against the tensors autograd saves.
EAGER_TARGET = 0.6
COMPILED_TARGET = 0.8
BYTES_TARGET = 0.7


def load(path):
    rows = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if r.get("framework") == "pytorch":
                    r["backend"] = "torch " + r["mode"]
                rows.append(r)
    except OSError as e:
        sys.exit(f"gpt_compare.py: {path}: {e.strerror}")
    except (json.JSONDecodeError, KeyError) as e:
        sys.exit(f"gpt_compare.py: {path}, line {number}: not a bench/gpt_pair.sh record ({e})")
    return rows


def find(rows, workload, threads, backend):
    for r in rows:
        same_run = r.get("workload") == workload and r.get("threads") == threads
        if same_run and r.get("backend", "eager") == backend:
            return r
    return None


def product_flops(r):
    """The step's matrix-product flops with the causal mask's zero half of attention skipped:
    `flops` counts every product of the step, attention's scores and weighted sums whole."""
    tokens = r["batch"] * r["context"]
    whole_attention = 12.0 * r["layers"] * r["context"] * r["embd"] * tokens
    return r["flops"] - whole_attention / 2


def ratios(runs, threads, ours, theirs, key="ms_per_step"):
    out = []
    for rows in runs:
        a, b = find(rows, "gpt", threads, ours), find(rows, "gpt", threads, theirs)
        out.append(None if a is None or b is None else a[key] / b[key])
    return out


def verdict(values, target):
    if not values or any(v is None for v in values):
        return "-"
    met = [v <= target for v in values]
    return "met" if all(met) else ("met in some runs" if any(met) else "missed")


def shown(values):
    return " ".join("-" if v is None else "%.2f" % v for v in values)


def main(paths):
    runs = [load(p) for p in paths]
    threads = sorted({r.get("threads") for rows in runs for r in rows if r.get("workload") == "gpt"})
    print("| threads | eager / PyTorch eager | target | compiled / torch.compile | target |")
    print("|---|---|---|---|---|")
    for t in threads:
        e = ratios(runs, t, "eager", "torch eager")
        c = ratios(runs, t, "compiled", "torch compiled")
        print(
            f"| {t} | {shown(e)} | <= {EAGER_TARGET}: {verdict(e, EAGER_TARGET)} "
            f"| {shown(c)} | <= {COMPILED_TARGET}: {verdict(c, COMPILED_TARGET)} |"
        )
    print()
    print("Median ms per step (ours eager, ours compiled, PyTorch eager, torch.compile), one line per run:")
    for t in threads:
        for rows in runs:
            cells = []
            for b in ("eager", "compiled", "torch eager", "torch compiled"):
                r = find(rows, "gpt", t, b)
                cells.append("-" if r is None else "%.1f" % r["ms_per_step"])
            print(f"  threads {t}: {' / '.join(cells)}")
    print()
    b = []
    for rows in runs:
        kept = [r["kept_bytes"] for r in rows if r.get("workload") == "gpt" and r.get("backend") == "compiled"]
        saved = [r["saved_bytes"] for r in rows if r.get("workload") == "gpt" and r.get("framework") == "pytorch"]
        b.append(kept[0] / saved[0] if kept and saved else None)
    print(f"Bytes kept for backward, compiled / PyTorch's saved tensors: {shown(b)} "
          f"(target <= {BYTES_TARGET}: {verdict(b, BYTES_TARGET)})")
    print()
    print("The ceiling: this machine's f32 FMA peak (`tapegrad bench peak`) and what it allows, per run.")
    print("'floor' is the step's matrix products (attention's causal half skipped) at that peak with")
    print("nothing else ('ours' is our eager step); 'best ratio' is floor / PyTorch eager's median.")
    for t in threads:
        cells = []
        for rows in runs:
            peak = find(rows, "peak", t, "eager")
            ours = find(rows, "gpt", t, "eager")
            torch = find(rows, "gpt", t, "torch eager")
            if peak is None or ours is None:
                cells.append("-")
                continue
            torch_ms = torch["ms_per_step"] if torch else None
            cells.append(floor_cell(peak["gflops"], product_flops(ours), ours, torch_ms, digits=1))
        print(f"  threads {t}: {'; '.join(cells)}")
    print()
    print("Vector instruction sets (one per run, ours / PyTorch's):")
    for rows in runs:
        ours = sorted({r.get("simd", "?") for r in rows if "framework" not in r})
        torch = sorted({r.get("simd", "?") for r in rows if "framework" in r})
        print(f"  {','.join(ours) or '-'} / {','.join(torch) or '-'}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
