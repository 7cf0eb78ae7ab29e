#!/usr/bin/env python3
"""FLAME's f8 dtypes against PyTorch's float8_e4m3fn / float8_e5m2, bit for bit.

For each source dtype f32, bf16, f16 and f64: a tensor of the edge values (zeros, subnormals and
the ties around them, ties to even, the largest values and the ties past them, overflow,
infinities, NaN, each with both signs), every 16-bit pattern of the source's width where it is
16-bit, and random values, converted to f8 by FLAME (flame_to_dtype on the GPU) and by PyTorch
(.to() on the CPU: c10's conversion, which defines the dtype) must give the same bytes; then the f8
tensor back to f32 must give the same floats (NaN matched as NaN with its sign), and every one of
the 256 codes of each format must decode as PyTorch decodes it. PyTorch's CUDA conversion is
compared too and any difference from its CPU conversion is printed as a note (PyTorch builds with
CUDA >= 13.2 convert f32 to e4m3 with a saturating intrinsic on the GPU, which its CPU path does
not do; FLAME follows the CPU path).

Usage: python3 tests/parity/test_f8_torch.py
Env:   FLAME_LIBRARY (path to libflame.so.1), FLAME_REQUIRE_GPU=1 (a missing GPU or PyTorch fails).
Prints "SKIPPED: <reason>" and exits 0 without PyTorch or a GPU (unless FLAME_REQUIRE_GPU=1);
otherwise ends with "N passed, M failed" and exits non-zero on any failure.
"""
import ctypes
import math
import os
import struct
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flame_ctypes as fc  # noqa: E402

torch = None  # imported in main()
F8 = {"f8_e4m3": "float8_e4m3fn", "f8_e5m2": "float8_e5m2"}


def edge_values():
    """The same edge values as tests/common/f8_reference.h, both signs."""
    ld = math.ldexp
    v = [0.0, 1.0, 1.5, 0.1, 3.14159, 1.0625, 1.125, 1.1875, 1.25, 1.375,
         ld(1, -9), ld(1, -10), ld(3, -11), ld(1.5, -9), ld(2.5, -9), ld(1, -6), ld(7.5, -9), ld(15, -10),
         ld(1, -11), 240.0, 248.0, 256.0, 272.0, 288.0, 416.0, 432.0, 440.0, 448.0, 456.0, 463.99, 464.0,
         464.01, 479.99, 480.0, 500.0, 1000.0, 65504.0,
         ld(1, -16), ld(1, -17), ld(3, -17), ld(1, -14), ld(3.5, -16), ld(1, -18), 4.5, 11.0, 49152.0,
         53248.0, 57344.0, 59392.0, 61439.99, 61440.0, 61441.0, 65535.0, 65536.0, 1.0e6, 3.0e38,
         ld(1, -149), ld(1, -126), math.inf, math.nan]
    return v + [-x for x in v]


def torch_bytes(t):
    t = t.contiguous().cpu()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def to_flame(fl, ctx, t, dt):
    t = t.contiguous().cpu()
    return fl.from_host_ptr(ctx, t.data_ptr(), t.numel() * t.element_size(), list(t.shape), dt)


def flame_bytes(fl, t, n, size):
    buf = ctypes.create_string_buffer(max(n * size, 1))
    fl.to_host_ptr(t, ctypes.addressof(buf), n * size)
    return buf.raw[:n * size]


def same_floats(a_bytes, b_bytes):
    """Indices where two f32 byte strings differ as values (NaN equals NaN of the same sign)."""
    n = len(a_bytes) // 4
    a, b = struct.unpack(f"<{n}f", a_bytes), struct.unpack(f"<{n}f", b_bytes)
    bad = []
    for i, (x, y) in enumerate(zip(a, b)):
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y) and math.copysign(1, x) == math.copysign(1, y)):
                bad.append(i)
        elif x != y or math.copysign(1, x) != math.copysign(1, y):
            bad.append(i)
    return bad


def first_diff(a, b, src):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return f"first at {i}: input {src[i].item()!r}, 0x{a[i]:02x} vs 0x{b[i]:02x}"
    return f"lengths {len(a)} vs {len(b)}"


def sources(gen):
    """(name, torch CPU tensor) pairs to convert."""
    edges32 = torch.tensor(edge_values(), dtype=torch.float32)
    rand32 = torch.cat([torch.randn(20000, generator=gen) * s for s in (1e-4, 1e-2, 1.0, 30.0, 500.0, 3e4, 1e5)])
    rand_bits = torch.randint(-2**31, 2**31 - 1, (50000,), generator=gen, dtype=torch.int64).to(torch.int32)
    out = [("f32", torch.cat([edges32, rand32, rand_bits.view(torch.float32)])),
           ("f64", torch.cat([torch.tensor(edge_values(), dtype=torch.float64), rand32.double() * 1.0000001]))]
    every16 = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        out.append((name, torch.cat([edges32.to(dt), every16.view(dt), rand32.to(dt)])))
    return out


def check_format(fl, ctx, f8, gen, rep):
    tdt = getattr(torch, F8[f8])
    code = fc.DTYPES[f8]
    for name, src in sources(gen):
        n = src.numel()
        want = torch_bytes(src.to(tdt))  # PyTorch's CPU conversion: the definition
        ft = to_flame(fl, ctx, src, name)
        q = fl.call("to_dtype", ft, code)
        got = flame_bytes(fl, q, n, 1)
        rep.check(got == want, f"{name} -> {f8} bytes ({n} values)", first_diff(got, want, src))
        cuda = torch_bytes(src.cuda().to(tdt))
        if cuda != want:
            diff = sum(1 for a, b in zip(cuda, want) if a != b)
            print(f"note: PyTorch's CUDA {name} -> {f8} differs from its CPU conversion in {diff} of {n} values "
                  f"(CUDA {torch.version.cuda}); FLAME follows the CPU conversion. {first_diff(cuda, want, src)}")
        # Back to f32: the same floats as PyTorch's.
        back = flame_bytes(fl, fl.call("to_dtype", q, fc.DTYPES["f32"]), n, 4)
        tback = torch_bytes(src.to(tdt).float())
        bad = same_floats(back, tback)
        rep.check(not bad, f"{name} -> {f8} -> f32 values", f"{len(bad)} differ, first at {bad[:1]}")
    # Every code decodes as PyTorch decodes it, to f32, bf16 and f16.
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    q = to_flame(fl, ctx, codes, f8)
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16), ("f16", torch.float16)):
        wide = fl.call("to_dtype", q, fc.DTYPES[name])
        got = flame_bytes(fl, fl.call("to_dtype", wide, fc.DTYPES["f32"]), 256, 4)
        want = torch_bytes(codes.view(tdt).to(dt).float())
        bad = same_floats(got, want)
        rep.check(not bad, f"{f8} every code -> {name}", f"codes {bad[:8]} differ")


def main():
    global torch
    try:
        import torch as _torch
    except ImportError:
        return fc.skip("PyTorch is not installed")
    torch = _torch
    if not all(hasattr(torch, v) for v in F8.values()):
        return fc.skip(f"this PyTorch ({torch.__version__}) lacks float8_e4m3fn / float8_e5m2")
    fl, ctx, status = fc.open_on_gpu(torch, need=("flame_to_dtype",))
    if fl is None:
        return status
    rep = fc.Report()
    gen = torch.Generator().manual_seed(35)
    try:
        for f8 in F8:
            check_format(fl, ctx, f8, gen, rep)
    except Exception:  # noqa: BLE001 - a crash is one failure, with its traceback
        traceback.print_exc()
        rep.check(False, "no exception")
    finally:
        fl.ctx_destroy(ctx)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
