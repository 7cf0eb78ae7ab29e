#!/usr/bin/env python3
"""GPU busy fraction from a torch.profiler trace, the PyTorch half of issue 36's busy column (the FLAME
half is flame_bench_model_step --busy, bench/cupti_busy.c, with the same definition).

Busy fraction = the length of the union of the device intervals of every kernel, memcpy and memset
(overlapping work on several streams counts once) / the wall-clock time from the host's start of the
first measured step to the end, device synchronised, of the last. The intervals come from the Chrome
trace that torch.profiler exports (events of category kernel, gpu_memcpy, gpu_memset; user annotations
projected onto the GPU timeline, category gpu_user_annotation, are not device work and are left out).
With a marker (a substring of a kernel's name), only the work that starts after the last marker kernel
ends counts: lora_full.py traces one untimed step, then a marker kernel, synchronises and only then
starts the wall clock, so that the trace's start-up and the untimed step stay out (the profiler's and
the device's clocks need not agree).

No torch needed here: `python3 bench/busy_trace.py` runs the self-check of the merging and the trace
reading on hand-made intervals (exit 0 when every check holds).
"""
import sys

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def union_length(intervals):
    """The length of the union of (start, end) pairs; empty or reversed pairs count nothing."""
    total = 0.0
    run_start = run_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if run_end is not None and start <= run_end:  # overlaps or touches the current run: extend it
            run_end = max(run_end, end)
            continue
        if run_end is not None:
            total += run_end - run_start
        run_start, run_end = start, end
    if run_end is not None:
        total += run_end - run_start
    return total


def device_intervals(trace, marker=None):
    """(start_us, end_us) of the kernel / memcpy / memset events of a Chrome trace (a dict as json.load
    gives it; torch.profiler's ts and dur are in microseconds). With marker: only those starting at or
    after the end of the last kernel whose name holds marker, and None when there is no such kernel."""
    out, marker_end = [], None
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in DEVICE_CATEGORIES:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            if marker and marker in str(e.get("name", "")):
                marker_end = ts + dur if marker_end is None else max(marker_end, ts + dur)
                continue
            out.append((ts, ts + dur))
    if not marker:
        return out
    if marker_end is None:
        return None
    return [(s, e) for s, e in out if s >= marker_end]


def summary(trace, wall_ms, steps, marker=None):
    """The busy fields of a row (the names of flame_bench_model_step's RESULT) for `steps` steps that took
    wall_ms of wall-clock time (after the marker kernel, when given), or busy_error when the trace holds
    no marker, no device work or more than the wall time (clocks that disagree)."""
    intervals = device_intervals(trace, marker)
    if intervals is None:
        return dict(busy_steps=steps, busy_error=f"no marker kernel ({marker}) in the profile")
    busy_ms = union_length(intervals) / 1e3
    row = dict(busy_steps=steps, busy_wall_ms_per_step=wall_ms / steps, busy_records_per_step=len(intervals) / steps)
    if not intervals:
        return dict(row, busy_error="the profile holds no kernel, memcpy or memset")
    if busy_ms > wall_ms * 1.001:
        return dict(row, busy_error=f"device time {busy_ms:.3f} ms exceeds the wall time {wall_ms:.3f} ms")
    return dict(row, busy_fraction=busy_ms / wall_ms, busy_device_ms_per_step=busy_ms / steps)


def _self_check():
    failures = []

    def expect(what, got, want):
        if abs(got - want) > 1e-9:
            failures.append(f"{what}: got {got}, want {want}")

    expect("empty", union_length([]), 0)
    expect("disjoint", union_length([(50, 60), (10, 20), (30, 35)]), 25)
    expect("overlapping chain", union_length([(10, 30), (20, 40), (35, 50)]), 40)
    expect("nested", union_length([(0, 100), (10, 20), (30, 90), (99, 100)]), 100)
    expect("touching", union_length([(0, 10), (10, 20), (25, 30)]), 25)
    expect("empty intervals", union_length([(5, 5), (9, 3), (40, 45)]), 5)
    expect("two streams", union_length([(0, 40), (100, 140), (30, 110), (200, 210), (205, 220)]), 160)
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1000.0, "dur": 400.0},
        {"ph": "X", "cat": "kernel", "name": "add", "ts": 1300.0, "dur": 200.0},  # overlaps gemm
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 1600.0, "dur": 100.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 1800.0, "dur": 50.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step", "ts": 900.0, "dur": 2000.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 990.0, "dur": 5.0},
        {"ph": "f", "cat": "kernel", "name": "flow", "ts": 1000.0},
    ]}
    expect("device events", len(device_intervals(trace)), 4)
    s = summary(trace, wall_ms=1.0, steps=2)  # 500 + 100 + 50 us busy of 1000 us
    expect("fraction", s.get("busy_fraction", -1), 0.65)
    expect("device ms per step", s.get("busy_device_ms_per_step", -1), 0.325)
    expect("records per step", s["busy_records_per_step"], 2)
    marked = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "untimed_step", "ts": 100.0, "dur": 300.0},
        {"ph": "X", "cat": "kernel", "name": "spin_kernel(long)", "ts": 500.0, "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "late_overlap", "ts": 550.0, "dur": 100.0},  # starts inside the marker
    ] + trace["traceEvents"]}
    expect("marked device events", len(device_intervals(marked, "spin_kernel")), 4)
    expect("marked fraction", summary(marked, 1.0, 2, "spin_kernel").get("busy_fraction", -1), 0.65)
    if device_intervals(trace, "spin_kernel") is not None or "busy_error" not in summary(trace, 1.0, 2, "spin_kernel"):
        failures.append("a missing marker must give None / busy_error")
    if "busy_error" not in summary({"traceEvents": []}, 1.0, 1):
        failures.append("an empty trace must give busy_error")
    if "busy_error" not in summary(trace, wall_ms=0.5, steps=1):
        failures.append("device time beyond the wall time must give busy_error")
    for f in failures:
        print("busy_trace self-check:", f, file=sys.stderr)
    print("busy_trace self-check:", "FAILED" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_self_check())
