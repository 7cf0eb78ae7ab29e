"""The GPT-2 rows of bench/run.py: T3 (training step time, FLAME vs PyTorch eager and torch.compile,
and loss-curve parity), T4 (cold and warm start to the first step) and T5 (peak memory).

FLAME's side is bench/gpt2.c, built as libflame_gpt2_bench.so (driven here through ctypes, in this
process, on its own FLAME context and stream) and as the program flame_bench_gpt2 (run by T4 in
fresh processes). PyTorch's side is bench/gpt2_torch.py: the same model, parameter names and
layouts, initial weights and token batches.

Parity: the initial weights are drawn once (nanoGPT's initialisation, on the CPU), written to a
safetensors file that FLAME loads, and both libraries train PARITY_STEPS steps on the same
synthetic batches. Tolerances (absolute, on the mean cross-entropy in nats; the loss starts near
ln(50304) = 10.8):
  - step 0 (identical weights, the forward pass only): |FLAME - eager| <= STEP0_TOL = 0.01. Both
    round the products' and attention's outputs to bf16 (relative error 2^-9) and average over
    B*T = 8192 positions; differences of order 1e-3 are expected, a wrong op gives 0.1 or more.
  - every step: |FLAME - eager| <= max(CURVE_TOL = 0.05, the largest |eager bf16 - eager f32| and,
    when torch.compile runs, the largest |eager - torch.compile| over the same steps). Training
    amplifies rounding differences (Adam's first steps move every weight by about lr whatever the
    gradient's size, so gradients near zero whose sign differs move weights in opposite directions),
    so the bound is what bf16 itself does to PyTorch's own curve, and how far PyTorch's two bf16
    implementations (eager and compiled kernels) drift apart, measured in the same run, and never
    tighter than 0.05 nats (0.5% of the initial loss).
A failed check marks the row FAIL and makes run.py exit with status 1.
"""
import ctypes
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import gpt2_torch as gt

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARITY_STEPS = 20
STEP0_TOL = 0.01
CURVE_TOL = 0.05
WARM_START_TARGET_MS = 1000.0
GiB = float(1 << 30)
i64, f64, P = ctypes.c_int64, ctypes.c_double, ctypes.POINTER


class Gpt2Config(ctypes.Structure):
    """gpt2_config of bench/gpt2.h (every field 8 bytes)."""
    _fields_ = [("vocab", i64), ("block", i64), ("layers", i64), ("heads", i64), ("dim", i64), ("batch", i64),
                ("seq", i64), ("lr", f64), ("weight_decay", f64), ("beta1", f64), ("beta2", f64), ("eps", f64),
                ("seed", i64), ("bf16", i64), ("gemm_heuristic_only", i64)]


def library_path():
    return os.environ.get("FLAME_GPT2_LIBRARY") or os.path.join(ROOT, "build", "bench", "libflame_gpt2_bench.so")


def program_path():
    return os.environ.get("FLAME_BENCH_GPT2") or os.path.join(ROOT, "build", "bench", "flame_bench_gpt2")


class FlameGpt2:
    """One FLAME GPT-2 (its own context) through libflame_gpt2_bench.so."""

    def __init__(self, c, weights=None, cache_dir=None, bf16=True):
        lib = self.lib = ctypes.CDLL(library_path())
        H = ctypes.c_void_p
        for name, res, args in (("gpt2_config_default", None, [P(Gpt2Config)]),
                                ("gpt2_create", ctypes.c_int32, [P(Gpt2Config), ctypes.c_char_p, ctypes.c_char_p, P(H)]),
                                ("gpt2_destroy", None, [H]),
                                ("gpt2_set_batch", ctypes.c_int32, [H, H, H]),
                                ("gpt2_step", ctypes.c_int32, [H, P(ctypes.c_float)]),
                                ("gpt2_sync", ctypes.c_int32, [H]),
                                ("gpt2_stream", ctypes.c_int32, [H, P(H)]),
                                ("gpt2_memory", ctypes.c_int32, [H, P(ctypes.c_uint64)]),
                                ("gpt2_reset_peak", ctypes.c_int32, [H]),
                                ("gpt2_last_error", ctypes.c_char_p, [])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        cfg = Gpt2Config()
        lib.gpt2_config_default(ctypes.byref(cfg))
        for k in ("vocab", "block", "layers", "heads", "dim", "batch", "seq", "lr", "weight_decay", "beta1", "beta2", "eps"):
            setattr(cfg, k, getattr(c, k))
        cfg.bf16 = 1 if bf16 else 0
        self.c = c
        self.g = H()
        self.check(lib.gpt2_create(ctypes.byref(cfg), weights.encode() if weights else None,
                                   cache_dir.encode() if cache_dir is not None else None, ctypes.byref(self.g)),
                   "gpt2_create")
        s = H()
        self.check(lib.gpt2_stream(self.g, ctypes.byref(s)), "gpt2_stream")
        self.stream = torch.cuda.ExternalStream(s.value)

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"FLAME GPT-2 {what} failed (status {status}): {self.lib.gpt2_last_error().decode(errors='replace')}")

    def set_batch(self, x, y):
        x, y = x.to("cpu", torch.int64).contiguous(), y.to("cpu", torch.int64).contiguous()
        assert x.numel() == y.numel() == self.c.batch * self.c.seq
        self.check(self.lib.gpt2_set_batch(self.g, x.data_ptr(), y.data_ptr()), "gpt2_set_batch")

    def step(self, read_loss=False):
        if not read_loss:
            self.check(self.lib.gpt2_step(self.g, None), "gpt2_step")
            return None
        v = ctypes.c_float()
        self.check(self.lib.gpt2_step(self.g, ctypes.byref(v)), "gpt2_step")
        return v.value

    def sync(self):
        self.check(self.lib.gpt2_sync(self.g), "gpt2_sync")

    def reset_peak(self):
        self.check(self.lib.gpt2_reset_peak(self.g), "gpt2_reset_peak")

    def memory(self):
        m = (ctypes.c_uint64 * 4)()
        self.check(self.lib.gpt2_memory(self.g, m), "gpt2_memory")
        return {"in_use": m[0], "reserved": m[1], "peak_in_use": m[2], "live_tensors": m[3]}

    def close(self):
        if self.g:
            self.lib.gpt2_destroy(self.g)
            self.g = ctypes.c_void_p()


def config(args):
    return gt.Config(**gt.TINY) if getattr(args, "gpt2_tiny", False) else gt.Config()


def shape_of(c):
    return f"B{c.batch} T{c.seq} L{c.layers} d{c.dim} V{c.vocab}"


def train_flame(b, c, weights, batches, reps, median_ms):
    """FLAME: the parity steps (loss read back after each), then the timed steps on batch 0 and the pool's
    peak over them. Returns losses, median ms, memory dict."""
    fl = FlameGpt2(c, weights)
    try:
        losses = []
        for x, y in batches:
            fl.set_batch(x, y)
            losses.append(fl.step(read_loss=True))
        fl.set_batch(*batches[0])
        fl.sync()
        fl.reset_peak()
        ms = median_ms(lambda: fl.step(), fl.stream, reps, 3, fl.sync)
        fl.sync()
        return losses, ms, fl.memory()
    finally:
        fl.close()


def train_torch(b, c, init, batches, reps, compile_=False, bf16=True, timed=True):
    """PyTorch from the same initial weights: parity steps, then (timed) the median step on batch 0 and
    the allocator's peaks over the timed steps. Returns losses, median ms (or None), (max allocated,
    max reserved), seconds of the first step (with torch.compile: compilation included)."""
    torch.cuda.empty_cache()
    m = gt.GPT(c)
    m.load_state_dict(init)
    m = m.cuda()
    opt = gt.optimizer(m, c)
    sm = torch.compile(m) if compile_ else m
    losses, first_s = [], None
    for x, y in batches:
        x, y = x.cuda(), y.cuda()
        t = time.perf_counter()
        losses.append(gt.train_step(sm, opt, x, y, bf16=bf16).item())
        if first_s is None:
            first_s = time.perf_counter() - t
    ms, mem = None, None
    if timed:
        x0, y0 = batches[0][0].cuda(), batches[0][1].cuda()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = b.time_torch(lambda: gt.train_step(sm, opt, x0, y0, bf16=bf16), reps=reps)
        torch.cuda.synchronize()
        mem = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    del sm, m, opt
    if compile_ and hasattr(torch, "_dynamo"):
        torch._dynamo.reset()  # drop the compiled graphs (and the memory they keep) before the next run
    torch.cuda.empty_cache()
    return losses, ms, mem, first_s


def max_abs_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def tier3(b, median_ms):
    """T3 GPT-2 step time and loss parity; T5 memory rows from the same runs."""
    args = b.args
    c = config(args)
    steps = args.gpt2_steps
    reps = 10 if args.quick else 20
    tokens = c.batch * c.seq
    shape = shape_of(c)
    print(f"GPT-2 {shape}: {steps} parity steps, then {reps} timed steps per library", flush=True)
    batches = gt.synthetic_batches(c, steps)
    tmp = tempfile.mkdtemp(prefix="flame_gpt2_")
    try:
        model = gt.GPT(c)
        gt.init_weights(model, 1337)
        init = gt.state_to_cpu(model)
        del model
        weights = os.path.join(tmp, "gpt2_init.safetensors")
        gt.save_safetensors(weights, init)
        n_params = sum(v.numel() for v in init.values())
        # training FLOPs per step: 6 N per token for the weights, 12 L d T per token for attention
        # (nanoGPT / PaLM's estimate, counting the full score matrix, not the causal half)
        flops = (6.0 * n_params + 12.0 * c.layers * c.dim * c.seq) * tokens

        f_losses, f_ms, f_mem = train_flame(b, c, weights, batches, reps, median_ms)
        print(f"  FLAME   {f_ms:8.3f} ms/step  losses {fmt_losses(f_losses)}", flush=True)
        e_losses, e_ms, e_mem, _ = train_torch(b, c, init, batches, reps)
        print(f"  eager   {e_ms:8.3f} ms/step  losses {fmt_losses(e_losses)}", flush=True)
        y_losses, _, _, _ = train_torch(b, c, init, batches, reps, bf16=False, timed=False)
        print(f"  eager f32 (yardstick)    losses {fmt_losses(y_losses)}", flush=True)
        comp = None
        if not args.no_compile:
            try:
                comp = train_torch(b, c, init, batches, reps, compile_=True)
                print(f"  compile {comp[1]:8.3f} ms/step  first step {comp[3]:.1f} s  losses {fmt_losses(comp[0])}", flush=True)
            except Exception as e:  # noqa: BLE001  (a torch.compile failure must not lose FLAME's rows)
                print(f"  torch.compile failed: {type(e).__name__}: {e}", flush=True)
                b.failures.append(f"T3 GPT-2 torch.compile: {type(e).__name__}: {e}")
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    tps = lambda ms: tokens / (ms * 1e-3)  # noqa: E731
    b.add("T3", "GPT-2 train step vs eager", shape, "bf16", f_ms, e_ms, flops=flops,
          note=f"tokens/s FLAME {tps(f_ms):.0f}, eager {tps(e_ms):.0f}; target ratio <= 0.87")
    if comp:
        b.add("T3", "GPT-2 train step vs torch.compile", shape, "bf16", f_ms, comp[1], flops=flops,
              note=f"tokens/s torch.compile {tps(comp[1]):.0f}; its first step (compilation) took {comp[3]:.1f} s; "
                   f"stretch target ratio <= 1")

    # parity
    d0 = abs(f_losses[0] - e_losses[0])
    d = max_abs_diff(f_losses, e_losses)
    yard = max_abs_diff(e_losses, y_losses)
    yard_c = max_abs_diff(e_losses, comp[0]) if comp else 0.0
    tol = max(CURVE_TOL, yard, yard_c)
    ok = d0 <= STEP0_TOL and d <= tol and all(math.isfinite(x) for x in f_losses)
    note = (f"{'PASS' if ok else 'FAIL'}: max abs(FLAME - eager) {d:.4f} (tolerance {tol:.4f} = max({CURVE_TOL}, "
            f"eager bf16 vs f32 {yard:.4f}, eager vs torch.compile {yard_c:.4f})), step 0 {d0:.4f} (tolerance {STEP0_TOL}); "
            f"loss {f_losses[0]:.3f} -> {f_losses[-1]:.3f}")
    extra = {"flame_losses": f_losses, "torch_losses": e_losses, "torch_f32_losses": y_losses}
    if comp:
        dc = max_abs_diff(f_losses, comp[0])
        note += f"; max abs(FLAME - torch.compile) {dc:.4f}"
        extra["torch_compile_losses"] = comp[0]
    b.info("T3", f"GPT-2 loss parity, {steps} steps", shape, "bf16", d, tol, "nats", note, ratio=d / tol, extra=extra)
    if not ok:
        b.failures.append("GPT-2 loss parity: " + note)

    # T5 memory: FLAME's pool over the timed steps vs the caching allocator's peaks over the same steps
    fp, fr = f_mem["peak_in_use"] / GiB, f_mem["reserved"] / GiB
    for name, mem in (("eager", e_mem),) + ((("torch.compile", comp[2]),) if comp else ()):
        ta, tr = mem[0] / GiB, mem[1] / GiB
        b.info("T5", f"GPT-2 peak in use vs {name} max_memory_allocated", shape, "bf16", fp, ta, "GiB",
               "FLAME pool peak_bytes_in_use over the timed steps", ratio=fp / ta)
        b.info("T5", f"GPT-2 reserved vs {name} max_memory_reserved", shape, "bf16", fr, tr, "GiB",
               "FLAME pool bytes_reserved after the timed steps", ratio=fr / tr)


def fmt_losses(ls):
    if len(ls) <= 6:
        return " ".join(f"{x:.4f}" for x in ls)
    return " ".join(f"{x:.4f}" for x in ls[:3]) + " ... " + " ".join(f"{x:.4f}" for x in ls[-3:])


def run_program(exe, args, timeout):
    """Runs flame_bench_gpt2 and returns its RESULT object; raises with its stderr on failure."""
    import json
    p = subprocess.run([exe] + args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{os.path.basename(exe)} {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{exe}: no RESULT line in its output:\n{p.stdout[-2000:]}")


def tier4(b):
    """T4: from just before flame_ctx_create to the end of the first GPT-2 step (its loss read back), each in
    a fresh process: with an empty kernel cache directory (every kernel compiled by NVRTC and written
    there), then twice with the filled one (the better of the two is reported), then warm with
    gemm_heuristic_only (no cuBLASLt timing of candidate algorithms on first use of a shape)."""
    exe = program_path()
    if not os.path.exists(exe):
        print(f"T4: {exe} not found (build the 'flame_bench_gpt2' target); T4 skipped")
        return
    c = config(b.args)
    shape = shape_of(c)
    common = ["--steps", "1", "--vocab", str(c.vocab), "--block", str(c.block), "--layers", str(c.layers), "--heads",
              str(c.heads), "--dim", str(c.dim), "--batch", str(c.batch), "--seq", str(c.seq)]
    cache = tempfile.mkdtemp(prefix="flame_kcache_")
    try:
        cold = run_program(exe, common + ["--cache-dir", cache], 900)
        files = sum(len(fs) for _, _, fs in os.walk(cache))
        warm = min((run_program(exe, common + ["--cache-dir", cache], 300) for _ in range(2)),
                   key=lambda r: r["ctx_to_first_step_ms"])
        heur = run_program(exe, common + ["--cache-dir", cache, "--heuristic-gemm"], 300)
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    def parts(r):
        return f"context+init {r['create_ms']:.0f} ms, first step {r['first_step_ms']:.0f} ms"

    b.info("T4", "GPT-2 start to first step, cold kernel cache", shape, "bf16", cold["ctx_to_first_step_ms"], None, "ms",
           f"{parts(cold)}; {files} files written to the empty cache directory")
    for name, r in (("warm kernel cache", warm), ("warm, heuristic GEMM choice", heur)):
        v = r["ctx_to_first_step_ms"]
        b.info("T4", f"GPT-2 start to first step, {name}", shape, "bf16", v, WARM_START_TARGET_MS, "ms",
               f"{'meets' if v <= WARM_START_TARGET_MS else 'misses'} the {WARM_START_TARGET_MS:.0f} ms target; {parts(r)}",
               ratio=v / WARM_START_TARGET_MS)
    b.info("T4", "GPT-2 kernel compilation (cold - warm)", shape, "bf16",
           cold["ctx_to_first_step_ms"] - warm["ctx_to_first_step_ms"], None, "ms",
           "NVRTC compilation and cache writes of every kernel the program uses, as the difference of the two starts "
           "(FLAME has no public counter of compile time)")
