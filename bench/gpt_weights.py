#!/usr/bin/env python3
"""GPT weights between tapegrad and PyTorch, both ways, with nanoGPT's module and names.

    # PyTorch -> tapegrad: a PyTorch-initialised model's state_dict as safetensors, then train from it
    python3 bench/gpt_weights.py export --out init.safetensors [--layers 4 --heads 4 --embd 128
        --context 64] [--text FILE] [--tie] [--seed 0]
    tapegrad train gpt --init-from init.safetensors [--tie-weights] --save gpt.st

    # tapegrad -> PyTorch: load a tapegrad checkpoint's tensors with load_state_dict(strict=True)
    # and compare the validation loss on tapegrad's fixed windows with `tapegrad eval --load`
    python3 bench/gpt_weights.py check --load gpt.st [--tapegrad target/release/tapegrad]

    # Both: export, `train gpt --init-from` for --steps steps (0: the weights must come back
    # bit for bit), then check
    python3 bench/gpt_weights.py roundtrip [--steps 20] [--tie] [--layers 1 --embd 32 ...]

    # The test fixture (crates/nn/tests/fixtures/gpt_tiny.{safetensors,json}), PyTorch's logits,
    # loss and some gradients for a fixed batch, in f64 from the f32 weights
    python3 bench/gpt_weights.py fixture --out-dir crates/nn/tests/fixtures

The module is nanoGPT's (model.py, bias=True): LayerNorm with bias, one fused c_attn Linear,
F.scaled_dot_product_attention(is_causal=True), exact GELU, dropout where nanoGPT has it, LM head
without bias, the token embedding optionally tied to it, GPT-2's initialisation. The vocabulary
is the text's sorted distinct characters, as tapegrad's; its last 10% is the validation part.
Needs torch and safetensors.
"""

import argparse
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nanogpt(vocab, context, layers, heads, embd, dropout=0.0, tie=False):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LayerNorm(nn.Module):
        def __init__(self, ndim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim))

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(embd, 3 * embd)
            self.c_proj = nn.Linear(embd, embd)
            self.resid_dropout = nn.Dropout(dropout)

        def forward(self, x):
            b, t, e = x.size()
            q, k, v = self.c_attn(x).split(embd, dim=2)
            q, k, v = (z.view(b, t, heads, e // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout if self.training else 0.0, is_causal=True
            )
            y = y.transpose(1, 2).contiguous().view(b, t, e)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(embd, 4 * embd)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * embd, embd)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm(embd)
            self.attn = CausalSelfAttention()
            self.ln_2 = LayerNorm(embd)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, embd),
                wpe=nn.Embedding(context, embd),
                drop=nn.Dropout(dropout),
                h=nn.ModuleList([Block() for _ in range(layers)]),
                ln_f=LayerNorm(embd),
            ))
            self.lm_head = nn.Linear(embd, vocab, bias=False)
            if tie:
                self.transformer.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return GPT()


def read_text(path):
    """The text of a `--text` file, or the embedded Shakespeare plays."""
    if path is None:
        with gzip.open(os.path.join(ROOT, "data", "shakespeare.txt.gz"), "rb") as f:
            return f.read().decode("utf-8")
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def vocab_of(text):
    return sorted(set(text))


def metadata(vocab, context, layers, heads, embd):
    return {
        "n_layer": str(layers), "n_head": str(heads), "n_embd": str(embd),
        "block_size": str(context), "vocab_size": str(len(vocab)),
        "vocab": json.dumps("".join(vocab), ensure_ascii=False),
        "source": "bench/gpt_weights.py",
    }


def save_state_dict(model, path, meta, tie):
    """safetensors of model.state_dict(): a tied table is stored once (save_model drops the
    duplicate name and records it in the metadata), as PyTorch users save tied models."""
    from safetensors.torch import save_file, save_model
    if tie:
        save_model(model, path, metadata=meta)
    else:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path, metadata=meta)


def cmd_export(a):
    import torch
    torch.manual_seed(a.seed)
    vocab = vocab_of(read_text(a.text))
    model = nanogpt(len(vocab), a.context, a.layers, a.heads, a.embd, tie=a.tie)
    save_state_dict(model, a.out, metadata(vocab, a.context, a.layers, a.heads, a.embd), a.tie)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: nanoGPT {a.layers} layers, {a.heads} heads, width {a.embd}, "
          f"context {a.context}, vocab {len(vocab)}, {n} parameters{', tied' if a.tie else ''}")
    return model


def load_tapegrad(path):
    """A tapegrad gpt checkpoint: its config, vocabulary and parameters (names without `model.`)."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        if meta.get("preset") != "gpt":
            sys.exit(f"{path}: not a tapegrad gpt checkpoint (metadata preset {meta.get('preset')!r})")
        params = {k[len("model."):]: f.get_tensor(k) for k in f.keys() if k.startswith("model.")}
    return json.loads(meta["config"]), json.loads(meta["vocab"]), meta["dtype"], params


def validation_loss(model, ids, context, windows=256, batch=32):
    """tapegrad's validation loss: the mean cross entropy over `windows` fixed windows spread
    evenly over the last 10% of the text (crates/nn/src/data/text.rs, val_batches)."""
    import torch
    import torch.nn.functional as F
    n = len(ids)
    val = ids[n - n // 10:]
    last = len(val) - (context + 1)
    count = max(1, min(windows, last + 1))
    starts = [0 if count == 1 else i * last // (count - 1) for i in range(count)]
    total, chars = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts), batch):
            s = starts[i:i + batch]
            x = torch.tensor([val[j:j + context] for j in s])
            y = torch.tensor([val[j + 1:j + context + 1] for j in s])
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                     reduction="sum").item()
            chars += y.numel()
    return total / chars


def cmd_check(a):
    import torch
    config, vocab, dtype, params = load_tapegrad(a.load)
    m = config["model"]
    tie = m["tie_weights"]
    model = nanogpt(m["vocab"], m["context"], m["layers"], m["heads"], m["embd"], tie=tie)
    if dtype == "f64":
        model = model.double()
    if tie:
        params["lm_head.weight"] = params["transformer.wte.weight"]
    model.load_state_dict(params, strict=True)
    print(f"{a.load}: {len(params)} tensors loaded into nanoGPT's module with "
          f"load_state_dict(strict=True) ({dtype})")
    text_cfg = config["text"]
    text = read_text(text_cfg.get("path") if text_cfg["kind"] == "file" else None)
    index = {c: i for i, c in enumerate(vocab)}
    ids = [index[c] for c in text]
    torch.set_num_threads(1)
    ours = validation_loss(model, ids, m["context"], config["val_windows"], config["batch_size"])
    out = subprocess.run([a.tapegrad, "eval", "--load", a.load], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tapegrad eval failed: {out.stderr.strip()}")
    theirs = float(re.search(r"loss ([0-9.eE+-]+) nats/char", out.stdout).group(1))
    diff = abs(ours - theirs)
    # eval prints 6 decimals; f32 sums over 16,384 characters in another order: 1e-5 is ample.
    tol = 2e-5 if dtype == "f32" else 1e-6
    print(f"validation loss: PyTorch {ours:.6f}, tapegrad eval {theirs:.6f}, "
          f"difference {diff:.1e} (tolerance {tol:.0e})")
    if diff > tol:
        sys.exit("the two disagree")
    return params


def cmd_roundtrip(a):
    import torch
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init.safetensors")
        a.out = init
        model = cmd_export(a)
        st = os.path.join(d, "gpt.st")
        flags = ["--layers", str(a.layers), "--heads", str(a.heads), "--embd", str(a.embd),
                 "--context", str(a.context), "--steps", str(a.steps), "--quiet"]
        if a.text:
            flags += ["--text", a.text]
        if a.tie:
            flags.append("--tie-weights")
        cmd = [a.tapegrad, "train", "gpt", "--init-from", init, "--save", st] + flags
        print("$ " + " ".join(cmd))
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"tapegrad train failed: {out.stderr.strip()}")
        a.load = st
        params = cmd_check(a)
        if a.steps == 0:
            want = model.state_dict()
            for name, t in params.items():
                if not torch.equal(t, want[name]):
                    sys.exit(f"{name} did not come back bit for bit")
            print(f"after 0 steps all {len(params)} tensors are PyTorch's, bit for bit")


def cmd_fixture(a):
    """A tiny model's f32 weights (moved off their initial values so every gradient takes part)
    and PyTorch's logits, loss and some gradients for a fixed batch, computed in f64 from those
    weights."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    torch.manual_seed(1234)
    vocab, context, layers, heads, embd, batch = 11, 8, 2, 2, 16, 2
    model = nanogpt(vocab, context, layers, heads, embd)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.empty_like(p).uniform_(-0.3, 0.3))
    os.makedirs(a.out_dir, exist_ok=True)
    weights = os.path.join(a.out_dir, "gpt_tiny.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights,
              metadata={"n_head": str(heads), "source": "bench/gpt_weights.py fixture"})
    x = torch.randint(0, vocab, (batch, context))
    y = torch.randint(0, vocab, (batch, context))
    m64 = model.double()
    logits = m64(x).reshape(-1, vocab)
    loss = F.cross_entropy(logits, y.reshape(-1))
    loss.backward()
    named = dict(m64.named_parameters())
    picked = ["transformer.wpe.weight", "transformer.h.0.attn.c_attn.bias",
              "transformer.h.1.mlp.c_fc.bias", "transformer.ln_f.weight"]
    record = {
        "about": "PyTorch " + torch.__version__ + ": nanoGPT's module (bench/gpt_weights.py) with "
                 "the f32 weights of gpt_tiny.safetensors, evaluated in f64",
        "config": {"vocab": vocab, "context": context, "layers": layers, "heads": heads,
                   "embd": embd, "mlp_ratio": 4, "tie_weights": False},
        "x": x.tolist(),
        "y": y.reshape(-1).tolist(),
        "logits": logits.detach().reshape(-1).tolist(),
        "loss": loss.item(),
        "grads": {n: named[n].grad.reshape(-1).tolist() for n in picked},
    }
    path = os.path.join(a.out_dir, "gpt_tiny.json")
    with open(path, "w") as f:
        json.dump(record, f)
        f.write("\n")
    os.chmod(weights, 0o644)
    print(f"wrote {weights} ({os.path.getsize(weights)} bytes) and {path} "
          f"({os.path.getsize(path)} bytes); loss {loss.item():.6f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def sizes(q):
        q.add_argument("--layers", type=int, default=4)
        q.add_argument("--heads", type=int, default=4)
        q.add_argument("--embd", type=int, default=128)
        q.add_argument("--context", type=int, default=64)
        q.add_argument("--text", default=None, help="a UTF-8 text (default: the embedded plays)")
        q.add_argument("--tie", action="store_true", help="tie lm_head to the token embedding")
        q.add_argument("--seed", type=int, default=0)

    binary = os.path.join(ROOT, "target", "release", "tapegrad")
    e = sub.add_parser("export")
    sizes(e)
    e.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--load", required=True)
    c.add_argument("--tapegrad", default=binary)
    r = sub.add_parser("roundtrip")
    sizes(r)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--tapegrad", default=binary)
    f = sub.add_parser("fixture")
    f.add_argument("--out-dir", default=os.path.join(ROOT, "crates", "nn", "tests", "fixtures"))
    a = p.parse_args()
    {"export": cmd_export, "check": cmd_check, "roundtrip": cmd_roundtrip,
     "fixture": cmd_fixture}[a.cmd](a)


if __name__ == "__main__":
    main()
