#!/usr/bin/env python3
"""FLAME's LoKr (flame_model_add_lora's "type": "lokr", src/models/model_lora.h) against peft's LoKr.

Runs where PyTorch, transformers and peft import (the GPU machine). Builds the tiny CLIPTextModel of
check_model_parity.py's clip_l case (hidden 64, intermediate 160), writes its weights, and for each
configuration below wraps it with peft's LoKrConfig(init_weights=False: every factor random) on
q/k/v/out_proj and fc1/fc2. Then, in float32 with TF32 off:

 1. peft -> FLAME: the adapter is written as a LyCORIS / kohya file ("lora_te1_<module>.lokr_w1" or
    "_w1_a" / "_w1_b", ".lokr_w2" or "_w2_a" / "_w2_b", ".alpha"), the keys ComfyUI's
    comfy/weight_adapter/lokr.py reads; `flame_model_run --lora-load` (trainable) runs it with random
    output gradients; FLAME's outputs and every factor's gradient must equal peft's.
 2. FLAME -> peft: the same run writes the adapter back (`--lora-save-kohya`); its keys must be exactly
    LyCORIS' for the factors peft made, each alpha must give peft's scale by ComfyUI's rule (alpha / r
    with a low-rank factor, else 1), and the file loaded into a fresh peft LoKr model of the same base
    must give peft's outputs.

peft's LoKr scale is alpha / r always, LyCORIS' (and FLAME's, ComfyUI's) 1 when both factors are
whole: the configuration with whole factors uses alpha = r, where the two agree.
Tolerance: max|flame - peft| / max|peft| per tensor within --tol (1e-4).

    python3 tests/models/check_lokr_parity.py --tool build/tests/models/flame_model_run [--keep DIR]

Exit status 0 when every compared tensor is within tolerance, 1 otherwise.
"""
import json
import os
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common  # noqa: E402
from check_model_parity import clip_case, rel_err  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
# (name, r, alpha, decompose_both, decompose_factor): q/k/v/out [64, 64] = (8 x 8) kron (8 x 8),
# fc1 [160, 64] = (10 x 8) kron (16 x 8), fc2 the transpose.
CONFIGS = [
    ("w2_low_rank", 2, 3.0, False, -1),
    ("decompose_both", 2, 5.0, True, -1),
    ("whole_and_mixed", 4, 4.0, False, -1),  # q/k/v/out: both whole (scale 1 = alpha / r); fc1/fc2: W2 low rank
    ("factor_4", 3, 6.0, False, 4),
]
FACTORS = ["lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b"]


def flame_name(peft_name, rename):
    """peft's parameter or state-dict name -> the name FLAME's adapter list gives the tensor."""
    n = peft_name
    if n.startswith("base_model.model."):
        n = n[len("base_model.model."):]
    n = n.replace(".default", "")
    return rename(n)


def kohya_base(module):
    return "lora_te1_" + module.replace(".", "_")


def lokr_layers(peft_model, rename):
    """{FLAME module name: peft LoKr layer} of a peft model."""
    out = {}
    for name, layer in peft_model.named_modules():
        if hasattr(layer, "lokr_w1") and isinstance(getattr(layer, "lokr_w1"), torch.nn.ParameterDict) and \
                any("default" in getattr(layer, f) for f in FACTORS):
            n = name[len("base_model.model."):] if name.startswith("base_model.model.") else name
            out[rename(n)] = layer
    return out


def layer_factors(layer):
    return {f: getattr(layer, f)["default"] for f in FACTORS if "default" in getattr(layer, f)}


def comfy_scale(factors, alpha):
    """ComfyUI's LoKrAdapter.calculate_weight: alpha / dim with dim = w2_b's (else w1_b's) rows."""
    dim = None
    if "lokr_w1" not in factors:
        dim = factors["lokr_w1_b"].shape[0]
    if "lokr_w2" not in factors:
        dim = factors["lokr_w2_b"].shape[0]
    return alpha / dim if dim is not None else 1.0


def run_config(tool, d, tol, cfg_name, r, alpha, decompose_both, factor):
    from peft import LoKrConfig, get_peft_model
    torch.manual_seed(0)
    c = clip_case(False, "quick_gelu", 2, False)
    rename, forward = c["rename"], c["forward"]
    base_state = {k: v.clone() for k, v in c["model"].float().state_dict().items()}
    p = {k: os.path.join(d, f"{cfg_name}_{k}") for k in ("config.json", "weights.safetensors", "inputs.safetensors",
                                                         "grads.safetensors", "lora.safetensors", "flame.safetensors",
                                                         "flame_lokr.safetensors")}
    with open(p["config.json"], "w") as f:
        json.dump(c["config"], f)
    save_file({rename(k): v.detach().contiguous().cpu() for k, v in base_state.items()}, p["weights.safetensors"])
    save_file({k: v.contiguous() for k, v in c["inputs"].items()}, p["inputs.safetensors"])

    def make_peft(seed):
        torch.manual_seed(seed)
        model = c["model"].__class__(c["model"].config)
        model.load_state_dict(base_state)
        model = model.float().cuda().train(False)
        config = LoKrConfig(r=r, alpha=alpha, target_modules=TARGETS, init_weights=False, decompose_both=decompose_both,
                            decompose_factor=factor, rank_dropout=0.0, module_dropout=0.0)
        return model, get_peft_model(model, config)

    model, peft_model = make_peft(7)
    layers = lokr_layers(peft_model, rename)
    if not layers:
        print(f"[lokr/{cfg_name}] FAIL: peft made no LoKr layers")
        return False
    # peft -> kohya file, LyCORIS' keys
    lora = {}
    for module, layer in layers.items():
        base = kohya_base(module)
        for f, t in layer_factors(layer).items():
            lora[f"{base}.{f}"] = t.detach().contiguous().cpu()
        lora[f"{base}.alpha"] = torch.tensor(float(alpha))
    save_file(lora, p["lora.safetensors"], metadata={"ss_network_module": "lycoris.kohya"})

    peft_model.train(False)
    x = {k: v.cuda() for k, v in c["inputs"].items()}
    outs = forward(model, x)
    gen = torch.Generator().manual_seed(3)
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in outs.items()}
    save_file(grads, p["grads.safetensors"])
    sum((outs[k] * grads[k].cuda()).sum() for k in outs).backward()
    ref = {f"out.{k}": v.detach().cpu() for k, v in outs.items()}
    for n, t in peft_model.named_parameters():
        if t.requires_grad and t.grad is not None:
            ref["lora_grad." + flame_name(n, rename)] = t.grad.detach().cpu()
    n_factor_grads = sum(1 for k in ref if k.startswith("lora_grad."))
    if n_factor_grads != len(lora) - len(layers):
        print(f"[lokr/{cfg_name}] FAIL: {n_factor_grads} factor gradients from peft, {len(lora) - len(layers)} factors")
        return False

    cmd = [tool, "--arch", c["arch"], "--config", p["config.json"], "--weights", p["weights.safetensors"],
           "--inputs", p["inputs.safetensors"], "--grads", p["grads.safetensors"], "--out", p["flame.safetensors"],
           "--lora-load", p["lora.safetensors"], "--lora-save-kohya", p["flame_lokr.safetensors"]]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FLAME_LOG="warning"))
    if res.returncode != 0:
        print(f"[lokr/{cfg_name}] FAIL: flame_model_run exited {res.returncode}: {res.stderr.strip()}")
        return False
    got = load_file(p["flame.safetensors"])
    floor = 1e-6 * max(v.abs().max().item() for k, v in ref.items() if k.startswith("lora_grad"))
    ok, worst = parity_common.compare_tensors(got, ref, tol, lambda k: floor if k.startswith("lora_grad") else 0.0)

    # FLAME's file: LyCORIS' keys for exactly peft's factors, alphas giving peft's scale
    with safe_open(p["flame_lokr.safetensors"], "pt") as f:
        written = {k: f.get_tensor(k) for k in f.keys()}
    expected = set(lora.keys())
    if set(written) != expected:
        print(f"FAIL: FLAME's kohya file keys differ: extra {sorted(set(written) - expected)[:4]}, "
              f"missing {sorted(expected - set(written))[:4]}")
        ok = False
    else:
        for module, layer in layers.items():
            base = kohya_base(module)
            factors = {f: written[f"{base}.{f}"] for f in FACTORS if f"{base}.{f}" in written}
            s = comfy_scale(factors, written[f"{base}.alpha"].item())
            if abs(s - layer.scaling["default"]) > 1e-6 * abs(layer.scaling["default"]):
                print(f"FAIL: {base}: ComfyUI's scale {s} of FLAME's file, peft's {layer.scaling['default']}")
                ok = False
        # FLAME's file into a fresh peft model of the same base (other random factors first)
        model2, peft2 = make_peft(11)
        with torch.no_grad():
            for module, layer in lokr_layers(peft2, rename).items():
                base = kohya_base(module)
                factors = {f: written[f"{base}.{f}"] for f in FACTORS if f"{base}.{f}" in written}
                for f, t in layer_factors(layer).items():
                    t.copy_(factors[f].to(t.device, t.dtype))
                # a whole-whole module of FLAME's file has scale 1 (alpha = r there): peft's alpha / r
                layer.scaling["default"] = comfy_scale(factors, written[f"{base}.alpha"].item())
        peft2.train(False)
        with torch.no_grad():
            outs2 = forward(model2, x)
        for k, v in outs2.items():
            e = rel_err(v.detach().cpu(), ref[f"out.{k}"], 0.0)
            worst = max(worst, (e, f"flame_file.{k}"))
            if e > tol:
                print(f"FAIL: peft with FLAME's file: out.{k}: rel err {e:.3e} > {tol:.0e}")
                ok = False
    print(f"[lokr/{cfg_name}] {'OK' if ok else 'FAIL'}: {len(ref)} tensors, {len(layers)} LoKr modules, "
          f"file of {len(written)} keys, worst {worst[0]:.3e} ({worst[1]})")
    return ok


def run(tool, d, tol):
    try:
        import peft  # noqa: F401
        from peft import LoKrConfig  # noqa: F401
    except ImportError as e:
        print(f"FAIL: peft's LoKr does not import ({e}); pip install peft")
        return False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ok = True
    for cfg in CONFIGS:
        ok = run_config(tool, d, tol, *cfg) and ok
    return ok


if __name__ == "__main__":
    parity_common.main(__doc__, run)
