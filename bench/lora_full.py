#!/usr/bin/env python3
"""LoRA training steps of full-size models on one GPU, FLAME beside diffusers + peft (tier "T6").

Issue 36's rows: SDXL-base UNet (B=1 and B=4, with and without checkpointing), Flux-dev transformer
(B=1, with and without checkpointing), SD3.5-medium transformer (B=1); bf16 weights, random init,
1024x1024 (latents 128x128), a rank-16 LoRA (alpha 16, f32 A and B as diffusers' training scripts
keep them under bf16 mixed precision) on diffusers' training-script targets, AdamW (lr 1e-4) on the
adapter only. Step = forward + loss (sum(sample * G), fixed random G) + backward + optimizer step +
gradients dropped; median of the timed steps after warm-up; peak = max allocated over the timed steps
(weights included).

  - PyTorch: the diffusers class, `add_adapter(LoraConfig(...))` (peft), torch.optim.AdamW (its
    default foreach implementation), `enable_gradient_checkpointing()` where the row says; with
    --compile also `compile_repeated_blocks(fullgraph=True)` (diffusers' regional compile; SD3, which
    names no repeated blocks, gets each transformer block compiled the same way), its first step (the
    compile) timed separately.
  - FLAME: build/bench/flame_bench_model_step --arch --config (flame_model_create) --lora (the same
    targets by the architecture's default preset, checked by the adapter's element count) eager, and
    with --graph 1 the whole step captured as one CUDA graph. FLAME-only rows may add model options
    (fp8 base, offload) and flags of the tool: "...-oib" rows pass --optimizer-in-backward (one AdamW
    per adapter tensor, stepped from its post-accumulate-grad hook during backward, which then drops
    the gradient: bench/optimizer_in_backward.h), so that no adapter gradient waits for the end of
    backward.

  - Work per step (issue 36): kernels (every launch: kernels, GEMMs, memsets, copies; a replayed
    FLAME graph is one), cast kernels (dtype conversions) and host syncs. FLAME: flame_ctx_counters
    over the timed steps. PyTorch: torch.profiler over one more step after the timing (a separate
    pass, so the timing is undisturbed): CUDA device events as kernels, those whose name is a copy
    kernel with casting loads/stores as casts, and cudaStreamSynchronize / cudaDeviceSynchronize /
    cudaEventSynchronize / blocking cudaMemcpy calls of the CPU activity as syncs.
  - GPU busy fraction (issue 36; --busy-steps N, default 3, 0 leaves it out): the union of the device
    intervals of every kernel, memcpy and memset over the wall-clock time from the host's start of the
    first of N steps to the end, device synchronised, of the last (overlapping work counts once). Both
    sides measure N more steps after the timed ones, so the timed rows carry no tracing cost. FLAME:
    flame_bench_model_step --busy N (CUPTI activity trace, bench/cupti_busy.c; eager and graph replay,
    whose kernels CUPTI reports one by one), after one untimed step under the trace. PyTorch:
    torch.profiler with the CUDA activity only (no CPU op tracing), after one untimed step under the
    trace and a marker kernel, its Chrome trace's kernel / gpu_memcpy / gpu_memset events after the
    marker merged (bench/busy_trace.py). Tracing costs host time per launch on both sides, which
    lowers a host-bound step's fraction a little: busy_wall_ms_per_step (in the JSON) against the timed
    ms shows how much.

    PYTHONPATH=$PWD/.ref python3 bench/lora_full.py [--rows sdxl-b1,...] [--compile] [--busy-steps 3] [--out DIR]

Writes DIR/lora_full.json and DIR/lora_full.md (the tier's table for bench/RESULTS.md).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import models_full  # noqa: E402  (the full-size configs and inputs)
import busy_trace  # noqa: E402  (the busy fraction's merging, shared with its self-check)

# row -> (model, batch, checkpointing[, FLAME model options[, flame_bench_model_step flags]])
ROWS = {
    "sdxl-b1": ("sdxl", 1, 0),
    "sdxl-b4": ("sdxl", 4, 0),
    "sdxl-b4-ckpt": ("sdxl", 4, 1),
    "flux-b1-ckpt": ("flux", 1, 1),
    "flux-b1": ("flux", 1, 0),
    "sd35-b1": ("sd35", 1, 0),
    # FLAME only (diffusers has no fp8 frozen base to train on): judged against FLAME's bf16 row
    "flux-b1-ckpt-fp8": ("flux", 1, 1, {"quantize": {"dtype": "f8_e4m3", "scale": "tensor"}}),
    # FLAME only: the fp8 row with the optimizer applied inside backward (issue 36's 14 GiB target)
    "flux-b1-ckpt-fp8-oib": ("flux", 1, 1, {"quantize": {"dtype": "f8_e4m3", "scale": "tensor"}},
                             ["--optimizer-in-backward"]),
    # FLAME only: a QLoRA-style NF4 base (64-value blocks, double-quantised scales, as bitsandbytes'
    # nf4 with compress_statistics; bitsandbytes is not on the bench machine), judged against the bf16 row
    "flux-b1-ckpt-nf4": ("flux", 1, 1, {"quantize": {"dtype": "nf4"}}),
    # FLAME only: the bf16 ckpt row with AdamW's moments in 8 bits (flame_optimizer_set_state_bits, as
    # bitsandbytes' AdamW8bit; not installed on the bench machine)
    "flux-b1-ckpt-adamw8bit": ("flux", 1, 1, None, ["--state-bits", "8"]),
    # FLAME only: frozen blocks streamed from pinned host memory within 12 GiB of device memory for the
    # parameters (offload is not captured into graphs: eager only), judged against the bf16 ckpt row
    "flux-b1-ckpt-offload12": ("flux", 1, 1, {"offload": {"budget_bytes": 12 * 2**30}}),
}
ARCH = {"sdxl": "UNet2DConditionModel", "flux": "FluxTransformer2DModel", "sd35": "SD3Transformer2DModel"}
# diffusers' training scripts' defaults (train_dreambooth_lora_{sdxl,flux,sd3}.py)
TARGETS = {
    "sdxl": ["to_q", "to_k", "to_v", "to_out.0"],
    "flux": ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
             "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
             "ff_context.net.2"],
    "sd35": ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "attn.to_k",
             "attn.to_out.0", "attn.to_q", "attn.to_v"],
}
UNBATCHED = ("img_ids", "txt_ids")
RANK = 16


def batched(inputs, b):
    return {k: (v if k in UNBATCHED or b == 1 else v.repeat(b, *([1] * (v.dim() - 1)))) for k, v in inputs.items()}


TORCH_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                    "cudaMemcpy2D")
CAST_KERNEL = re.compile(r"copy_kernel.*(WithCast|[Cc]ast)")


def torch_counts(step):
    """Kernels, cast kernels and host syncs of one PyTorch step, from torch.profiler. Syncs are the
    runtime calls inside the step's own range (the profile's closing synchronize is outside it)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("lora_full_step"):
            step()
        torch.cuda.synchronize()
    events = prof.events()
    span = next(e.time_range for e in events if e.name == "lora_full_step")
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    syncs = [e for e in events if e.device_type == DeviceType.CPU and e.name in TORCH_SYNC_CALLS
             and span.start <= e.time_range.start <= span.end]
    return dict(launches_per_step=len(device), cast_kernels_per_step=sum(1 for e in device if CAST_KERNEL.search(e.name)),
                host_syncs_per_step=len(syncs))


TORCH_BUSY_MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: the device work after it is measured


def torch_busy(step, steps, work):
    """GPU busy fraction of `steps` more PyTorch steps (bench/busy_trace.py's definition): torch.profiler
    with the CUDA activity only. Inside the profile one untimed step (the trace's start-up, as
    flame_bench_model_step --busy does), then a marker kernel (torch.cuda._sleep) and a synchronize, then
    the wall clock from just before the first measured step to the synchronised end of the last; the
    device intervals that start after the marker, from the exported Chrome trace."""
    from torch.profiler import ProfilerActivity, profile
    marker = TORCH_BUSY_MARKER if hasattr(torch.cuda, "_sleep") else None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if marker:
            step()
            torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    path = os.path.join(work, "torch_busy_trace.json")
    prof.export_chrome_trace(path)
    try:
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.remove(path)
    return busy_trace.summary(trace, wall_ms, steps, marker)


def torch_row(spec, key, batch, ckpt, args):
    from peft import LoraConfig
    torch.backends.cuda.enable_cudnn_sdp(spec.get("torch_cudnn_sdp", True))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = spec["cls"](**spec["cfg"])
    model = model.to(torch.bfloat16)
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=RANK, lora_alpha=RANK, init_lora_weights="gaussian", target_modules=TARGETS[key]))
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in lora:
        p.data = p.data.float()  # diffusers' cast_training_params(model, torch.float32)
    adapter_elements = sum(p.numel() for p in lora)
    if ckpt:
        model.enable_gradient_checkpointing()
    model.train()
    compile_s = None
    if args.compile:
        # each row compiles afresh; SDXL's blocks see a shape per resolution level (and per batch
        # size), more than dynamo's default of 8 recompiles per code object
        torch._dynamo.reset()
        torch._dynamo.config.cache_size_limit = 64
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        if getattr(model, "_repeated_blocks", None):
            model.compile_repeated_blocks(fullgraph=True)
        else:  # SD3Transformer2DModel names no repeated blocks: compile each transformer block, the same regions
            for block in model.transformer_blocks:
                block.compile(fullgraph=True)
    opt = torch.optim.AdamW(lora, lr=1e-4)
    x = {k: (v.cuda().to(torch.bfloat16) if v.is_floating_point() and k not in UNBATCHED else v.cuda())
         for k, v in batched(spec["inputs"], batch).items()}
    with torch.no_grad():
        shape = spec["forward"](model, x).shape
    g = torch.Generator().manual_seed(3)
    grad_cpu = torch.randn(shape, generator=g)
    grad = grad_cpu.cuda().to(torch.bfloat16)
    torch.cuda.synchronize()
    times = []

    def step():
        out = spec["forward"](model, x)
        (out * grad).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i == 0 and args.compile:
            compile_s = time.perf_counter() - t0
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated()
    try:
        counts = torch_counts(step)
    except RuntimeError as e:  # no CUPTI: the row keeps its timing
        counts = dict(counts_error=str(e).splitlines()[0][:200])
    if args.busy_steps:
        try:
            counts.update(torch_busy(step, args.busy_steps, args.work))
        except (RuntimeError, OSError, ValueError) as e:  # no CUPTI, or no trace: the row keeps its timing
            counts["busy_error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
    del model, opt, lora, x
    torch.cuda.empty_cache()
    return dict(ms=statistics.median(times), peak_gib=peak / 2**30, adapter_elements=adapter_elements,
                compile_s=compile_s, **counts), grad_cpu


def flame_row(spec, key, batch, ckpt, grad_cpu, args, graph, extra_options=None, tool_flags=()):
    side = os.path.join(args.work, f"{key}_b{batch}")
    os.makedirs(side, exist_ok=True)
    inputs = {k: (v.to(torch.bfloat16) if v.is_floating_point() and k not in UNBATCHED else v)
              for k, v in batched(spec["inputs"], batch).items()}
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(side, "inputs.safetensors"))
    save_file({"sample": grad_cpu.to(torch.bfloat16)}, os.path.join(side, "grads.safetensors"))
    lora = {"rank": RANK, "alpha": RANK, "init": "gaussian"}
    options = dict({"dtype": "bf16"}, **(extra_options or {}))
    cmd = [args.tool, "--arch", ARCH[key], "--config", json.dumps(spec["cfg"]), "--options", json.dumps(options),
           "--inputs", os.path.join(side, "inputs.safetensors"), "--grads", os.path.join(side, "grads.safetensors"),
           "--checkpoint", str(ckpt), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--lora", json.dumps(lora), "--graph", str(int(graph)), *tool_flags]
    busy_error = None
    r = subprocess.run(cmd + (["--busy", str(args.busy_steps)] if args.busy_steps else []), capture_output=True, text=True)
    if r.returncode != 0 and "built without CUPTI" in r.stderr:  # the row without its busy fraction
        busy_error = r.stderr.strip().splitlines()[-1][:200]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return dict(error=(r.stderr or r.stdout).strip()[-1500:])
    res = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
    counts = {k: res[k] for k in ("launches_per_step", "cast_kernels_per_step", "host_syncs_per_step",
                                  "driver_allocations_per_step", "optimizer_in_backward", "optimizer_state_bytes",
                                  "state_bits") if k in res}
    busy = {k: v for k, v in res.items() if k.startswith("busy_")}
    if busy.get("busy_error"):  # no fraction (RESULT's -1): busy_error says why
        busy.pop("busy_fraction", None)
    else:
        busy.pop("busy_error", None)
    if busy_error:
        busy["busy_error"] = busy_error
    counts.update(busy)
    return dict(ms=res["step_ms_median"], peak_gib=res["peak_bytes"] / 2**30, adapter_elements=res["adapter_elements"],
                graph=bool(res["graph"]), graph_error=res["graph_error"], **counts)


def warm_start_row(name, args):
    """Process start to the first finished LoRA step, FLAME loading the diffusers folder from a warm page
    cache with a filled kernel cache: the folder is written once by diffusers (save_pretrained), FLAME
    runs once to fill both caches and is timed on its second run (start_to_first_step_ms of
    flame_bench_model_step: context, load, adapter, optimizer, inputs, first step)."""
    key, batch, ckpt = ROWS[name][:3]
    spec = models_full.MODELS[key]()
    folder = os.path.join(args.work, f"{key}_diffusers")
    if not os.path.exists(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = spec["cls"](**spec["cfg"])
        model.to(torch.bfloat16).save_pretrained(folder)
        del model
        torch.cuda.empty_cache()
    side = os.path.join(args.work, f"{key}_b{batch}")
    os.makedirs(side, exist_ok=True)
    inputs = {k: (v.to(torch.bfloat16) if v.is_floating_point() and k not in UNBATCHED else v)
              for k, v in batched(spec["inputs"], batch).items()}
    save_file({k: v.contiguous() for k, v in inputs.items()}, os.path.join(side, "inputs.safetensors"))
    g = torch.Generator().manual_seed(3)
    out_shape = inputs["sample" if key == "sdxl" else "hidden_states"].shape  # the output has the latents' shape
    save_file({"sample": torch.randn(out_shape, generator=g).to(torch.bfloat16)}, os.path.join(side, "grads.safetensors"))
    lora = {"rank": RANK, "alpha": RANK, "init": "gaussian"}
    cmd = [args.tool, "--load", folder, "--options", json.dumps({"dtype": "bf16"}),
           "--inputs", os.path.join(side, "inputs.safetensors"), "--grads", os.path.join(side, "grads.safetensors"),
           "--checkpoint", str(ckpt), "--warmup", "1", "--steps", "1", "--lora", json.dumps(lora)]
    runs = []
    for _ in range(2):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            return dict(row=name, error=(r.stderr or r.stdout).strip()[-1500:])
        res = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
        runs.append(dict(start_to_first_step_s=res["start_to_first_step_ms"] / 1e3, load_s=res["load_ms"] / 1e3,
                         process_wall_s=wall))
    row = dict(row=name, first_run=runs[0], warm=runs[1])
    print(f"[{name} warm start] {json.dumps(row)}", flush=True)
    return row


def run_row(name, args):
    key, batch, ckpt = ROWS[name][:3]
    extra = ROWS[name][3] if len(ROWS[name]) > 3 else None
    flags = ROWS[name][4] if len(ROWS[name]) > 4 else []
    spec = models_full.MODELS[key]()
    row = dict(row=name, model=spec["name"], batch=batch, checkpoint=ckpt, options=extra, tool_flags=flags)
    if extra or flags or args.flame_only:  # FLAME only; the output gradient has the latents' shape (Flux: packed hidden_states)
        g = torch.Generator().manual_seed(3)
        latents = batched(spec["inputs"], batch)["sample" if key == "sdxl" else "hidden_states"]
        grad_cpu = torch.randn(latents.shape, generator=g)
        row["torch"] = {}
        row["flame"] = flame_row(spec, key, batch, ckpt, grad_cpu, args, graph=False, extra_options=extra, tool_flags=flags)
        if not args.no_graph:
            row["flame_graph"] = flame_row(spec, key, batch, ckpt, grad_cpu, args, graph=True, extra_options=extra,
                                           tool_flags=flags)
        print(f"[{name}] {json.dumps(row)}", flush=True)
        return row
    try:
        row["torch"], grad_cpu = torch_row(spec, key, batch, ckpt, args)
    except Exception as e:  # out of memory, or a compile failure (torch._dynamo's own exceptions)
        row["torch"] = dict(error=(str(e).splitlines() or [type(e).__name__])[0][:300])
        torch.cuda.empty_cache()
        print(f"[{name}] PyTorch failed: {row['torch']['error']}", flush=True)
        return row
    row["flame"] = flame_row(spec, key, batch, ckpt, grad_cpu, args, graph=False)
    if not args.no_graph:
        row["flame_graph"] = flame_row(spec, key, batch, ckpt, grad_cpu, args, graph=True)
    for k in ("flame", "flame_graph"):
        if k in row and "ms" in row[k]:
            row[k]["ratio"] = row[k]["ms"] / row["torch"]["ms"]
            row[k]["mem_ratio"] = row[k]["peak_gib"] / row["torch"]["peak_gib"]
            row[k]["same_adapter"] = row[k]["adapter_elements"] == row["torch"]["adapter_elements"]
    print(f"[{name}] {json.dumps(row)}", flush=True)
    return row


def cell(r, k, fmt):
    return format(r[k], fmt) if r and k in r and r[k] is not None else "-"


def work_cell(r, casts=True):
    keys = ("launches_per_step", "cast_kernels_per_step", "host_syncs_per_step") if casts else (
        "launches_per_step", "host_syncs_per_step")
    return " / ".join(cell(r, k, ".0f") for k in keys)


def busy_cell(t, f, fg):
    """PyTorch / FLAME eager / FLAME graph busy fractions (- where not measured or no graph)."""
    return " / ".join([cell(t, "busy_fraction", ".2f"), cell(f, "busy_fraction", ".2f"),
                       cell(fg, "busy_fraction", ".2f") if fg.get("graph") else "-"])


def table(rows, device, commit, compiled):
    lines = [f"{time.strftime('%Y-%m-%d')} · {device} · commit {commit} · torch {torch.__version__}"
             f"{' · PyTorch with regional compile' if compiled else ' · PyTorch eager'}", "",
             "bf16 weights, 1024x1024, rank-16 LoRA (f32 A/B) on diffusers' script targets, AdamW on the adapter; "
             "step = forward + backward + optimizer step; median of the timed steps; peak = max allocated "
             "(weights included). ratio = FLAME ms / PyTorch ms (lower is better).", "",
             "kernels / casts / syncs: per step (PyTorch: torch.profiler over one step; FLAME: flame_ctx_counters, "
             "a replayed graph is one launch).", "",
             "busy: GPU busy fraction, the union of the kernel / memcpy / memset device intervals over the wall "
             "time of separate traced steps after the timed ones (PyTorch: torch.profiler, CUDA activity only; "
             "FLAME: flame_bench_model_step --busy, CUPTI).", "",
             "| row | PyTorch ms | PyTorch GiB | FLAME eager ms | ratio | FLAME graph ms | ratio | FLAME GiB | mem ratio "
             "| PyTorch kernels / casts / syncs | FLAME eager kernels / casts / syncs | FLAME graph kernels / syncs "
             "| busy PyTorch / FLAME eager / FLAME graph |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, f, fg = r.get("torch", {}), r.get("flame", {}), r.get("flame_graph", {})
        fe = " ".join(dict.fromkeys(x for x in (f.get("error") or fg.get("graph_error"), t.get("busy_error"),
                                                f.get("busy_error"), fg.get("busy_error")) if x))
        lines.append(f"| {r['row']} | {cell(t, 'ms', '.1f')} | {cell(t, 'peak_gib', '.2f')} | {cell(f, 'ms', '.1f')} "
                     f"| {cell(f, 'ratio', '.3f')} | {cell(fg, 'ms', '.1f') if fg.get('graph') else '-'} "
                     f"| {cell(fg, 'ratio', '.3f') if fg.get('graph') else '-'} | {cell(f, 'peak_gib', '.2f')} "
                     f"| {cell(f, 'mem_ratio', '.3f')} | {work_cell(t)} | {work_cell(f)} "
                     f"| {work_cell(fg, casts=False) if fg.get('graph') else '-'} | {busy_cell(t, f, fg)} |"
                     + (f" {fe[:120]}" if fe else ""))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bench", "flame_bench_model_step"))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="PyTorch with compile_repeated_blocks(fullgraph=True)")
    ap.add_argument("--no-graph", action="store_true", help="FLAME eager only")
    ap.add_argument("--busy-steps", type=int, default=3,
                    help="steps traced after the timed ones for the GPU busy fraction, both sides (0: not measured)")
    ap.add_argument("--flame-only", action="store_true",
                    help="FLAME's rows without PyTorch's (no ratios): FLAME-only rows judged against FLAME's bf16 row")
    ap.add_argument("--work", default="/tmp/flame_lora_full")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default="")
    ap.add_argument("--warm-start", action="store_true",
                    help="instead of the step table: FLAME's process start to first step, loading a diffusers folder")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    if args.warm_start:
        for name in args.rows.split(","):
            if len(ROWS[name]) > 3:
                continue
            rows.append(warm_start_row(name, args))
            with open(os.path.join(args.out, "lora_warm_start.json"), "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    for name in args.rows.split(","):
        rows.append(run_row(name, args))
        with open(os.path.join(args.out, "lora_full.json"), "w") as f:
            json.dump(rows, f, indent=1)
    md = table(rows, torch.cuda.get_device_name(), args.commit, args.compile)
    with open(os.path.join(args.out, "lora_full.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
