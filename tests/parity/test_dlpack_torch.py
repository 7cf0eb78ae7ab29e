#!/usr/bin/env python3
"""DLPack exchange between FLAME and PyTorch on the GPU, through ctypes (flame_ctypes.py).

FLAME -> torch: torch.from_dlpack reads a FLAME tensor (a capsule, and the __dlpack__ protocol with
the versioned struct when both sides have it): same data_ptr (no copy), same values, strides in
elements for views, a write from torch is seen by FLAME, and FLAME's memory returns to its pool
(flame_ctx_memory_stats) only once both the FLAME handle and the torch tensor are gone.
torch -> FLAME: flame_tensor_from_dlpack takes torch's DLManagedTensor (contiguous and not): same
pointer, same strides and values, FLAME ops on it, writes from torch seen by FLAME, and torch's
memory (torch.cuda.memory_allocated) is freed only once both sides let go. Bad input (a CPU tensor,
complex, int8, another GPU) is an error and leaves the capsule to torch. float8_e4m3fn and
float8_e5m2 go both ways as FLAME's f8 dtypes (skipped where this torch lacks them in DLPack).

Usage: python3 tests/parity/test_dlpack_torch.py [-v]
Env:   FLAME_LIBRARY (path to libflame.so.1), FLAME_REQUIRE_GPU=1 (a missing GPU/torch fails).
Prints "SKIPPED: <reason>" and exits 0 without torch or a CUDA GPU (unless FLAME_REQUIRE_GPU=1);
otherwise ends with "N passed, M failed" and exits non-zero on any failure.
"""
import argparse
import ctypes
import gc
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flame_ctypes as fc  # noqa: E402

torch = None  # imported in main()

FLAME_ERROR_INVALID_ARGUMENT = 1
FLAME_ERROR_DTYPE_MISMATCH = 4
FLAME_ERROR_UNSUPPORTED = 12
KDL_CUDA = 2

# Capsule names: PyCapsule keeps the pointer, so these bytes objects must live as long as the module.
DLTENSOR = b"dltensor"
USED_DLTENSOR = b"used_dltensor"
DLTENSOR_VERSIONED = b"dltensor_versioned"
USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Skip(Exception):
    pass


def tdtype(name):
    return {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
            "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool,
            "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}[name]


def fname(tdt):
    return {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
            torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "bool",
            torch.float8_e4m3fn: "f8_e4m3", torch.float8_e5m2: "f8_e5m2"}[tdt]


class Env:
    """The library, a context on device 0 and helpers over raw handles."""

    def __init__(self, fl, ctx):
        self.fl, self.ctx = fl, ctx
        probe = self.upload(torch.zeros(1))
        out = ctypes.c_void_p()
        st = fl.fn("flame_tensor_to_dlpack_versioned")(probe.h, ctypes.byref(out))
        self.flame_versioned = st == fc.FLAME_OK
        if self.flame_versioned:  # hand it back to FLAME, which calls its deleter
            back = fc.H()
            fl.check(fl.fn("flame_tensor_from_dlpack_versioned")(ctx, out, ctypes.byref(back)), "probe")
            fc.Tensor(fl, back)
        elif st != FLAME_ERROR_UNSUPPORTED:
            fl.check(st, "flame_tensor_to_dlpack_versioned")

    def upload(self, t):
        c = t.detach().to("cpu").contiguous()
        return self.fl.from_host_ptr(self.ctx, c.data_ptr(), c.numel() * c.element_size(), list(c.shape),
                                     fname(c.dtype))

    def download(self, ft):
        out = torch.empty(self.fl.shape(ft), dtype=tdtype(self.fl.dtype(ft)))
        self.fl.to_host_ptr(ft, out.data_ptr(), out.numel() * out.element_size())
        return out

    def data_ptr(self, ft):
        p = ctypes.c_void_p()
        self.fl.check(self.fl.fn("flame_tensor_data_ptr")(ft.h, ctypes.byref(p)), "flame_tensor_data_ptr")
        return p.value or 0

    def strides(self, ft):
        n = len(self.fl.shape(ft))
        arr = (fc.i64 * max(n, 1))()
        self.fl.check(self.fl.fn("flame_tensor_strides")(ft.h, arr, n), "flame_tensor_strides")
        return tuple(arr[i] for i in range(n))

    def stats(self):
        self.fl.check(self.fl.raw.flame_ctx_synchronize(self.ctx), "flame_ctx_synchronize")
        s = fc.MemoryStats()
        s.struct_size = ctypes.sizeof(s)
        self.fl.check(self.fl.raw.flame_ctx_memory_stats(self.ctx, ctypes.byref(s)), "flame_ctx_memory_stats")
        return s.bytes_in_use, s.live_tensors

    # ---- FLAME -> DLPack
    def capsule(self, ft, versioned=False):
        out = ctypes.c_void_p()
        name = "flame_tensor_to_dlpack_versioned" if versioned else "flame_tensor_to_dlpack"
        self.fl.check(self.fl.fn(name)(ft.h, ctypes.byref(out)), name)
        return _api.PyCapsule_New(out, DLTENSOR_VERSIONED if versioned else DLTENSOR, None)

    # ---- DLPack (from torch) -> FLAME; returns (status, Tensor or None); the capsule is marked used
    # only when FLAME took it over.
    def import_capsule(self, cap, versioned=False):
        name, used = (DLTENSOR_VERSIONED, USED_DLTENSOR_VERSIONED) if versioned else (DLTENSOR, USED_DLTENSOR)
        ptr = _api.PyCapsule_GetPointer(cap, name)
        out = fc.H()
        fn = "flame_tensor_from_dlpack_versioned" if versioned else "flame_tensor_from_dlpack"
        st = self.fl.fn(fn)(self.ctx, ptr, ctypes.byref(out))
        if st != fc.FLAME_OK:
            return st, None
        _api.PyCapsule_SetName(cap, used)
        return st, fc.Tensor(self.fl, out)

    def error(self):
        return (self.fl.raw.flame_last_error_message() or b"").decode(errors="replace")


class Exported:
    """A FLAME tensor offered to torch.from_dlpack through the __dlpack__ protocol."""

    def __init__(self, env, ft):
        self.env, self.ft = env, ft
        self.gave_versioned = None

    def __dlpack_device__(self):
        return (KDL_CUDA, 0)

    def __dlpack__(self, stream=None, max_version=None, **_):
        # FLAME waits for its own stream before exporting: any consumer stream may use the data.
        self.gave_versioned = bool(max_version and max_version[0] >= 1 and self.env.flame_versioned)
        return self.env.capsule(self.ft, versioned=self.gave_versioned)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def same(a, b, what):
    a, b = a.detach().cpu(), b.detach().cpu()
    expect(a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}")
    expect(torch.equal(a, b), f"{what}: values differ\n{a}\n{b}")


def collect():
    gc.collect()
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------- FLAME -> torch


def t_flame_to_torch_every_dtype(env):
    g = torch.Generator().manual_seed(1)
    for name in ("f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"):
        if name == "bool":
            ref = torch.rand(3, 4, generator=g) > 0.5
        elif name in ("i32", "i64", "u8"):
            ref = torch.randint(0, 100, (3, 4), generator=g).to(tdtype(name))
        else:
            ref = (torch.rand(3, 4, generator=g, dtype=torch.float64) * 4 - 2).to(tdtype(name))
        ft = env.upload(ref)
        x = torch.utils.dlpack.from_dlpack(env.capsule(ft))
        expect(x.is_cuda and x.device.index == 0, f"{name}: device {x.device}")
        expect(x.data_ptr() == env.data_ptr(ft), f"{name}: torch copied (data_ptr differs)")
        same(x, ref, f"{name} values")


def t_flame_to_torch_write_back(env):
    ref = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    ft = env.upload(ref)
    x = torch.from_dlpack(Exported(env, ft))
    expect(x.data_ptr() == env.data_ptr(ft), "no copy")
    same(x, ref, "values")
    x.add_(1).mul_(2)  # torch writes into FLAME's memory
    torch.cuda.synchronize()
    same(env.download(ft), (ref + 1) * 2, "torch's write seen by FLAME")
    y = env.fl.call("mul_scalar", ft, 0.5)  # and FLAME computes on it
    same(env.download(y), ref + 1, "FLAME op after torch's write")


def t_flame_to_torch_views(env):
    ref = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    ft = env.upload(ref)
    views = [("transpose", env.fl.call("transpose", ft, 0, 1), ref.t()),
             ("slice", env.fl.call("slice", ft, 1, 1, 6, 2), ref[:, 1:6:2]),
             ("narrow", env.fl.call("narrow", ft, 0, 1, 2), ref[1:3])]
    for name, fv, rv in views:
        x = torch.utils.dlpack.from_dlpack(env.capsule(fv))
        expect(x.stride() == env.strides(fv), f"{name}: strides {x.stride()} vs FLAME {env.strides(fv)}")
        expect(x.stride() == rv.stride(), f"{name}: strides {x.stride()} vs torch {rv.stride()}")
        expect(x.data_ptr() == env.data_ptr(fv), f"{name}: no copy")
        same(x, rv, f"{name} values")


def t_flame_to_torch_versioned(env):
    if not env.flame_versioned:
        raise Skip("this FLAME was built with a dlpack.h older than 1.0")
    ft = env.upload(torch.linspace(-1, 1, 12).reshape(3, 4))
    e = Exported(env, ft)
    x = torch.from_dlpack(e)
    if not e.gave_versioned:
        raise Skip(f"torch {torch.__version__} does not ask for the versioned struct")
    expect(x.data_ptr() == env.data_ptr(ft), "no copy")
    same(x, env.download(ft), "values")


def t_flame_memory_freed_when_both_let_go(env):
    collect()
    base_bytes, base_live = env.stats()
    ft = env.upload(torch.ones(256, 1024))  # 1 MiB
    x = torch.from_dlpack(Exported(env, ft))
    del ft
    collect()
    held, live = env.stats()
    expect(live == base_live, f"the FLAME handle is gone: live {live} vs {base_live}")
    expect(held >= base_bytes + (1 << 20), f"torch still holds FLAME's memory: {held} vs base {base_bytes}")
    x.add_(1)
    torch.cuda.synchronize()
    del x
    collect()
    after, _ = env.stats()
    expect(after == base_bytes, f"FLAME's memory back in the pool: {after} vs {base_bytes}")


# ---------------------------------------------------------------------------- torch -> FLAME


def t_torch_to_flame(env):
    g = torch.Generator().manual_seed(2)
    base = torch.rand(6, 8, generator=g).cuda()
    cases = [("contiguous", base), ("transpose", base.t()), ("step slice", base[:, ::3]),
             ("offset", base[2:5, 1:7]), ("expand (zero stride)", base[:1].expand(4, 8))]
    for name, t in cases:
        torch.cuda.synchronize()  # the data must be ready before FLAME's stream uses it
        st, ft = env.import_capsule(torch.utils.dlpack.to_dlpack(t))
        expect(st == fc.FLAME_OK, f"{name}: status {st}: {env.error()}")
        expect(env.data_ptr(ft) == t.data_ptr(), f"{name}: FLAME copied")
        # torch writes stride 1 for size-1 dims (gh-83069); the others must arrive unchanged
        big = [i for i, n in enumerate(t.shape) if n > 1]
        expect([env.strides(ft)[i] for i in big] == [t.stride(i) for i in big],
               f"{name}: strides {env.strides(ft)} vs {t.stride()}")
        same(env.download(ft), t, f"{name} values")
        y = env.fl.call("add_scalar", ft, 1.5)
        same(env.download(y), t + 1.5, f"{name}: FLAME op")
    t = base.clone()
    st, ft = env.import_capsule(torch.utils.dlpack.to_dlpack(t))
    expect(st == fc.FLAME_OK, env.error())
    t.mul_(-3)  # torch writes after the import
    torch.cuda.synchronize()
    same(env.download(ft), t, "torch's later write seen by FLAME")


def t_torch_to_flame_versioned(env):
    if not env.flame_versioned:
        raise Skip("this FLAME was built with a dlpack.h older than 1.0")
    t = torch.arange(10, dtype=torch.int64, device="cuda")[::2]
    try:
        cap = t.__dlpack__(max_version=(1, 0))
    except TypeError:
        raise Skip(f"torch {torch.__version__} cannot export the versioned struct")
    if not _api.PyCapsule_IsValid(cap, DLTENSOR_VERSIONED):
        raise Skip("torch returned an unversioned capsule")
    torch.cuda.synchronize()
    st, ft = env.import_capsule(cap, versioned=True)
    expect(st == fc.FLAME_OK, f"status {st}: {env.error()}")
    expect(env.data_ptr(ft) == t.data_ptr(), "no copy")
    same(env.download(ft), t, "values")


def t_torch_memory_freed_when_both_let_go(env):
    collect()
    m0 = torch.cuda.memory_allocated()
    t = torch.full((1 << 20,), 2.0, device="cuda")  # 4 MiB from torch's allocator
    m1 = torch.cuda.memory_allocated()
    expect(m1 >= m0 + (4 << 20), f"allocated {m1 - m0}")
    torch.cuda.synchronize()
    st, ft = env.import_capsule(torch.utils.dlpack.to_dlpack(t))
    expect(st == fc.FLAME_OK, env.error())
    del t
    collect()
    expect(torch.cuda.memory_allocated() == m1, "FLAME keeps torch's memory alive")
    s = env.fl.call("sum_all", ft)
    same(env.download(s), torch.tensor(2.0 * (1 << 20)), "FLAME reads it")
    del s, ft  # FLAME's last reference: it syncs its stream, then calls torch's deleter
    collect()
    expect(torch.cuda.memory_allocated() == m0, f"torch's memory freed: {torch.cuda.memory_allocated()} vs {m0}")


def t_float8_both_ways(env):
    """float8_e4m3fn / float8_e5m2 (DLPack 1.1 codes 10 and 12) both ways, bytes compared."""
    g = torch.Generator().manual_seed(8)
    for tdt in (torch.float8_e4m3fn, torch.float8_e5m2):
        ref = (torch.rand(3, 4, generator=g) * 8 - 4).to(tdt)
        ft = env.upload(ref)
        try:
            x = torch.utils.dlpack.from_dlpack(env.capsule(ft))
        except (RuntimeError, TypeError, BufferError) as e:
            raise Skip(f"this PyTorch ({torch.__version__}) does not import {tdt} through DLPack: {e}")
        expect(x.dtype == tdt, f"{tdt}: torch sees {x.dtype}")
        expect(x.data_ptr() == env.data_ptr(ft), f"{tdt}: torch copied (data_ptr differs)")
        same(x.view(torch.uint8), ref.view(torch.uint8), f"{tdt} bytes, FLAME -> torch")
        t = ref.cuda()
        torch.cuda.synchronize()
        try:
            cap = torch.utils.dlpack.to_dlpack(t)
        except (RuntimeError, TypeError, BufferError) as e:
            raise Skip(f"this PyTorch ({torch.__version__}) does not export {tdt} through DLPack: {e}")
        st, back = env.import_capsule(cap)
        expect(st == fc.FLAME_OK, f"{tdt}: status {st}: {env.error()}")
        expect(env.fl.dtype(back) == fname(tdt), f"{tdt}: FLAME sees {env.fl.dtype(back)}")
        same(env.download(back).view(torch.uint8), ref.view(torch.uint8), f"{tdt} bytes, torch -> FLAME")


def t_round_trip_flame_torch_flame(env):
    ref = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ft = env.upload(ref)
    x = torch.utils.dlpack.from_dlpack(env.capsule(ft))
    st, back = env.import_capsule(torch.utils.dlpack.to_dlpack(x))
    expect(st == fc.FLAME_OK, env.error())
    expect(env.data_ptr(back) == env.data_ptr(ft), "the same memory after FLAME -> torch -> FLAME")
    same(env.download(back), ref, "values")


def t_bad_input_is_an_error(env):
    cases = [("CPU tensor", torch.ones(3), FLAME_ERROR_UNSUPPORTED),
             ("complex64", torch.ones(3, dtype=torch.complex64, device="cuda"), FLAME_ERROR_DTYPE_MISMATCH),
             ("int8", torch.ones(3, dtype=torch.int8, device="cuda"), FLAME_ERROR_DTYPE_MISMATCH)]
    if torch.cuda.device_count() > 1:
        cases.append(("another GPU", torch.ones(3, device="cuda:1"), FLAME_ERROR_INVALID_ARGUMENT))
    for name, t, want in cases:
        cap = torch.utils.dlpack.to_dlpack(t)
        st, ft = env.import_capsule(cap)
        expect(st == want and ft is None, f"{name}: status {st}, expected {want}: {env.error()}")
        expect("src" in env.error(), f"{name}: the message names the argument: {env.error()}")
        expect(_api.PyCapsule_IsValid(cap, DLTENSOR) == 1, f"{name}: the capsule stays torch's")
        del cap  # torch's capsule destructor calls the deleter: nothing leaks, nothing is freed twice
    collect()


TESTS = [t_flame_to_torch_every_dtype, t_flame_to_torch_write_back, t_flame_to_torch_views,
         t_flame_to_torch_versioned, t_flame_memory_freed_when_both_let_go, t_torch_to_flame,
         t_torch_to_flame_versioned, t_torch_memory_freed_when_both_let_go, t_round_trip_flame_torch_flame,
         t_float8_both_ways, t_bad_input_is_an_error]


def main(argv=None):
    global torch
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", dest="verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        import torch as _torch
        import torch.utils.dlpack  # noqa: F401
    except ImportError as e:
        return fc.skip(f"PyTorch is not installed ({e})")
    torch = _torch
    fl, ctx, status = fc.open_on_gpu(torch)
    if status is not None:
        return status
    torch.cuda.init()
    env = Env(fl, ctx)
    print(f"FLAME <-> PyTorch {torch.__version__} DLPack on {torch.cuda.get_device_name(0)}; FLAME versioned "
          f"DLPack: {'yes' if env.flame_versioned else 'no'}; library {fl.path}")
    passed = failed = skipped = 0
    for test in TESTS:
        try:
            test(env)
            passed += 1
            print(f"ok      {test.__name__}")
        except Skip as s:
            skipped += 1
            print(f"skipped {test.__name__}: {s}")
        except Exception as e:  # an assertion, a FlameError or a torch error
            failed += 1
            print(f"FAIL    {test.__name__}: {e}")
            if args.verbose or not isinstance(e, AssertionError):
                print("   " + traceback.format_exc().replace("\n", "\n   "))
        collect()
    del env
    gc.collect()
    fl.ctx_destroy(ctx)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
