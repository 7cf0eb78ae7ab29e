"""Where the time of any bench/run.py row goes: runs chosen Bench methods of run.py with each timed
callable profiled (PyTorch profiler; CUPTI also sees the kernels FLAME launches through the driver
API and cuDNN), and prints, per row, FLAME's and PyTorch's kernels grouped by name with their time
per call, beside the CUDA-event time of the call (the difference is idle time between kernels).
Run on the GPU machine after building libflame:
    FLAME_LIBRARY=build/libflame.so.1 python3 bench/profile_ops.py attention_rows conv_rows [--top 12]
Method names are Bench's (tier1, tier1_nn, tier1_nnops, tier1_fused, linear_rows, conv_rows,
attention_rows, tier3, cross_entropy_row, adamw_row); --quick as in run.py.
The event times of rows bound by host time (small kernels, cuDNN's host work) read slower here than in
run.py once the first profile has run: CUPTI stays attached to every launch. Take times from run.py.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import run  # noqa: E402
from profile_gpt2 import kernel_table  # noqa: E402  (total, [(name, ms, launches)] per call)


class ProfiledBench(run.Bench):
    """run.Bench whose time_flame / time_torch also profile the callable; add() prints the tables."""

    def __init__(self, args):
        super().__init__(args)
        self.pending = []

    def _profiled(self, side, fn, stream, sync, reps):
        ms = run.median_ms(fn, stream, reps or self.reps, 3, sync)
        calls = 5
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            sync()
            torch.cuda.synchronize()
        self.pending.append((side, ms, kernel_table(prof, calls, None)))
        return ms

    def time_flame(self, fn, fl=None, reps=None):
        fl = fl or self.fl
        return self._profiled("FLAME", fn, fl.stream, fl.sync, reps)

    def time_torch(self, fn, reps=None):
        return self._profiled("PyTorch", fn, torch.cuda.current_stream(), torch.cuda.synchronize, reps)

    def add(self, tier, op, shape, dtype, f_ms, t_ms, bytes_=None, flops=None, note=""):
        super().add(tier, op, shape, dtype, f_ms, t_ms, bytes_, flops, note)
        for side, ms, (total, table) in self.pending:
            print(f"   -- {side}: {ms:.4f} ms per call (events), {total:.4f} ms of kernels, "
                  f"{sum(n for _, _, n in table):.0f} kernels")
            for name, k_ms, n in table[:self.args.top]:
                print(f"      {k_ms:8.4f} ms {n:5.1f}x  {name[:120]}")
        self.pending.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("methods", nargs="+", help="Bench methods to run, e.g. attention_rows conv_rows tier1")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    # the fields run.Bench reads from its arguments
    args.out, args.no_results_md, args.no_compile = None, True, True
    args.gpt2_steps, args.gpt2_tiny, args.tiers = 0, False, ""
    if not torch.cuda.is_available():
        print("profile_ops: no CUDA GPU visible to PyTorch")
        return 2
    b = ProfiledBench(args)
    b.measure_limits()
    b.pending.clear()
    for m in args.methods:
        print(f"==== {m}", flush=True)
        getattr(b, m)()
    b.fl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
