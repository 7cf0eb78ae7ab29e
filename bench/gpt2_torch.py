#!/usr/bin/env python3
"""GPT-2 in PyTorch, the same model as bench/gpt2.c (FLAME), for bench/run.py's T3/T5 tiers.

Parameter names and layouts are nanoGPT's (transformer.wte.weight [V, d], transformer.h.<l>.attn.
c_attn.weight [3d, d] as nn.Linear, ...); the head is tied to wte (F.linear with wte's weight, no
separate parameter). Pre-LayerNorm blocks, causal F.scaled_dot_product_attention, GELU (tanh) MLP,
mean cross-entropy. Training: f32 parameters, forward and loss under torch.autocast(bf16), AdamW
(fused=True) with weight decay on the 2-D parameters only. `compile=True` wraps the model in
torch.compile (forward and backward compiled; the fused optimizer runs eagerly, as nanoGPT does).

Also here: nanoGPT's initialisation from a seed, a safetensors writer that needs neither numpy nor
the `safetensors` package (so the GPU machine needs nothing beyond torch), and the synthetic token
batches both libraries train on.

Standalone: python3 bench/gpt2_torch.py [--steps N] [--compile] [--tiny] prints the losses.
"""
import argparse
import ctypes
import json
import math
import struct
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 50304
    block: int = 1024
    layers: int = 12
    heads: int = 12
    dim: int = 768
    batch: int = 8
    seq: int = 1024
    lr: float = 6e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


TINY = dict(vocab=512, block=128, layers=2, heads=2, dim=128, batch=4, seq=64)  # head dim 64, as GPT-2


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.c_attn = nn.Linear(c.dim, 3 * c.dim)
        self.c_proj = nn.Linear(c.dim, c.dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.dim, 4 * c.dim)
        self.c_proj = nn.Linear(4 * c.dim, c.dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.dim)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c.dim)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab, c.dim),
            wpe=nn.Embedding(c.block, c.dim),
            h=nn.ModuleList(Block(c) for _ in range(c.layers)),
            ln_f=nn.LayerNorm(c.dim)))

    def forward(self, idx, targets):
        tr = self.transformer
        T = idx.shape[1]
        x = tr.wte(idx) + tr.wpe.weight[:T]
        for b in tr.h:
            x = b(x)
        logits = F.linear(tr.ln_f(x), tr.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def init_weights(model, seed):
    """nanoGPT's initialisation, drawn on the CPU from `seed` (the same weights on every machine)."""
    g = torch.Generator().manual_seed(seed)
    res = 0.02 / math.sqrt(2 * model.c.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                p.fill_(1.0)
            else:
                std = res if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build(c, seed=1337, device="cuda"):
    """A model with nanoGPT's initialisation (on the CPU first, so the weights do not depend on the GPU)."""
    m = GPT(c)
    init_weights(m, seed)
    return m.to(device)


def optimizer(model, c, fused=True):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps, fused=fused)


def train_step(model, opt, x, y, bf16=True):
    """One step; returns the loss tensor (not synchronised)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def state_to_cpu(model):
    """name -> f32 CPU copy of every parameter (the tied head has no entry of its own)."""
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def save_safetensors(path, tensors):
    """Writes {name: tensor} as a safetensors file (all f32): an 8-byte little-endian header length,
    the JSON header padded with spaces to a multiple of 8, then the tensors' bytes back to back in
    the header's order. Raw bytes come from the tensor's memory through ctypes (no numpy)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.float32).contiguous()
        nbytes = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + nbytes]}
        blobs.append((t, nbytes))
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t, nbytes in blobs:
            if nbytes:
                f.write(ctypes.string_at(t.data_ptr(), nbytes))


def synthetic_batches(c, steps, seed=1234):
    """`steps` batches (tokens, targets), int64 [B, T] on the CPU: sequences from a fixed random
    successor table (token t is followed by succ[t] with probability 3/4, else by a uniform token),
    so that the loss falls quickly; targets are the tokens shifted by one."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, c.vocab, (c.vocab,), generator=g)
    out = []
    for _ in range(steps):
        seq = torch.empty(c.batch, c.seq + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(0, c.vocab, (c.batch,), generator=g)
        keep = torch.rand(c.batch, c.seq, generator=g) < 0.75
        rnd = torch.randint(0, c.vocab, (c.batch, c.seq), generator=g)
        for t in range(c.seq):
            seq[:, t + 1] = torch.where(keep[:, t], succ[seq[:, t]], rnd[:, t])
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--f32", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    c = Config(**TINY) if args.tiny else Config()
    model = build(c)
    opt = optimizer(model, c)
    step_model = torch.compile(model) if args.compile else model
    for i, (x, y) in enumerate(synthetic_batches(c, args.steps)):
        t = time.perf_counter()
        loss = train_step(step_model, opt, x.cuda(), y.cuda(), bf16=not args.f32).item()
        print(f"step {i:4d}  loss {loss:.6f}  {1e3 * (time.perf_counter() - t):9.3f} ms")


if __name__ == "__main__":
    main()
