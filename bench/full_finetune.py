#!/usr/bin/env python3
"""Full fine-tunes sharded over the GPUs of one machine, FLAME beside PyTorch FSDP2 (issue 38's rows).

Every parameter trains: bf16 parameters with f32 master weights, AdamW (lr 1e-5), gradient
checkpointing, 1024x1024 (latents 128x128), batch 1 per GPU, random init; loss = sum(sample * G) for a
fixed random G (the same inputs on every rank). Step = forward + backward + the sharded optimizer step;
median of the timed steps after the warm-ups; peak = max allocated on each rank over the timed steps.

  - PyTorch: the diffusers class in f32, `fully_shard` (FSDP2) on every transformer block and resnet
    (Flux: every double and single block), then on the root, with
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32): f32 parameter, gradient and AdamW shards,
    bf16 all-gathered for compute; `enable_gradient_checkpointing()`; torch.optim.AdamW. Started with
    torchrun (`python3 -m torch.distributed.run`).
  - FLAME: build/bench/flame_bench_model_step --zero STAGE (flame_zero_create: ZeRO-1 all-reduce or
    ZeRO-2 reduce-scatter, f32 master and AdamW state sharded, bf16 parameters replicated), started with
    scripts/flame-run (flame_comm_create_from_env).

    PYTHONPATH=$PWD/.ref python3 bench/full_finetune.py [--models sdxl,flux] [--stages 1,2] [--gpus 2]

Writes DIR/full_finetune.json and DIR/full_finetune.md.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

ARCH = {"sdxl": "UNet2DConditionModel", "flux": "FluxTransformer2DModel"}
LR = 1e-5


def output_shape(key, inputs):
    return inputs["sample" if key == "sdxl" else "hidden_states"].shape


def fsdp_worker(args):
    """One rank of the PyTorch FSDP2 run (started by torchrun); prints 'RESULT {json}'."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    import models_full

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.backends.cuda.matmul.allow_tf32 = False
    spec = models_full.MODELS[args.model]()
    torch.backends.cuda.enable_cudnn_sdp(spec.get("torch_cudnn_sdp", True))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = spec["cls"](**spec["cfg"])  # f32: the FSDP2 shards are the master weights
    model.enable_gradient_checkpointing()
    model.train()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.resnet import ResnetBlock2D
    block_types = (BasicTransformerBlock, ResnetBlock2D)
    if args.model == "flux":
        from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock
        block_types = (FluxTransformerBlock, FluxSingleTransformerBlock)
    for m in list(model.modules()):
        if isinstance(m, block_types):
            fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x = {k: (v.cuda().to(torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids") else v.cuda())
         for k, v in spec["inputs"].items()}
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(output_shape(args.model, spec["inputs"]), generator=g).cuda().to(torch.bfloat16)

    def step():
        out = spec["forward"](model, x)
        (out.float() * grad.float()).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    res = dict(rank=dist.get_rank(), step_ms_median=statistics.median(times),
               peak_bytes=torch.cuda.max_memory_allocated())
    print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


def rank_results(text):
    """The RESULT json of every rank in a launcher's output (lines may carry a '[rank R] ' prefix)."""
    out = []
    for line in text.splitlines():
        m = re.search(r"RESULT (\{.*\})", line)
        if m:
            out.append(json.loads(m.group(1)))
    return out


def summary(results, nranks):
    if len(results) != nranks:
        return None
    return dict(step_ms=max(r["step_ms_median"] for r in results),
                peak_gib=max(r["peak_bytes"] for r in results) / 2**30,
                state_gib=max(r.get("optimizer_state_bytes", 0) for r in results) / 2**30)


def run_torch(key, args):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.gpus}", "--master-port=29611",
           os.path.abspath(__file__), "--worker", "--model", key, "--warmup", str(args.warmup),
           "--steps", str(args.steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    s = summary(rank_results(r.stdout), args.gpus)
    if s is None:  # the first rank's own error line, not the launcher's ChildFailedError summary
        tail = (r.stderr + "\n" + r.stdout).strip().splitlines()
        own = [l for l in tail if re.search(r"(Error|error):", l) and "elastic" not in l and "ChildFailed" not in l]
        return dict(error=(own[-1] if own else tail[-1] if tail else "failed").strip()[:300])
    return s


def run_flame(key, stage, args):
    import torch
    from safetensors.torch import save_file
    import models_full
    spec = models_full.MODELS[key]()
    side = os.path.join(args.work, key)
    os.makedirs(side, exist_ok=True)
    inputs = {k: (v.to(torch.bfloat16) if v.is_floating_point() and k not in ("img_ids", "txt_ids") else v)
              for k, v in spec["inputs"].items()}
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(side, "inputs.safetensors"))
    g = torch.Generator().manual_seed(3)
    save_file({"sample": torch.randn(output_shape(key, spec["inputs"]), generator=g).to(torch.bfloat16)},
              os.path.join(side, "grads.safetensors"))
    cmd = [os.path.join(ROOT, "scripts", "flame-run"), "--nproc", str(args.gpus), "--master-port", "29612",
           args.tool, "--arch", ARCH[key], "--config", json.dumps(spec["cfg"]), "--options", '{"dtype": "bf16"}',
           "--inputs", os.path.join(side, "inputs.safetensors"), "--grads", os.path.join(side, "grads.safetensors"),
           "--checkpoint", "1", "--warmup", str(args.warmup), "--steps", str(args.steps), "--zero", str(stage),
           "--lr", str(LR)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    s = summary(rank_results(r.stdout), args.gpus)
    if s is None:
        tail = (r.stderr + r.stdout).strip().splitlines()
        return dict(error=next((l for l in reversed(tail) if "failed" in l or "rror" in l), tail[-1] if tail else "?")[:300])
    return s


def table(rows, device, commit, gpus):
    lines = [f"{time.strftime('%Y-%m-%d')} · {gpus}x {device} · commit {commit}", "",
             "Full fine-tune, bf16 parameters with f32 master weights, AdamW, checkpointing, 1024x1024, B=1 per GPU; "
             "step ms = the slowest rank's median; GiB = the largest rank's peak allocated; ratio = FLAME / FSDP2.", "",
             "| model | FSDP2 ms | FSDP2 GiB | FLAME stage | FLAME ms | ratio | FLAME GiB | mem ratio | FLAME optimizer state GiB / rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["torch"]
        for stage, f in r["flame"].items():
            def c(d, k, fmt):
                return format(d[k], fmt) if k in d else "-"
            ratio = f"{f['step_ms'] / t['step_ms']:.3f}" if "step_ms" in f and "step_ms" in t else "-"
            mem = f"{f['peak_gib'] / t['peak_gib']:.3f}" if "peak_gib" in f and "peak_gib" in t else "-"
            err = (" " + (f.get("error") or t.get("error") or "")[:160]) if ("error" in f or "error" in t) else ""
            lines.append(f"| {r['model']} | {c(t, 'step_ms', '.1f')} | {c(t, 'peak_gib', '.2f')} | ZeRO-{stage} "
                         f"| {c(f, 'step_ms', '.1f')} | {ratio} | {c(f, 'peak_gib', '.2f')} | {mem} "
                         f"| {c(f, 'state_gib', '.2f')} |{err}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="sdxl", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="sdxl")
    ap.add_argument("--stages", default="1,2")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bench", "flame_bench_model_step"))
    ap.add_argument("--work", default="/tmp/flame_full_finetune")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    if args.worker:
        fsdp_worker(args)
        return 0
    import torch
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for key in args.models.split(","):
        row = dict(model=key, torch=run_torch(key, args), flame={})
        print(f"[{key}] FSDP2 {json.dumps(row['torch'])}", flush=True)
        for stage in args.stages.split(","):
            row["flame"][stage] = run_flame(key, int(stage), args)
            print(f"[{key}] FLAME ZeRO-{stage} {json.dumps(row['flame'][stage])}", flush=True)
        rows.append(row)
        with open(os.path.join(args.out, "full_finetune.json"), "w") as f:
            json.dump(rows, f, indent=1)
    md = table(rows, torch.cuda.get_device_name(), args.commit, args.gpus)
    with open(os.path.join(args.out, "full_finetune.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
