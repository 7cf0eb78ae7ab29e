#!/usr/bin/env python3
"""Full-size models on one GPU, FLAME beside diffusers (issue 35's full-size rule; tier "T6m").

For each model (SDXL-base UNet, Flux-dev transformer, SD3.5-medium transformer; random init plus
noise, bf16, 1024x1024: latents 128x128):
  1. diffusers builds the model on the GPU and writes it as a diffusers folder (config.json and
     sharded safetensors, as the published folders are);
  2. PyTorch bf16 eager: warm-up, then timed forward + backward steps (loss = sum(sample * G) with a
     fixed random G; every parameter requires grad, gradients dropped after each step), peak memory
     (max_memory_allocated over the timed steps, weights included);
  3. the same weights upcast to float32, forward only: the reference output;
  4. FLAME (build/bench/flame_bench_model_step, the C ABI) loads the folder (load rate, page cache warm
     from step 1), runs the same steps in bf16, writes its first output;
  5. closeness: max|x - ref32| / max|ref32| for FLAME bf16 and for PyTorch bf16 ("within the spread":
     FLAME's error at most 1.5x PyTorch's), both outputs finite.
Flux runs with gradient checkpointing of every block on both sides (its full backward without it
would not leave room for the f32 reference on one GPU); SDXL and SD3.5 without.

    PYTHONPATH=$PWD/.ref python3 bench/models_full.py [--models sdxl,flux,sd35] [--steps 5] [--out DIR]

Writes DIR/models_full.json (every number) and DIR/models_full.md (the tier's table for
bench/RESULTS.md). Exit 1 when a model's FLAME output is not finite or outside the spread.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import save_file, load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sdxl():
    from diffusers import UNet2DConditionModel
    cfg = dict(sample_size=128, in_channels=4, out_channels=4,
               down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
               up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
               block_out_channels=[320, 640, 1280], layers_per_block=2, transformer_layers_per_block=[1, 2, 10],
               attention_head_dim=[5, 10, 20], cross_attention_dim=2048, use_linear_projection=True,
               norm_num_groups=32, addition_embed_type="text_time", addition_time_embed_dim=256,
               projection_class_embeddings_input_dim=2816)
    g = torch.Generator().manual_seed(2)
    inputs = {"sample": torch.randn(1, 4, 128, 128, generator=g), "timestep": torch.tensor([500.0]),
              "encoder_hidden_states": torch.randn(1, 77, 2048, generator=g),
              "text_embeds": torch.randn(1, 1280, generator=g),
              "time_ids": torch.tensor([[1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0]])}

    def forward(m, x):
        return m(x["sample"], x["timestep"], x["encoder_hidden_states"],
                 added_cond_kwargs={"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]}).sample

    return dict(name="SDXL-base UNet", cls=UNet2DConditionModel, cfg=cfg, inputs=inputs, forward=forward,
                checkpoint=0)


def flux():
    from diffusers import FluxTransformer2DModel
    cfg = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
               num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
               axes_dims_rope=[16, 56, 56])
    g = torch.Generator().manual_seed(2)
    h = w = 64  # 1024 / 8 / 2
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    inputs = {"hidden_states": torch.randn(1, h * w, 64, generator=g),
              "encoder_hidden_states": torch.randn(1, 512, 4096, generator=g),
              "pooled_projections": torch.randn(1, 768, generator=g), "timestep": torch.tensor([0.5]),
              "guidance": torch.tensor([3.5]), "img_ids": img_ids.reshape(h * w, 3), "txt_ids": torch.zeros(512, 3)}

    def forward(m, x):
        return m(**x).sample

    # PyTorch 2.11's cuDNN SDPA backend failed in this model's backward on an H200 (CUBLAS_STATUS_EXECUTION_FAILED,
    # then an illegal address, 2026-11-28): PyTorch runs Flux with its other SDPA backends
    return dict(name="Flux-dev transformer", cls=FluxTransformer2DModel, cfg=cfg, inputs=inputs, forward=forward,
                checkpoint=1, torch_cudnn_sdp=False)


def sd35():
    from diffusers import SD3Transformer2DModel
    cfg = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
               num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
               pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
               dual_attention_layers=list(range(13)), qk_norm="rms_norm")
    g = torch.Generator().manual_seed(2)
    inputs = {"hidden_states": torch.randn(1, 16, 128, 128, generator=g),
              "encoder_hidden_states": torch.randn(1, 333, 4096, generator=g),
              "pooled_projections": torch.randn(1, 2048, generator=g), "timestep": torch.tensor([500.0])}

    def forward(m, x):
        return m(**x).sample

    return dict(name="SD3.5-medium transformer", cls=SD3Transformer2DModel, cfg=cfg, inputs=inputs,
                forward=forward, checkpoint=0)


MODELS = {"sdxl": sdxl, "flux": flux, "sd35": sd35}


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def torch_steps(model, forward, x, grad, warmup, steps):
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = forward(model, x)
        (out * grad).sum().backward()
        for p in model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        if i == 0:
            first = out.detach().float().cpu()
        del out
    return first, statistics.median(times), torch.cuda.max_memory_allocated()


def run_model(key, args, work):
    spec = MODELS[key]()
    torch.backends.cuda.enable_cudnn_sdp(spec.get("torch_cudnn_sdp", True))
    folder = os.path.join(work, key)
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = spec["cls"](**spec["cfg"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # zero-initialised layers get weights too
    model = model.to(torch.bfloat16)
    torch.cuda.empty_cache()  # the float32 construction's blocks
    model.save_pretrained(folder, max_shard_size="5GB")
    write_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())

    x = {k: (v.cuda().to(torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids") else v.cuda())
         for k, v in spec["inputs"].items()}
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out_shape = spec["forward"](model, x).shape
    grad_cpu = torch.randn(out_shape, generator=g)
    grad = grad_cpu.cuda().to(torch.bfloat16)
    if spec["checkpoint"]:
        model.enable_gradient_checkpointing()
    model.train()
    try:
        out_bf16, torch_ms, torch_peak = torch_steps(model, spec["forward"], x, grad, args.warmup, args.steps)
        torch_error = None
    except RuntimeError as e:  # recorded; FLAME still runs and is compared with the f32 reference
        out_bf16, torch_ms, torch_peak, torch_error = None, float("nan"), float("nan"), str(e).splitlines()[0][:300]
        print(f"[{key}] PyTorch failed: {torch_error}", flush=True)
        for p in model.parameters():
            p.grad = None
        torch.cuda.empty_cache()
    # The float32 reference: the same (bf16-rounded) weights and inputs, upcast.
    model = model.float().eval()
    with torch.no_grad():
        x32 = {k: (v.float() if v.is_floating_point() else v) for k, v in x.items()}
        ref = spec["forward"](model, x32).float().cpu()
    del model, x, x32
    torch.cuda.empty_cache()

    bf_inputs = {k: (v.to(torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids") else v)
                 for k, v in spec["inputs"].items()}
    # beside the model folder, not in it (the loader reads every safetensors file of a folder's index)
    side = os.path.join(work, key + "_io")
    os.makedirs(side, exist_ok=True)
    save_file({k: v.contiguous() for k, v in bf_inputs.items()}, os.path.join(side, "inputs.safetensors"))
    save_file({"sample": grad_cpu.to(torch.bfloat16)}, os.path.join(side, "grads.safetensors"))
    cmd = [args.tool, "--load", folder, "--options", json.dumps({"dtype": "bf16"}),
           "--inputs", os.path.join(side, "inputs.safetensors"), "--grads", os.path.join(side, "grads.safetensors"),
           "--checkpoint", str(spec["checkpoint"]), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--out", os.path.join(side, "flame_out.safetensors")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    row = dict(model=spec["name"], key=key, params=n_params, checkpoint=spec["checkpoint"], torch_ms=torch_ms,
               torch_peak_gib=torch_peak / 2**30, write_s=write_s, torch_error=torch_error)
    if r.returncode != 0:
        row["error"] = (r.stderr or r.stdout).strip()[-2000:]
        print(f"[{key}] FLAME failed: {row['error']}", flush=True)
        return row
    res = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
    flame_out = load_file(os.path.join(side, "flame_out.safetensors"))["out.sample"].float()
    row.update(flame_ms=res["step_ms_median"], flame_peak_gib=res["peak_bytes"] / 2**30,
               load_gb_per_s=res["load_gb_per_s"], load_s=res["load_ms"] / 1e3, checkpoint_gb=res["checkpoint_bytes"] / 1e9,
               flame_err=rel(flame_out, ref), torch_err=rel(out_bf16, ref) if out_bf16 is not None else float("nan"),
               finite=bool(torch.isfinite(flame_out).all().item()))
    row["ratio"] = row["flame_ms"] / row["torch_ms"]
    # without a PyTorch bf16 output, the spread of the other models (2-3e-2) is the bound
    spread = row["torch_err"] if out_bf16 is not None else 3e-2
    row["close"] = row["finite"] and row["flame_err"] <= 1.5 * spread
    print(f"[{key}] {json.dumps(row)}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return row


def table(rows, device, commit):
    lines = [f"{time.strftime('%Y-%m-%d')} · {device} · commit {commit} · torch {torch.__version__}", "",
             "bf16, batch 1, 1024x1024 (latents 128x128), random init; step = forward + backward into every parameter "
             "(loss = sum(sample * G)), median of the timed steps; peak = weights + gradients + activations. "
             "Error = max|x - f32 reference| / max|f32 reference| of the first output (f32 reference: the same "
             "bf16 weights upcast). Load: flame_model_load of the diffusers folder (sharded, page cache warm).", "",
             "| model | params | ckpt | FLAME ms | diffusers eager ms | ratio | FLAME peak GiB | diffusers peak GiB "
             "| FLAME err | PyTorch bf16 err | load GB/s (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['checkpoint']} | failed | {r['torch_ms']:.1f} | - | - "
                         f"| {r['torch_peak_gib']:.1f} | - | - | - |")
            continue
        lines.append(f"| {r['model']} | {r['params'] / 1e9:.2f} B | {r['checkpoint']} | {r['flame_ms']:.1f} | {r['torch_ms']:.1f} "
                     f"| {r['ratio']:.3f} | {r['flame_peak_gib']:.2f} | {r['torch_peak_gib']:.2f} | {r['flame_err']:.2e} "
                     f"| {r['torch_err']:.2e} | {r['load_gb_per_s']:.2f} ({r['load_s']:.1f}) |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="sdxl,sd35,flux")
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bench", "flame_bench_model_step"))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/flame_models_full")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for key in args.models.split(","):
        rows.append(run_model(key, args, args.work))
        with open(os.path.join(args.out, "models_full.json"), "w") as f:
            json.dump(rows, f, indent=1)
    md = table(rows, torch.cuda.get_device_name(), args.commit)
    with open(os.path.join(args.out, "models_full.md"), "w") as f:
        f.write(md)
    print(md)
    return 0 if all(r.get("close") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
