"""Repeated timings of FLAME's own attention kernels (a context without cuDNN) at bench/run.py's T2 shape,
with fresh inputs each round, to see the spread between rounds that one bench row hides:
    FLAME_LIBRARY=build/libflame.so.1 python3 dev/attn_timing.py [rounds] [B H S D]
FLAME_DISABLE_WGMMA=1 times the FlashAttention-2 (mma.sync) kernels instead of the sm_90a ones."""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
os.environ["FLAME_DISABLE_CUDNN"] = "1"
import run  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
B, H, S, D = (int(x) for x in sys.argv[2:6]) if len(sys.argv) > 5 else (8, 16, 2048, 128)
fl = run.Flame()
lib = fl.lib
opts = run.fc.AttentionOptions()
lib.check(lib.raw.flame_attention_options_init(ctypes.byref(opts)), "flame_attention_options_init")
fwd_flops = 4.0 * B * H * S * S * D
for rnd in range(rounds):
    q, k, v, g = (fl.randn([B, H, S, D], "bf16") for _ in range(4))
    line = []
    for causal in (False, True):
        opts.flags = run.fc.ATTENTION_CAUSAL if causal else 0
        f = fwd_flops / (2 if causal else 1)
        ms = run.median_ms(lambda: fl.call("scaled_dot_product_attention", q, k, v, None, ctypes.byref(opts)),
                           fl.stream, 20, 3, fl.sync)
        line.append(f"fwd{' causal' if causal else ''} {ms:.4f} ms {f / ms / 1e9:.0f} TF/s")
    for t in (q, k, v):
        lib.set_requires_grad(t, True)
    for causal in (False, True):
        opts.flags = run.fc.ATTENTION_CAUSAL if causal else 0
        f = 3.5 * fwd_flops / (2 if causal else 1)

        def step():
            y = fl.call("scaled_dot_product_attention", q, k, v, None, ctypes.byref(opts))
            lib.grad(fl.ctx, [y], [g], [q, k, v], 0)

        ms = run.median_ms(step, fl.stream, 20, 3, fl.sync)
        line.append(f"fwd+bwd{' causal' if causal else ''} {ms:.4f} ms {f / ms / 1e9:.0f} TF/s")
    print(f"round {rnd}: " + " | ".join(line), flush=True)
