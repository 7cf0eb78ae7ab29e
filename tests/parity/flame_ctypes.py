"""Minimal ctypes binding of libflame's C ABI (include/flame.h) for the PyTorch parity harness.

Every function used is declared with argtypes/restype. Data moves through flame_from_host /
flame_to_host using raw host pointers (torch CPU tensors or ctypes buffers); numpy is not needed.

The library is found through $FLAME_LIBRARY, else build/libflame.so.1 under the repository root.
"""
import ctypes
import os
import pathlib

H = ctypes.c_void_p          # every opaque handle (flame_ctx_t, flame_tensor_t, flame_hook_t)
P = ctypes.POINTER
c_int = ctypes.c_int         # enums: flame_status_t, flame_dtype_t
i32, i64, u32, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64
f64, size_t = ctypes.c_double, ctypes.c_size_t

DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "f64": 3, "i32": 4, "i64": 5, "u8": 6, "bool": 7, "f8_e4m3": 8, "f8_e5m2": 9}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i32": 4, "i64": 8, "u8": 1, "bool": 1, "f8_e4m3": 1,
               "f8_e5m2": 1}

FLAME_OK = 0
FLAME_ERROR_NO_DRIVER = 6
FLAME_ERROR_NO_DEVICE = 7
RETAIN_GRAPH = 1
CREATE_GRAPH = 2
ALLOW_UNUSED = 4
DIM_ALL = -2147483648


class CtxOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", size_t),
        ("device", i32),
        ("seed", u64),
        ("kernel_cache_dir", ctypes.c_char_p),
        ("memory_limit", u64),
        ("allow_tf32", i32),
        ("gemm_heuristic_only", i32),
    ]


class MemoryStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", size_t),
        ("bytes_in_use", u64),
        ("bytes_reserved", u64),
        ("peak_bytes_in_use", u64),
        ("live_tensors", u64),
    ]


_UNARY = ("neg abs exp log log1p expm1 sqrt rsqrt sin cos tanh sigmoid relu silu floor ceil round sign "
          "reciprocal square isnan isinf logical_not contiguous clone squeeze_all sum_all max_all min_all "
          "tensor_detach").split()
_SCALAR = "add_scalar sub_scalar rsub_scalar mul_scalar div_scalar pow_scalar leaky_relu elu".split()
_BINARY = "add sub mul div pow maximum minimum eq ne lt le gt ge logical_and logical_or".split()
_REDUCE = "sum mean prod max min logsumexp".split()

_SIGNATURES = {
    "flame_version_string": (ctypes.c_char_p, []),
    "flame_abi_version": (i32, []),
    "flame_status_string": (ctypes.c_char_p, [c_int]),
    "flame_last_error_message": (ctypes.c_char_p, []),
    "flame_dtype_size": (size_t, [c_int]),
    "flame_ctx_options_init": (c_int, [P(CtxOptions)]),
    "flame_ctx_create": (c_int, [P(CtxOptions), P(H)]),
    "flame_ctx_destroy": (None, [H]),
    "flame_ctx_synchronize": (c_int, [H]),
    "flame_ctx_memory_stats": (c_int, [H, P(MemoryStats)]),
    "flame_ctx_set_grad_enabled": (c_int, [H, i32, P(i32)]),
    "flame_tensor_release": (None, [H]),
    "flame_tensor_dtype": (c_int, [H, P(c_int)]),
    "flame_tensor_ndim": (c_int, [H, P(i32)]),
    "flame_tensor_shape": (c_int, [H, P(i64), i32]),
    "flame_tensor_numel": (c_int, [H, P(i64)]),
    "flame_tensor_is_contiguous": (c_int, [H, P(i32)]),
    "flame_from_host": (c_int, [H, ctypes.c_void_p, size_t, P(i64), i32, c_int, P(H)]),
    "flame_to_host": (c_int, [H, ctypes.c_void_p, size_t]),
    "flame_tensor_set_requires_grad": (c_int, [H, i32]),
    "flame_tensor_requires_grad": (c_int, [H, P(i32)]),
    "flame_tensor_is_leaf": (c_int, [H, P(i32)]),
    "flame_tensor_grad": (c_int, [H, P(H)]),
    "flame_tensor_set_grad": (c_int, [H, H]),
    "flame_backward": (c_int, [H, H, H, u32]),
    "flame_grad": (c_int, [H, P(H), P(H), i32, P(H), i32, u32, P(H)]),
    "flame_where": (c_int, [H, H, H, P(H)]),
    "flame_clamp": (c_int, [H, f64, f64, P(H)]),
    "flame_gelu": (c_int, [H, i32, P(H)]),
    "flame_softplus": (c_int, [H, f64, f64, P(H)]),
    "flame_to_dtype": (c_int, [H, c_int, P(H)]),
    "flame_reshape": (c_int, [H, P(i64), i32, P(H)]),
    "flame_view": (c_int, [H, P(i64), i32, P(H)]),
    "flame_expand": (c_int, [H, P(i64), i32, P(H)]),
    "flame_permute": (c_int, [H, P(i32), i32, P(H)]),
    "flame_transpose": (c_int, [H, i32, i32, P(H)]),
    "flame_squeeze": (c_int, [H, i32, P(H)]),
    "flame_unsqueeze": (c_int, [H, i32, P(H)]),
    "flame_narrow": (c_int, [H, i32, i64, i64, P(H)]),
    "flame_slice": (c_int, [H, i32, i64, i64, i64, P(H)]),
    "flame_select": (c_int, [H, i32, i64, P(H)]),
    "flame_flip": (c_int, [H, P(i32), i32, P(H)]),
    "flame_diagonal": (c_int, [H, i64, i32, i32, P(H)]),
    "flame_cat": (c_int, [P(H), i32, i32, P(H)]),
    "flame_stack": (c_int, [P(H), i32, i32, P(H)]),
    "flame_split": (c_int, [H, i64, i32, P(H), i32, P(i32)]),
    "flame_split_sizes": (c_int, [H, P(i64), i32, i32, P(H)]),
    "flame_chunk": (c_int, [H, i32, i32, P(H), i32, P(i32)]),
    "flame_triu": (c_int, [H, i64, P(H)]),
    "flame_tril": (c_int, [H, i64, P(H)]),
    "flame_var": (c_int, [H, P(i32), i32, f64, i32, P(H)]),
    "flame_std": (c_int, [H, P(i32), i32, f64, i32, P(H)]),
    "flame_norm": (c_int, [H, f64, P(i32), i32, i32, P(H)]),
    "flame_argmax": (c_int, [H, i32, i32, P(H)]),
    "flame_argmin": (c_int, [H, i32, i32, P(H)]),
    "flame_cumsum": (c_int, [H, i32, P(H)]),
    "flame_matmul": (c_int, [H, H, P(H)]),
    "flame_bmm": (c_int, [H, H, P(H)]),
    "flame_linear": (c_int, [H, H, H, i32, P(H)]),
}
# ---- losses (flame.h "Losses"); the reduction is a flame_reduction_t
_SIGNATURES.update({
    "flame_cross_entropy": (c_int, [H, H, H, i64, f64, c_int, P(H)]),
    "flame_nll_loss": (c_int, [H, H, H, i64, c_int, P(H)]),
    "flame_mse_loss": (c_int, [H, H, c_int, P(H)]),
    "flame_l1_loss": (c_int, [H, H, c_int, P(H)]),
    "flame_smooth_l1_loss": (c_int, [H, H, f64, c_int, P(H)]),
    "flame_huber_loss": (c_int, [H, H, f64, c_int, P(H)]),
    "flame_binary_cross_entropy_with_logits": (c_int, [H, H, H, H, c_int, P(H)]),
})
# ---- indexing (flame.h "Indexing")
NO_PADDING = -2**63
_SIGNATURES.update({
    "flame_index_select": (c_int, [H, i32, H, P(H)]),
    "flame_gather": (c_int, [H, i32, H, P(H)]),
    "flame_scatter_add": (c_int, [H, i32, H, H, P(H)]),
    "flame_index_add": (c_int, [H, i32, H, H, f64, P(H)]),
    "flame_masked_fill": (c_int, [H, H, f64, P(H)]),
    "flame_one_hot": (c_int, [H, i64, P(H)]),
    "flame_embedding": (c_int, [H, H, i64, P(H)]),
})


# ---- DLPack exchange and the queries its tests use (DLManagedTensor pointers as void*)
_SIGNATURES.update({
    "flame_tensor_retain": (c_int, [H]),
    "flame_tensor_strides": (c_int, [H, P(i64), i32]),
    "flame_tensor_data_ptr": (c_int, [H, P(ctypes.c_void_p)]),
    "flame_tensor_to_dlpack": (c_int, [H, P(ctypes.c_void_p)]),
    "flame_tensor_from_dlpack": (c_int, [H, ctypes.c_void_p, P(H)]),
    "flame_tensor_to_dlpack_versioned": (c_int, [H, P(ctypes.c_void_p)]),
    "flame_tensor_from_dlpack_versioned": (c_int, [H, ctypes.c_void_p, P(H)]),
})
for _n in _UNARY:
    _SIGNATURES["flame_" + _n] = (c_int, [H, P(H)])
for _n in _SCALAR:
    _SIGNATURES["flame_" + _n] = (c_int, [H, f64, P(H)])
for _n in _BINARY:
    _SIGNATURES["flame_" + _n] = (c_int, [H, H, P(H)])
for _n in _REDUCE:
    _SIGNATURES["flame_" + _n] = (c_int, [H, P(i32), i32, i32, P(H)])

# ---- neural-network ops: softmax and normalisation ----
_SIGNATURES.update({
    "flame_tensor_context": (c_int, [H, P(H)]),
    "flame_softmax": (c_int, [H, i32, P(H)]),
    "flame_log_softmax": (c_int, [H, i32, P(H)]),
    "flame_layer_norm": (c_int, [H, P(i64), i32, H, H, f64, P(H)]),
    "flame_rms_norm": (c_int, [H, P(i64), i32, H, f64, P(H)]),
    "flame_group_norm": (c_int, [H, i32, H, H, f64, i32, P(H)]),
    "flame_batch_norm": (c_int, [H, H, H, H, H, i32, f64, f64, P(H)]),
})

# ---- safetensors (flame_safetensors_t is an opaque handle too) ----
_SIGNATURES.update({
    "flame_safetensors_load": (c_int, [H, ctypes.c_char_p, P(H)]),
    "flame_safetensors_release": (None, [H]),
    "flame_safetensors_count": (c_int, [H, P(i64)]),
    "flame_safetensors_name": (c_int, [H, i64, P(ctypes.c_char_p)]),
    "flame_safetensors_info": (c_int, [H, ctypes.c_char_p, P(c_int), P(i64), i32, P(i32)]),
    "flame_safetensors_get": (c_int, [H, ctypes.c_char_p, P(H)]),
    "flame_safetensors_metadata_count": (c_int, [H, P(i64)]),
    "flame_safetensors_metadata_key": (c_int, [H, i64, P(ctypes.c_char_p)]),
    "flame_safetensors_metadata": (c_int, [H, ctypes.c_char_p, P(ctypes.c_char_p)]),
    "flame_safetensors_save": (c_int, [H, ctypes.c_char_p, P(ctypes.c_char_p), P(H), i64, P(ctypes.c_char_p), i64]),
})

# ---- attention (flame.h "Attention") ----
ATTENTION_CAUSAL = 1


class AttentionOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", size_t),
        ("flags", u32),
        ("scale", f64),
        ("dropout_p", f64),
    ]


_SIGNATURES.update({
    "flame_attention_options_init": (c_int, [P(AttentionOptions)]),
    "flame_scaled_dot_product_attention": (c_int, [H, H, H, H, P(AttentionOptions), P(H)]),
})


# ---- more nn ops (flame.h "Indexing: scatter, masked_select, repeat, pad" and the sections after it)
_SIGNATURES.update({
    "flame_scatter": (c_int, [H, i32, H, H, P(H)]),
    "flame_masked_select": (c_int, [H, H, P(H)]),
    "flame_repeat": (c_int, [H, P(i64), i32, P(H)]),
    "flame_repeat_interleave": (c_int, [H, i64, i32, P(H)]),
    "flame_pad": (c_int, [H, P(i64), i32, i32, f64, P(H)]),
    "flame_ctx_set_rng_state": (c_int, [H, u64, u64]),
    "flame_ctx_get_rng_state": (c_int, [H, P(u64), P(u64)]),
    "flame_dropout": (c_int, [H, f64, i32, P(H)]),
})


class Pool2dOptions(ctypes.Structure):
    """flame_pool2d_options_t."""
    _fields_ = [
        ("struct_size", size_t),
        ("kernel_size", i64 * 2),
        ("stride", i64 * 2),
        ("padding", i64 * 2),
        ("dilation", i64 * 2),
        ("ceil_mode", i32),
        ("count_include_pad", i32),
        ("divisor_override", i64),
    ]


_SIGNATURES.update({
    "flame_pool2d_options_init": (c_int, [P(Pool2dOptions), i64, i64]),
    "flame_max_pool2d": (c_int, [H, P(Pool2dOptions), P(H)]),
    "flame_avg_pool2d": (c_int, [H, P(Pool2dOptions), P(H)]),
    "flame_adaptive_avg_pool2d": (c_int, [H, i64, i64, P(H)]),
    "flame_upsample_nearest2d": (c_int, [H, i64, i64, f64, f64, P(H)]),
    "flame_upsample_bilinear2d": (c_int, [H, i64, i64, f64, f64, i32, P(H)]),
})


class RopeOptions(ctypes.Structure):
    """flame_rope_options_t."""
    _fields_ = [
        ("struct_size", size_t),
        ("theta", f64),
        ("rotary_dim", i64),
        ("position_offset", i64),
        ("interleaved", i32),
        ("seq_dim", i32),
    ]


_SIGNATURES.update({
    "flame_rope_options_init": (c_int, [P(RopeOptions)]),
    "flame_rope": (c_int, [H, H, P(RopeOptions), P(H)]),
    "flame_timestep_embedding": (c_int, [H, i64, f64, i32, f64, f64, P(H)]),
    "flame_geglu": (c_int, [H, i32, P(H)]),
    "flame_adaln_modulate": (c_int, [H, H, H, P(H)]),
    "flame_swiglu_mlp": (c_int, [H, H, H, H, P(H)]),
})

class FlameError(RuntimeError):
    def __init__(self, status, status_name, what, message):
        super().__init__(f"{what} -> {status_name}: {message}")
        self.status = status


def default_library_path():
    env = os.environ.get("FLAME_LIBRARY")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parents[2]
    return str(root / "build" / "libflame.so.1")


# ---- shared by the parity scripts: skipping, start-up, pass/fail reporting ----
class Report:
    """Counts passed checks and prints each failure as it happens."""

    def __init__(self):
        self.passed, self.failed = 0, []

    def check(self, ok, label, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed.append(label)
            print(f"FAIL {label}" + (f": {detail}" if detail else ""))

    def finish(self):
        """Prints the summary line; the exit status: 0 only when something passed and nothing failed."""
        print(f"{self.passed} passed, {len(self.failed)} failed")
        return 0 if not self.failed and self.passed > 0 else 1


def skip(reason):
    """Prints why a run is skipped; the exit status, 1 under FLAME_REQUIRE_GPU=1 (a skip is a failure)."""
    print(f"SKIPPED: {reason}")
    if os.environ.get("FLAME_REQUIRE_GPU") == "1":
        print("FLAME_REQUIRE_GPU=1: a skipped run is a failure")
        return 1
    return 0


def setup_failure(message):
    print(message)
    print("0 passed, 1 failed")
    return 1


def open_on_gpu(torch, need=(), seed=1):
    """Loads libflame and creates a context next to PyTorch's GPU. Returns (fl, ctx, None), or
    (None, None, exit status) after printing why not: no GPU (a skip), no library, a library that
    lacks a function whose name starts with one of `need`, or a failed context creation."""
    if not torch.cuda.is_available():
        return None, None, skip("no CUDA GPU visible to PyTorch")
    try:
        fl = Flame()
    except OSError as e:
        return None, None, setup_failure(f"cannot load libflame from {default_library_path()}: {e} (set FLAME_LIBRARY)")
    missing = [n for n in fl.missing if need and n.startswith(tuple(need))]
    if missing:
        return None, None, setup_failure(f"libflame lacks {' '.join(missing)}")
    try:
        ctx = fl.ctx_create(seed=seed)
    except FlameError as e:
        if e.status in (FLAME_ERROR_NO_DRIVER, FLAME_ERROR_NO_DEVICE):
            return None, None, skip(f"FLAME sees no GPU: {e}")
        return None, None, setup_failure(f"flame_ctx_create failed: {e}")
    return fl, ctx, None


class Tensor:
    """Owns one reference to a flame_tensor_t."""

    def __init__(self, lib, handle):
        self._lib = lib
        self.h = handle if isinstance(handle, H) else H(handle)

    def __del__(self):
        if self.h and self.h.value:
            self._lib.raw.flame_tensor_release(self.h)
            self.h = H()

    @property
    def shape(self):
        return self._lib.shape(self)

    @property
    def dtype(self):
        return self._lib.dtype(self)

    @property
    def requires_grad(self):
        v = i32()
        self._lib.check(self._lib.raw.flame_tensor_requires_grad(self.h, ctypes.byref(v)), "requires_grad")
        return bool(v.value)


def _arr(ctype, values):
    values = list(values)
    return (ctype * max(len(values), 1))(*values), len(values)


class Flame:
    """The loaded library plus helpers. raw: the ctypes CDLL with declared signatures."""

    def __init__(self, path=None):
        self.path = path or default_library_path()
        self.raw = ctypes.CDLL(self.path)
        self.missing = []
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(self.raw, name)
            except AttributeError:
                self.missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes

    # ---- errors
    def check(self, status, what):
        if status != FLAME_OK:
            name = self.raw.flame_status_string(status).decode()
            msg = (self.raw.flame_last_error_message() or b"").decode(errors="replace")
            raise FlameError(status, name, what, msg)

    def fn(self, name):
        if name in self.missing:
            raise FlameError(-1, "MISSING_SYMBOL", name, "the library does not export it")
        return getattr(self.raw, name)

    # ---- context
    def ctx_create(self, device=0, seed=0):
        opts = CtxOptions()
        self.check(self.raw.flame_ctx_options_init(ctypes.byref(opts)), "flame_ctx_options_init")
        opts.device = device
        opts.seed = seed
        ctx = H()
        self.check(self.raw.flame_ctx_create(ctypes.byref(opts), ctypes.byref(ctx)), "flame_ctx_create")
        return ctx

    def ctx_destroy(self, ctx):
        self.raw.flame_ctx_destroy(ctx)

    # ---- tensors
    def shape(self, t):
        nd = i32()
        self.check(self.raw.flame_tensor_ndim(t.h, ctypes.byref(nd)), "flame_tensor_ndim")
        dims = (i64 * max(nd.value, 1))()
        if nd.value:
            self.check(self.raw.flame_tensor_shape(t.h, dims, nd.value), "flame_tensor_shape")
        return tuple(dims[i] for i in range(nd.value))

    def dtype(self, t):
        d = c_int()
        self.check(self.raw.flame_tensor_dtype(t.h, ctypes.byref(d)), "flame_tensor_dtype")
        return DTYPE_NAMES.get(d.value, "unknown")

    def from_host_ptr(self, ctx, ptr, nbytes, shape, dtype):
        dims, nd = _arr(i64, shape)
        out = H()
        self.check(self.raw.flame_from_host(ctx, ctypes.c_void_p(ptr), nbytes, dims if nd else None, nd,
                                            DTYPES[dtype], ctypes.byref(out)), "flame_from_host")
        return Tensor(self, out)

    def to_host_ptr(self, t, ptr, nbytes):
        self.check(self.raw.flame_to_host(t.h, ctypes.c_void_p(ptr), nbytes), "flame_to_host")

    def set_requires_grad(self, t, flag=True):
        self.check(self.raw.flame_tensor_set_requires_grad(t.h, 1 if flag else 0), "set_requires_grad")

    # ---- generic calls: the output pointer comes last
    def call(self, name, *args):
        out = H()
        conv = [a.h if isinstance(a, Tensor) else a for a in args]
        self.check(self.fn("flame_" + name)(*conv, ctypes.byref(out)), "flame_" + name)
        return Tensor(self, out)

    def unary(self, name, t):
        return self.call(name, t)

    def dims_call(self, name, t, dims, *rest):
        """Calls reductions of the form f(t, dims, ndims, ..., out); dims None = all."""
        dims = [] if dims is None else list(dims)
        arr, n = _arr(i32, dims)
        return self.call(name, t, arr if n else None, n, *rest)

    def shape_call(self, name, t, shape):
        arr, n = _arr(i64, shape)
        return self.call(name, t, arr if n else None, n)

    def permute(self, t, dims):
        arr, n = _arr(i32, dims)
        return self.call("permute", t, arr, n)

    def flip(self, t, dims):
        arr, n = _arr(i32, dims)
        return self.call("flip", t, arr, n)

    def join(self, name, tensors, dim):
        arr = (H * len(tensors))(*[t.h for t in tensors])
        return self.call(name, arr, len(tensors), dim)

    def norm(self, t, p, dims, keepdim):
        arr, n = _arr(i32, [] if dims is None else dims)
        return self.call("norm", t, float(p), arr if n else None, n, keepdim)

    def var(self, name, t, dims, correction, keepdim):
        arr, n = _arr(i32, [] if dims is None else dims)
        return self.call(name, t, arr if n else None, n, float(correction), keepdim)

    def split(self, t, size, dim, capacity=16):
        outs = (H * capacity)()
        count = i32()
        self.check(self.fn("flame_split")(t.h, size, dim, outs, capacity, ctypes.byref(count)), "flame_split")
        return [Tensor(self, H(outs[i])) for i in range(count.value)]

    def chunk(self, t, chunks, dim, capacity=16):
        outs = (H * capacity)()
        count = i32()
        self.check(self.fn("flame_chunk")(t.h, chunks, dim, outs, capacity, ctypes.byref(count)), "flame_chunk")
        return [Tensor(self, H(outs[i])) for i in range(count.value)]

    def split_sizes(self, t, sizes, dim):
        arr, n = _arr(i64, sizes)
        outs = (H * n)()
        self.check(self.fn("flame_split_sizes")(t.h, arr, n, dim, outs), "flame_split_sizes")
        return [Tensor(self, H(outs[i])) for i in range(n)]

    def grad(self, ctx, outputs, grad_outputs, inputs, flags):
        """flame_grad: returns a list with a Tensor or None per input."""
        no, ni = len(outputs), len(inputs)
        outs = (H * no)(*[t.h for t in outputs])
        gos = (H * no)(*[(g.h if g is not None else None) for g in grad_outputs]) if grad_outputs else None
        ins = (H * ni)(*[t.h for t in inputs])
        res = (H * ni)()
        self.check(self.fn("flame_grad")(ctx, outs, gos, no, ins, ni, flags, res), "flame_grad")
        return [Tensor(self, H(res[i])) if res[i] else None for i in range(ni)]

    def backward(self, ctx, root, grad=None, flags=0):
        self.check(self.fn("flame_backward")(ctx, root.h, grad.h if grad is not None else None, flags),
                   "flame_backward")

    def tensor_grad(self, t):
        out = H()
        self.check(self.fn("flame_tensor_grad")(t.h, ctypes.byref(out)), "flame_tensor_grad")
        return Tensor(self, out) if out.value else None


# ---- convolution (flame.h "Convolution") ----
class ConvOptions(ctypes.Structure):
    """flame_conv_options_t."""
    _fields_ = [
        ("struct_size", size_t),
        ("stride", i64 * 2),
        ("padding", i64 * 2),
        ("dilation", i64 * 2),
        ("groups", i64),
        ("output_padding", i64 * 2),
        ("padding_same", i32),
    ]


_SIGNATURES.update({
    "flame_conv_options_init": (c_int, [P(ConvOptions)]),
    "flame_conv2d": (c_int, [H, H, H, P(ConvOptions), P(H)]),
    "flame_conv_transpose2d": (c_int, [H, H, H, P(ConvOptions), P(H)]),
    "flame_conv1d": (c_int, [H, H, H, P(ConvOptions), P(H)]),
})


def conv_options(lib, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, output_padding=(0, 0), same=False):
    """A filled flame_conv_options_t (pass ctypes.byref(result) to flame_conv2d and friends); lib: a Flame."""
    o = ConvOptions()
    lib.check(lib.fn("flame_conv_options_init")(ctypes.byref(o)), "flame_conv_options_init")
    for i in range(2):
        o.stride[i], o.padding[i], o.dilation[i], o.output_padding[i] = stride[i], padding[i], dilation[i], output_padding[i]
    o.groups = groups
    o.padding_same = 1 if same else 0
    return o
# ---- training toolkit: optimizers and gradient clipping (flame.h "Optimizers", "Gradient tools") ----
class OptimizerOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", size_t),
        ("kind", i32),
        ("lr", f64),
        ("weight_decay", f64),
        ("beta1", f64),
        ("beta2", f64),
        ("eps", f64),
        ("momentum", f64),
        ("dampening", f64),
        ("nesterov", i32),
        ("amsgrad", i32),
        ("maximize", i32),
        ("master_weights", i32),
        ("stochastic_rounding", i32),
    ]


OPTIMIZER_KINDS = {"sgd": 0, "adam": 1, "adamw": 2, "lion": 3}
_SIGNATURES.update({
    "flame_optimizer_options_init": (c_int, [P(OptimizerOptions), i32]),
    "flame_optimizer_create": (c_int, [H, P(OptimizerOptions), P(H), i64, P(H)]),
    "flame_optimizer_step": (c_int, [H]),
    "flame_optimizer_zero_grad": (c_int, [H, i32]),
    "flame_optimizer_release": (None, [H]),
    "flame_clip_grad_norm": (c_int, [H, P(H), i64, f64, f64, i32, P(H)]),
    "flame_tensor_item": (c_int, [H, P(f64)]),
})


# ---- fused elementwise expressions (flame.h "Fused elementwise expressions")
_SIGNATURES.update({
    "flame_fused_compile": (c_int, [H, ctypes.c_char_p, i32, P(H)]),
    "flame_fused_call": (c_int, [H, P(H), i32, P(H)]),
    "flame_fused_release": (None, [H]),
})
