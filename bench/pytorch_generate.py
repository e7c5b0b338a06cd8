#!/usr/bin/env python3
"""PyTorch baseline for `tapegrad bench generate`: the same GPT as bench/pytorch_gpt.py (its
`build`, nanoGPT's layout) sampling --tokens characters from a one-token prompt under
torch.no_grad(), temperature 1, torch.multinomial, timed two ways:

  no_cache  nanoGPT's `generate`: every token runs the whole forward over the last `context`
            tokens and samples from the last position's logits;
  kv_cache  per layer, the keys and values of the window's positions are kept, and a token runs
            one position; when the window is full it is rebuilt from its last half (one causal
            forward over the last context / 2 tokens, at positions 0..), as tapegrad's Generator
            does (crates/nn/src/gpt/generate.rs).

Usage (needs `pip install torch`):
    python3 bench/pytorch_generate.py --threads 1 [--tokens 500] [--json]

Timings: median, min and max of --reps whole runs (default 5) after one warm-up run.
The vocabulary is the embedded Shakespeare text's, 76 characters.
"""

import argparse
import json
import statistics
import time

from pytorch_gpt import build


def last_logits(model, idx):
    """nanoGPT's inference forward: the blocks over every position, the LM head on the last."""
    import torch

    tr = model.transformer
    x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
    for block in tr.h:
        x = block(x)
    return model.lm_head(tr.ln_f(x[:, -1, :]))


def no_cache_run(model, context, tokens, prompt, gen):
    """nanoGPT's GPT.generate at temperature 1 without top-k."""
    import torch
    import torch.nn.functional as F

    idx = prompt
    for _ in range(tokens):
        logits = last_logits(model, idx[:, -context:])
        probs = F.softmax(logits, dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, 1, generator=gen)), dim=1)
    return idx


class Cache:
    """Per layer, keys and values `[1, heads, context, head_dim]` of the window's positions."""

    def __init__(self, layers, heads, context, head_dim):
        import torch

        shape = (1, heads, context, head_dim)
        self.keys = [torch.zeros(shape) for _ in range(layers)]
        self.values = [torch.zeros(shape) for _ in range(layers)]
        self.window = []


def cached_forward(model, cache, ids, heads):
    """Runs `ids` (a list of token ids) at the window's next positions, storing their keys and
    values, and returns the last position's logits `[1, vocab]`."""
    import torch
    import torch.nn.functional as F

    tr = model.transformer
    start, t = len(cache.window), len(ids)
    idx = torch.tensor([ids])
    x = tr.wte(idx) + tr.wpe(torch.arange(start, start + t))
    e = x.shape[-1]
    d = e // heads
    for layer, block in enumerate(tr.h):
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(e, dim=2)
        q, k, v = (z.view(1, t, heads, d).transpose(1, 2) for z in (q, k, v))
        cache.keys[layer][:, :, start:start + t] = k
        cache.values[layer][:, :, start:start + t] = v
        keys = cache.keys[layer][:, :, :start + t]
        values = cache.values[layer][:, :, :start + t]
        if t == 1:
            y = F.scaled_dot_product_attention(q, keys, values)
        else:
            # Position start + i sees the cached positions and the new ones up to itself.
            mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + block.attn.c_proj(y.transpose(1, 2).contiguous().view(1, t, e))
        x = x + block.mlp(block.ln_2(x))
    cache.window.extend(ids)
    return model.lm_head(tr.ln_f(x[:, -1, :]))


def push(model, cache, token, context, heads):
    """Appends `token`, first rebuilding a full window from its last half; the next logits."""
    if len(cache.window) == context:
        kept = cache.window[-max(context // 2, 1):]
        cache.window = []
        cached_forward(model, cache, kept, heads)
    return cached_forward(model, cache, [token], heads)


def kv_cache_run(model, context, heads, tokens, prompt, gen):
    """The loop of tapegrad's `continue_prompt`: the last token drawn is not pushed."""
    import torch
    import torch.nn.functional as F

    embd = model.transformer.wte.weight.shape[1]
    cache = Cache(len(model.transformer.h), heads, context, embd // heads)
    logits = push(model, cache, prompt, context, heads)
    out = [prompt]
    for drawn in range(1, tokens + 1):
        probs = F.softmax(logits, dim=-1)
        nxt = int(torch.multinomial(probs, 1, generator=gen))
        out.append(nxt)
        if drawn < tokens:
            logits = push(model, cache, nxt, context, heads)
    return out


def check_cache(model, context, heads, vocab):
    """The cached logits equal the full forward's over the same window (sliding included)."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (context + context // 2 + 3,), generator=g).tolist()
    embd = model.transformer.wte.weight.shape[1]
    cache = Cache(len(model.transformer.h), heads, context, embd // heads)
    for i, tok in enumerate(ids):
        got = push(model, cache, tok, context, heads)
        want = last_logits(model, torch.tensor([cache.window]))
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            raise SystemExit(f"kv cache differs from the full forward at token {i}")


def timed(reps, fn):
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    out.sort()
    return statistics.median(out), out[0], out[-1], len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=76)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.vocab, a.context, a.layers, a.embd, a.heads).eval()
    # The newline, first of the sorted vocabulary, as tapegrad's prompt.
    prompt = 0
    with torch.no_grad():
        check_cache(model, a.context, a.heads, a.vocab)
        modes = [
            ("no_cache", lambda g: no_cache_run(
                model, a.context, a.tokens, torch.tensor([[prompt]]), g)),
            ("kv_cache", lambda g: kv_cache_run(
                model, a.context, a.heads, a.tokens, prompt, g)),
        ]
        for mode, run in modes:
            med, lo, hi, n = timed(a.reps, lambda: run(torch.Generator().manual_seed(0)))
            rec = {
                "workload": "generate", "framework": "pytorch", "backend": "pytorch",
                "mode": mode, "threads": a.threads, "tokens": a.tokens, "context": a.context,
                "layers": a.layers, "embd": a.embd, "heads": a.heads,
                "ms_per_step": med * 1e3 / a.tokens, "ms_min": lo * 1e3 / a.tokens,
                "ms_max": hi * 1e3 / a.tokens, "ms_per_run": med * 1e3, "reps": n,
                "tokens_per_s": a.tokens / med,
            }
            if a.json:
                print(json.dumps(rec))
            else:
                print(f"pytorch generate {mode:<8} threads {a.threads}: "
                      f"{a.tokens / med:.0f} tokens/s, {med * 1e3 / a.tokens:.4f} ms/token "
                      f"(min {lo * 1e3 / a.tokens:.4f}, max {hi * 1e3 / a.tokens:.4f}; {n} runs "
                      f"of {a.tokens} tokens)")


if __name__ == "__main__":
    main()
