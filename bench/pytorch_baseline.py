#!/usr/bin/env python3
"""PyTorch CPU baseline for `tapegrad bench`: the same workloads, the same statistics, the same JSON.

Usage (needs `pip install torch`):
    python3 bench/pytorch_baseline.py --threads 1
    python3 bench/pytorch_baseline.py --threads 2 --json

Workloads: an MLP 784-256-128-10 training step (ReLU, softmax cross entropy, SGD) at batch 1, 32, 256;
the tape-overhead chain 1,000 x (x = x * 1.0001 + 0.0001) forward + backward on 1 and 16 elements;
square sgemm at 512 and 1024. Timings: median, min and max over --reps repetitions after warm-up.
"""

import argparse
import json
import statistics
import time


def timed(reps, fn):
    for _ in range(reps // 5 + 1):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    out.sort()
    return statistics.median(out), out[0], out[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []

    for batch in (1, 32, 256):
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.rand(batch, 784) * 2 - 1
        y = torch.randint(0, 10, (batch,))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        med, lo, hi = timed(args.reps, step)
        rows.append({"workload": "mlp", "batch": batch, "threads": args.threads, "backend": "pytorch",
                     "ms_per_step": med * 1e3, "ms_min": lo * 1e3, "ms_max": hi * 1e3})

    for numel in (1, 16):
        x0 = torch.ones(numel)

        def chain():
            x = x0.clone().requires_grad_(True)
            y = x
            for _ in range(1000):
                y = y * 1.0001 + 0.0001
            y.backward(torch.ones(numel))

        med, lo, hi = timed(args.reps, chain)
        rows.append({"workload": "chain", "numel": numel, "threads": args.threads, "backend": "pytorch",
                     "us_per_op": med * 1e6 / 2000, "us_min": lo * 1e6 / 2000, "us_max": hi * 1e6 / 2000})

    for n in (512, 1024):
        a = torch.rand(n, n)
        b = torch.rand(n, n)
        med, lo, hi = timed(max(args.reps // 3, 3), lambda: a @ b)
        flops = 2 * n ** 3
        rows.append({"workload": "matmul", "n": n, "threads": args.threads, "backend": "pytorch",
                     "gflops": flops / med / 1e9, "gflops_min": flops / hi / 1e9, "gflops_max": flops / lo / 1e9})

    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            detail = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
            print(detail)


if __name__ == "__main__":
    main()
