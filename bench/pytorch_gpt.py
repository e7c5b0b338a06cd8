#!/usr/bin/env python3
"""PyTorch baseline for `tapegrad bench gpt`: the same GPT (nanoGPT's layout: nn.Linear,
F.scaled_dot_product_attention(is_causal=True), exact GELU, pre-norm blocks, LM head without bias),
the same training step (forward, cross entropy, backward, clip_grad_norm_ 1.0, AdamW lr 1e-3,
betas 0.9/0.99, weight decay 0.1), timed eager and with torch.compile, and the bytes autograd
saves for backward (torch.autograd.graph.saved_tensors_hooks, each storage once).

Usage (needs `pip install torch`):
    python3 bench/pytorch_gpt.py --threads 1 [--compile] [--json]
    python3 bench/pytorch_gpt.py --batch 32 --context 64 --layers 4 --embd 128 --heads 4

Timings: median, min and max over --reps repetitions after warm-up (default: at least 20 and at
least 3 seconds). The vocabulary is the embedded Shakespeare text's, 76 characters.
"""

import argparse
import json
import math
import statistics
import time


def build(vocab, context, layers, embd, heads):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(embd, 3 * embd)
            self.c_proj = nn.Linear(embd, embd)

        def forward(self, x):
            b, t, e = x.shape
            q, k, v = self.c_attn(x).split(embd, dim=2)
            q, k, v = (z.view(b, t, heads, e // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, e))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(embd, 4 * embd)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * embd, embd)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(embd)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(embd)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, embd),
                wpe=nn.Embedding(context, embd),
                h=nn.ModuleList([Block() for _ in range(layers)]),
                ln_f=nn.LayerNorm(embd),
            ))
            self.lm_head = nn.Linear(embd, vocab, bias=False)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)
                elif "ln_" in name:
                    nn.init.ones_(p)
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            t = idx.shape[1]
            pos = torch.arange(t, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return Gpt()


def timed(reps, fn):
    for _ in range(5):
        fn()
    out = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if reps is not None and len(out) >= reps:
            break
        if reps is None and len(out) >= 20 and time.perf_counter() - start >= 3.0:
            break
    out.sort()
    return statistics.median(out), out[0], out[-1], len(out)


def saved_bytes(model, x, y):
    """Bytes autograd keeps for backward in one training forward pass, each storage once (as
    `tapegrad bench gpt`'s kept_bytes, which counts the parameters and the batch too)."""
    import torch
    import torch.nn.functional as F

    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    del loss
    return sum(seen.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=76)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="time torch.compile's model too")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.vocab, a.context, a.layers, a.embd, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)

    def step_of(m):
        def step():
            logits = m(x)
            loss = F.cross_entropy(logits.view(-1, a.vocab), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        return step

    tokens = a.batch * a.context
    weights = 12 * a.layers * a.embd ** 2 + a.vocab * a.embd
    flops = tokens * (6 * weights + 12 * a.layers * a.context * a.embd)
    kinds = [("eager", model)]
    if a.compile:
        kinds.append(("compiled", torch.compile(model)))
    for kind, m in kinds:
        med, lo, hi, n = timed(a.reps, step_of(m))
        rec = {
            "workload": "gpt", "framework": "pytorch", "mode": kind, "threads": a.threads,
            "batch": a.batch, "context": a.context, "layers": a.layers, "embd": a.embd,
            "heads": a.heads, "ms_per_step": med * 1e3, "ms_min": lo * 1e3, "ms_max": hi * 1e3,
            "reps": n, "tokens_per_s": tokens / med, "gflops": flops / med / 1e9,
            "saved_bytes": saved_bytes(model, x, y),
            "simd": str(getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")()).lower(),
        }
        if a.json:
            print(json.dumps(rec))
        else:
            print(f"pytorch {kind:<8} threads {a.threads}: {med * 1e3:.2f} ms/step "
                  f"(min {lo * 1e3:.2f}, max {hi * 1e3:.2f}; {n} reps), "
                  f"{tokens / med:.0f} tokens/s, {flops / med / 1e9:.1f} GFLOP/s, "
                  f"{rec['saved_bytes']} bytes saved for backward")


if __name__ == "__main__":
    main()
