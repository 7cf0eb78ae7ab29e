#!/usr/bin/env python3
"""flame-train on full-size models: s/step and peak GPU memory beside tier T6 (issue 37).

Issue 37's full-size check: Flux-dev and SDXL-base (random init, bf16) train a few LoRA steps with
the flame-train program itself (not the bench harness), from real model layouts and a latent cache.
For each model:
  1. the full-size random-init model (bench/models_full.py's MODELS configs) built with diffusers in
     bf16 and written with save_pretrained as a diffusers model folder (config.json + sharded
     diffusion_pytorch_model safetensors: a layout flame_model_load reads), once, under --work;
  2. a synthetic latent cache in tools/flame-train/training_data.h's format: 8 samples at 1024x1024
     (latents [C, 128, 128] bf16; Flux: T5 states [512, 4096] + CLIP pooled [768]; SDXL: states
     [77, 2048], pooled [1280], time_ids [6] f32), random values;
  3. a flame-train JSON config (rank 16, alpha 16, AdamW lr 1e-4, batch 1, bf16, 12 steps, no
     sampling, LoRA saved only at the end) run as `flame-train --config FILE` under a timeout.
Rows: Flux-dev with gradient checkpointing; SDXL without and with checkpointing.
Step time: the JSONL log's per-step "ms" (flame-train times train_step on the host clock), median
over the steps after the first 2. Peak memory: the JSONL's "peak_gib" (FLAME's pool, peak bytes in
use, weights included: what T6 reports); beside it the whole process's as a thread polls
`nvidia-smi --query-gpu=memory.used` every 0.2 s (max minus the reading before the run: CUDA context,
pool reserve and caches; a poll can miss a short spike), and flame-train's own memory estimate (the
"memory estimate: X GiB peak" line it prints before loading the model).
The T6 rows (bench/RESULTS.md, commit T6_COMMIT) are given beside each row: FLAME eager / graph ms
and GiB of the bench harness's step for the same model, batch and checkpointing.

    PYTHONPATH=$PWD/.ref python3 bench/trainer_full.py [--models flux,sdxl] \
        [--tool build-gpu/tools/flame-train/flame-train] [--work /tmp/flame_trainer_full] [--out DIR]

Writes DIR/trainer_full.json and DIR/trainer_full.md (DIR: --out, default $OUT or the current folder).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from models_full import MODELS  # noqa: E402

SAMPLES = 8
STEPS = 12
WARMUP_STEPS = 2

# T6 rows of bench/RESULTS.md (lora_full.py, commit T6_COMMIT): FLAME eager ms, graph ms, GiB
T6_COMMIT = "009244f"
T6 = {
    "Flux-dev B=1, ckpt": (640.3, 624.7, 25.14),
    "SDXL B=1": (184.1, 74.3, 10.20),
}

# row name -> (model key, gradient checkpointing, T6 row it sits beside)
ROWS = {
    "flux-ckpt": ("flux", True, "Flux-dev B=1, ckpt"),
    "sdxl": ("sdxl", False, "SDXL B=1"),
    "sdxl-ckpt": ("sdxl", True, "SDXL B=1"),  # T6 has no SDXL B=1 ckpt row: beside the plain one
}

# per family: latent channels, text tokens, text width, pooled width (training_data.h)
CACHE_SHAPES = {"flux": (16, 512, 4096, 768), "sdxl": (4, 77, 2048, 1280)}


def write_model(key, folder):
    """The full-size random-init model in bf16 as a diffusers model folder (skipped when present)."""
    if os.path.exists(os.path.join(folder, "config.json")):
        print(f"{key}: model folder {folder} present, reused", flush=True)
        return
    spec = MODELS[key]()
    t0 = time.time()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: fast
        model = spec["cls"](**spec["cfg"])
    model = model.to(torch.bfloat16)
    tmp = folder + ".partial"  # renamed when complete: an interrupted save is not reused
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    os.rename(tmp, folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(f"{key}: wrote {folder} ({n / 1e9:.2f} B parameters, {time.time() - t0:.0f} s)", flush=True)


def write_cache(family, path, samples=SAMPLES, pixels=1024, seed=0):
    """A latent cache (training_data.h) of random values: samples images at pixels x pixels."""
    channels, tokens, text_dim, pooled_dim = CACHE_SHAPES[family]
    side = pixels // 8
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(samples):
        tensors[f"latents.{i}"] = torch.randn(channels, side, side, generator=g).to(torch.bfloat16)
        tensors[f"prompt_embeds.{i}"] = torch.randn(tokens, text_dim, generator=g).to(torch.bfloat16)
        tensors[f"pooled_prompt_embeds.{i}"] = torch.randn(pooled_dim, generator=g).to(torch.bfloat16)
        if family == "sdxl":
            tensors[f"time_ids.{i}"] = torch.tensor([pixels, pixels, 0, 0, pixels, pixels], dtype=torch.float32)
    meta = {"flame_train_cache": "1", "family": family, "count": str(samples), "sample_prompts": "0",
            "fingerprint": "bench/trainer_full.py synthetic"}
    save_file(tensors, path, metadata=meta)


def train_config(model_folder, cache, out_dir, family, checkpointing):
    return {
        "model": {"path": model_folder, "arch": family},
        "data": {"path": "", "cache_file": cache, "resolution": 1024},
        "network": {"dim": 16, "alpha": 16},
        "optimizer": {"type": "adamw", "learning_rate": 1e-4, "lr_scheduler": "constant"},
        "training": {"seed": 42, "batch_size": 1, "max_train_steps": STEPS, "mixed_precision": "bf16",
                     "gradient_checkpointing": checkpointing},
        "sample": {"every_n_steps": 0},
        "output": {"dir": out_dir, "name": "lora", "save_every_n_steps": 0, "format": "kohya"},
    }


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"],
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[0])


class MemoryPoller:
    """Max of nvidia-smi's memory.used (MiB, GPU 0) while running, every interval seconds."""

    def __init__(self, interval=0.2):
        self.interval, self.peak, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, gpu_used_mib())
            except (subprocess.SubprocessError, ValueError, IndexError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def step_times(log_path):
    """Per-step ms of flame-train's JSONL log, in step order."""
    steps = []
    with open(log_path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "ms" in rec and "step" in rec:
                    steps.append((rec["step"], rec["ms"], rec.get("loss"), rec.get("peak_gib")))
    steps.sort()
    return steps


def run_row(row, args):
    key, checkpointing, t6_row = ROWS[row]
    family = key
    model_folder = os.path.join(args.work, f"{key}-diffusers")
    write_model(key, model_folder)
    cache = os.path.join(args.work, f"{family}-cache-{SAMPLES}x1024.safetensors")
    if not os.path.exists(cache):
        write_cache(family, cache)
    run_dir = os.path.join(args.work, "runs", row)
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, "config.json")
    with open(config_path, "w") as f:
        json.dump(train_config(model_folder, cache, run_dir, family, checkpointing), f, indent=1)
    log_path = os.path.join(run_dir, "lora.jsonl")
    if os.path.exists(log_path):
        os.remove(log_path)

    baseline = gpu_used_mib()
    t0 = time.time()
    with MemoryPoller() as poller:
        try:
            proc = subprocess.run([args.tool, "--config", config_path], capture_output=True, text=True,
                                  timeout=args.timeout)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            output = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    wall = time.time() - t0
    with open(os.path.join(run_dir, "flame-train.log"), "w") as f:
        f.write(output)
    print(f"--- {row}: flame-train rc {rc}, {wall:.1f} s\n{output[-3000:]}", flush=True)

    steps = step_times(log_path) if os.path.exists(log_path) else []
    timed = [ms for _, ms, _, _ in steps[WARMUP_STEPS:]]
    pool_peaks = [p for _, _, _, p in steps if p is not None]  # flame-train's pool counter (JSONL peak_gib)
    median_s = statistics.median(timed) / 1000 if timed else None
    estimate = re.search(r"memory estimate: ([0-9.]+) GiB peak", output)  # memory_check.cpp's line
    eager, graph, t6_gib = T6[t6_row]
    return {"row": row, "model": key, "checkpointing": checkpointing, "rc": rc, "wall_s": round(wall, 1),
            "steps": len(steps), "median_s_per_step": median_s, "step_ms": [ms for _, ms, _, _ in steps],
            "losses": [loss for _, _, loss, _ in steps],
            "peak_gib": round(max(pool_peaks), 2) if pool_peaks else None,
            "peak_source": "flame-train's JSONL peak_gib (the pool's peak bytes in use, weights included)",
            "process_peak_gib": round((poller.peak - baseline) / 1024, 2) if poller.peak else None,
            "estimate_gib": float(estimate.group(1)) if estimate else None,
            "t6_row": t6_row, "t6_flame_eager_ms": eager, "t6_flame_graph_ms": graph, "t6_flame_gib": t6_gib,
            "t6_commit": T6_COMMIT}


def markdown(results, header):
    lines = [header, "",
             f"| row | rc | steps | median s/step (steps {WARMUP_STEPS + 1}+) | peak GiB (pool) | "
             f"process GiB (nvidia-smi) | flame-train estimate GiB | T6 row ({T6_COMMIT}) | "
             f"T6 FLAME eager / graph ms | T6 FLAME GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        med = f"{r['median_s_per_step']:.3f}" if r["median_s_per_step"] is not None else "-"
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        est = f"{r['estimate_gib']:.2f}" if r.get("estimate_gib") is not None else "-"
        proc = f"{r['process_peak_gib']:.2f}" if r.get("process_peak_gib") is not None else "-"
        lines.append(f"| {r['row']} | {r['rc']} | {r['steps']} | {med} | {peak} | {proc} | {est} | {r['t6_row']} | "
                     f"{r['t6_flame_eager_ms']} / {r['t6_flame_graph_ms']} | {r['t6_flame_gib']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="flux,sdxl", help="comma list of flux, sdxl")
    ap.add_argument("--tool", default="build-gpu/tools/flame-train/flame-train", help="the flame-train binary")
    ap.add_argument("--work", default="/tmp/flame_trainer_full", help="model folders, caches and runs")
    ap.add_argument("--commit", default="", help="the commit measured (default: git rev-parse of this tree; the GPU "
                    "machine's copy has no .git)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the table and JSON go")
    ap.add_argument("--timeout", type=int, default=400, help="seconds per flame-train run")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        ap.error("--models: name at least one of flux, sdxl")
    for m in models:
        if m not in CACHE_SHAPES:
            ap.error(f"--models: unknown model {m!r} (flux, sdxl)")
    if not os.access(args.tool, os.X_OK):
        ap.error(f"--tool: {args.tool} is not an executable file")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)

    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=HERE).stdout.strip()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "--id=0"],
                         capture_output=True, text=True).stdout.strip()
    header = (f"flame-train, full size (issue 37) · {time.strftime('%Y-%m-%d')} · {gpu} · commit {commit} · "
              f"`bench/trainer_full.py` · {SAMPLES} cached 1024x1024 samples, rank 16, AdamW, batch 1, "
              f"{STEPS} steps; peak = FLAME's pool peak (JSONL peak_gib), process = nvidia-smi polling")
    results = []
    for row, (key, _, _) in ROWS.items():
        if key not in models:
            continue
        results.append(run_row(row, args))
        md = markdown(results, header)  # rewritten after every row: a later timeout keeps the earlier ones
        with open(os.path.join(args.out, "trainer_full.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "trainer_full.json"), "w") as f:
            json.dump({"commit": commit, "gpu": gpu, "rows": results}, f, indent=1)
    print(md)
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
