#!/usr/bin/env python3
"""PyTorch's side of `cargo bench --bench norms`: layer_norm [64, 4096], batch_norm (training)
and group_norm (8 groups) on [16, 64, 16, 16], f32, one thread, forward + backward (input, weight
and bias gradients) from the same inputs and seed as benches/norms.rs. Prints the minimum and
median milliseconds per call over --rounds rounds of --reps calls each.

Usage: python3 bench/pytorch_norms.py [--reps 200] [--rounds 5] [--json]
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def filled(*dims):
    """(i * 7919 % 1000) / 1000 - 0.5 in row-major order, as benches/norms.rs fills its tensors."""
    n = 1
    for d in dims:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    return (((i * 7919) % 1000).to(torch.float32) / 1000.0 - 0.5).reshape(dims)


def case(name, dims, channels, forward):
    x = filled(*dims).requires_grad_(True)
    w = filled(channels).requires_grad_(True)
    b = filled(channels).requires_grad_(True)
    seed = filled(*dims)

    def call():
        out = forward(x, w, b)
        torch.autograd.grad(out, (x, w, b), seed)

    return name, call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [
        case(
            "layer_norm_64x4096",
            (64, 4096),
            4096,
            lambda x, w, b: F.layer_norm(x, (4096,), w, b, 1e-5),
        ),
        case(
            "batch_norm_16x64x16x16",
            (16, 64, 16, 16),
            64,
            lambda x, w, b: F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
        ),
        case(
            "group_norm_16x64x16x16",
            (16, 64, 16, 16),
            64,
            lambda x, w, b: F.group_norm(x, 8, w, b, 1e-5),
        ),
    ]
    for name, call in cases:
        for _ in range(20):
            call()
        times = []
        for _ in range(args.rounds):
            for _ in range(args.reps):
                start = time.perf_counter()
                call()
                times.append((time.perf_counter() - start) * 1e3)
        row = {
            "workload": name,
            "backend": "pytorch",
            "threads": 1,
            "ms_min": min(times),
            "ms_median": statistics.median(times),
            "reps": len(times),
            "torch": torch.__version__,
        }
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{name:26} min {row['ms_min']:.3f} ms  median {row['ms_median']:.3f} ms")


if __name__ == "__main__":
    main()
