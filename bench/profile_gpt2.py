"""Where the time of a GPT-2 124M training step goes: the GPU kernels of a few FLAME steps and of
a few PyTorch eager steps, grouped by kernel name, from the PyTorch profiler (CUPTI sees the
kernels FLAME launches through the driver API too). Run on the GPU machine after building
flame_gpt2_bench:
    FLAME_LIBRARY=build/libflame.so.1 python3 bench/profile_gpt2.py [--steps 3] [--top 25]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import gpt2_tiers  # noqa: E402
import gpt2_torch as gt  # noqa: E402


def kernel_table(prof, steps, top):
    """(total ms per step, [(name, ms per step, calls per step)]) over the CUDA kernels."""
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms, n = rows.get(e.name, (0.0, 0))
            rows[e.name] = (ms + e.device_time / 1e3, n + 1)
    total = sum(ms for ms, _ in rows.values()) / steps
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]
    return total, [(name, ms / steps, n / steps) for name, (ms, n) in ranked]


def show(title, total, table):
    print(f"== {title}: {total:.2f} ms of kernels per step")
    for name, ms, calls in table:
        print(f"  {ms:8.3f} ms {calls:6.1f}x  {100 * ms / total:5.1f}%  {name[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    c = gt.Config()
    (x, y), = gt.synthetic_batches(c, 1)  # host tensors: gpt2_set_batch copies from host memory
    fl = gpt2_tiers.FlameGpt2(c)
    fl.set_batch(x, y)
    x, y = x.cuda(), y.cuda()
    for _ in range(3):
        fl.step()
    fl.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            fl.step()
        fl.sync()
    show("FLAME", *kernel_table(prof, args.steps, args.top))
    fl.close()
    model = gt.build(c)
    opt = gt.optimizer(model, c)
    for _ in range(3):
        gt.train_step(model, opt, x, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            gt.train_step(model, opt, x, y)
        torch.cuda.synchronize()
    show("PyTorch eager", *kernel_table(prof, args.steps, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
