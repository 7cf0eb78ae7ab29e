#!/usr/bin/env python3
"""FLAME vs PyTorch, side by side in one process on one GPU.

FLAME is driven through its C ABI (ctypes, tests/parity/flame_ctypes.py); PyTorch through its
Python API. Device times come from CUDA events recorded on each library's own stream (FLAME's
stream is wrapped with torch.cuda.ExternalStream), after warm-up, as the median of many
repetitions, on fresh random inputs (never zeros) larger than L2 for bandwidth rows. Host
overhead (T0) is measured by the C program bench/overhead.c for FLAME (no ctypes in the loop) and
in Python for PyTorch (what a PyTorch user pays). The T0 row add_1elem_graph is the wall time per
kernel of a replayed 100-op CUDA graph (flame_graph_* vs torch.cuda.CUDAGraph); the T3 MLP step
also runs as a captured graph ('graph': FLAME graph vs PyTorch eager; 'graphs': both captured).

Each row reports FLAME and PyTorch time, the ratio FLAME/PyTorch (below 1: FLAME is faster), and
the fraction of the physical limit measured in the same run: copy bandwidth for memory-bound rows,
PyTorch's bf16 GEMM rate at 8192^3 for matrix rows.

GPT-2 tiers (bench/gpt2_tiers.py; FLAME side bench/gpt2.c, PyTorch side bench/gpt2_torch.py):
  T3  GPT-2 124M training step (B8 T1024, bf16 autocast, f32 parameters, AdamW): FLAME vs PyTorch
      eager and vs torch.compile (median of CUDA-event-timed steps after the parity steps and warm-up),
      tokens/s, torch.compile's first-step (compilation) time; loss-curve parity over --gpt2-steps
      steps from the same initial weights (safetensors) and batches, which fails the run (exit 1)
      beyond bf16 tolerance (the rule is in gpt2_tiers.py's docstring). Also the MLP step rows.
  T4  start of a fresh process's GPT-2 training to the end of its first step (from just before
      flame_ctx_create), with an empty and with a filled kernel cache directory (target: warm <= 1 s).
  T5  memory of the T3 runs: FLAME pool peak in use and reserved vs torch.cuda.max_memory_allocated /
      max_memory_reserved (rows come from the T3 GPT-2 run: --tiers T3 or T5 runs it).
  T4 and T5 rows carry their own unit and are left out of the geometric means.
  T3dp (only when named) the GPT-2 step data-parallel on 2 GPUs vs 1 GPU, same per-GPU batch: FLAME
      (gpt2_dp_run: flame_dp over NCCL, one thread per GPU) and PyTorch DDP (2 processes), ms/step,
      tokens/s and the scaling efficiency (target >= 0.90). Needs 2 visible GPUs (skipped otherwise).

Usage: python3 bench/run.py [--tiers T0,T1,T2,T3,T4,T5] [--quick] [--out DIR] [--no-results-md]
                            [--no-compile] [--gpt2-steps N] [--gpt2-tiny]
Env:   FLAME_LIBRARY (libflame.so.1), FLAME_BENCH_OVERHEAD (path of the flame_bench_overhead binary),
       FLAME_GPT2_LIBRARY (libflame_gpt2_bench.so), FLAME_BENCH_GPT2 (the flame_bench_gpt2 program);
       both default to build/bench/.
Writes DIR/bench.json and DIR/bench.csv (DIR: $OUT or bench/out), the run to bench/history/, and
replaces in bench/RESULTS.md the tables of the tiers it ran (bench/results_md.py; --quick: history only).
"""
import argparse
import csv
import ctypes
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))
import flame_ctypes as fc  # noqa: E402
import results_md  # noqa: E402
import gpt2_tiers  # noqa: E402  (bench/, next to this file)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

H, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
DT = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3}
TDT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
SIZE = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}


class OptimOptions(ctypes.Structure):
    """flame_optimizer_options_t (include/flame.h)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_int32), ("lr", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("beta1", ctypes.c_double), ("beta2", ctypes.c_double),
                ("eps", ctypes.c_double), ("momentum", ctypes.c_double), ("dampening", ctypes.c_double),
                ("nesterov", ctypes.c_int32), ("amsgrad", ctypes.c_int32), ("maximize", ctypes.c_int32),
                ("master_weights", ctypes.c_int32), ("stochastic_rounding", ctypes.c_int32)]


class Flame:
    """The few FLAME calls the benchmark needs, on top of the parity harness's ctypes layer."""

    def __init__(self, allow_tf32=False):
        self.lib = fc.Flame()
        raw = self.lib.raw
        for name, argtypes in (("flame_randn", [H, ctypes.POINTER(i64), i32, ctypes.c_int, ctypes.POINTER(H)]),
                               ("flame_contiguous", [H, ctypes.POINTER(H)]),
                               ("flame_ctx_stream", [H, ctypes.POINTER(H)])):
            getattr(raw, name).argtypes = argtypes
            getattr(raw, name).restype = ctypes.c_int
        opts = fc.CtxOptions()
        raw.flame_ctx_options_init(ctypes.byref(opts))
        opts.allow_tf32 = 1 if allow_tf32 else 0
        self.ctx = H()
        self.lib.check(raw.flame_ctx_create(ctypes.byref(opts), ctypes.byref(self.ctx)), "flame_ctx_create")
        s = H()
        self.lib.check(raw.flame_ctx_stream(self.ctx, ctypes.byref(s)), "flame_ctx_stream")
        self.stream = torch.cuda.ExternalStream(s.value)

    def randn(self, shape, dt):
        arr = (i64 * len(shape))(*shape)
        out = H()
        self.lib.check(self.lib.raw.flame_randn(self.ctx, arr, len(shape), DT[dt], ctypes.byref(out)), "flame_randn")
        return fc.Tensor(self.lib, out)

    def call(self, name, *args):
        return self.lib.call(name, *args)

    def sync(self):
        self.lib.check(self.lib.raw.flame_ctx_synchronize(self.ctx), "flame_ctx_synchronize")

    def close(self):
        self.sync()
        self.lib.ctx_destroy(self.ctx)


def median_ms(fn, stream, reps, warmup, sync):
    """Median device time per call of fn: events on stream around `inner` back-to-back calls, so
    that the host's enqueue latency before the first call is amortised (inner is chosen from a
    first estimate so that one repetition takes about 2 ms)."""
    for _ in range(warmup):
        fn()
    sync()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(stream)
    fn()
    e.record(stream)
    sync()
    est = max(s.elapsed_time(e), 1e-3)
    inner = max(1, min(50, int(2.0 / est)))
    pairs = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(stream)
        for _ in range(inner):
            fn()
        e.record(stream)
        pairs.append((s, e))
    sync()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / inner for s, e in pairs)


class Bench:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.reps = 10 if args.quick else 30
        self.fl = Flame()
        self.fl32 = None
        self.copy_bw = None  # bytes/s
        self.gemm_peak = None  # flop/s
        self.failures = []  # checks that failed (GPT-2 loss parity): run.py exits 1

    def info(self, tier, op, shape, dtype, flame, torch_, unit, note, ratio=None, extra=None):
        """A row of values in `unit` (T3 parity, T4 start times, T5 memory), left out of the geometric means.
        torch_ may be None (no PyTorch counterpart; for parity and start rows it holds the tolerance/target)."""
        r = {"tier": tier, "op": op, "shape": shape, "dtype": dtype, "flame": flame, "torch": torch_, "unit": unit,
             "ratio": ratio if ratio is not None else float("nan"), "note": note, "info": True}
        r.update(extra or {})
        self.rows.append(r)
        t = f"{torch_:9.4f}" if torch_ is not None else "        -"
        print(f"{tier:3} {op:28} {shape:26} {dtype:5} flame {flame:9.4f} {unit:4} other {t} {unit:4} "
              f"ratio {r['ratio']:5.2f}  {note}", flush=True)

    def time_flame(self, fn, fl=None, reps=None):
        fl = fl or self.fl
        return median_ms(fn, fl.stream, reps or self.reps, 3, fl.sync)

    def time_torch(self, fn, reps=None):
        return median_ms(fn, torch.cuda.current_stream(), reps or self.reps, 3, torch.cuda.synchronize)

    def add(self, tier, op, shape, dtype, f_ms, t_ms, bytes_=None, flops=None, note=""):
        r = {"tier": tier, "op": op, "shape": shape, "dtype": dtype, "flame_ms": f_ms, "torch_ms": t_ms,
             "ratio": f_ms / t_ms if t_ms else float("nan"), "note": note}
        if bytes_ is not None:
            r["flame_GBps"] = bytes_ / f_ms / 1e6
            r["torch_GBps"] = bytes_ / t_ms / 1e6
            r["limit"] = "copy"
            r["flame_frac"] = bytes_ / (f_ms * 1e-3) / self.copy_bw
            r["torch_frac"] = bytes_ / (t_ms * 1e-3) / self.copy_bw
        if flops is not None:
            r["flame_TFLOPs"] = flops / f_ms / 1e9
            r["torch_TFLOPs"] = flops / t_ms / 1e9
            r["limit"] = "bf16 GEMM peak"
            r["flame_frac"] = flops / (f_ms * 1e-3) / self.gemm_peak
            r["torch_frac"] = flops / (t_ms * 1e-3) / self.gemm_peak
        self.rows.append(r)
        frac = f"{r['flame_frac']:.2f}" if "flame_frac" in r else "-"
        print(f"{tier:3} {op:28} {shape:26} {dtype:5} flame {f_ms:9.4f} ms  torch {t_ms:9.4f} ms  "
              f"ratio {r['ratio']:5.2f}  limit {frac} {note}", flush=True)

    # ---------------------------------------------------------------- limits
    def measure_limits(self):
        n = 1 << 28
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        ms = self.time_torch(lambda: y.copy_(x), reps=20)
        self.copy_bw = 2 * n * 4 / (ms * 1e-3)
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        ms = self.time_torch(lambda: torch.matmul(a, b), reps=20)
        self.gemm_peak = 2 * 8192 ** 3 / (ms * 1e-3)
        print(f"limits: copy {self.copy_bw / 1e12:.3f} TB/s, bf16 GEMM (torch 8192^3) {self.gemm_peak / 1e12:.1f} TFLOP/s")
        del x, y, a, b

    # ---------------------------------------------------------------- T0: host overhead per op
    def tier0(self):
        exe = os.environ.get("FLAME_BENCH_OVERHEAD") or os.path.join(ROOT, "build", "bench", "flame_bench_overhead")
        flame = {}
        if os.path.exists(exe):
            out = subprocess.run([exe], capture_output=True, text=True, env=dict(os.environ))
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    d = json.loads(line)
                    flame[d["name"]] = d["us_per_op"]
            if out.returncode != 0:
                print(f"overhead binary failed ({out.returncode}): {out.stderr.strip()}")
        else:
            print(f"T0: {exe} not found (build the 'flame_bench_overhead' target); FLAME column skipped")
        n = 20000
        a = torch.ones(1, device="cuda")
        b = torch.ones(1, device="cuda")
        ag = torch.ones(1, device="cuda", requires_grad=True)
        m1 = torch.randn(64, 64, device="cuda")
        m2 = torch.randn(64, 64, device="cuda")

        def per_op(fn):
            import time
            for _ in range(1000):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n * 1e6

        def graph_per_kernel(chain=100, reps=max(10, n // 100)):
            # torch.cuda.CUDAGraph of `chain` 1-element adds (as overhead.c's add_1elem_graph): wall
            # time per replayed kernel, launch and GPU execution included.
            import time
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the default stream, as torch's docs advise
                c = a
                for _ in range(chain):
                    c = c + b
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                c = a
                for _ in range(chain):
                    c = c + b
            for _ in range(50):
                g.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / (reps * chain) * 1e6

        torch_us = {"add_1elem": per_op(lambda: a + b), "add_1elem_autograd": per_op(lambda: ag + b),
                    "matmul_64x64_f32": per_op(lambda: torch.matmul(m1, m2)),
                    "add_1elem_graph": graph_per_kernel()}
        for k, t in torch_us.items():
            f = flame.get(k)
            if f is None:
                continue
            # overhead rows: times in us, ratio as usual
            note = "us/kernel of a replayed 100-op graph (both CUDA graphs)" if k.endswith("_graph") else "host us/op"
            self.add("T0", k, "1" if "1elem" in k else "64x64", "f32", f / 1e3, t / 1e3, note=note)
        parts = {"part_raw_cuLaunchKernel": "the driver's launch of an empty kernel alone (no FLAME code): the floor",
                 "part_view": "a view (entry point, handles, tensor bookkeeping; no allocation, no kernel)",
                 "part_empty": "allocation + free of a 1-element tensor (no kernel)",
                 "part_zeros": "allocation + one kernel", "part_retain_release": "handle retain + release"}
        for k, what in parts.items():
            if k in flame:
                self.info("T0", k, "1", "f32", flame[k], None, "us", f"FLAME host breakdown: {what}")

    # ---------------------------------------------------------------- T1: bandwidth
    def tier1(self):
        fl = self.fl
        n = 1 << 26 if self.args.quick else 1 << 28
        side = 8192 if self.args.quick else 16384

        def pair(op, shape, dt, ffn, tfn, bytes_):
            self.add("T1", op, shape, dt, self.time_flame(ffn), self.time_torch(tfn), bytes_=bytes_)

        for dt in ("f32", "bf16"):
            fx, fy = fl.randn([n], dt), fl.randn([n], dt)
            tx, ty = torch.randn(n, device="cuda", dtype=TDT[dt]), torch.randn(n, device="cuda", dtype=TDT[dt])
            s = SIZE[dt]
            pair("copy (clone)", f"{n}", dt, lambda: fl.call("clone", fx), lambda: tx.clone(), 2 * n * s)
            pair("add", f"{n}", dt, lambda: fl.call("add", fx, fy), lambda: tx + ty, 3 * n * s)
            if dt == "f32":
                pair("mul_scalar", f"{n}", dt, lambda: fl.call("mul_scalar", fx, 1.5), lambda: tx * 1.5, 2 * n * s)
                pair("relu", f"{n}", dt, lambda: fl.call("relu", fx), lambda: torch.relu(tx), 2 * n * s)
                pair("gelu_tanh", f"{n}", dt, lambda: fl.call("gelu", fx, 1), lambda: F.gelu(tx, approximate="tanh"), 2 * n * s)
                pair("silu", f"{n}", dt, lambda: fl.call("silu", fx), lambda: F.silu(tx), 2 * n * s)
                pair("sum (all)", f"{n}", dt, lambda: fl.call("sum_all", fx), lambda: tx.sum(), n * s)
                pair("to bf16", f"{n}", dt, lambda: fl.call("to_dtype", fx, DT["bf16"]), lambda: tx.to(torch.bfloat16), n * 6)
            del fx, fy, tx, ty
        fm, fb = fl.randn([side, side], "f32"), fl.randn([side], "f32")
        tm, tb = torch.randn(side, side, device="cuda"), torch.randn(side, device="cuda")
        dims = (ctypes.c_int32 * 1)(1)
        nn = side * side
        pair("broadcast add [S,S]+[S]", f"{side}x{side}", "f32", lambda: fl.call("add", fm, fb), lambda: tm + tb, 2 * nn * 4)
        pair("sum(dim=1)", f"{side}x{side}", "f32", lambda: fl.call("sum", fm, dims, 1, 0), lambda: tm.sum(1), nn * 4)
        ft = fl.call("transpose", fm, 0, 1)
        pair("transpose().contiguous()", f"{side}x{side}", "f32", lambda: fl.call("contiguous", ft),
             lambda: tm.t().contiguous(), 2 * nn * 4)

    # ---------------------------------------------------------------- T1: fused NN kernels and AdamW
    def tier1_nn(self):
        fl, lib = self.fl, self.fl.lib
        q = self.args.quick

        def pair(op, shape, dt, ffn, tfn, bytes_, note=""):
            self.add("T1", op, shape, dt, self.time_flame(ffn), self.time_torch(tfn), bytes_=bytes_, note=note)

        R, C = (4096, 4096) if q else (8192, 8192)
        fx, tx = fl.randn([R, C], "f32"), torch.randn(R, C, device="cuda")
        pair("softmax(dim=-1)", f"{R}x{C}", "f32", lambda: fl.call("softmax", fx, -1), lambda: torch.softmax(tx, -1), 2 * R * C * 4)
        # 16384 rows of 768 / 1024 floats (50 / 67 MB) are about the size of L2; 65536 rows are well past it.
        # Rows of 16384: 2048 (128 MB, a 60-us kernel whose start and tail weigh) and 4096 (256 MB, the
        # size of the 65536 x 1024 and 16384 x 4096 rows).
        for rows, width in ((16384, 768), (16384, 1024), (65536, 768), (65536, 1024), (8192 if q else 16384, 4096),
                            (2048, 16384), (4096, 16384)):
            if q and (rows == 65536 or (rows, width) == (4096, 16384)):
                continue
            self.norm_softmax_rows(rows, width, "f32")
        self.group_norm_row("f32")
        self.cross_entropy_row()
        self.adamw_row()

    def norm_softmax_rows(self, rows, width, dt):
        """layer_norm, rms_norm and softmax over [rows, width] rows of dt (f32 or bf16), forward and fwd+bwd(x),
        FLAME beside PyTorch (tier T1)."""
        fl, lib = self.fl, self.fl.lib
        tdt, es = {"f32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}[dt]
        n = rows * width
        x, w, b, g = fl.randn([rows, width], dt), fl.randn([width], dt), fl.randn([width], dt), fl.randn([rows, width], dt)
        tx_, tw, tb, tg = (torch.randn(rows, width, device="cuda", dtype=tdt), torch.randn(width, device="cuda", dtype=tdt),
                           torch.randn(width, device="cuda", dtype=tdt), torch.randn(rows, width, device="cuda", dtype=tdt))
        ns = (ctypes.c_int64 * 1)(width)
        shape = f"{rows}x{width}"

        def pair(op, ffn, tfn, bytes_, note=""):
            self.add("T1", op, shape, dt, self.time_flame(ffn), self.time_torch(tfn), bytes_=bytes_, note=note)

        pair("layer_norm fwd", lambda: fl.call("layer_norm", x, ns, 1, w, b, 1e-5),
             lambda: F.layer_norm(tx_, (width,), tw, tb), 2 * n * es)
        pair("rms_norm fwd", lambda: fl.call("rms_norm", x, ns, 1, w, 1e-5),
             lambda: F.rms_norm(tx_, (width,), tw, eps=1e-5), 2 * n * es)
        pair("softmax(dim=-1)", lambda: fl.call("softmax", x, -1),
             lambda: torch.softmax(tx_, -1), 2 * n * es, "bytes: read x, write y")
        lib.set_requires_grad(x, True)
        tx_.requires_grad_(True)
        pair("layer_norm fwd+bwd(x)",
             lambda: lib.grad(fl.ctx, [fl.call("layer_norm", x, ns, 1, w, b, 1e-5)], [g], [x], 0),
             lambda: torch.autograd.grad([F.layer_norm(tx_, (width,), tw, tb)], [tx_], [tg]), 5 * n * es,
             "bytes: fwd 2, bwd 3 passes")
        pair("rms_norm fwd+bwd(x)",
             lambda: lib.grad(fl.ctx, [fl.call("rms_norm", x, ns, 1, w, 1e-5)], [g], [x], 0),
             lambda: torch.autograd.grad([F.rms_norm(tx_, (width,), tw, eps=1e-5)], [tx_], [tg]), 5 * n * es,
             "bytes: fwd 2, bwd 3 passes")
        pair("softmax(dim=-1) fwd+bwd(x)",
             lambda: lib.grad(fl.ctx, [fl.call("softmax", x, -1)], [g], [x], 0),
             lambda: torch.autograd.grad([torch.softmax(tx_, -1)], [tx_], [tg]), 5 * n * es,
             "bytes: fwd read x, write y; bwd read y, g, write dx")

    def group_norm_row(self, dt):
        """group_norm forward over 32x128x64x64 of dt with 32 groups (rows of 16384), FLAME beside PyTorch (T1)."""
        fl = self.fl
        tdt, es = {"f32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}[dt]
        gx, gw, gb = fl.randn([32, 128, 64, 64], dt), fl.randn([128], dt), fl.randn([128], dt)
        tgx, tgw, tgb = (torch.randn(32, 128, 64, 64, device="cuda", dtype=tdt), torch.randn(128, device="cuda", dtype=tdt),
                         torch.randn(128, device="cuda", dtype=tdt))
        self.add("T1", "group_norm fwd (32 groups)", "32x128x64x64", dt,
                 self.time_flame(lambda: fl.call("group_norm", gx, 32, gw, gb, 1e-5, 0)),
                 self.time_torch(lambda: F.group_norm(tgx, 32, tgw, tgb)), bytes_=2 * 32 * 128 * 64 * 64 * es)

    # ---------------------------------------------------------------- T1: the same rows in bf16
    def tier1_nn_bf16(self):
        """layer_norm, rms_norm and softmax over bf16 rows (the dtype of mixed-precision training), forward and
        fwd+bwd(x), at widths past L2 whose rows are short (1024), middle (4096) and 32 KiB (16384); group_norm
        forward over 32x128x64x64 (rows of 32 KiB)."""
        q = self.args.quick
        for rows, width in ((16384 if q else 65536, 1024), (16384 if q else 65536, 4096), (4096 if q else 8192, 16384)):
            self.norm_softmax_rows(rows, width, "bf16")
        self.group_norm_row("bf16")

    # ---------------------------------------------------------------- T1: fused elementwise expressions
    def tier1_fused(self):
        """flame_fused_compile / flame_fused_call against the same math as separate FLAME ops and as PyTorch
        eager ops (and torch's own fused gelu as a reference): gelu-tanh on 2^28 elements and DiT's adaLN
        modulation x * (1 + scale) + shift, forward and forward+backward. Bytes are the one-pass minimum."""
        fl, lib = self.fl, self.fl.lib
        q = self.args.quick

        def pair(op, shape, dt, ffn, tfn, bytes_, note=""):
            self.add("T1", op, shape, dt, self.time_flame(ffn), self.time_torch(tfn), bytes_=bytes_, note=note)

        def compile_fused(expr, n):
            f = H()
            lib.check(lib.fn("flame_fused_compile")(fl.ctx, expr.encode(), n, ctypes.byref(f)), "flame_fused_compile")
            return f

        def caller(f, xs):
            arr = (H * len(xs))(*[x.h for x in xs])

            def call():
                out = H()
                lib.check(lib.fn("flame_fused_call")(f, arr, len(xs), ctypes.byref(out)), "flame_fused_call")
                return fc.Tensor(lib, out)
            return call

        k, c = 0.7978845608028654, 0.044715
        gelu = compile_fused(f"0.5 * x0 * (1 + tanh({k!r} * (x0 + {c!r} * x0 * x0 * x0)))", 1)
        adaln = compile_fused("x0 * (1 + x1) + x2", 3)

        def gelu_ops(x):  # the same math as separate FLAME ops
            x3 = fl.call("mul", fl.call("mul", x, x), x)
            u = fl.call("mul_scalar", fl.call("add", x, fl.call("mul_scalar", x3, c)), k)
            return fl.call("mul_scalar", fl.call("mul", x, fl.call("add_scalar", fl.call("tanh", u), 1.0)), 0.5)

        def gelu_torch(x):
            return 0.5 * x * (1 + torch.tanh(k * (x + c * x * x * x)))

        n = 1 << 26 if q else 1 << 28
        for dt in ("f32", "bf16"):
            s = SIZE[dt]
            fx, tx = fl.randn([n], dt), torch.randn(n, device="cuda", dtype=TDT[dt])
            fg, tg = fl.randn([n], dt), torch.randn(n, device="cuda", dtype=TDT[dt])
            fused_gelu = caller(gelu, [fx])
            pair("gelu_tanh as FLAME ops fwd", f"{n}", dt, lambda: gelu_ops(fx), lambda: gelu_torch(tx), 2 * n * s,
                 "torch: the same ops, eager")
            pair("gelu_tanh fused fwd", f"{n}", dt, fused_gelu, lambda: gelu_torch(tx), 2 * n * s, "torch: the same ops, eager")
            pair("gelu_tanh fused fwd vs F.gelu", f"{n}", dt, fused_gelu, lambda: F.gelu(tx, approximate="tanh"), 2 * n * s,
                 "torch: F.gelu(approximate='tanh')")
            lib.set_requires_grad(fx, True)
            tx.requires_grad_(True)
            fused_gelu = caller(gelu, [fx])
            pair("gelu_tanh as FLAME ops fwd+bwd", f"{n}", dt, lambda: lib.grad(fl.ctx, [gelu_ops(fx)], [fg], [fx], 0),
                 lambda: torch.autograd.grad([gelu_torch(tx)], [tx], [tg]), 5 * n * s, "torch: the same ops, eager")
            pair("gelu_tanh fused fwd+bwd", f"{n}", dt, lambda: lib.grad(fl.ctx, [fused_gelu()], [fg], [fx], 0),
                 lambda: torch.autograd.grad([gelu_torch(tx)], [tx], [tg]), 5 * n * s, "torch: the same ops, eager")
            pair("gelu_tanh fused fwd+bwd vs F.gelu", f"{n}", dt, lambda: lib.grad(fl.ctx, [fused_gelu()], [fg], [fx], 0),
                 lambda: torch.autograd.grad([F.gelu(tx, approximate="tanh")], [tx], [tg]), 5 * n * s,
                 "torch: F.gelu(approximate='tanh')")
            del fx, tx, fg, tg, fused_gelu

        N, T, C = 8, 1024, 1152
        m = N * T * C
        shape = f"{N}x{T}x{C}+[{N},1,{C}]"
        for dt in ("f32", "bf16"):
            s = SIZE[dt]
            fx, fsc, fsh = fl.randn([N, T, C], dt), fl.randn([N, 1, C], dt), fl.randn([N, 1, C], dt)
            tx, tsc, tsh = (torch.randn(N, T, C, device="cuda", dtype=TDT[dt]), torch.randn(N, 1, C, device="cuda", dtype=TDT[dt]),
                            torch.randn(N, 1, C, device="cuda", dtype=TDT[dt]))
            fg, tg = fl.randn([N, T, C], dt), torch.randn(N, T, C, device="cuda", dtype=TDT[dt])

            def ada_ops():
                return fl.call("add", fl.call("mul", fx, fl.call("add_scalar", fsc, 1.0)), fsh)

            fused_ada = caller(adaln, [fx, fsc, fsh])
            pair("adaLN as FLAME ops fwd", shape, dt, ada_ops, lambda: tx * (1 + tsc) + tsh, 2 * m * s, "torch: the same ops, eager")
            pair("adaLN fused fwd", shape, dt, fused_ada, lambda: tx * (1 + tsc) + tsh, 2 * m * s, "torch: the same ops, eager")
            for f_t in (fx, fsc, fsh):
                lib.set_requires_grad(f_t, True)
            for t_t in (tx, tsc, tsh):
                t_t.requires_grad_(True)
            fused_ada = caller(adaln, [fx, fsc, fsh])
            pair("adaLN as FLAME ops fwd+bwd", shape, dt, lambda: lib.grad(fl.ctx, [ada_ops()], [fg], [fx, fsc, fsh], 0),
                 lambda: torch.autograd.grad([tx * (1 + tsc) + tsh], [tx, tsc, tsh], [tg]), 5 * m * s,
                 "bytes: fwd 2, bwd 3 passes; torch: the same ops, eager")
            pair("adaLN fused fwd+bwd", shape, dt, lambda: lib.grad(fl.ctx, [fused_ada()], [fg], [fx, fsc, fsh], 0),
                 lambda: torch.autograd.grad([tx * (1 + tsc) + tsh], [tx, tsc, tsh], [tg]), 5 * m * s,
                 "bytes: fwd 2, bwd 3 passes; torch: the same ops, eager")
            del fx, fsc, fsh, tx, tsc, tsh, fg, tg, fused_ada
        lib.fn("flame_fused_release")(gelu)
        lib.fn("flame_fused_release")(adaln)

    def cross_entropy_row(self):
        """Cross-entropy fwd+bwd(logits) at GPT-2's head (class indices, mean reduction) on f32 and bf16
        logits vs F.cross_entropy on logits of the same dtype."""
        fl, lib = self.fl, self.fl.lib
        N, C = (4096, 50304) if self.args.quick else (8192, 50304)
        tgt_cpu = torch.randint(0, C, (N,), dtype=torch.int64)
        shape = (ctypes.c_int64 * 1)(N)
        out = fc.H()
        lib.check(lib.raw.flame_from_host(fl.ctx, ctypes.c_void_p(tgt_cpu.data_ptr()), N * 8, shape, 1, 5, ctypes.byref(out)),
                  "flame_from_host")
        ft, tt = fc.Tensor(lib, out), tgt_cpu.cuda()
        for dt in ("f32", "bf16"):
            fx, tx = fl.randn([N, C], dt), torch.randn(N, C, device="cuda", dtype=TDT[dt], requires_grad=True)
            lib.set_requires_grad(fx, True)

            def f_step():
                loss = fl.call("cross_entropy", fx, ft, None, -100, 0.0, 1)
                lib.grad(fl.ctx, [loss], [], [fx], 0)

            def t_step():
                loss = F.cross_entropy(tx, tt)
                torch.autograd.grad([loss], [tx])

            self.add("T1", "cross_entropy fwd+bwd", f"{N}x{C}", dt, self.time_flame(f_step), self.time_torch(t_step),
                     bytes_=2 * N * C * SIZE[dt], note="bound: read logits once, write grad (3-pass bound: x1.5)")
            del fx, tx

    def adamw_row(self):
        """AdamW over 124M f32 parameters (GPT-2 small's count) vs torch.optim.AdamW(fused=True)."""
        fl, lib = self.fl, self.fl.lib
        sizes = [50304 * 768, 1024 * 768] + [768 * 2304, 768 * 768, 768 * 3072, 3072 * 768] * 12
        total = sum(sizes)
        fps, tps = [], []
        for n in sizes:
            p, g = fl.randn([n], "f32"), fl.randn([n], "f32")
            lib.set_requires_grad(p, True)
            lib.check(lib.raw.flame_tensor_set_grad(p.h, g.h), "flame_tensor_set_grad")
            fps.append(p)
            tp = torch.randn(n, device="cuda", requires_grad=True)
            tp.grad = torch.randn(n, device="cuda")
            tps.append(tp)
        opts = OptimOptions()
        raw = lib.raw
        raw.flame_optimizer_options_init.argtypes = [ctypes.POINTER(OptimOptions), ctypes.c_int32]
        raw.flame_optimizer_create.argtypes = [H, ctypes.POINTER(OptimOptions), ctypes.POINTER(H), ctypes.c_int64, ctypes.POINTER(H)]
        raw.flame_optimizer_step.argtypes = [H]
        raw.flame_optimizer_release.argtypes = [H]
        raw.flame_optimizer_release.restype = None
        lib.check(raw.flame_optimizer_options_init(ctypes.byref(opts), 2), "flame_optimizer_options_init")
        arr = (H * len(fps))(*[p.h for p in fps])
        opt = H()
        lib.check(raw.flame_optimizer_create(fl.ctx, ctypes.byref(opts), arr, len(fps), ctypes.byref(opt)), "flame_optimizer_create")
        topt = torch.optim.AdamW(tps, lr=1e-3, weight_decay=1e-2, fused=True)
        f_ms = self.time_flame(lambda: lib.check(raw.flame_optimizer_step(opt), "flame_optimizer_step"), reps=10)
        t_ms = self.time_torch(lambda: topt.step(), reps=10)
        self.add("T1", "AdamW step (fused)", f"{total / 1e6:.0f}M params", "f32", f_ms, t_ms, bytes_=7 * 4 * total,
                 note="bound: read p,g,m,v write p,m,v")
        raw.flame_optimizer_release(opt)

    # ---------------------------------------------------------------- T2: matrix products
    def gemm_row(self, name, m, k, n, dt, ta=False, tb=False, fl=None, note=""):
        """C[m,n] = A[m,k] @ B[k,n]; ta/tb: the operand is a transposed view of a stored [k,m] / [n,k]."""
        fl = fl or self.fl
        fa = fl.call("transpose", fl.randn([k, m], dt), 0, 1) if ta else fl.randn([m, k], dt)
        fb = fl.call("transpose", fl.randn([n, k], dt), 0, 1) if tb else fl.randn([k, n], dt)
        ta_ = torch.randn(k, m, device="cuda", dtype=TDT[dt]).t() if ta else torch.randn(m, k, device="cuda", dtype=TDT[dt])
        tb_ = torch.randn(n, k, device="cuda", dtype=TDT[dt]).t() if tb else torch.randn(k, n, device="cuda", dtype=TDT[dt])
        f_ms = self.time_flame(lambda: fl.call("matmul", fa, fb), fl=fl)
        t_ms = self.time_torch(lambda: torch.matmul(ta_, tb_))
        self.add("T2", name, f"{m}x{k}x{n}", dt, f_ms, t_ms, flops=2.0 * m * n * k, note=note)

    def tier2(self):
        sq = 4096 if self.args.quick else 8192
        for dt in ("bf16", "f16", "f32"):
            self.gemm_row("matmul", sq, sq, sq, dt, note="IEEE f32" if dt == "f32" else "")
        torch.backends.cuda.matmul.allow_tf32 = True
        self.fl32 = Flame(allow_tf32=True)
        self.gemm_row("matmul tf32", sq, sq, sq, "f32", fl=self.fl32, note="allow_tf32 both")
        torch.backends.cuda.matmul.allow_tf32 = False
        self.fl32.close()
        self.fl32 = None
        self.gemm_row("matmul", 4096, 4096, 4096, "bf16")
        # GPT-2 (B8 T1024 = 8192 rows): forward x W^T, backward dX = dY W, dW = dY^T X
        for k, n in ((768, 2304), (768, 3072), (3072, 768), (768, 50304)):
            self.gemm_row(f"gpt2 fwd x@W^T", 8192, k, n, "bf16", tb=True)
            self.gemm_row(f"gpt2 bwd dX=dY@W", 8192, n, k, "bf16")
            self.gemm_row(f"gpt2 bwd dW=dY^T@X", n, 8192, k, "bf16", ta=True)
        # bmm
        fl = self.fl
        fa, fb = fl.randn([64, 512, 512], "bf16"), fl.randn([64, 512, 512], "bf16")
        ta_, tb_ = torch.randn(64, 512, 512, device="cuda", dtype=torch.bfloat16), torch.randn(64, 512, 512, device="cuda", dtype=torch.bfloat16)
        self.add("T2", "bmm", "64x512x512x512", "bf16", self.time_flame(lambda: fl.call("bmm", fa, fb)),
                 self.time_torch(lambda: torch.bmm(ta_, tb_)), flops=2.0 * 64 * 512 ** 3)
        self.linear_rows()
        self.conv_rows()
        self.attention_rows()

    def linear_rows(self):
        """linear + bias + GELU(tanh), GPT-2 MLP up-projection: FLAME's fused epilogues vs PyTorch unfused."""
        fl, raw = self.fl, self.fl.lib
        R, K, N = 8192, 768, 3072
        fx, fw, fb, fg = fl.randn([R, K], "bf16"), fl.randn([N, K], "bf16"), fl.randn([N], "bf16"), fl.randn([R, N], "bf16")
        tx = torch.randn(R, K, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        tb = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        tg = torch.randn(R, N, device="cuda", dtype=torch.bfloat16)
        f_ms = self.time_flame(lambda: fl.call("linear", fx, fw, fb, 2))
        t_ms = self.time_torch(lambda: F.gelu(F.linear(tx, tw, tb), approximate="tanh"))
        self.add("T2", "linear+bias+gelu fwd", f"{R}x{K}->{N}", "bf16", f_ms, t_ms, flops=2.0 * R * K * N)
        for t in (fx, fw, fb):
            raw.set_requires_grad(t, True)
        for t in (tx, tw, tb):
            t.requires_grad_(True)

        def flame_step():
            y = fl.call("linear", fx, fw, fb, 2)
            raw.grad(fl.ctx, [y], [fg], [fx, fw, fb], 0)

        def torch_step():
            y = F.gelu(F.linear(tx, tw, tb), approximate="tanh")
            torch.autograd.grad([y], [tx, tw, tb], [tg])

        self.add("T2", "linear+bias+gelu fwd+bwd", f"{R}x{K}->{N}", "bf16", self.time_flame(flame_step),
                 self.time_torch(torch_step), flops=6.0 * R * K * N)

        # The GPT-2 MLP block: the down-projection's dgrad GEMM applies the up-projection's DGELU and
        # bias gradient in its epilogue (cross-node fusion in the autograd engine).
        fw2, fb2, fg2 = fl.randn([K, N], "bf16"), fl.randn([K], "bf16"), fl.randn([R, K], "bf16")
        tw2 = (torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_(True)
        tb2 = torch.randn(K, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
        tg2 = torch.randn(R, K, device="cuda", dtype=torch.bfloat16)
        for t in (fw2, fb2):
            raw.set_requires_grad(t, True)

        def flame_mlp():
            h = fl.call("linear", fx, fw, fb, 2)
            y = fl.call("linear", h, fw2, fb2, 0)
            raw.grad(fl.ctx, [y], [fg2], [fx, fw, fb, fw2, fb2], 0)

        def torch_mlp():
            y = F.linear(F.gelu(F.linear(tx, tw, tb), approximate="tanh"), tw2, tb2)
            torch.autograd.grad([y], [tx, tw, tb, tw2, tb2], [tg2])

        t_mlp = self.time_torch(torch_mlp)
        self.add("T2", "MLP block (linear+gelu, linear) fwd+bwd", f"{R}x{K}->{N}->{K}", "bf16", self.time_flame(flame_mlp),
                 t_mlp, flops=12.0 * R * K * N)
        # The same block on a context with cuBLASLt epilogues off (separate kernels): what fusion buys.
        os.environ["FLAME_DISABLE_EPILOGUES"] = "1"
        try:
            plain = Flame()
        finally:
            del os.environ["FLAME_DISABLE_EPILOGUES"]
        px, pw, pb, pw2, pb2, pg = (plain.randn(s_, "bf16") for s_ in ([R, K], [N, K], [N], [K, N], [K], [R, K]))
        for t in (px, pw, pb, pw2, pb2):
            plain.lib.set_requires_grad(t, True)

        def plain_mlp():
            h = plain.call("linear", px, pw, pb, 2)
            y = plain.call("linear", h, pw2, pb2, 0)
            plain.lib.grad(plain.ctx, [y], [pg], [px, pw, pb, pw2, pb2], 0)

        self.add("T2", "MLP block fwd+bwd, epilogues off", f"{R}x{K}->{N}->{K}", "bf16", self.time_flame(plain_mlp, plain),
                 t_mlp, flops=12.0 * R * K * N)
        del px, pw, pb, pw2, pb2, pg
        plain.close()

    # ---------------------------------------------------------------- T3: end-to-end training steps
    def tier3(self):
        """MLP 1024-4096-4096-1024 (GELU), batch 8192, MSE, AdamW: one whole training step (forward,
        backward, optimizer step, zero_grad) in f32, and in bf16 (FLAME: bf16 parameters with f32
        master weights; PyTorch: f32 parameters under bf16 autocast, its usual mixed precision)."""
        fl, lib = self.fl, self.fl.lib
        raw = lib.raw
        raw.flame_optimizer_options_init.argtypes = [ctypes.POINTER(OptimOptions), ctypes.c_int32]
        raw.flame_optimizer_create.argtypes = [H, ctypes.POINTER(OptimOptions), ctypes.POINTER(H), ctypes.c_int64, ctypes.POINTER(H)]
        for name in ("flame_optimizer_step", "flame_optimizer_release"):
            getattr(raw, name).argtypes = [H]
        raw.flame_optimizer_zero_grad.argtypes = [H, ctypes.c_int32]
        raw.flame_optimizer_release.restype = None
        B, dims = 8192, [1024, 4096, 4096, 1024]
        flops = sum(6.0 * B * a * b for a, b in zip(dims[:-1], dims[1:]))
        for dt in ("f32", "bf16"):
            ws, bs = [], []
            for a, b in zip(dims[:-1], dims[1:]):
                w = fl.call("mul_scalar", fl.randn([b, a], dt), 1.0 / math.sqrt(a))
                ws.append(w)
                bs.append(fl.call("mul_scalar", fl.randn([b], dt), 0.0))
            params = ws + bs
            for p in params:
                lib.set_requires_grad(p, True)
            x, tgt = fl.randn([B, dims[0]], dt), fl.randn([B, dims[-1]], dt)
            opts = OptimOptions()
            lib.check(raw.flame_optimizer_options_init(ctypes.byref(opts), 2), "flame_optimizer_options_init")
            opts.master_weights = 1 if dt == "bf16" else 0
            arr = (H * len(params))(*[p.h for p in params])
            opt = H()
            lib.check(raw.flame_optimizer_create(fl.ctx, ctypes.byref(opts), arr, len(params), ctypes.byref(opt)),
                      "flame_optimizer_create")

            def flame_step():
                h = x
                for i in range(3):
                    h = fl.call("linear", h, ws[i], bs[i], 2 if i < 2 else 0)
                loss = fl.call("mse_loss", h, tgt, 1)
                lib.backward(fl.ctx, loss)
                lib.check(raw.flame_optimizer_step(opt), "flame_optimizer_step")
                lib.check(raw.flame_optimizer_zero_grad(opt, 1), "flame_optimizer_zero_grad")

            tl = [torch.nn.Linear(a, b, device="cuda") for a, b in zip(dims[:-1], dims[1:])]
            tx = torch.randn(B, dims[0], device="cuda")
            tt = torch.randn(B, dims[-1], device="cuda")
            tparams = [p for m in tl for p in m.parameters()]
            topt = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=1e-2, fused=True)

            def torch_step():
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dt == "bf16"):
                    h = tx
                    for i, m in enumerate(tl):
                        h = m(h)
                        if i < 2:
                            h = F.gelu(h, approximate="tanh")
                    loss = F.mse_loss(h.float(), tt)
                loss.backward()
                topt.step()
                topt.zero_grad(set_to_none=True)

            note = "FLAME bf16 params + f32 master; torch f32 params + bf16 autocast" if dt == "bf16" else "IEEE f32"
            shape = f"b{B} " + "-".join(map(str, dims))
            t_eager = self.time_torch(torch_step, reps=10)
            self.add("T3", "MLP train step (AdamW)", shape, dt, self.time_flame(flame_step, reps=10), t_eager, flops=flops,
                     note=note)

            # 'graph' variant: the same step captured once (flame_graph_*) and replayed; x and tgt are
            # static inputs, and the eager steps above made the optimizer state and master weights.
            f_graph = self.flame_graph_ms(flame_step)
            if f_graph is not None:
                self.add("T3", "MLP train step (AdamW) graph", shape, dt, f_graph, t_eager, flops=flops,
                         note=note + "; FLAME CUDA graph vs torch eager")
                t_graph = self.torch_graph_ms(tl, tparams, tx, tt, dt)
                if t_graph is not None:
                    self.add("T3", "MLP train step (AdamW) graphs", shape, dt, f_graph, t_graph, flops=flops,
                             note=note + "; both CUDA graphs (torch: capturable fused AdamW)")
            raw.flame_optimizer_release(opt)
            del params, ws, bs, x, tgt, tl, tparams, topt

    def flame_graph_ms(self, step):
        """Captures step() (FLAME calls on self.fl's context) into a graph and times its replays; None
        (with the reason printed) when the capture fails."""
        fl, lib = self.fl, self.fl.lib
        raw = lib.raw
        raw.flame_graph_capture_begin.argtypes = [H]
        raw.flame_graph_capture_end.argtypes = [H, ctypes.POINTER(H)]
        raw.flame_graph_replay.argtypes = [H]
        raw.flame_graph_release.argtypes = [H]
        raw.flame_graph_release.restype = None
        lib.check(raw.flame_graph_capture_begin(fl.ctx), "flame_graph_capture_begin")
        g = H()
        try:
            step()
        except Exception as e:  # the capture is aborted; end it so that the context is usable
            print(f"T3 graph: capture failed: {e}")
        st = raw.flame_graph_capture_end(fl.ctx, ctypes.byref(g))
        if st != 0:
            print(f"T3 graph: flame_graph_capture_end failed: {(raw.flame_last_error_message() or b'').decode()}")
            return None

        def replay():
            lib.check(raw.flame_graph_replay(g), "flame_graph_replay")

        try:
            return self.time_flame(replay, reps=10)
        finally:
            raw.flame_graph_release(g)

    def torch_graph_ms(self, layers, tparams, tx, tt, dt):
        """PyTorch's whole-step CUDA graph (torch.cuda.graphs, as its docs' whole-network example):
        warm-up on a side stream, grads set to None before the capture, capturable fused AdamW."""
        try:
            opt = torch.optim.AdamW(tparams, lr=1e-3, weight_decay=1e-2, fused=True, capturable=True)

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dt == "bf16"):
                    h = tx
                    for i, m in enumerate(layers):
                        h = m(h)
                        if i < len(layers) - 1:
                            h = F.gelu(h, approximate="tanh")
                    loss = F.mse_loss(h.float(), tt)
                loss.backward()
                opt.step()

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                step()
            return self.time_torch(graph.replay, reps=10)
        except Exception as e:
            print(f"T3 graph: PyTorch CUDA graph capture failed: {e}")
            return None
    def conv_rows(self):
        """conv2d 3x3, padding 1, N32 C128 64x64 -> 128 (a UNet-style layer) vs torch.nn.functional.conv2d
        (cuDNN): bf16 channels-last forward, and forward + backward (x, weight, bias); f32 NCHW forward
        with TF32 off on both sides (FLAME's f32 convolutions are IEEE). FLOPs: 2 N Ho Wo O C kh kw per
        forward, twice that for the backward."""
        fl, lib = self.fl, self.fl.lib
        N, C, S, O = (8 if self.args.quick else 32), 128, 64, 128
        flops = 2.0 * N * S * S * O * C * 9
        shape = f"{N}x{C}x{S}x{S}->{O} 3x3"
        opts = fc.conv_options(lib, padding=(1, 1))
        to_nchw = (ctypes.c_int32 * 4)(0, 3, 1, 2)

        def cl(t):  # FLAME's channels-last: an NHWC tensor viewed as [N, C, H, W]
            return fl.call("permute", t, to_nchw, 4)

        def conv(x, w, b):
            return fl.call("conv2d", x, w, b, ctypes.byref(opts))

        cl_fmt = torch.channels_last
        fx, fw, fb, fg = cl(fl.randn([N, S, S, C], "bf16")), cl(fl.randn([O, 3, 3, C], "bf16")), fl.randn([O], "bf16"), \
            cl(fl.randn([N, S, S, O], "bf16"))
        tx = torch.randn(N, C, S, S, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl_fmt)
        tw = torch.randn(O, C, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl_fmt)
        tb = torch.randn(O, device="cuda", dtype=torch.bfloat16)
        tg = torch.randn(N, O, S, S, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl_fmt)
        t_fwd = self.time_torch(lambda: F.conv2d(tx, tw, tb, 1, 1))
        self.add("T2", "conv2d fwd (channels-last)", shape, "bf16", self.time_flame(lambda: conv(fx, fw, fb)), t_fwd,
                 flops=flops)
        for t in (fx, fw, fb):
            lib.set_requires_grad(t, True)
        for t in (tx, tw, tb):
            t.requires_grad_(True)

        def flame_step():
            lib.grad(fl.ctx, [conv(fx, fw, fb)], [fg], [fx, fw, fb], 0)

        def torch_step():
            torch.autograd.grad([F.conv2d(tx, tw, tb, 1, 1)], [tx, tw, tb], [tg])

        t_step = self.time_torch(torch_step)
        self.add("T2", "conv2d fwd+bwd (channels-last)", shape, "bf16", self.time_flame(flame_step), t_step,
                 flops=3 * flops, note="bwd: dx, dW, db")
        del fx, fw, fb, fg, tx, tw, tb, tg
        # The same layer on a context created with FLAME_DISABLE_CUDNN=1: FLAME's own kernels (the rows
        # above use cuDNN when the context found libcudnn.so.9).
        os.environ["FLAME_DISABLE_CUDNN"] = "1"
        try:
            plain = Flame()
        finally:
            del os.environ["FLAME_DISABLE_CUDNN"]
        px, pw, pg = (plain.call("permute", plain.randn(s_, "bf16"), to_nchw, 4) for s_ in ([N, S, S, C], [O, 3, 3, C], [N, S, S, O]))
        pb = plain.randn([O], "bf16")

        def plain_conv():
            return plain.call("conv2d", px, pw, pb, ctypes.byref(opts))

        self.add("T2", "conv2d fwd (channels-last), FLAME kernels", shape, "bf16", self.time_flame(plain_conv, plain), t_fwd,
                 flops=flops, note="FLAME_DISABLE_CUDNN=1")
        for t in (px, pw, pb):
            plain.lib.set_requires_grad(t, True)

        def plain_step():
            plain.lib.grad(plain.ctx, [plain_conv()], [pg], [px, pw, pb], 0)

        self.add("T2", "conv2d fwd+bwd (channels-last), FLAME kernels", shape, "bf16", self.time_flame(plain_step, plain),
                 t_step, flops=3 * flops, note="FLAME_DISABLE_CUDNN=1")
        del px, pw, pb, pg
        plain.close()
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        fx, fw, fb = fl.randn([N, C, S, S], "f32"), fl.randn([O, C, 3, 3], "f32"), fl.randn([O], "f32")
        tx, tw, tb = (torch.randn(N, C, S, S, device="cuda"), torch.randn(O, C, 3, 3, device="cuda"),
                      torch.randn(O, device="cuda"))
        self.add("T2", "conv2d fwd (NCHW)", shape, "f32", self.time_flame(lambda: conv(fx, fw, fb)),
                 self.time_torch(lambda: F.conv2d(tx, tw, tb, 1, 1)), flops=flops, note="IEEE f32 (no TF32) both")
        torch.backends.cudnn.allow_tf32 = tf32
    def attention_rows(self):
        """Scaled-dot-product attention, bf16 B8 H16 S2048 D128, causal and not: FLAME (cuDNN's fused
        flash attention when the context uses cuDNN, else FLAME's fused kernels) vs
        F.scaled_dot_product_attention with PyTorch's default backend; then the same shapes on a context
        created with FLAME_DISABLE_CUDNN=1 (FLAME's kernels), against the same PyTorch times. FLOPs:
        forward 4 B H S^2 D (half of it causal), backward 2.5 times the forward."""
        fl, lib = self.fl, self.fl.lib
        B, Hh, S, D = (4, 16, 1024, 128) if self.args.quick else (8, 16, 2048, 128)
        shape = f"{B}x{Hh}x{S}x{D}"
        tq, tk, tv, tg = (torch.randn(B, Hh, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        t_fwd = {c: self.time_torch(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=c)) for c in (False, True)}
        for t in (tq, tk, tv):
            t.requires_grad_(True)

        def torch_step(causal):
            y = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            torch.autograd.grad([y], [tq, tk, tv], [tg])

        t_step = {c: self.time_torch(lambda: torch_step(c)) for c in (False, True)}
        del tq, tk, tv, tg

        def cudnn_counts(f):  # (forward, backward) attentions the context ran through cuDNN so far
            fn = f.lib.raw.flame_ctx_cudnn_attention_info
            fn.argtypes = [H, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
            fn.restype = ctypes.c_int
            fwd, bwd = ctypes.c_uint64(0), ctypes.c_uint64(0)
            f.lib.check(fn(f.ctx, ctypes.byref(fwd), ctypes.byref(bwd)),
                        "flame_ctx_cudnn_attention_info")
            return fwd.value, bwd.value

        def rows(f, suffix, note):
            fq, fk, fv, fg = (f.randn([B, Hh, S, D], "bf16") for _ in range(4))
            opts = fc.AttentionOptions()
            f.lib.check(f.lib.raw.flame_attention_options_init(ctypes.byref(opts)), "flame_attention_options_init")

            def flame_attend():
                return f.call("scaled_dot_product_attention", fq, fk, fv, None, ctypes.byref(opts))

            for causal in (False, True):
                opts.flags = fc.ATTENTION_CAUSAL if causal else 0
                fwd = 4.0 * B * Hh * S * S * D / (2 if causal else 1)
                before = cudnn_counts(f)
                ms = self.time_flame(flame_attend, f)
                path = "cuDNN" if cudnn_counts(f)[0] > before[0] else "FLAME kernels"
                self.add("T2", "sdpa fwd" + (" causal" if causal else "") + suffix, shape, "bf16", ms, t_fwd[causal],
                         flops=fwd, note=note or path)
            for t in (fq, fk, fv):
                f.lib.set_requires_grad(t, True)
            for causal in (False, True):
                opts.flags = fc.ATTENTION_CAUSAL if causal else 0
                fwd = 4.0 * B * Hh * S * S * D / (2 if causal else 1)

                def flame_step():
                    f.lib.grad(f.ctx, [flame_attend()], [fg], [fq, fk, fv], 0)

                before = cudnn_counts(f)
                ms = self.time_flame(flame_step, f)
                path = "cuDNN" if cudnn_counts(f)[1] > before[1] else "FLAME kernels"
                self.add("T2", "sdpa fwd+bwd" + (" causal" if causal else "") + suffix, shape, "bf16", ms, t_step[causal],
                         flops=3.5 * fwd, note=note or "bwd: " + path)
            del fq, fk, fv, fg

        rows(fl, "", "")
        os.environ["FLAME_DISABLE_CUDNN"] = "1"
        try:
            plain = Flame()
        finally:
            del os.environ["FLAME_DISABLE_CUDNN"]
        rows(plain, ", FLAME kernels", "FLAME_DISABLE_CUDNN=1")
        plain.close()
        # FLAME's kernels without the sm_90a forward (mma.sync FlashAttention-2 forward): the A/B of that path.
        os.environ.update(FLAME_DISABLE_CUDNN="1", FLAME_DISABLE_WGMMA="1")
        try:
            sync_only = Flame()
        finally:
            del os.environ["FLAME_DISABLE_CUDNN"], os.environ["FLAME_DISABLE_WGMMA"]
        rows(sync_only, ", FLAME mma.sync kernels", "FLAME_DISABLE_CUDNN=1 FLAME_DISABLE_WGMMA=1")
        sync_only.close()
    # ---------------------------------------------------------------- T1: more nn ops (issue 5, part 2)
    def tier1_nnops(self):
        fl = self.fl
        q = self.args.quick

        def pair(op, shape, dt, ffn, tfn, bytes_, note=""):
            self.add("T1", op, shape, dt, self.time_flame(ffn), self.time_torch(tfn), bytes_=bytes_, note=note)

        R = 4096 if q else 8192
        for dt in ("f32", "bf16"):
            fx, tx = fl.randn([R, R], dt), torch.randn(R, R, device="cuda", dtype=TDT[dt])
            n = R * R
            pair("dropout p=0.1 (train)", f"{R}x{R}", dt, lambda: fl.call("dropout", fx, 0.1, 1),
                 lambda: F.dropout(tx, 0.1, training=True), 2 * n * SIZE[dt], "bytes: read x, write y (torch also writes a mask)")
            del fx, tx
        # diffusion UNet shapes: [B, 320, 64, 64] activations
        B = 4 if q else 16
        shape = [B, 320, 64, 64]
        n = B * 320 * 64 * 64
        popts = fc.Pool2dOptions()
        self.fl.lib.check(self.fl.lib.fn("flame_pool2d_options_init")(ctypes.byref(popts), 2, 2), "flame_pool2d_options_init")
        for dt in ("f32", "bf16"):
            fx, tx = fl.randn(shape, dt), torch.randn(*shape, device="cuda", dtype=TDT[dt])
            pair("avg_pool2d 2x2", "x".join(map(str, shape)), dt, lambda: fl.call("avg_pool2d", fx, ctypes.byref(popts)),
                 lambda: F.avg_pool2d(tx, 2), (n + n // 4) * SIZE[dt])
            pair("upsample nearest x2", "x".join(map(str, shape)), dt,
                 lambda: fl.call("upsample_nearest2d", fx, 0, 0, 2.0, 2.0),
                 lambda: F.interpolate(tx, scale_factor=2.0, mode="nearest"), 5 * n * SIZE[dt])
            lib = fl.lib
            lib.set_requires_grad(fx, True)
            tx.requires_grad_(True)
            fg, tg = fl.randn([B, 320, 128, 128], dt), torch.randn(B, 320, 128, 128, device="cuda", dtype=TDT[dt])

            def f_bwd():
                y = fl.call("upsample_nearest2d", fx, 0, 0, 2.0, 2.0)
                lib.grad(fl.ctx, [y], [fg], [fx], 0)

            def t_bwd():
                y = F.interpolate(tx, scale_factor=2.0, mode="nearest")
                torch.autograd.grad([y], [tx], [tg])

            pair("upsample nearest x2 fwd+bwd", "x".join(map(str, shape)), dt, f_bwd, t_bwd, 10 * n * SIZE[dt],
                 "bytes: fwd read x write 4x, bwd read 4x write x")
            del fx, tx, fg, tg
        self.rope_rows()

    def rope_rows(self):
        """RoPE on llama-7B-like q [B, 32, T, 128] against Hugging Face's eager formulation with cached
        cos / sin tables (x * cos + rotate_half(x) * sin), which is what PyTorch users run."""
        fl = self.fl
        B, T = (2, 1024) if self.args.quick else (8, 2048)
        shape = [B, 32, T, 128]
        n = B * 32 * T * 128
        o = fc.RopeOptions()
        fl.lib.check(fl.lib.fn("flame_rope_options_init")(ctypes.byref(o)), "flame_rope_options_init")
        inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda", dtype=torch.float32) / 128))
        freqs = torch.outer(torch.arange(T, device="cuda", dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        for dt in ("f32", "bf16"):
            fx, tx = fl.randn(shape, dt), torch.randn(*shape, device="cuda", dtype=TDT[dt])
            cos, sin = emb.cos().to(TDT[dt]), emb.sin().to(TDT[dt])

            def t_rope():
                x1, x2 = tx[..., :64], tx[..., 64:]
                return tx * cos + torch.cat([-x2, x1], dim=-1) * sin

            self.add("T1", "rope (half-split)", "x".join(map(str, shape)), dt,
                     self.time_flame(lambda: fl.call("rope", fx, None, ctypes.byref(o))), self.time_torch(t_rope),
                     bytes_=2 * n * SIZE[dt], note="torch: HF apply_rotary_pos_emb, cached tables")
            del fx, tx

    # ---------------------------------------------------------------- output
    def finish(self):
        out_dir = self.args.out or os.environ.get("OUT") or os.path.join(HERE, "out")
        os.makedirs(out_dir, exist_ok=True)
        meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                "commit": git_commit(), "torch": torch.__version__, "flame": self.fl.lib.raw.flame_version_string().decode(),
                "copy_TBps": self.copy_bw / 1e12, "bf16_gemm_TFLOPs": self.gemm_peak / 1e12}
        with open(os.path.join(out_dir, "bench.json"), "w") as f:
            json.dump({"meta": meta, "rows": self.rows}, f, indent=1)
        keys = sorted({k for r in self.rows for k in r})
        with open(os.path.join(out_dir, "bench.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)
        geo = results_md.geomeans(self.rows)
        for t, g in sorted(geo.items()):
            print(f"geometric-mean ratio {t}: {g:.3f} over {sum(1 for r in self.rows if r['tier'] == t and not r.get('info'))} rows")
        if not self.args.no_results_md:
            hist = results_md.append(meta, self.rows, geo, quick=self.args.quick)
            print(f"recorded in {hist}" + ("" if self.args.quick else " and bench/RESULTS.md"))
        print(f"wrote {out_dir}/bench.json and bench.csv")


def git_commit():
    """FLAME_COMMIT (set it where the tree was copied without its git history, as on the device), else git."""
    if os.environ.get("FLAME_COMMIT"):
        return os.environ["FLAME_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiers", default="T0,T1,T2,T3,T4,T5",
                    help="tiers (T0..T5) or parts of one (T1core, T1nn, T1nnbf16, T1nnops, T1fused, T2attn, T3mlp, T3gpt2, "
                         "T3dp: 2 GPUs, only when named), comma-separated")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-results-md", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="T3: skip the torch.compile GPT-2 variant")
    ap.add_argument("--gpt2-steps", type=int, default=gpt2_tiers.PARITY_STEPS, help="T3: GPT-2 parity steps")
    ap.add_argument("--gpt2-tiny", action="store_true", help="T3/T4/T5: a tiny GPT-2 (checks the harness quickly)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU visible to PyTorch")
        return 2
    b = Bench(args)
    b.measure_limits()
    tiers = args.tiers.split(",")
    # A tier name runs all its parts; a part name (T1core, T1nn, T1nnbf16, T1nnops, T1fused, T3mlp) runs that part alone.
    for t, part, fn in (("T0", "T0", b.tier0), ("T1", "T1core", b.tier1), ("T1", "T1nn", b.tier1_nn),
                        ("T1", "T1nnbf16", b.tier1_nn_bf16),
                        ("T1", "T1nnops", b.tier1_nnops), ("T1", "T1fused", b.tier1_fused), ("T2", "T2", b.tier2),
                        ("T3", "T3mlp", b.tier3)):
        if t in tiers or part in tiers:
            fn()
    if "T2attn" in tiers and "T2" not in tiers:  # the attention rows of T2 alone
        b.attention_rows()
    # a failure in the GPT-2 tiers is reported and fails the run, but keeps the rows measured so far
    for t, fn in (("T3", lambda: gpt2_tiers.tier3(b, median_ms)), ("T4", lambda: gpt2_tiers.tier4(b)),
                  ("T3dp", lambda: gpt2_tiers.tier3_dp(b))):
        if t in tiers or (t == "T3" and ("T5" in tiers or "T3gpt2" in tiers)):
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                b.failures.append(f"{t} GPT-2: {e}")
    b.finish()
    b.fl.close()
    for f in b.failures:
        print("FAILED: " + f)
    return 1 if b.failures else 0


if __name__ == "__main__":
    sys.exit(main())
