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
     reference the CPU tests (tests/cpu/test_flux_keys.cpp) read.

    python3 tests/models/check_model_keys.py --tool build/tests/models/flame_model_keys [--write DIR]

Exit status 0 when every check passes, 1 otherwise (the differences are printed).
"""
import argparse
import json
import os
import subprocess
import sys

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
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
