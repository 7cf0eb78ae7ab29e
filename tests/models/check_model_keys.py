#!/usr/bin/env python3
"""FLAME's checkpoint key tables against the real diffusers classes and converters.

Runs where PyTorch and diffusers import (the GPU machine, with reference/diffusers on PYTHONPATH:
../shared/reference/README.md); needs no GPU and no weights. For each model and configuration:

  1. the diffusers parameter list FLAME derives (names, shapes, order) equals the state_dict of the
     real class built on the meta device (FluxTransformer2DModel, UNet2DConditionModel);
  2. diffusers' own single-file converter (convert_flux_transformer_checkpoint_to_diffusers), fed a
     checkpoint with FLAME's original (BFL) names, produces exactly the diffusers names, and every
     row lands where FLAME's table says (row range, halves swapped): the converter only splits and
     reorders rows, so each original tensor is given one column of distinct values to trace them;
     likewise convert_ldm_unet_checkpoint for the UNet's SGM names (each tensor one distinct value);
  3. with --write DIR, the real class's list is written as DIR/<model>_<config>_diffusers.json, the
     reference the CPU tests (tests/cpu/test_model_key_references.cpp) read.

The families of src/models/mapped_keys.h follow the same steps:
  - sd3 (SD3Transformer2DModel: state_dict, the pos_embed buffer included), vae (AutoencoderKL:
    state_dict), clip (transformers' CLIPTextModel / CLIPTextModelWithProjection) and t5
    (transformers' T5EncoderModel): for transformers' classes the list is named_parameters (the tied
    encoder.embed_tokens.weight is shared.weight, listed once; position_ids is no parameter);
  - the converters convert_sd3_transformer_checkpoint_to_diffusers (original names under
    model.diffusion_model.), convert_ldm_vae_checkpoint (under first_stage_model.),
    convert_open_clip_checkpoint (under conditioner.embedders.1.model.) and convert_ldm_clip_checkpoint
    (transformers names under conditioner.embedders.0.transformer.), convert_sd3_t5_checkpoint_to_diffusers
    (under text_encoders.t5xxl.transformer.) are fed FLAME's original tensors: for the tiny configs
    with their real shapes and distinct values (so every row range, half swap, transposition and
    reshape is checked element by element), for the full-size ones as one column of distinct values a
    row (names, row ranges, swaps, transpositions);
  - --write stores sd3_<config>_diffusers.json, vae_<config>_diffusers.json,
    clip_<config>_transformers.json, t5_<config>_transformers.json.

    python3 tests/models/check_model_keys.py --tool build/tests/models/flame_model_keys [--write DIR]

Exit status 0 when every check passes, 1 otherwise (the differences are printed).
"""
import argparse
import json
import os
import subprocess
import sys
import traceback

import torch


def flame_tables(tool, model, config):
    out = subprocess.run([tool, model, config], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def real_flux_state(cfg):
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        m = FluxTransformer2DModel(**cfg)
    return [[k, list(v.shape)] for k, v in m.state_dict().items()]


def real_unet_state(cfg):
    from diffusers import UNet2DConditionModel
    with torch.device("meta"):
        m = UNet2DConditionModel(**cfg)
    return [[k, list(v.shape)] for k, v in m.state_dict().items()]


def check_unet_converter(tables):
    """Feeds diffusers' LDM -> diffusers UNet converter FLAME's SGM names (under model.diffusion_model.,
    each tensor one distinct value) and checks that every diffusers name receives FLAME's tensor."""
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
    ck = {"model.diffusion_model." + name: torch.tensor([float(i)]) for i, (name, _) in enumerate(tables["original"])}
    index = {name: i for i, (name, _) in enumerate(tables["original"])}
    converted = convert_ldm_unet_checkpoint(ck, dict(tables["config"]))
    mapped = {d: o for d, o, _, _, _ in tables["map"]}
    problems = []
    if set(converted) != set(mapped):
        problems.append(f"converter names differ: only converter {sorted(set(converted) - set(mapped))[:8]}, "
                        f"only FLAME {sorted(set(mapped) - set(converted))[:8]}")
    for d, t in converted.items():
        if d in mapped and (t is None or float(t[0]) != index[mapped[d]]):
            problems.append(f"{d}: the converter takes it from {t}, FLAME from {mapped[d]} ({index[mapped[d]]})")
    return problems


def compare_lists(what, ours, theirs):
    problems = []
    if [k for k, _ in ours] != [k for k, _ in theirs]:
        a, b = {k for k, _ in ours}, {k for k, _ in theirs}
        problems.append(f"{what}: names differ: only FLAME {sorted(a - b)[:8]}, only diffusers {sorted(b - a)[:8]}"
                        if a != b else f"{what}: same names in another order")
    shapes = dict(theirs)
    for k, s in ours:
        if k in shapes and list(shapes[k]) != list(s):
            problems.append(f"{what}: {k} FLAME {s} diffusers {shapes[k]}")
    return problems


def check_flux_converter(tables):
    """Feeds diffusers' BFL -> diffusers converter a BFL checkpoint of FLAME's names (each tensor one
    column of distinct values) and checks every diffusers row against FLAME's table."""
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers
    problems = []
    original, base, at = {}, {}, 0
    for name, shape in tables["original"]:
        rows = shape[0]
        original[name] = torch.arange(at, at + rows, dtype=torch.float64)
        base[name] = at
        at += rows
    converted = convert_flux_transformer_checkpoint_to_diffusers(dict(original))
    mapped = {d: (o, b, r, s) for d, o, b, r, s in tables["map"]}
    if set(converted) != set(mapped):
        problems.append(f"converter names differ: only converter {sorted(set(converted) - set(mapped))[:8]}, "
                        f"only FLAME {sorted(set(mapped) - set(converted))[:8]}")
    for d, t in converted.items():
        if d not in mapped:
            continue
        o, b, r, s = mapped[d]
        want = original[o][b:b + r]
        if s:
            h = r // 2
            want = torch.cat([want[h:], want[:h]])
        if t.shape != want.shape or not torch.equal(t, want):
            problems.append(f"{d}: converter rows {t[:3].tolist()}.. of {o}, FLAME rows {want[:3].tolist()}.. (swap {s})")
    return problems


# family -> (configurations checked, configurations written as references, converter prefix)
MAPPED_FAMILIES = {
    "sd3": (("sd35-medium", "sd3-medium", "tiny"), ("sd35-medium", "tiny"), "model.diffusion_model."),
    "vae": (("sdxl", "flux", "sd3", "tiny"), ("sdxl", "flux", "tiny"), "first_stage_model."),
    "clip": (("l", "l-projection", "bigg", "tiny"), ("l", "bigg", "tiny"), "conditioner.embedders.1.model."),
    "t5": (("xxl", "tiny"), ("xxl", "tiny"), "text_encoders.t5xxl.transformer."),
}


def real_mapped_state(tables):
    """The real class's parameter list for a mapped family's configuration, built on the meta device."""
    cls, cfg = tables["class"], dict(tables["config"])
    if cls == "SD3Transformer2DModel":
        from diffusers import SD3Transformer2DModel
        cfg["dual_attention_layers"] = tuple(cfg["dual_attention_layers"])
        with torch.device("meta"):
            m = SD3Transformer2DModel(**cfg)
        return [[k, list(v.shape)] for k, v in m.state_dict().items()]
    if cls == "AutoencoderKL":
        from diffusers import AutoencoderKL
        for key in ("down_block_types", "up_block_types", "block_out_channels"):
            cfg[key] = tuple(cfg[key])
        with torch.device("meta"):
            m = AutoencoderKL(**cfg)
        return [[k, list(v.shape)] for k, v in m.state_dict().items()]
    import transformers
    if cls in ("CLIPTextModel", "CLIPTextModelWithProjection"):
        config = transformers.CLIPTextConfig(**cfg)
    elif cls == "T5EncoderModel":
        config = transformers.T5Config(**cfg)
    else:
        raise ValueError(f"unknown class {cls}")
    with torch.device("meta"):
        m = getattr(transformers, cls)(config)
    return [[k, list(p.shape)] for k, p in m.named_parameters()]


def traced_original(tables, prefix, exact):
    """FLAME's original tensors under prefix, each with distinct values: the real shape when exact,
    else one column [rows, 1]."""
    ck, at = {}, 0
    for name, shape in tables["original"]:
        shape = list(shape) if exact else [shape[0], 1]
        n = 1
        for d in shape:
            n *= d
        ck[prefix + name] = torch.arange(at, at + n, dtype=torch.float64).reshape(shape)
        at += n
    return ck


def run_converter(family, tables, ck, prefix):
    from types import SimpleNamespace
    from diffusers.loaders import single_file_utils as sfu
    if family == "sd3":
        return sfu.convert_sd3_transformer_checkpoint_to_diffusers(dict(ck))
    if family == "vae":
        return sfu.convert_ldm_vae_checkpoint(dict(ck), dict(tables["config"]))
    if family == "clip":
        # Consulted only for the projection width when the checkpoint has no text_projection.
        text_model = SimpleNamespace(config=SimpleNamespace(hidden_size=tables["config"]["hidden_size"]))
        return sfu.convert_open_clip_checkpoint(text_model, dict(ck), prefix=prefix)
    if family == "t5":
        return sfu.convert_sd3_t5_checkpoint_to_diffusers(dict(ck))
    raise ValueError(family)


def check_mapped_converter(family, tables, exact):
    """Feeds diffusers' converter FLAME's original tensors and checks that every converted tensor is the
    piece of the original tensor FLAME's table names (rows, halves swapped, transposed, reshaped)."""
    prefix = MAPPED_FAMILIES[family][2]
    ck = traced_original(tables, prefix, exact)
    converted = run_converter(family, tables, ck, prefix)
    shapes = dict((k, s) for k, s in tables["diffusers"])
    mapped = {m[0]: m[1:] for m in tables["map"]}
    problems = []
    if set(converted) != set(mapped):
        problems.append(f"converter names differ: only converter {sorted(set(converted) - set(mapped))[:8]}, "
                        f"only FLAME {sorted(set(mapped) - set(converted))[:8]}")
    for d, t in converted.items():
        if d not in mapped:
            continue
        o, b, r, swap, transposed = mapped[d]
        want = ck[prefix + o][b:b + r]
        if swap:
            h = r // 2
            want = torch.cat([want[h:], want[:h]])
        if transposed:
            want = want.T
        if exact:
            want = want.reshape(shapes[d])
        if t is None or t.shape != want.shape or not torch.equal(t, want):
            got = None if t is None else (list(t.shape), t.flatten()[:3].tolist())
            problems.append(f"{d}: converter {got}.., FLAME {list(want.shape)} {want.flatten()[:3].tolist()}.. "
                            f"from {o} rows {b}+{r} (swap {swap}, transposed {transposed})")
    if family == "clip":
        # transformers-named CLIP in an SDXL file (conditioner.embedders.0.transformer.): names kept.
        pre = "conditioner.embedders.0.transformer."
        ck2 = {pre + k: torch.zeros(1) + i for i, (k, _) in enumerate(tables["diffusers"])}
        from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint
        out = convert_ldm_clip_checkpoint(dict(ck2))
        if sorted(out) != sorted(k for k, _ in tables["diffusers"]) or any(
                not torch.equal(out[k], ck2[pre + k]) for k in out if pre + k in ck2):
            problems.append("convert_ldm_clip_checkpoint does not keep the transformers names and tensors")
    return problems


def check_mapped_families(tool, write):
    failures = 0
    for family, (configs, written, _) in MAPPED_FAMILIES.items():
        for config in configs:
            tables = flame_tables(tool, family, config)
            library = "diffusers" if family in ("sd3", "vae") else "transformers"
            try:  # one family's failure to build or convert must not hide the others' results
                theirs = real_mapped_state(tables)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                print(f"{family} {config}: building {tables['class']} FAILED: {type(e).__name__}: {e}")
                failures += 1
                continue
            problems = compare_lists(f"{family} {config} {library} list", tables["diffusers"], theirs)
            try:
                problems += check_mapped_converter(family, tables, exact=(config == "tiny"))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                problems.append(f"the converter raised {type(e).__name__}: {e}")
            n = sum(torch.Size(s).numel() for _, s in theirs)
            print(f"{family} {config} ({tables['class']}): {len(theirs)} tensors, {n:,} elements, "
                  f"{len(tables['original'])} original tensors: {'ok' if not problems else 'FAILED'}")
            for p in problems[:20]:
                print("   ", p)
            failures += bool(problems)
            if write and config in written:
                os.makedirs(write, exist_ok=True)
                name = f"{family}_{config.replace('-', '_')}_{library}.json"
                with open(os.path.join(write, name), "w") as f:
                    json.dump({"class": tables["class"], "config": tables["config"], "state_dict": theirs}, f)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="build/tests/models/flame_model_keys")
    ap.add_argument("--write", default=None, help="write the real classes' lists here")
    args = ap.parse_args()
    failures = 0
    for config in ("dev", "schnell", "tiny"):
        tables = flame_tables(args.tool, "flux", config)
        cfg = dict(tables["config"])
        cfg["axes_dims_rope"] = tuple(cfg["axes_dims_rope"])
        theirs = real_flux_state(cfg)
        problems = compare_lists(f"flux {config} diffusers list", tables["diffusers"], theirs)
        if config != "tiny":  # the converter assumes Flux's widths (inner 3072, MLP x4)
            problems += check_flux_converter(tables)
        n = sum(torch.Size(s).numel() for _, s in theirs)
        print(f"flux {config}: {len(theirs)} diffusers tensors, {n:,} parameters, "
              f"{len(tables['original'])} original tensors: {'ok' if not problems else 'FAILED'}")
        for p in problems[:20]:
            print("   ", p)
        failures += bool(problems)
        if args.write and config in ("dev", "tiny"):
            os.makedirs(args.write, exist_ok=True)
            with open(os.path.join(args.write, f"flux_{config}_diffusers.json"), "w") as f:
                json.dump({"class": "FluxTransformer2DModel", "config": tables["config"], "state_dict": theirs}, f)
    for config in ("sdxl", "sd15", "tiny"):
        tables = flame_tables(args.tool, "unet", config)
        theirs = real_unet_state(dict(tables["config"]))
        problems = compare_lists(f"unet {config} diffusers list", tables["diffusers"], theirs)
        problems += check_unet_converter(tables)
        n = sum(torch.Size(s).numel() for _, s in theirs)
        print(f"unet {config}: {len(theirs)} diffusers tensors, {n:,} parameters: {'ok' if not problems else 'FAILED'}")
        for p in problems[:20]:
            print("   ", p)
        failures += bool(problems)
        if args.write:
            os.makedirs(args.write, exist_ok=True)
            with open(os.path.join(args.write, f"unet_{config}_diffusers.json"), "w") as f:
                json.dump({"class": "UNet2DConditionModel", "config": tables["config"], "state_dict": theirs}, f)
    failures += check_mapped_families(args.tool, args.write)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
