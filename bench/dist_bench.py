#!/usr/bin/env python3
"""all_reduce bus bandwidth on 2 GPUs: FLAME (flame_comm_all_reduce) against torch.distributed (NCCL).

FLAME runs in this process: one context per GPU, one Python thread per rank (ctypes releases the
GIL during each call, so the ranks run concurrently, as NCCL needs), driven through the C ABI
(tests/parity/flame_ctypes.py loads the library). PyTorch runs in 2 processes started with
torch.multiprocessing.spawn, init_method file://. Both use the same NCCL algorithm choice rules;
differences come from the library loaded (torch's bundled NCCL vs libnccl.so.2) and the launch path.

For each size (8 MiB .. 4 GiB of f32 per rank): warm-up, then `iters` all_reduce(sum) in place,
timed on the host around the loop between two full synchronisations (a barrier starts the ranks
together); time per call = elapsed / iters, taken as the slower rank. Bus bandwidth as nccl-tests:
busbw = bytes * 2 (n - 1) / n / time. Prints both and the ratio of bus bandwidths FLAME / torch (1 = the same, above 1 = FLAME faster).

Usage: python3 bench/dist_bench.py [--max-mib 4096] [--min-mib 8] [--dtype f32|bf16]
Env:   FLAME_LIBRARY (libflame.so.1). Needs 2 GPUs and NCCL (libnccl.so.2, or FLAME_NCCL_PATH).
Runs in well under 2 minutes on NVLink or PCIe machines.
"""
import argparse
import ctypes
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "parity"))

H, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
WORLD = 2
DTYPES = {"f32": (0, 4), "bf16": (2, 2)}  # FLAME dtype value, element size
FLAME_REDUCE_SUM = 0


class CommId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_uint8 * 128)]


class CommOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("timeout_ms", ctypes.c_int64)]


def iters_for(nbytes):
    return max(3, min(40, int(2e9 // nbytes)))


def sizes(min_mib, max_mib):
    s, out = min_mib, []
    while s <= max_mib:
        out.append(s << 20)
        s *= 2
    return out


def busbw(nbytes, seconds):
    return nbytes * 2 * (WORLD - 1) / WORLD / seconds / 1e9


# ---------------- FLAME: one process, two contexts, two threads ----------------

def flame_run(byte_sizes, dtype):
    import flame_ctypes as fc
    lib = fc.Flame()
    raw = lib.raw
    raw.flame_comm_unique_id.argtypes = [H, ctypes.POINTER(CommId)]
    raw.flame_comm_create.argtypes = [H, ctypes.POINTER(CommId), i32, i32, ctypes.POINTER(CommOptions), ctypes.POINTER(H)]
    raw.flame_comm_all_reduce.argtypes = [H, H, i32]
    raw.flame_comm_synchronize.argtypes = [H]
    raw.flame_comm_release.argtypes = [H]
    raw.flame_comm_release.restype = None
    raw.flame_full.argtypes = [H, ctypes.POINTER(i64), i32, i32, ctypes.c_double, ctypes.POINTER(H)]
    raw.flame_tensor_release.argtypes = [H]
    raw.flame_tensor_release.restype = None

    ctxs = [lib.ctx_create(device=r) for r in range(WORLD)]
    cid = CommId()
    lib.check(raw.flame_comm_unique_id(ctxs[0], ctypes.byref(cid)), "flame_comm_unique_id")
    opts = CommOptions(ctypes.sizeof(CommOptions), 120000)
    comms = [H() for _ in range(WORLD)]
    barrier = threading.Barrier(WORLD)
    times = {}  # (rank, nbytes) -> seconds per call
    errors = []
    code, esize = DTYPES[dtype]

    def rank_main(r):
        try:
            lib.check(raw.flame_comm_create(ctxs[r], ctypes.byref(cid), r, WORLD, ctypes.byref(opts), ctypes.byref(comms[r])),
                      "flame_comm_create")
            for nbytes in byte_sizes:
                shape = (i64 * 1)(nbytes // esize)
                t = H()
                lib.check(raw.flame_full(ctxs[r], shape, 1, code, 1.0, ctypes.byref(t)), "flame_full")
                for _ in range(2):  # warm-up (first call builds NCCL's buffers for the size)
                    lib.check(raw.flame_comm_all_reduce(comms[r], t, FLAME_REDUCE_SUM), "flame_comm_all_reduce")
                lib.check(raw.flame_comm_synchronize(comms[r]), "flame_comm_synchronize")
                n = iters_for(nbytes)
                barrier.wait()
                t0 = time.perf_counter()
                for _ in range(n):
                    lib.check(raw.flame_comm_all_reduce(comms[r], t, FLAME_REDUCE_SUM), "flame_comm_all_reduce")
                lib.check(raw.flame_comm_synchronize(comms[r]), "flame_comm_synchronize")
                times[(r, nbytes)] = (time.perf_counter() - t0) / n
                raw.flame_tensor_release(t)
        except Exception as e:  # reported by the main thread
            errors.append(f"rank {r}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    releases = [threading.Thread(target=raw.flame_comm_release, args=(comms[r],)) for r in range(WORLD)]
    for th in releases:
        th.start()
    for th in releases:
        th.join()
    for c in ctxs:
        lib.ctx_destroy(c)
    if errors:
        raise RuntimeError("; ".join(errors))
    return {nb: max(times[(r, nb)] for r in range(WORLD)) for nb in byte_sizes}


# ---------------- torch.distributed: two processes ----------------

def torch_worker(rank, init_file, byte_sizes, dtype, queue):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=WORLD)
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    esize = DTYPES[dtype][1]
    out = {}
    for nbytes in byte_sizes:
        t = torch.ones(nbytes // esize, dtype=tdt, device="cuda")
        for _ in range(2):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        n = iters_for(nbytes)
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        out[nbytes] = (time.perf_counter() - t0) / n
        del t
        torch.cuda.empty_cache()
    queue.put((rank, out))
    dist.destroy_process_group()


def torch_run(byte_sizes, dtype):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(torch_worker, args=(init_file, byte_sizes, dtype, queue), nprocs=WORLD, join=True)
    per_rank = [queue.get() for _ in range(WORLD)]
    return {nb: max(r[1][nb] for r in per_rank) for nb in byte_sizes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-mib", type=int, default=8)
    ap.add_argument("--max-mib", type=int, default=4096)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    byte_sizes = sizes(args.min_mib, args.max_mib)
    start = time.perf_counter()
    ft = flame_run(byte_sizes, args.dtype)
    tt = {} if args.skip_torch else torch_run(byte_sizes, args.dtype)
    print(f"all_reduce (sum, {args.dtype}, in place), {WORLD} GPUs; bus bandwidth in GB/s (nccl-tests definition)")
    print(f"{'size':>10} {'FLAME us':>11} {'FLAME busbw':>12} {'torch us':>11} {'torch busbw':>12} {'FLAME/torch':>12}")
    for nb in byte_sizes:
        f_bw = busbw(nb, ft[nb])
        row = f"{nb >> 20:>7} MiB {ft[nb] * 1e6:>11.1f} {f_bw:>12.1f}"
        if tt:
            t_bw = busbw(nb, tt[nb])
            row += f" {tt[nb] * 1e6:>11.1f} {t_bw:>12.1f} {f_bw / t_bw:>12.3f}"
        print(row)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
