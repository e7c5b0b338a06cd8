#!/usr/bin/env python3
"""PyTorch DistributedDataParallel baseline for `mpiexec -n N tapegrad train --distributed`.

The same training step as tapegrad's presets, timed in one process at the global batch and under
DDP (gloo backend, CPU) on N processes with `batch / N` rows each:

    mlp: Linear(64, 128) - ReLU - Linear(128, 10)                          (9,610 parameters)
    cnn: Conv(1, 16, 3, pad 1) - BatchNorm - ReLU - MaxPool(2)
         - Conv(16, 32, 3, pad 1) - BatchNorm - ReLU - MaxPool(2) - Flatten - Linear(128, 10)
                                                                            (6,186 parameters)

    gpt: the `train gpt` preset's model (bench/pytorch_gpt.py: 4 layers, 4 heads, width 128,
         context 64, a vocabulary of 76 characters)                        (818,176 parameters)

cross entropy, f32, on random inputs (8x8 images, or token windows for gpt; the timing does not
depend on the values); Adam (lr 1e-3) for mlp and cnn, and for gpt the preset's AdamW (lr 1e-3,
betas 0.9/0.99, weight decay 0.1) after clipping the gradient's norm to 1. DDP keeps its defaults
(25 MiB buckets, overlap with the backward, all-reduce).

Usage (/work/venv/bin/python has torch):
    python bench/ddp_pytorch.py --model cnn --batch 32 --threads 1
    python bench/ddp_pytorch.py --model mlp --batch 256 --procs 2 --json
    python bench/ddp_pytorch.py --model gpt --batch 32 --steps 40 --warmup 5

Prints the median step time (and min, max) of each mode; each process runs --threads threads.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

# The gpt preset's sizes, as `tapegrad train gpt` (its vocabulary: the embedded text's characters).
GPT = dict(vocab=76, context=64, layers=4, embd=128, heads=4)


def build(name):
    import torch.nn as nn

    if name == "gpt":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from pytorch_gpt import build as build_gpt

        return build_gpt(**GPT)
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def batch(name, rows, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    if name == "gpt":
        windows = (rows, GPT["context"])
        x = torch.randint(0, GPT["vocab"], windows, generator=g)
        return x, torch.randint(0, GPT["vocab"], windows, generator=g)
    shape = (rows, 64) if name == "mlp" else (rows, 1, 8, 8)
    return torch.randn(shape, generator=g), torch.randint(0, 10, (rows,), generator=g)


def run_steps(name, model, x, y, steps, warmup, sync=None):
    """Seconds per optimizer step: the list over `steps` timed steps after `warmup`."""
    import torch
    import torch.nn.functional as F

    if name == "gpt":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for i in range(warmup + steps):
        if sync is not None and i == warmup:
            sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        if name == "gpt":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def summary(times):
    s = sorted(times)
    return {
        "median_ms": statistics.median(s) * 1e3,
        "min_ms": s[0] * 1e3,
        "max_ms": s[-1] * 1e3,
        "mean_ms": sum(s) / len(s) * 1e3,
    }


def one_process(args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(args.model)
    x, y = batch(args.model, args.batch, 1)
    return summary(run_steps(args.model, model, x, y, args.steps, args.warmup))


def rank_main(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.procs
    )
    torch.manual_seed(0)
    model = DDP(build(args.model))
    # Rank k's share of the global batch (the extra rows to the first ranks, as tapegrad).
    q, r = divmod(args.batch, args.procs)
    x, y = batch(args.model, q + (1 if rank < r else 0), 1 + rank)
    times = run_steps(args.model, model, x, y, args.steps, args.warmup, sync=dist.barrier)
    dist.barrier()
    if rank == 0:
        queue.put(summary(times))
    dist.destroy_process_group()


def ddp(args):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, port, queue)) for r in range(args.procs)]
    for p in procs:
        p.start()
    result = queue.get()
    for p in procs:
        p.join()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="cnn")
    p.add_argument("--batch", type=int, default=32, help="global batch (rows per step)")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per process")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    one = one_process(args)
    many = ddp(args)
    out = {
        "model": args.model,
        "batch": args.batch,
        "procs": args.procs,
        "threads": args.threads,
        "one_process": one,
        "ddp": many,
        "speedup_median": one["median_ms"] / many["median_ms"],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.model}, global batch {args.batch}, {args.threads} thread(s) per process: "
            f"1 process {one['median_ms']:.3f} ms/step (min {one['min_ms']:.3f}); "
            f"DDP gloo x{args.procs} {many['median_ms']:.3f} ms/step (min {many['min_ms']:.3f}); "
            f"speedup {out['speedup_median']:.2f}x"
        )


if __name__ == "__main__":
    main()
