#!/usr/bin/env python3
"""LoRA files between FLAME and diffusers, judged by the models' outputs (issue 36's conformance).

For each case (tiny Flux, SDXL UNet and SD3.5 configs of tests/models/check_model_parity.py, float32,
TF32 off, the SDPA math backend) and each target set ("default": diffusers' training-script targets;
"all": every nn.Linear of the model):

 1. diffusers -> FLAME. peft adds a LoRA to the real diffusers class (LoraConfig with a rank and
    alpha pattern, random A and B), diffusers' own `save_lora_weights` writes it as its training
    scripts do (peft keys with lora_adapter_metadata; for the UNet also the older
    convert_state_dict_to_diffusers key form), and the reference runs forward + backward with random
    output gradients. `flame_model_run --lora-load` loads the same base weights and LoRA file into
    FLAME's model: every output, every LoRA A / B gradient and every float input gradient must match
    (max|flame - ref| / max|ref| <= 1e-4).
 2. FLAME -> diffusers. In that same run FLAME writes the adapter back (`flame_model_save_lora`) in
    kohya format (BFL names for Flux, SGM names for SDXL, 0-d alphas) and in peft format. Each file
    goes through the pipeline's `lora_state_dict` (kohya conversion included) and
    `load_lora_into_transformer` / `load_lora_into_unet` into a fresh diffusers model with the same
    base weights, whose output must match FLAME's (1e-4).

Known gaps, reported as SKIP: diffusers has no loader for kohya SD3 files (SD3LoraLoaderMixin reads
peft keys only); its kohya Flux converter splits a single block's fused linear1 at Flux-dev's sizes
(3072, 3072, 3072, 12288), so kohya Flux files are checked on "flux_wide" (Flux-dev's width, one
block of each kind) and skipped on the tiny "flux". That converter also leaves the embedders' and
final layer's keys without the "transformer." prefix its loaders filter on (they would be dropped);
the check gives them the prefix (a note says how many).

Runs on the GPU machine (PyTorch, peft, and diffusers from a copy of ../shared/reference/diffusers on
PYTHONPATH):

    PYTHONPATH=$PWD/.ref python3 tests/models/check_lora_conformance.py --tool build-gpu/tests/models/flame_model_run
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_model_parity as parity  # noqa: E402  (the tiny model cases)

TOL = 1e-4


def flux_wide_case():
    """Flux with Flux-dev's width (24 heads of 128: diffusers' kohya converter splits a single block's
    linear1 at the hard-coded sizes 3072, 3072, 3072, 12288) and one block of each kind."""
    from diffusers import FluxTransformer2DModel
    c = parity.flux_case(True, False)
    cfg = dict(c["config"], num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=24,
               axes_dims_rope=[16, 56, 56])
    model = FluxTransformer2DModel(**cfg)
    parity.add_noise(model)
    return dict(c, config=cfg, model=model)


# case -> (model builder, pipeline mixin, component, loader function, diffusers' default targets, kohya
# checked: diffusers reads FLAME's kohya file for this case)
CASES = {
    "flux": ("flux_tiny", "FluxLoraLoaderMixin", "transformer", "load_lora_into_transformer",
             ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
              "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
              "ff_context.net.2"], False),
    "flux_wide": (flux_wide_case, "FluxLoraLoaderMixin", "transformer", "load_lora_into_transformer",
                  ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                   "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                   "ff_context.net.2"], True),
    "sdxl": ("unet_sdxl_tiny", "StableDiffusionXLLoraLoaderMixin", "unet", "load_lora_into_unet",
             ["to_q", "to_k", "to_v", "to_out.0"], True),
    "sd35": ("sd35_tiny", "SD3LoraLoaderMixin", "transformer", "load_lora_into_transformer",
             ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"], False),
}


def rel_err(a, b):
    a, b = a.double(), b.double()
    den = b.abs().max().item()
    num = (a - b).abs().max().item()
    return num / den if den > 0 else num


# Target sets besides "default" and "all": groups of Flux's other linear layers, so that a failure
# of "all" points at its modules.
GROUPS = {
    "embedders": ["x_embedder", "context_embedder", "time_text_embed.*"],
    "modulation": ["*norm1.linear", "*norm1_context.linear", "*norm.linear", "norm_out.linear"],
    "single": ["single_transformer_blocks.*.proj_mlp", "single_transformer_blocks.*.proj_out"],
    "final": ["proj_out"],
}


def linear_names(model, targets):
    """The nn.Linear modules a target list selects (peft's rule: the name or a '.'-suffix of it;
    GROUPS' entries are fnmatch patterns of whole names)."""
    import fnmatch
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if targets == "all":
        return names
    if isinstance(targets, str) and targets in GROUPS:
        return [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in GROUPS[targets])]
    return [n for n in names if any(n == t or n.endswith("." + t) for t in targets)]


def add_reference_lora(model, modules, seed, one_alpha):
    """A peft LoRA on modules with varied ranks (and alphas unless one_alpha), A and B drawn at random
    (B nonzero). UNet kohya files keep one alpha: diffusers' kohya UNet conversion names per-module
    alphas so that get_peft_kwargs's alpha_pattern cannot match them (see check_lora_formats.py)."""
    from peft import LoraConfig
    ranks = {m: 2 + (i % 3) for i, m in enumerate(modules)}   # 2, 3, 4
    alphas = {m: 3.0 if one_alpha else 1.5 + (i % 4) for i, m in enumerate(modules)}
    for m in ("norm_out.linear", "proj_out"):  # diffusers' kohya Flux converter ignores final_layer alphas
        if m in alphas and not one_alpha and type(model).__name__ == "FluxTransformer2DModel":
            alphas[m] = float(ranks[m])
    config = LoraConfig(r=4, lora_alpha=3.0 if one_alpha else 4, target_modules=list(modules), init_lora_weights=False,
                        # "^name": the whole name (peft PR 2419), so that the top-level proj_out's entry
                        # does not also match a single block's proj_out
                        rank_pattern={f"^{m}": r for m, r in ranks.items() if r != 4},
                        alpha_pattern={} if one_alpha else {f"^{m}": a for m, a in alphas.items()})
    model.add_adapter(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return config


def forward_backward(model, forward, inputs, grads):
    x = {k: v.cuda() for k, v in inputs.items()}
    for v in x.values():
        if v.is_floating_point():
            v.requires_grad_(True)
    outs = forward(model, x)
    loss = sum((outs[k] * grads[k].cuda()).sum() for k in outs)
    loss.backward()
    ref = {f"out.{k}": v.detach().cpu() for k, v in outs.items()}
    for n, p in model.named_parameters():
        if "lora_" in n and p.grad is not None:
            ref["lora_grad." + n.replace(".default.", ".")] = p.grad.detach().cpu()
    for k, v in x.items():
        if v.is_floating_point() and v.grad is not None:
            ref[f"grad_input.{k}"] = v.grad.detach().cpu()
    return ref


def compare(label, got, ref, keys):
    ok, worst = True, (0.0, "")
    for k in keys:
        if k not in got:
            print(f"[{label}] FAIL: {k} missing from FLAME's results")
            ok = False
            continue
        e = rel_err(got[k], ref[k])
        if e > worst[0]:
            worst = (e, k)
        if e > TOL:
            print(f"[{label}] FAIL: {k} rel err {e:.3e} > {TOL:.0e}")
            ok = False
    print(f"[{label}] {'PASS' if ok else 'FAIL'}: {len(keys)} tensors, worst {worst[0]:.3e} at {worst[1]}")
    return ok


def diffusers_output(base, c, mixin_name, loader, component, path, inputs):
    """A fresh copy of the base model with the LoRA file read as the pipeline does; its outputs."""
    from diffusers.loaders import lora_pipeline
    mixin = getattr(lora_pipeline, mixin_name)
    model = copy.deepcopy(base)
    if mixin_name == "FluxLoraLoaderMixin":
        state_dict, alphas, metadata = mixin.lora_state_dict(path, return_alphas=True, return_lora_metadata=True)
        # diffusers' kohya Flux converter names the embedders' and the final layer's LoRA keys without
        # the "transformer." prefix, which its loaders then filter out (silently dropped): they are
        # taken as the transformer's here, as check_lora_formats.py does, and counted in the report.
        bare = [k for k in state_dict if not k.startswith(("transformer.", "text_encoder"))]
        if bare:
            print(f"  note: {len(bare)} keys without a component prefix from diffusers, taken as the transformer's")
            state_dict = {(f"transformer.{k}" if k in bare else k): v for k, v in state_dict.items()}
    elif mixin_name == "StableDiffusionXLLoraLoaderMixin":
        state_dict, alphas, metadata = mixin.lora_state_dict(path, unet_config=model.config, return_lora_metadata=True)
    else:
        state_dict, metadata = mixin.lora_state_dict(path, return_lora_metadata=True)
        alphas = None
    kwargs = dict(network_alphas=alphas, metadata=metadata, **{component: model})
    if loader == "load_lora_into_transformer" and mixin_name == "SD3LoraLoaderMixin":
        kwargs.pop("network_alphas")
    getattr(mixin, loader)(state_dict, **kwargs)
    n_lora = sum(1 for n, _ in model.named_parameters() if "lora_" in n)
    x = {k: v.cuda() for k, v in inputs.items()}
    with torch.no_grad():
        outs = c["forward"](model, x)
    return {f"out.{k}": v.detach().cpu() for k, v in outs.items()}, n_lora


def run_case(name, targets_name, tool, workdir):
    builder, mixin_name, component, loader, default_targets, kohya_checked = CASES[name]
    torch.manual_seed(0)
    c = builder() if callable(builder) else parity.CASES[builder]()
    model = c["model"].float().cuda().train(False)
    rename = c.get("rename", lambda n: n)
    base = copy.deepcopy(model)
    d = os.path.join(workdir, f"{name}_{targets_name}")
    os.makedirs(d, exist_ok=True)
    p = {k: os.path.join(d, k) for k in ("config.json", "weights.safetensors", "inputs.safetensors", "grads.safetensors",
                                         "flame.safetensors", "flame_kohya.safetensors", "flame_peft.safetensors")}
    with open(p["config.json"], "w") as f:
        json.dump(c["config"], f)
    save_file({rename(k): v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, p["weights.safetensors"])
    save_file({k: v.contiguous() for k, v in c["inputs"].items()}, p["inputs.safetensors"])

    modules = linear_names(model, default_targets if targets_name == "default" else targets_name)
    if not modules:
        print(f"[{name}/{targets_name}] SKIP: no linear layer in this set")
        return True
    config = add_reference_lora(model, modules, seed=7, one_alpha=component == "unet")
    with torch.no_grad():
        outs = c["forward"](model, {k: v.cuda() for k, v in c["inputs"].items()})
    g = torch.Generator().manual_seed(3)
    grads = {k: torch.randn(v.shape, generator=g) for k, v in outs.items()}
    save_file(grads, p["grads.safetensors"])
    ref = forward_backward(model, c["forward"], c["inputs"], grads)

    from diffusers.loaders import lora_pipeline
    from peft.utils import get_peft_model_state_dict
    mixin = getattr(lora_pipeline, mixin_name)
    layers = {k: v.detach().clone().contiguous().cpu() for k, v in get_peft_model_state_dict(model).items()}
    files = {"peft": os.path.join(d, "diffusers_peft.safetensors")}
    mixin.save_lora_weights(d, weight_name="diffusers_peft.safetensors", **{
        f"{component}_lora_layers": layers, f"{component}_lora_adapter_metadata": config.to_dict()})
    if component == "unet" and targets_name == "default":
        # The SDXL training scripts' form: convert_state_dict_to_diffusers' "lora.down" keys, no metadata
        # (its table renames attention projections only, the scripts' targets; other modules would
        # keep peft names in a file no script writes).
        from diffusers.utils import convert_state_dict_to_diffusers
        files["old"] = os.path.join(d, "diffusers_old.safetensors")
        mixin.save_lora_weights(d, weight_name="diffusers_old.safetensors",
                                unet_lora_layers=convert_state_dict_to_diffusers(layers))

    ok = True
    for form, path in files.items():
        label = f"{name}/{targets_name}/diffusers-{form}->flame"
        cmd = [tool, "--arch", c["arch"], "--config", p["config.json"], "--weights", p["weights.safetensors"],
               "--inputs", p["inputs.safetensors"], "--grads", p["grads.safetensors"], "--out", p["flame.safetensors"],
               "--lora-load", path, "--lora-save-kohya", p["flame_kohya.safetensors"],
               "--lora-save-peft", p["flame_peft.safetensors"]]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FLAME_LOG="warning"))
        if r.returncode != 0:
            print(f"[{label}] FAIL: flame_model_run exited {r.returncode}: {r.stderr.strip()[-800:]}")
            ok = False
            continue
        got = load_file(p["flame.safetensors"])
        if form == "old":
            # no metadata: diffusers and FLAME both read alpha = rank (scale 1), so the reference is
            # diffusers' own reading of the file
            out, _ = diffusers_output(base, c, mixin_name, loader, component, path, c["inputs"])
            ok &= compare(label, got, out, list(out))
            continue
        lora_keys = [k for k in ref if k.startswith("lora_grad.")]
        if len([k for k in got if k.startswith("lora_grad.")]) != len(lora_keys):
            print(f"[{label}] FAIL: FLAME has {len([k for k in got if k.startswith('lora_grad.')])} LoRA gradients, "
                  f"the reference {len(lora_keys)}")
            ok = False
        ok &= compare(label, got, ref, list(ref))
        if form != "peft":
            continue
        flame_out = {k: v for k, v in got.items() if k.startswith("out.")}
        for fmt in ("kohya", "peft"):
            label = f"{name}/{targets_name}/flame-{fmt}->diffusers"
            if fmt == "kohya" and not kohya_checked:
                print(f"[{label}] SKIP: " + ("diffusers' kohya Flux converter takes Flux-dev's widths only: flux_wide "
                                             "checks it" if name == "flux" else "diffusers has no loader for this format"))
                continue
            try:
                out, n_lora = diffusers_output(base, c, mixin_name, loader, component, p[f"flame_{fmt}.safetensors"],
                                               c["inputs"])
            except Exception as e:  # a loader that rejects FLAME's file is a failure of this check
                import traceback
                tb = traceback.format_exc().strip().splitlines()
                print(f"[{label}] FAIL: diffusers could not load FLAME's file: {type(e).__name__}: {e}\n    "
                      + "\n    ".join(tb[-8:]))
                ok = False
                continue
            if n_lora == 0:
                print(f"[{label}] FAIL: diffusers loaded no LoRA layer from FLAME's file")
                ok = False
                continue
            ok &= compare(label, flame_out, out, list(out))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path of flame_model_run")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--targets", default="default,all,embedders,modulation,single,final",
                    help="target sets: default (diffusers' scripts), all, " + ", ".join(GROUPS))
    ap.add_argument("--keep", help="directory to keep the files in (default: a temporary one)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    workdir = args.keep or tempfile.mkdtemp(prefix="flame_lora_conf_")
    results = {}
    explicit_targets = args.targets != ap.get_default("targets")
    for name in args.cases.split(","):
        for t in args.targets.split(","):
            if t in GROUPS and not (name == "flux" or (name == "flux_wide" and explicit_targets)):
                continue  # the groups split Flux's "all"; the other cases run default and all
            try:
                results[f"{name}/{t}"] = run_case(name, t, args.tool, workdir)
            except Exception as e:
                import traceback
                traceback.print_exc()
                print(f"[{name}/{t}] FAIL: {type(e).__name__}: {e}")
                results[f"{name}/{t}"] = False
    failed = [k for k, v in results.items() if not v]
    print(f"check_lora_conformance: {len(results) - len(failed)}/{len(results)} cases pass"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
