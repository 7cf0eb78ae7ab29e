#!/usr/bin/env python3
"""FLAME's LoRA file formats (src/models/lora_format.*) against diffusers' own LoRA loaders.

Runs where PyTorch, safetensors and diffusers import (the GPU machine, with a copy of diffusers' source
on PYTHONPATH); needs no GPU and no model weights. For each case, `flame_lora_plan save` gives FLAME's
plan for a full-size model (Flux-dev, SDXL, SD 1.5, SD3.5-medium, CLIP-L, bigG) in kohya or peft
format; this script

 1. gives every FLAME module random down A [r, in] and up B [out, r] (float64) with FLAME's scale
    alpha / r, and writes the safetensors file the plan describes (down pieces stacked, up pieces in
    their rows / rank columns, halves swapped and up blocks rescaled where the plan says, zeros
    elsewhere, 0-d float32 alphas, the plan's metadata);
 2. reads it with the pipeline's `lora_state_dict` (kohya conversion included:
    _convert_kohya_flux_lora_to_diffusers, _maybe_map_sgm_blocks_to_diffusers +
    _convert_non_diffusers_lora_to_diffusers), turns each component into peft keys and a LoraConfig the
    way diffusers' loaders do (convert_unet_state_dict_to_peft / convert_state_dict_to_peft,
    lora_adapter_metadata or get_peft_kwargs, peft's rank_pattern / alpha_pattern rule), and checks
    that every diffusers module's delta W = scale * B @ A equals FLAME's (zero for modules FLAME has
    no LoRA on; compared on random probes X: max |dW X - dW' X| / max |dW X| <= 1e-6), and that no
    FLAME module is lost;
 3. checks FLAME's own load plan of the file (`save` prints it) the same way;
 4. the reverse: writes the peft LoRA diffusers read with diffusers' own `save_lora_weights` (its
    lora_adapter_metadata), gives its keys and metadata to `flame_lora_plan load`, and checks FLAME's
    plan means the same delta W.

Kohya cases of the UNet and CLIP vary ranks but keep one alpha ("mixedranks"): diffusers'
_get_alpha_name names an attention module's alpha "<...>.processor.to_q_lora.down.weight.alpha" (and a
CLIP one "<...>.self_attn.to_q_lora.down.weight.alpha"), which get_peft_kwargs's alpha_pattern cannot
match, so per-module alphas other than the most common one are lost by diffusers there (by reading
loaders/lora_conversion_utils.py; ComfyUI reads every .alpha). Flux's converter folds alphas into the
weights and peft files carry alpha_pattern, so those cases use "mixed" alphas.

Known gaps, reported as SKIP: diffusers has no kohya loader for SD3 (SD3LoraLoaderMixin reads peft
keys only) nor for T5 (lora_te3_ is dropped by the Flux converter; no pipeline loads a T5 peft LoRA).

  PYTHONPATH=$PWD/.ref python3 tests/models/check_lora_formats.py --tool build/tests/models/flame_lora_plan
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CASES = [
    # model, format, targets, extra tool arguments
    ("flux", "kohya", "diffusers", []),
    ("flux", "kohya", "kohya", []),
    ("flux", "kohya", "kohya", ["mixed"]),
    ("flux", "kohya", "diffusers",  # the final layer's swapped halves; diffusers ignores final_layer alphas: scale 1
     ["unit", "modules=norm_out.linear,proj_out,transformer_blocks.0.attn.to_q,single_transformer_blocks.1.proj_mlp"]),
    ("flux", "peft", "diffusers", []),
    ("flux", "peft", "kohya", ["mixed"]),
    ("sdxl", "kohya", "diffusers", []),
    ("sdxl", "kohya", "kohya", ["mixedranks"]),
    ("sdxl", "peft", "diffusers", ["mixed"]),
    ("sd15", "kohya", "diffusers", []),
    ("sd15", "kohya", "kohya", ["mixedranks"]),
    ("sd15", "peft", "diffusers", []),
    ("sd3", "peft", "diffusers", ["mixed"]),
    ("sd3", "kohya", "diffusers", []),
    ("clip_l", "kohya", "kohya", ["mixedranks"]),
    ("clip_l", "peft", "diffusers", ["mixed"]),
    ("clip_g", "kohya", "kohya", []),
    ("clip_g", "peft", "diffusers", []),
    ("t5", "kohya", "kohya", []),
]

# The pipelines' LoRA loader mixins (their lora_state_dict / save_lora_weights are classmethods; the
# reference copy of diffusers has no pipelines/ folder, ../shared/reference/README.md).
PIPELINES = {"flux": "FluxLoraLoaderMixin", "sdxl": "StableDiffusionXLLoraLoaderMixin",
             "clip_l": "StableDiffusionXLLoraLoaderMixin", "clip_g": "StableDiffusionXLLoraLoaderMixin",
             "sd15": "StableDiffusionLoraLoaderMixin", "sd3": "SD3LoraLoaderMixin"}
REL_TOL = 1e-6
PROBES = 3


def seeded(name, *shape):
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def swap_halves(t):
    h = t.shape[0] // 2
    return torch.cat([t[h:], t[:h]], dim=0)


def flame_plan(tool, *args):
    out = subprocess.run([tool, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def module_weights(plan):
    """FLAME's modules: name -> (scale, A, B), random and reproducible."""
    return {m["module"]: (m["alpha"] / m["rank"], seeded(m["module"] + ":A", m["rank"], m["in"]) / m["in"] ** 0.5,
                          seeded(m["module"] + ":B", m["out"], m["rank"]))
            for m in plan["modules"]}


def build_file_tensors(save, weights):
    tensors = {}
    for t in save["tensors"]:
        if t["kind"] == "alpha":
            tensors[t["key"]] = torch.tensor(t["alpha"], dtype=torch.float32)
            continue
        full = torch.zeros(t["shape"], dtype=torch.float64)
        for p in t["pieces"]:
            _, a, b = weights[p["module"]]
            if t["kind"] == "down":
                block = a
            else:
                block = b * p["scale"]
                if p["swap_halves"]:
                    block = swap_halves(block)
            full[p["row_begin"]:p["row_begin"] + p["rows"], p["col_begin"]:p["col_begin"] + p["cols"]] = block
        tensors[t["key"]] = full.contiguous()
    return tensors


def pattern_key(pattern_keys, name):
    try:
        from peft.utils import get_pattern_key  # peft's own rule where peft is installed
        k = get_pattern_key(list(pattern_keys), name)
        return k if k in pattern_keys else None
    except ImportError:
        for key in pattern_keys:
            if key.startswith("^"):
                if re.match(rf"{key}$", name):
                    return key
            elif re.match(rf"(.*\.)?({key})$", name):
                return key
        return None


def peft_view(state_dict, alphas, metadata, prefix):
    """One component of what lora_state_dict returned, as diffusers' loaders hand it to peft:
    module -> (scale, A, B), plus the LoraConfig kwargs."""
    from diffusers.utils import convert_state_dict_to_diffusers, convert_state_dict_to_peft, convert_unet_state_dict_to_peft
    from diffusers.utils.peft_utils import get_peft_kwargs

    part = {k[len(prefix) + 1:]: v for k, v in state_dict.items() if k.startswith(prefix + ".")}
    if not part:
        return {}, None
    denoiser = prefix in ("unet", "transformer")
    if denoiser:
        if "lora_A" not in next(iter(part)):
            part = convert_unet_state_dict_to_peft(part)
        rank = {f"^{k}": v.shape[1] for k, v in part.items() if "lora_B" in k and v.ndim > 1}
    else:
        part = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))
        rank = {k: v.shape[1] for k, v in part.items() if "lora_B" in k and v.ndim > 1}
    meta = None
    if metadata:
        meta = {k[len(prefix) + 1:]: v for k, v in metadata.items() if k.startswith(prefix + ".")} or None
    net = None
    if alphas:
        net = {k[len(prefix) + 1:]: v for k, v in alphas.items()
               if k.startswith(prefix + ".") and (denoiser or k.split(".")[0] == prefix)} or None
    kwargs = meta if meta else get_peft_kwargs(rank, net, part, is_unet=denoiser)
    rank_pattern = kwargs.get("rank_pattern") or {}
    alpha_pattern = kwargs.get("alpha_pattern") or {}
    view = {}
    for key, a in part.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[:-len(".lora_A.weight")]
        b = part[module + ".lora_B.weight"]
        rk = pattern_key(rank_pattern, module)
        r = rank_pattern[rk] if rk else kwargs["r"]
        ak = pattern_key(alpha_pattern, module)
        alpha = alpha_pattern[ak] if ak else kwargs["lora_alpha"]
        if r != a.shape[0]:
            raise AssertionError(f"{prefix}.{module}: LoraConfig rank {r} but lora_A has {a.shape[0]} rows")
        view[module] = (alpha / r, a.double(), b.double())
    return view, kwargs


def flame_load_view(load, tensors):
    view = {}
    for m in load["modules"]:
        d, u = m["down"], m["up"]
        a = tensors[d["key"]][d["row_begin"]:d["row_begin"] + d["rows"]].double()
        b = tensors[u["key"]][u["row_begin"]:u["row_begin"] + u["rows"]].double()
        if u["swap_halves"]:
            b = swap_halves(b)
        alpha = float(tensors[m["alpha_key"]]) if m["alpha_key"] else m["alpha"]
        view[m["module"]] = (alpha / m["rank"], a, b)
    return view


def compare(expected, got, label, must_cover=True):
    """Every module's delta W on random probes; modules absent on one side count as zero."""
    failures, probes = [], {}
    for module in sorted(set(expected) | set(got)):
        if module not in got and must_cover:
            failures.append(f"{label}: {module} lost")
            continue
        ref = expected.get(module) or got.get(module)
        n_in = ref[1].shape[1]
        x = probes.setdefault(n_in, seeded(f"probe{n_in}", n_in, PROBES))

        def apply(v):
            return v[0] * (v[2] @ (v[1] @ x)) if v is not None else None

        e, g = apply(expected.get(module)), apply(got.get(module))
        if e is None:
            e = torch.zeros_like(g)
        if g is None:
            g = torch.zeros_like(e)
        if e.shape != g.shape:
            failures.append(f"{label}: {module} shapes {tuple(e.shape)} vs {tuple(g.shape)}")
            continue
        scale = e.abs().max().item()
        err = (e - g).abs().max().item()
        if scale == 0:
            if g.abs().max().item() > 1e-12:
                failures.append(f"{label}: {module} should have no effect, max |dW x| = {g.abs().max().item():.3g}")
        elif err > REL_TOL * scale:
            failures.append(f"{label}: {module} rel error {err / scale:.3g}")
    return failures


def diffusers_read(model, plan, directory, weight_name):
    from diffusers.configuration_utils import FrozenDict
    from diffusers.loaders import lora_pipeline

    pipe = getattr(lora_pipeline, PIPELINES[model])
    kwargs = {"weight_name": weight_name, "return_lora_metadata": True}
    if model == "flux":
        kwargs["return_alphas"] = True
    if model == "sdxl":
        kwargs["unet_config"] = FrozenDict(plan["config"])
    out = pipe.lora_state_dict(directory, **kwargs)
    if model == "sd3":
        state_dict, metadata = out
        alphas = None
    else:
        state_dict, alphas, metadata = out
    # diffusers' Flux converter leaves some keys without "transformer." (x_embedder, norm_out, ...).
    known = ("transformer.", "unet.", "text_encoder.", "text_encoder_2.", "text_encoder_3.")
    bare = [k for k in state_dict if not k.startswith(known)]
    if bare:
        print(f"  note: {len(bare)} keys without a component prefix from diffusers, taken as transformer's: {bare[:3]}")
        state_dict = {(k if k.startswith(known) else "transformer." + k): v for k, v in state_dict.items()}
    return state_dict, alphas, metadata


def diffusers_write_and_flame_load(tool, model, component, view, kwargs, directory):
    """The reverse direction: diffusers writes the peft LoRA it read; FLAME plans loading it."""
    from diffusers.loaders import lora_pipeline

    pipe = getattr(lora_pipeline, PIPELINES[model])
    layers = {}
    for module, (_, a, b) in view.items():
        # Diffusers' Flux kohya conversion shares one down tensor among q, k, v (and proj_mlp);
        # safetensors refuses shared storage, so each layer gets its own copy.
        layers[f"{module}.lora_A.weight"] = a.clone().contiguous()
        layers[f"{module}.lora_B.weight"] = b.clone().contiguous()
    meta = {k: v for k, v in kwargs.items() if k in ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "target_modules",
                                                     "use_dora", "lora_bias")}
    if isinstance(meta.get("target_modules"), (set, list)):
        meta["target_modules"] = sorted(meta["target_modules"])
    pipe.save_lora_weights(directory, weight_name="from_diffusers.safetensors",
                           **{f"{component}_lora_layers": layers, f"{component}_lora_adapter_metadata": meta})
    path = os.path.join(directory, "from_diffusers.safetensors")
    tensors, keys = {}, {}
    with safe_open(path, "pt") as f:
        file_meta = f.metadata() or {}
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
            keys[k] = list(tensors[k].shape)
    keys_path = os.path.join(directory, "from_diffusers_keys.json")
    with open(keys_path, "w") as f:
        json.dump({"keys": keys, "metadata": file_meta}, f)
    load = flame_plan(tool, "load", model, keys_path)["load"]
    return flame_load_view(load, tensors)


def run_case(tool, case, workdir):
    directory = tempfile.mkdtemp(dir=workdir)
    try:
        return check_case(tool, case, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # a full-size Flux file in float64 is about 1 GB


def check_case(tool, case, directory):
    model, fmt, targets, extra = case
    label = f"{model} {fmt} ({targets} targets{' ' + ' '.join(extra) if extra else ''})"
    plan = flame_plan(tool, "save", model, fmt, targets, *extra)
    component = plan["component"]
    weights = module_weights(plan)
    tensors = build_file_tensors(plan["save"], weights)
    save_file(tensors, os.path.join(directory, "flame.safetensors"), metadata=plan["save"]["metadata"])
    failures = compare(weights, flame_load_view(plan["load"], tensors), label + " [FLAME load]")
    if model == "t5" or (model == "sd3" and fmt == "kohya"):
        return failures, "SKIP diffusers (no loader for this format)"
    state_dict, alphas, metadata = diffusers_read(model, plan, directory, "flame.safetensors")
    view, kwargs = peft_view(state_dict, alphas, metadata, component)
    others = sorted({k.split(".")[0] for k in state_dict} - {component})
    if others:
        failures.append(f"{label}: diffusers put keys under {others}")
    failures += compare(weights, view, label + " [diffusers read]")
    if view:
        back = diffusers_write_and_flame_load(tool, model, component, view, kwargs, directory)
        failures += compare(view, back, label + " [diffusers write, FLAME load]")
    return failures, f"{len(weights)} modules, {len(view)} diffusers modules"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="build/tests/models/flame_lora_plan")
    ap.add_argument("--cases", default="", help="comma list of model names (default: all)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    chosen = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    all_failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for case in chosen:
            try:
                failures, summary = run_case(args.tool, case, workdir)
            except Exception as e:  # a loader that raises is a failure of the case, reported with the rest
                failures, summary = [f"{case}: {type(e).__name__}: {e}"], "error"
            status = "FAIL" if failures else "ok"
            print(f"{status:4} {case[0]} {case[1]} {case[2]} {' '.join(case[3])}: {summary}")
            for f in failures[:20]:
                print("     " + f)
            if len(failures) > 20:
                print(f"     ... {len(failures) - 20} more")
            all_failures += failures
    print(f"{len(chosen)} cases, {len(all_failures)} failures")
    return 1 if all_failures else 0


if __name__ == "__main__":
    sys.exit(main())
