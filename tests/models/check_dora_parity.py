#!/usr/bin/env python3
"""FLAME's DoRA (flame_model_add_lora's "dora": true, src/models/model_lora.h) against peft's own.

Runs where PyTorch, transformers and peft import (the GPU machine). Builds the tiny CLIPTextModel of
check_model_parity.py's clip_l case (random init plus noise), writes its weights, wraps it with peft's
LoraConfig(use_dora=True, init_lora_weights=False) on q/k/v/out_proj and fc1 (so B is not zero), moves
every magnitude away from ||W + s B A|| (so that it matters), and writes the adapter as diffusers
does for a text encoder: get_peft_model_state_dict's keys ("<module>.lora_A.weight", ".lora_B.weight",
".lora_magnitude_vector") under "text_encoder." with peft's LoraConfig in "lora_adapter_metadata".
Then it runs peft's forward and backward in float32 (TF32 off) with random output gradients, and
FLAME's `flame_model_run --lora-load` (tests/models/model_run_main.cpp: flame_model_load_lora, trainable)
on the same files, and compares the outputs and the gradients of every A, B and magnitude:
max|flame - peft| / max|peft| per tensor within --tol (1e-4).

    python3 tests/models/check_dora_parity.py --tool build/tests/models/flame_model_run [--keep DIR]

Exit status 0 when every compared tensor is within tolerance, 1 otherwise.
"""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common  # noqa: E402
from check_model_parity import clip_case  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1"]
RANK, ALPHA = 4, 8


def flame_name(peft_name, rename):
    """peft's parameter or state-dict name -> the name FLAME's adapter list gives the tensor."""
    n = peft_name
    if n.startswith("base_model.model."):
        n = n[len("base_model.model."):]
    n = n.replace(".default", "")
    if n.endswith(".lora_magnitude_vector.weight"):
        n = n[: -len(".weight")]
    return rename(n)


def run(tool, d, tol):
    try:
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    except ImportError as e:
        print(f"FAIL: peft does not import ({e}); pip install peft")
        return False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    c = clip_case(False, "quick_gelu", 2, False)
    model, rename, forward = c["model"].float().cuda().train(False), c["rename"], c["forward"]
    paths = {k: os.path.join(d, k) for k in ("config.json", "weights.safetensors", "inputs.safetensors",
                                             "grads.safetensors", "lora.safetensors", "flame.safetensors")}
    with open(paths["config.json"], "w") as f:
        json.dump(c["config"], f)
    save_file({rename(k): v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, paths["weights.safetensors"])
    save_file({k: v.contiguous() for k, v in c["inputs"].items()}, paths["inputs.safetensors"])

    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, use_dora=True, init_lora_weights=False,
                        lora_dropout=0.0)
    peft_model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(5)
    magnitudes = 0
    with torch.no_grad():
        for _, module in peft_model.named_modules():
            mv = getattr(module, "lora_magnitude_vector", None)
            if mv is not None and "default" in mv:
                w = mv["default"].weight
                w.mul_(1 + 0.2 * torch.randn(w.shape, generator=g).to(w.device))
                magnitudes += 1
    if magnitudes == 0:
        print("FAIL: peft made no DoRA magnitude vectors")
        return False
    state = get_peft_model_state_dict(peft_model)
    lora = {"text_encoder." + flame_name(k, rename): v.detach().contiguous().cpu() for k, v in state.items()}
    meta = {"text_encoder.r": RANK, "text_encoder.lora_alpha": ALPHA, "text_encoder.use_dora": True,
            "text_encoder.target_modules": TARGETS}
    save_file(lora, paths["lora.safetensors"], metadata={"format": "pt", "lora_adapter_metadata": json.dumps(meta)})

    peft_model.train(False)
    x = {k: v.cuda() for k, v in c["inputs"].items()}
    outs = forward(model, x)
    gen = torch.Generator().manual_seed(3)
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in outs.items()}
    save_file(grads, paths["grads.safetensors"])
    sum((outs[k] * grads[k].cuda()).sum() for k in outs).backward()
    ref = {f"out.{k}": v.detach().cpu() for k, v in outs.items()}
    for n, p in peft_model.named_parameters():
        if p.requires_grad and p.grad is not None:
            ref["lora_grad." + flame_name(n, rename)] = p.grad.detach().cpu()
    n_mag = sum(1 for k in ref if k.endswith(".lora_magnitude_vector"))
    if n_mag != magnitudes:
        print(f"FAIL: {n_mag} magnitude gradients from peft, {magnitudes} magnitudes")
        return False

    cmd = [tool, "--arch", c["arch"], "--config", paths["config.json"], "--weights", paths["weights.safetensors"],
           "--inputs", paths["inputs.safetensors"], "--grads", paths["grads.safetensors"], "--out",
           paths["flame.safetensors"], "--lora-load", paths["lora.safetensors"]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FLAME_LOG="warning"))
    if r.returncode != 0:
        print(f"FAIL: flame_model_run exited {r.returncode}: {r.stderr.strip()}")
        return False
    got = load_file(paths["flame.safetensors"])
    floor = 1e-6 * max(v.abs().max().item() for k, v in ref.items() if k.startswith(("grad", "lora_grad")))
    ok, worst = parity_common.compare_tensors(got, ref, tol, lambda k: floor if k.startswith("grad") else 0.0,
                                              report_above=1e-6)
    print(f"[dora/clip_l] {'OK' if ok else 'FAIL'}: {len(ref)} tensors ({magnitudes} DoRA modules), worst {worst[0]:.3e} ({worst[1]})")
    return ok


if __name__ == "__main__":
    parity_common.main(__doc__, run)
