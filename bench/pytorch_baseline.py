#!/usr/bin/env python3
"""PyTorch CPU baseline for `tapegrad bench`: the same workloads, the same statistics, the same JSON.

Usage (needs `pip install torch`):
    python3 bench/pytorch_baseline.py --threads 1
    python3 bench/pytorch_baseline.py --threads 2 --json

Workloads: an MLP 784-256-128-10 training step (ReLU, softmax cross entropy, SGD) at batch 1, 32, 256;
the tape-overhead chain 1,000 x (x = x * 1.0001 + 0.0001) forward + backward on 1 and 16 elements;
square sgemm at 512 and 1024; conv2d (32, 16, 28, 28) x 32 3x3, padding 1, forward + backward, at
stride 1 and at stride 2 (14 x 14 outputs; JSON key "stride", as `tapegrad bench conv --stride`).
Timings: median, min and max over --reps repetitions after warm-up (default: at least
50 and at least one second, as `tapegrad bench`).
"""

import argparse
import json
import statistics
import time


def timed(reps, fn):
    """Seconds per call: median, min, max (as `tapegrad bench`: with no --reps, at least 50 calls
    and at least one second)."""
    for _ in range(max(3, (reps or 50) // 5)):
        fn()
    out = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if reps is not None and len(out) >= reps:
            break
        if reps is None and (len(out) >= 5000 or (len(out) >= 50 and time.perf_counter() - start >= 1.0)):
            break
    out.sort()
    return statistics.median(out), out[0], out[-1]


def saved_bytes(model, x, y):
    """Bytes autograd keeps for backward in one training forward pass: every tensor it saves,
    each storage counted once (as `tapegrad bench`'s kept_bytes, which also counts the parameters
    and the input; PyTorch saves the weights and the input by reference, so they count here too)."""
    import torch

    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    del loss
    return sum(seen.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=None)
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
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.0)  # tapegrad bench's optimizer
        x = torch.rand(batch, 784) * 2 - 1
        y = torch.randint(0, 10, (batch,))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        med, lo, hi = timed(args.reps, step)
        rows.append({"workload": "mlp", "batch": batch, "threads": args.threads, "backend": "pytorch",
                     "ms_per_step": med * 1e3, "ms_min": lo * 1e3, "ms_max": hi * 1e3,
                     "kept_bytes": saved_bytes(model, x, y)})

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
        med, lo, hi = timed(args.reps, lambda: a @ b)
        flops = 2 * n ** 3
        rows.append({"workload": "matmul", "n": n, "threads": args.threads, "backend": "pytorch",
                     "gflops": flops / med / 1e9, "gflops_min": flops / hi / 1e9, "gflops_max": flops / lo / 1e9})

    # conv2d (32, 16, 28, 28) with 32 3x3 filters, padding 1, bias: forward + backward, at stride 1
    # (28 x 28 outputs) and stride 2 (14 x 14).
    for stride in (1, 2):
        out = (28 + 2 - 3) // stride + 1
        x0 = torch.rand(32, 16, 28, 28) * 2 - 1
        w0 = (torch.rand(32, 16, 3, 3) * 2 - 1) * 0.1
        b0 = (torch.rand(32) * 2 - 1) * 0.1
        seed = torch.rand(32, 32, out, out) * 2 - 1

        def conv():
            x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
            torch.nn.functional.conv2d(x, w, b, stride=stride, padding=1).backward(seed)

        med, lo, hi = timed(args.reps, conv)
        flops = 3 * 2 * 32 * 32 * out * out * 16 * 9
        rows.append({"workload": "conv", "stride": stride, "threads": args.threads, "backend": "pytorch",
                     "ms_per_step": med * 1e3, "ms_min": lo * 1e3, "ms_max": hi * 1e3,
                     "gflops": flops / med / 1e9})

    # The vector instruction set PyTorch's CPU kernels dispatch to, beside tapegrad's `simd` field.
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    for row in rows:
        row["simd"] = capability.lower()
        if args.json:
            print(json.dumps(row))
        else:
            detail = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
            print(detail)


if __name__ == "__main__":
    main()
