"""A/B of row-kernel launch plans: FLAME times of the norm and softmax rows of bench/run.py's T1nn tier
(plus rows past L2) per variant, as a fraction of the copy bandwidth (1 GiB clone in the same run), and
PyTorch's copy of each shape. Each argument is put in FLAME_ROW_EXP before its round; the library reads
that variable only while a temporary experiment patch makes the host planner read it (none is in the
tree), so without one every argument times the shipped plan. The variants alternate within each case
($AB_ROUNDS rounds, 3 by default; the median is printed). $AB_FILTER keeps the cases whose names hold
one of its comma-separated substrings; $AB_DTYPE (f32, bf16, f16) sets the dtype of the norm, softmax
and group_norm rows (the softmax rows of 8192x8192 stay f32) and
$AB_SHAPES (e.g. 2048x32768,4096x32768) their shapes. Usage: python3 dev/ab_rows.py 0 [1 ...]"""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
from run import Flame, median_ms  # noqa: E402
import torch  # noqa: E402

fl = Flame()
lib = fl.lib
t = lambda fn: median_ms(fn, fl.stream, 20, 3, fl.sync)
n = 1 << 28
xt = torch.randn(n, device="cuda"); yt = torch.empty_like(xt)
copy_bw = 2 * n * 4 / (median_ms(lambda: yt.copy_(xt), torch.cuda.current_stream(), 20, 3, torch.cuda.synchronize) * 1e-3)
del xt, yt
print(f"copy {copy_bw/1e12:.3f} TB/s")
cases = []
DT = os.environ.get("AB_DTYPE", "f32")  # the dtype of the norm, softmax and group_norm rows
ES = {"f32": 4, "bf16": 2, "f16": 2}[DT]  # bytes per element
SHAPES = ((16384, 768), (65536, 768), (16384, 1024), (65536, 1024), (16384, 4096), (8192, 8192), (2048, 16384), (4096, 16384), (8192, 16384))
if os.environ.get("AB_SHAPES"):  # rows x width, comma-separated: "2048x32768,4096x32768"
    SHAPES = tuple(tuple(int(n) for n in s.split("x")) for s in os.environ["AB_SHAPES"].split(","))
for rows, width in SHAPES:
    xx, w, b, g = fl.randn([rows, width], DT), fl.randn([width], DT), fl.randn([width], DT), fl.randn([rows, width], DT)
    xg = fl.randn([rows, width], DT); lib.set_requires_grad(xg, True)
    ns = (ctypes.c_int64 * 1)(width)
    nb = rows * width * ES
    cases.append((f"ln fwd {rows}x{width}", lambda xx=xx, ns=ns, w=w, b=b: fl.call("layer_norm", xx, ns, 1, w, b, 1e-5), 2 * nb))
    cases.append((f"rms fwd {rows}x{width}", lambda xx=xx, ns=ns, w=w: fl.call("rms_norm", xx, ns, 1, w, 1e-5), 2 * nb))
    def step(xg=xg, ns=ns, w=w, b=b, g=g):
        y = fl.call("layer_norm", xg, ns, 1, w, b, 1e-5)
        lib.grad(fl.ctx, [y], [g], [xg], 0)
    cases.append((f"ln f+b {rows}x{width}", step, 5 * nb))
    wg, bg = fl.randn([width], DT), fl.randn([width], DT)
    lib.set_requires_grad(wg, True); lib.set_requires_grad(bg, True)
    def step_wb(xg=xg, ns=ns, wg=wg, bg=bg, g=g):
        y = fl.call("layer_norm", xg, ns, 1, wg, bg, 1e-5)
        lib.grad(fl.ctx, [y], [g], [xg, wg, bg], 0)
    cases.append((f"ln f+b+dw {rows}x{width}", step_wb, 5 * nb))
    def rstep(xg=xg, ns=ns, w=w, g=g):
        y = fl.call("rms_norm", xg, ns, 1, w, 1e-5)
        lib.grad(fl.ctx, [y], [g], [xg], 0)
    cases.append((f"rms f+b {rows}x{width}", rstep, 5 * nb))
    cases.append((f"softmax {rows}x{width}", lambda xx=xx: fl.call("softmax", xx, -1), 2 * nb))
    def sstep_w(xg=xg, g=g):
        y = fl.call("softmax", xg, -1)
        lib.grad(fl.ctx, [y], [g], [xg], 0)
    cases.append((f"softmax f+b {rows}x{width}", sstep_w, 5 * nb))
sx = fl.randn([8192, 8192], "f32"); sxg = fl.randn([8192, 8192], "f32"); lib.set_requires_grad(sxg, True); sg = fl.randn([8192, 8192], "f32")
cases.append(("softmax 8192x8192", lambda: fl.call("softmax", sx, -1), 2 * 8192 * 8192 * 4))
def sstep():
    y = fl.call("softmax", sxg, -1)
    lib.grad(fl.ctx, [y], [sg], [sxg], 0)
cases.append(("softmax f+b 8192x8192", sstep, 5 * 8192 * 8192 * 4))
gx, gw, gb = fl.randn([32, 128, 64, 64], DT), fl.randn([128], DT), fl.randn([128], DT)
cases.append(("gn fwd 32x128x64x64", lambda: fl.call("group_norm", gx, 32, gw, gb, 1e-5, 0), 2 * 32 * 128 * 4096 * ES))
for rows, width in ((16384, 768), (65536, 768), (16384, 1024), (65536, 1024), (16384, 4096), (2048, 16384), (8192, 16384), (8192, 8192), (32 * 32, 4 * 4096)):
    a = torch.randn(rows, width, device="cuda"); c = torch.empty_like(a)
    ms = median_ms(lambda: c.copy_(a), torch.cuda.current_stream(), 20, 3, torch.cuda.synchronize)
    print(f"torch copy of {rows}x{width} f32: {2 * rows * width * 4 / (ms * 1e-3) / copy_bw:.3f} of the 1 GiB copy")
    del a, c
variants = sys.argv[1:] or ["0"]
if os.environ.get("AB_FILTER"):  # comma-separated substrings of case names
    cases = [c for c in cases if any(f in c[0] for f in os.environ["AB_FILTER"].split(","))]
# Variants alternate within each case, three rounds, and the median round is kept: the 128-256 MB rows
# spread by ~6% between runs of one kernel, more than the differences being looked for.
ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))
res = {}
for name, fn, by in cases:
    got = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for v in variants:
            os.environ["FLAME_ROW_EXP"] = v
            got[v].append(by / (t(fn) * 1e-3) / copy_bw)
    res[name] = [sorted(got[v])[len(got[v]) // 2] for v in variants]
print(f"{'case':28}" + "".join(f"{'exp' + v:>8}" for v in variants))
for name, fr in res.items():
    print(f"{name:28}" + "".join(f"{f:8.3f}" for f in fr))
