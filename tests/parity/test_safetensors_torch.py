#!/usr/bin/env python3
"""safetensors interoperability between FLAME (through ctypes, flame_ctypes.py) and the Python
package `safetensors`, in both directions.

1. Python writes (safetensors.torch.save_file) tensors of every dtype FLAME has (0-d, empty, 1-3
   dims, one of 1000x1000; float8_e4m3fn and float8_e5m2 among them), tensors of dtypes FLAME lacks
   (int16, int8 and, when this torch and safetensors have them, float8_e8m0fnu and uint16) and
   metadata. FLAME lists every tensor in byte
   order, reports dtypes and shapes, reads its own dtypes bit for bit, returns
   FLAME_ERROR_UNSUPPORTED for the others, and sees the same metadata.
2. FLAME writes (flame_safetensors_save) tensors of every dtype, contiguous and views (transposed,
   strided slice, flipped, expanded, permuted), with metadata; safetensors.torch.load_file reads
   them back bit for bit and safe_open sees the metadata.
3. Without metadata (and with one entry) FLAME's file is byte for byte what safetensors.torch.save
   writes for the same tensors.

Usage: python3 tests/parity/test_safetensors_torch.py [--seed N]
Env:   FLAME_LIBRARY (path to libflame.so.1), FLAME_REQUIRE_GPU=1 (a missing GPU or PyTorch fails).
Prints "SKIPPED: <reason>" and exits 0 when the `safetensors` package is not installed (always), or
without PyTorch or a GPU (unless FLAME_REQUIRE_GPU=1); otherwise ends with "N passed, M failed"
and exits non-zero on any failure.
"""
import argparse
import ctypes
import os
import random
import sys
import tempfile
import traceback
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flame_ctypes as fc  # noqa: E402

H = fc.H
FLAME_ERROR_UNSUPPORTED = 12
FLAME_DTYPES = ("f32", "f16", "bf16", "f64", "i64", "i32", "u8", "bool", "f8_e4m3", "f8_e5m2")
torch = None  # imported in main()


def torch_dtype(name):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
            "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8, "bool": torch.bool,
            "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}[name]


def random_tensor(dt, shape, gen):
    if dt == "bool":
        return torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    if dt == "u8":
        return torch.randint(0, 256, shape, generator=gen).to(torch.uint8)
    if dt == "i32":
        return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int64).to(torch.int32)
    if dt == "i64":
        return torch.randint(-2**62, 2**62, shape, generator=gen, dtype=torch.int64)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(torch_dtype(dt))


def raw_bytes(t):
    """Row-major bytes of a CPU tensor."""
    t = t.contiguous()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def shape_tag(shape):
    return "s" + "x".join(str(s) for s in shape) if len(shape) else "scalar"


def byte_order(names):
    return sorted(names, key=lambda s: s.encode())


# ---------------------------------------------------------------------------- FLAME helpers

def numel(fl, t):
    n = fc.i64()
    fl.check(fl.raw.flame_tensor_numel(t.h, ctypes.byref(n)), "flame_tensor_numel")
    return n.value


def flame_bytes(fl, t):
    n = numel(fl, t) * fc.DTYPE_SIZES[fl.dtype(t)]
    buf = ctypes.create_string_buffer(max(n, 1))
    fl.to_host_ptr(t, ctypes.addressof(buf), n)
    return buf.raw[:n]


def upload(fl, ctx, t, dt):
    t = t.contiguous()
    n = t.numel() * t.element_size()
    return fl.from_host_ptr(ctx, t.data_ptr() if n else 0, n, list(t.shape), dt)


class StFile:
    """An open flame_safetensors_t."""

    def __init__(self, fl, ctx, path):
        self.fl, self.h = fl, H()
        fl.check(fl.fn("flame_safetensors_load")(ctx, path.encode(), ctypes.byref(self.h)), "flame_safetensors_load")

    def close(self):
        if self.h.value:
            self.fl.fn("flame_safetensors_release")(self.h)
            self.h = H()

    def names(self):
        n = fc.i64()
        self.fl.check(self.fl.fn("flame_safetensors_count")(self.h, ctypes.byref(n)), "flame_safetensors_count")
        out = []
        for i in range(n.value):
            s = ctypes.c_char_p()
            self.fl.check(self.fl.fn("flame_safetensors_name")(self.h, i, ctypes.byref(s)), "flame_safetensors_name")
            out.append(s.value.decode())
        return out

    def info(self, name):
        """(status, dtype name, shape)."""
        dt, nd = fc.c_int(), fc.i32()
        shape = (fc.i64 * 64)()
        st = self.fl.fn("flame_safetensors_info")(self.h, name.encode(), ctypes.byref(dt), shape, 64, ctypes.byref(nd))
        if st != fc.FLAME_OK:
            return st, None, None
        return st, fc.DTYPE_NAMES.get(dt.value, "unknown"), tuple(shape[i] for i in range(nd.value))

    def get(self, name):
        """(status, fc.Tensor or None)."""
        out = H()
        st = self.fl.fn("flame_safetensors_get")(self.h, name.encode(), ctypes.byref(out))
        return st, (fc.Tensor(self.fl, out) if st == fc.FLAME_OK else None)

    def metadata(self):
        n = fc.i64()
        self.fl.check(self.fl.fn("flame_safetensors_metadata_count")(self.h, ctypes.byref(n)), "metadata_count")
        md = {}
        for i in range(n.value):
            k, v = ctypes.c_char_p(), ctypes.c_char_p()
            self.fl.check(self.fl.fn("flame_safetensors_metadata_key")(self.h, i, ctypes.byref(k)), "metadata_key")
            self.fl.check(self.fl.fn("flame_safetensors_metadata")(self.h, k.value, ctypes.byref(v)), "metadata")
            md[k.value.decode()] = v.value.decode()
        return md


def flame_save(fl, ctx, path, named, metadata=None):
    """named: list of (name, fc.Tensor); metadata: dict or None."""
    kv = []
    for k, v in (metadata or {}).items():
        kv += [k.encode(), v.encode()]
    names = (ctypes.c_char_p * max(len(named), 1))(*[n.encode() for n, _ in named])
    ts = (H * max(len(named), 1))(*[t.h for _, t in named])
    kvs = (ctypes.c_char_p * max(len(kv), 1))(*kv)
    fl.check(fl.fn("flame_safetensors_save")(ctx, path.encode(), names, ts, len(named), kvs, len(kv) // 2),
             "flame_safetensors_save")


# ---------------------------------------------------------------------------- checks

def python_writes_flame_reads(fl, ctx, tmp, gen, rep):
    from safetensors.torch import save, save_file
    tensors = {}
    for dt in FLAME_DTYPES:
        for shape in [(), (0,), (7,), (3, 5), (2, 3, 4), (2, 0, 3)]:
            tensors[f"{dt}.{shape_tag(shape)}"] = random_tensor(dt, shape, gen)
    tensors["big.f32"] = torch.randn(1000, 1000, generator=gen)
    candidates = {  # dtypes FLAME lacks; makers, since older torch versions lack some of them
        "other.i16": lambda: torch.randint(-2**15, 2**15, (5,), generator=gen).to(torch.int16),
        "other.i8": lambda: torch.randint(-128, 128, (2, 2), generator=gen).to(torch.int8),
        "other.f8e8m0": lambda: torch.rand(4, generator=gen).to(torch.float8_e8m0fnu),
        "other.u16": lambda: torch.randint(0, 2**15, (3,), generator=gen).to(torch.uint16),
    }
    unsupported = []
    for k, make in candidates.items():
        try:
            v = make()
            save({k: v})  # this torch / safetensors pair can write it
        except Exception as e:  # noqa: BLE001 - older versions lack some dtypes
            print(f"note: not testing {k}: {e!r}")
            continue
        tensors[k] = v
        unsupported.append(k)
    metadata = {"format": "pt", "note": "\u00fcn\u00ef \u2713", "empty": ""}
    path = os.path.join(tmp, "from_python.safetensors")
    save_file(tensors, path, metadata=metadata)

    f = StFile(fl, ctx, path)
    try:
        names = f.names()
        rep.check(names == byte_order(tensors), "py->flame: names listed in byte order", f"{names[:5]}...")
        rep.check(f.metadata() == metadata, "py->flame: metadata", f"{f.metadata()} vs {metadata}")
        for k, t in tensors.items():
            st, dt, shape = f.info(k)
            if k in unsupported:
                rep.check(st == FLAME_ERROR_UNSUPPORTED, f"py->flame: info({k}) is UNSUPPORTED", f"status {st}")
                st2, _ = f.get(k)
                rep.check(st2 == FLAME_ERROR_UNSUPPORTED, f"py->flame: get({k}) is UNSUPPORTED", f"status {st2}")
                continue
            want_dt = k.split(".")[0] if k != "big.f32" else "f32"
            rep.check(st == fc.FLAME_OK and dt == want_dt and shape == tuple(t.shape), f"py->flame: info({k})",
                      f"status {st}, {dt} {shape} vs {want_dt} {tuple(t.shape)}")
            st, got = f.get(k)
            if st != fc.FLAME_OK:
                rep.check(False, f"py->flame: get({k})", fl.raw.flame_last_error_message().decode())
                continue
            rep.check(fl.shape(got) == tuple(t.shape) and flame_bytes(fl, got) == raw_bytes(t), f"py->flame: values of {k}")
    finally:
        f.close()


def flame_writes_python_reads(fl, ctx, tmp, gen, rep):
    from safetensors import safe_open
    from safetensors.torch import load_file
    named, expect, keep = [], {}, []
    for dt in FLAME_DTYPES:
        for shape in [(), (0,), (7,), (3, 5)]:
            t = random_tensor(dt, shape, gen)
            named.append((f"{dt}.{shape_tag(shape)}", upload(fl, ctx, t, dt)))
            expect[named[-1][0]] = t
        base_t = random_tensor(dt, (4, 6), gen)
        base = upload(fl, ctx, base_t, dt)
        keep.append(base)
        named.append((f"{dt}.transposed", fl.call("transpose", base, 0, 1)))
        expect[f"{dt}.transposed"] = base_t.transpose(0, 1)
        s_t = random_tensor(dt, (10, 3), gen)
        s = upload(fl, ctx, s_t, dt)
        named.append((f"{dt}.sliced", fl.call("slice", s, 0, 1, 9, 3)))
        expect[f"{dt}.sliced"] = s_t[1:9:3]
        named.append((f"{dt}.flipped", fl.flip(s, [1])))
        expect[f"{dt}.flipped"] = torch.flip(s_t, [1])
        e_t = random_tensor(dt, (3, 1), gen)
        e = upload(fl, ctx, e_t, dt)
        named.append((f"{dt}.expanded", fl.shape_call("expand", e, [3, 5])))
        expect[f"{dt}.expanded"] = e_t.expand(3, 5)
        p_t = random_tensor(dt, (2, 3, 4), gen)
        p = upload(fl, ctx, p_t, dt)
        named.append((f"{dt}.permuted", fl.permute(p, [2, 0, 1])))
        expect[f"{dt}.permuted"] = p_t.permute(2, 0, 1)
        keep += [s, e, p]
    metadata = {"format": "pt", "writer": "flame", "\u00e9t\u00e9": "\u2713 \"quoted\" \\"}
    path = os.path.join(tmp, "from_flame.safetensors")
    flame_save(fl, ctx, path, named, metadata)

    loaded = load_file(path)
    rep.check(sorted(loaded) == sorted(expect), "flame->py: the same names", f"{sorted(loaded)[:5]}...")
    for k, t in expect.items():
        got = loaded.get(k)
        ok = got is not None and got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape) and raw_bytes(got) == raw_bytes(t)
        rep.check(ok, f"flame->py: {k}", "" if got is None else f"{got.dtype} {tuple(got.shape)} vs {t.dtype} {tuple(t.shape)}")
    with safe_open(path, framework="pt") as f:
        rep.check(f.metadata() == metadata, "flame->py: metadata", f"{f.metadata()} vs {metadata}")


def same_bytes_as_python(fl, ctx, tmp, gen, rep):
    from safetensors.torch import save
    specs = []  # (name, dtype, shape): names that sort differently from the dtype order
    for i, dt in enumerate(FLAME_DTYPES):
        specs += [(f"w{i}.{dt}", dt, (3, 2)), (f"a.{dt}", dt, (5,))]
    specs += [("z.empty", "f32", (0, 4)), ("z.scalar", "bf16", ())]
    tensors = {name: random_tensor(dt, shape, gen) for name, dt, shape in specs}
    named = [(name, upload(fl, ctx, tensors[name], dt)) for name, dt, _ in specs]
    for md in (None, {"format": "pt"}):
        path = os.path.join(tmp, "same.safetensors")
        flame_save(fl, ctx, path, named, md)
        with open(path, "rb") as fh:
            ours = fh.read()
        theirs = save(tensors, metadata=md)
        label = "byte-identical to safetensors.torch.save" + (" with one metadata entry" if md else "")
        detail = ""
        if ours != theirs:
            n = min(len(ours), len(theirs))
            first = next((i for i in range(n) if ours[i] != theirs[i]), n)
            detail = f"{len(ours)} vs {len(theirs)} bytes, first difference at byte {first}: " \
                     f"{ours[max(0, first - 20):first + 40]!r} vs {theirs[max(0, first - 20):first + 40]!r}"
        rep.check(ours == theirs, label, detail)


# ---------------------------------------------------------------------------- main

def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="seed of the random tensors (default: fresh)")
    args = ap.parse_args(argv)
    try:
        import torch as _torch
    except ImportError as e:
        return fc.skip(f"PyTorch is not installed ({e})")
    torch = _torch
    try:
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: the Python package safetensors is not installed ({e})")
        return 0

    fl, ctx, status = fc.open_on_gpu(torch, need=("flame_safetensors_",))
    if status is not None:
        return status

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"safetensors interop: FLAME {fl.path} vs safetensors {safetensors.__version__}, "
          f"PyTorch {torch.__version__}; seed {seed} (rerun with --seed {seed})")
    rep = fc.Report()
    with tempfile.TemporaryDirectory(prefix="flame-st-interop-") as tmp:
        for part in (python_writes_flame_reads, flame_writes_python_reads, same_bytes_as_python):
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{part.__name__}".encode()))
            try:
                part(fl, ctx, tmp, gen, rep)
            except Exception as e:  # noqa: BLE001 - report and go on with the next part
                rep.check(False, part.__name__, f"{e!r}\n{traceback.format_exc(limit=4)}")
    fl.ctx_destroy(ctx)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
