"""The GPT-2 rows of bench/run.py: T3 (training step time, FLAME vs PyTorch eager and torch.compile,
and loss-curve parity), T4 (cold and warm start to the first step), T5 (peak memory) and T3dp
(data-parallel scaling on 2 GPUs, tier3_dp's docstring).

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
                                ("gpt2_last_loss", ctypes.c_int32, [H, P(ctypes.c_float)]),
                                ("gpt2_graph_capture", ctypes.c_int32, [H]),
                                ("gpt2_graph_replay", ctypes.c_int32, [H]),
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

    def capture(self):
        self.check(self.lib.gpt2_graph_capture(self.g), "gpt2_graph_capture")

    def replay(self, read_loss=False):
        self.check(self.lib.gpt2_graph_replay(self.g), "gpt2_graph_replay")
        if not read_loss:
            return None
        v = ctypes.c_float()
        self.check(self.lib.gpt2_last_loss(self.g, ctypes.byref(v)), "gpt2_last_loss")
        return v.value

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


def train_flame_graph(c, weights, batch, steps, reps, median_ms):
    """FLAME with the training step captured once as a CUDA graph (flame_graph_*): `steps` steps on one
    batch two ways from the same weights, eager gpt2_step and (after one eager step) the replayed
    graph, losses read after each; then the median replay time. Returns (eager losses, graph
    losses, median ms)."""
    eager = []
    fl = FlameGpt2(c, weights)
    try:
        fl.set_batch(*batch)
        for _ in range(steps):
            eager.append(fl.step(read_loss=True))
    finally:
        fl.close()
    fl = FlameGpt2(c, weights)
    try:
        fl.set_batch(*batch)
        graph = [fl.step(read_loss=True)]
        fl.capture()
        for _ in range(steps - 1):
            graph.append(fl.replay(read_loss=True))
        fl.sync()
        ms = median_ms(lambda: fl.replay(), fl.stream, reps, 3, fl.sync)
        fl.sync()
        return eager, graph, ms
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
        graph = None
        try:
            graph = train_flame_graph(c, weights, batches[0], 8, reps, median_ms)
            print(f"  FLAME graph {graph[2]:8.3f} ms/step  losses eager {fmt_losses(graph[0])}, graph "
                  f"{fmt_losses(graph[1])}", flush=True)
        except Exception as e:  # noqa: BLE001  (a capture failure must not lose the other rows)
            print(f"  FLAME graph failed: {type(e).__name__}: {e}", flush=True)
            b.failures.append(f"T3 GPT-2 FLAME graph: {type(e).__name__}: {e}")
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
    if graph:
        gd = max_abs_diff(graph[0], graph[1])
        g_ok = gd <= 1e-3 and all(math.isfinite(x) for x in graph[1])
        b.add("T3", "GPT-2 train step, FLAME CUDA graph vs eager", shape, "bf16", graph[2], e_ms, flops=flops,
              note=f"the whole step (forward, backward, AdamW) captured once (flame_graph_*) and replayed, vs torch "
                   f"eager; {'PASS' if g_ok else 'FAIL'}: losses of 8 steps replayed vs eager FLAME differ by at most "
                   f"{gd:.2e} (tolerance 1e-3); target ratio <= 0.87")
        if not g_ok:
            b.failures.append(f"GPT-2 graph replay losses differ from eager by {gd}")
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


# ---------------------------------------------------------------- T3dp: data parallelism on 2 GPUs
DP_WORLD = 2
DP_TARGET = 0.90  # throughput on 2 GPUs >= 0.9 * 2 * throughput on 1 GPU


class Gpt2DpResult(ctypes.Structure):
    """gpt2_dp_result of bench/gpt2.h (every field 8 bytes)."""
    _fields_ = [("ms_per_step", f64), ("tokens_per_s", f64), ("first_loss", f64), ("last_loss", f64),
                ("params_identical", i64)]


def flame_dp_run(c, world, warmup, steps):
    """gpt2_dp_run of libflame_gpt2_bench.so: the C library starts one thread per GPU itself (ctypes releases
    the GIL for the call). Returns the Gpt2DpResult."""
    lib = ctypes.CDLL(library_path())
    lib.gpt2_config_default.restype, lib.gpt2_config_default.argtypes = None, [P(Gpt2Config)]
    lib.gpt2_dp_run.restype = ctypes.c_int32
    lib.gpt2_dp_run.argtypes = [P(Gpt2Config), i64, i64, i64, ctypes.c_char_p, P(Gpt2DpResult)]
    lib.gpt2_last_error.restype, lib.gpt2_last_error.argtypes = ctypes.c_char_p, []
    cfg = Gpt2Config()
    lib.gpt2_config_default(ctypes.byref(cfg))
    for k in ("vocab", "block", "layers", "heads", "dim", "batch", "seq", "lr", "weight_decay", "beta1", "beta2", "eps"):
        setattr(cfg, k, getattr(c, k))
    r = Gpt2DpResult()
    st = lib.gpt2_dp_run(ctypes.byref(cfg), world, warmup, steps, None, ctypes.byref(r))
    if st != 0:
        raise RuntimeError(f"FLAME gpt2_dp_run on {world} GPU(s) failed (status {st}): "
                           f"{lib.gpt2_last_error().decode(errors='replace')}")
    return r


def ddp_worker(rank, world, init_file, cfg, warmup, steps, queue):
    """One PyTorch rank (a process of torch.multiprocessing.spawn): the model of gpt2_torch.py, wrapped in
    DistributedDataParallel when world > 1 (NCCL, init_method file://, default 25 MiB buckets), trained on
    its own batch; times `steps` steps after `warmup` by wall clock between two synchronisations, as
    gpt2_dp_run does. Puts (rank, ms per step, first loss, last loss) on the queue."""
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    c = gt.Config(**cfg)
    if world > 1:
        dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=world)
    model = gt.build(c)
    step_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank]) if world > 1 else model
    opt = gt.optimizer(model, c)
    x, y = gt.synthetic_batches(c, 1, seed=1234 + rank)[0]
    x, y = x.cuda(), y.cuda()
    first = gt.train_step(step_model, opt, x, y).item()
    for _ in range(warmup - 1):
        gt.train_step(step_model, opt, x, y)
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = gt.train_step(step_model, opt, x, y)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    queue.put((rank, ms, first, loss.item()))
    if world > 1:
        dist.destroy_process_group()


def torch_dp_run(c, world, warmup, steps):
    """PyTorch on `world` GPUs in `world` fresh processes (1: the plain step, no DDP). Returns (ms per step of the
    slowest rank, mean first loss, mean last loss)."""
    import dataclasses
    import torch.multiprocessing as mp
    queue = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(ddp_worker, args=(world, os.path.join(d, "init"), dataclasses.asdict(c), warmup, steps, queue),
                 nprocs=world, join=True)
    res = [queue.get() for _ in range(world)]
    return max(r[1] for r in res), statistics.mean(r[2] for r in res), statistics.mean(r[3] for r in res)


def tier3_dp(b):
    """T3dp: the GPT-2 training step data-parallel on 2 GPUs against the same step on 1 GPU, the same
    per-GPU batch (B8 T1024 by default), FLAME (gpt2_dp_run: one process, a thread and a context per
    GPU, flame_dp with its default 64 MiB buckets) and PyTorch (DistributedDataParallel in 2 processes;
    1 GPU: the plain step in 1 process). Each rank trains on its own synthetic batch; wall clock per step
    over the timed steps between two synchronisations after warm-up (the slowest rank), the same method
    for 1 and 2 GPUs and for both libraries. Scaling efficiency = throughput on 2 GPUs / (2 x throughput
    on 1 GPU) = ms per step on 1 GPU / ms per step on 2 GPUs; target >= 0.90. Fails the run when FLAME's
    ranks end with different parameters or a loss is not finite; skipped with fewer than 2 GPUs
    (a failure when FLAME_REQUIRE_GPUS >= 2)."""
    c = config(b.args)
    shape = shape_of(c)
    have = torch.cuda.device_count()
    if have < DP_WORLD:
        msg = f"T3dp: needs {DP_WORLD} GPUs, {have} visible"
        print(msg + "; skipped", flush=True)
        if int(os.environ.get("FLAME_REQUIRE_GPUS", "0") or 0) >= DP_WORLD:
            b.failures.append(msg + " (FLAME_REQUIRE_GPUS is set)")
        return
    warmup, steps = (3, 10) if b.args.quick else (5, 30)
    tokens = c.batch * c.seq  # per GPU and step
    n_params = c.vocab * c.dim + c.block * c.dim + c.layers * (12 * c.dim * c.dim + 13 * c.dim) + 2 * c.dim
    flops = (6.0 * n_params + 12.0 * c.layers * c.dim * c.seq) * tokens  # per GPU and step, as T3
    print(f"GPT-2 data parallel, {shape} per GPU: {warmup} warm-up + {steps} timed steps on 1 and {DP_WORLD} GPUs", flush=True)

    f1 = flame_dp_run(c, 1, warmup, steps)
    print(f"  FLAME 1 GPU   {f1.ms_per_step:8.3f} ms/step {f1.tokens_per_s:9.0f} tokens/s  loss {f1.first_loss:.4f} -> "
          f"{f1.last_loss:.4f}", flush=True)
    f2 = flame_dp_run(c, DP_WORLD, warmup, steps)
    print(f"  FLAME {DP_WORLD} GPUs  {f2.ms_per_step:8.3f} ms/step {f2.tokens_per_s:9.0f} tokens/s  loss {f2.first_loss:.4f} -> "
          f"{f2.last_loss:.4f}  parameters {'identical' if f2.params_identical else 'DIFFER'}", flush=True)
    t1 = t2 = None
    try:
        t1 = torch_dp_run(c, 1, warmup, steps)
        print(f"  torch 1 GPU   {t1[0]:8.3f} ms/step {tokens / (t1[0] * 1e-3):9.0f} tokens/s", flush=True)
        t2 = torch_dp_run(c, DP_WORLD, warmup, steps)
        print(f"  torch DDP {DP_WORLD}   {t2[0]:8.3f} ms/step {DP_WORLD * tokens / (t2[0] * 1e-3):9.0f} tokens/s", flush=True)
    except Exception as e:  # noqa: BLE001  (a PyTorch failure must not lose FLAME's rows)
        print(f"  PyTorch DDP failed: {type(e).__name__}: {e}", flush=True)
        b.failures.append(f"T3dp PyTorch DDP: {type(e).__name__}: {e}")
        t1 = t2 = None

    eff = f1.ms_per_step / f2.ms_per_step
    tps = lambda ms, n: n * tokens / (ms * 1e-3)  # noqa: E731
    if t1 and t2:
        b.add("T3dp", "GPT-2 step, 1 GPU (DP baseline)", shape, "bf16", f1.ms_per_step, t1[0], flops=flops,
              note=f"tokens/s FLAME {tps(f1.ms_per_step, 1):.0f}, torch {tps(t1[0], 1):.0f}; wall clock per step")
        b.add("T3dp", f"GPT-2 step, {DP_WORLD} GPUs vs DDP", f"{shape} x{DP_WORLD} GPUs", "bf16", f2.ms_per_step, t2[0],
              flops=flops, note=f"tokens/s (all GPUs) FLAME {f2.tokens_per_s:.0f}, DDP {tps(t2[0], DP_WORLD):.0f}; "
                                f"TFLOP/s per GPU; flame_dp default 64 MiB buckets, DDP default 25 MiB")
    else:
        b.info("T3dp", "GPT-2 step, 1 GPU (DP baseline)", shape, "bf16", f1.ms_per_step, None, "ms",
               f"tokens/s {f1.tokens_per_s:.0f}; wall clock per step")
        b.info("T3dp", f"GPT-2 step, {DP_WORLD} GPUs", f"{shape} x{DP_WORLD} GPUs", "bf16", f2.ms_per_step, None, "ms",
               f"tokens/s (all GPUs) {f2.tokens_per_s:.0f}")
    note = (f"{'meets' if eff >= DP_TARGET else 'misses'} the {DP_TARGET:.2f} target (ratio = target / efficiency, "
            f"<= 1 meets it): {DP_WORLD}-GPU throughput "
            f"{f2.tokens_per_s:.0f} tokens/s / ({DP_WORLD} x 1-GPU {f1.tokens_per_s:.0f}) = 1-GPU ms {f1.ms_per_step:.3f} / "
            f"{DP_WORLD}-GPU ms {f2.ms_per_step:.3f}")
    if t1 and t2:
        note += f"; PyTorch DDP efficiency {t1[0] / t2[0]:.3f} ({t1[0]:.3f} / {t2[0]:.3f} ms)"
    b.info("T3dp", f"GPT-2 DP scaling efficiency, {DP_WORLD} GPUs", shape, "bf16", eff, DP_TARGET, "eff", note,
           ratio=DP_TARGET / eff, extra={"flame_ms_1gpu": f1.ms_per_step, "flame_ms_2gpu": f2.ms_per_step,
                                        "torch_ms_1gpu": t1[0] if t1 else None, "torch_ms_2gpu": t2[0] if t2 else None})
    losses = (f1.first_loss, f1.last_loss, f2.first_loss, f2.last_loss)
    if not f2.params_identical:
        b.failures.append(f"T3dp: FLAME's {DP_WORLD} ranks ended with different parameters")
    if not all(math.isfinite(x) for x in losses):
        b.failures.append(f"T3dp: a FLAME loss is not finite: {losses}")
