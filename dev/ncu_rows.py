"""Runs each memory-bound row kernel of the bench once (after a warm-up) so that ncu can profile it:
   ncu --clock-control none --metrics ... python3 dev/ncu_rows.py
Shapes as in bench/run.py's T1 tiers; "torch" adds PyTorch's sum(dim=1) and broadcast add; "attn" runs
FLAME's own attention kernels (a context without cuDNN) at the T2 shape, forward and backward."""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from run import Flame  # noqa: E402

which = sys.argv[1:] or ["ln", "rms", "softmax", "gn", "sum1", "bcast"]
if "attn" in which:
    os.environ["FLAME_DISABLE_CUDNN"] = "1"
fl = Flame()
lib = fl.lib
for _ in range(2):  # warm-up (kernel compile) then the profiled pass
    if "ln" in which or "rms" in which:
        for rows, width in ((16384, 768), (16384, 1024), (16384, 4096), (2048, 16384)):
            x, w, b, g = (fl.randn([rows, width], "f32"), fl.randn([width], "f32"), fl.randn([width], "f32"),
                          fl.randn([rows, width], "f32"))
            ns = (ctypes.c_int64 * 1)(width)
            if "ln" in which:
                lib.set_requires_grad(x, True)
                y = fl.call("layer_norm", x, ns, 1, w, b, 1e-5)
                lib.grad(fl.ctx, [y], [g], [x], 0)
                lib.set_requires_grad(x, False)
            if "rms" in which:
                fl.call("rms_norm", x, ns, 1, w, 1e-5)
    if "softmax" in which:
        x = fl.randn([8192, 8192], "f32")
        fl.call("softmax", x, -1)
    if "gn" in which:
        x, w, b = fl.randn([32, 128, 64, 64], "f32"), fl.randn([128], "f32"), fl.randn([128], "f32")
        fl.call("group_norm", x, 32, w, b, 1e-5, 0)
    if "sum1" in which or "bcast" in which:
        m, v = fl.randn([16384, 16384], "f32"), fl.randn([16384], "f32")
        dims = (ctypes.c_int32 * 1)(1)
        if "sum1" in which:
            fl.call("sum", m, dims, 1, 0)
        if "bcast" in which:
            fl.call("add", m, v)
    if "attn" in which:
        import run
        q, k, v, g = (fl.randn([8, 16, 2048, 128], "bf16") for _ in range(4))
        opts = run.fc.AttentionOptions()
        lib.check(lib.raw.flame_attention_options_init(ctypes.byref(opts)), "flame_attention_options_init")
        for t in (q, k, v):
            lib.set_requires_grad(t, True)
        y = fl.call("scaled_dot_product_attention", q, k, v, None, ctypes.byref(opts))
        lib.grad(fl.ctx, [y], [g], [q, k, v], 0)
    if "torch" in which:  # PyTorch's kernels for the same sum(dim=1) and broadcast add
        import torch
        tm, tb = torch.randn(16384, 16384, device="cuda"), torch.randn(16384, device="cuda")
        tm.sum(1)
        tm + tb
        torch.cuda.synchronize()
    fl.sync()
print("done")
