// Trains a small MLP (2 -> 16 -> 1, ReLU, logistic loss) on synthetic XOR-quadrant data: the C#
// twin of bindings/rust/examples/train_mlp.rs. FLAME has no matmul yet, so a dense layer is
// x.Unsqueeze(2) * w.Unsqueeze(0) summed over dim 1; it becomes x.Matmul(w) once flame_matmul
// is in flame.h (and therefore in the generated Ops.g.cs).
//
// Exit status: 0 when the accuracy passes 90%, 1 otherwise, 2 without a GPU.
// Build: mcs -unsafe -out:out/TrainMlp.exe -r:out/Flame.dll TrainMlp.cs
// Run:   FLAME_LIBRARY=/path/to/libflame.so.1 mono out/TrainMlp.exe
using System;
using Flame;
using Flame.Interop;

static class TrainMlp
{
    const int N = 512;
    const long H = 16;
    const DType F32 = DType.F32;

    static Tensor Dense(Tensor x, Tensor w, Tensor b)
    {
        Tensor prod = x.Unsqueeze(2) * w.Unsqueeze(0); // [N, D, H]
        return prod.Sum(new[] { 1 }, false) + b;
    }

    static Tensor Sgd(Context ctx, Tensor p, double lr)
    {
        using (ctx.NoGrad())
            return (p - p.Grad * lr).Detach();
    }

    static int Main()
    {
        Console.WriteLine("FLAME " + Library.Version + " (ABI " + Library.AbiVersion + ")");
        Context gpu;
        try { gpu = new Context(); }
        catch (FlameException e) when (e.Status == StatusCode.NoDriver || e.Status == StatusCode.NoDevice)
        {
            Console.Error.WriteLine("TrainMlp: no GPU available: " + e.Message);
            return 2;  // as the C examples: 2 means no GPU
        }
        using (var ctx = gpu)
        {
            Console.WriteLine("device: " + ctx.DeviceName());
            ctx.ManualSeed(0);
            var xs = new float[2 * N];
            var ys = new float[N];
            ulong s = 0x2545F4914F6CDD1D;
            for (int i = 0; i < N; i++)
            {
                for (int d = 0; d < 2; d++)
                {
                    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                    xs[2 * i + d] = (float)((s >> 11) / (double)(1UL << 53) * 2 - 1);
                }
                ys[i] = xs[2 * i] * xs[2 * i + 1] > 0 ? 1f : 0f;
            }
            Tensor x = ctx.FromArray(xs, N, 2), y = ctx.FromArray(ys, N);
            Tensor w1 = ctx.Randn(new long[] { 2, H }, F32);
            Tensor b1 = ctx.Zeros(new long[] { H }, F32);
            Tensor w2 = ctx.Randn(new long[] { H }, F32) * (1.0 / Math.Sqrt(H));
            Tensor b2 = ctx.Zeros(new long[] { 1 }, F32);
            int clipped = 0;
            double lr = 0.5, acc = 0;
            for (int step = 0; step <= 600; step++)
            {
                foreach (var p in new[] { w1, b1, w2, b2 }) p.SetRequiresGrad(true);
                // A delegate hook: clip the first layer's gradient.
                w1.RegisterHook(g =>
                {
                    if (g.Abs().MaxAll().Item() <= 1.0) return null;
                    clipped++;
                    return g.Clamp(-1, 1);
                });
                Tensor h = Dense(x, w1, b1).Relu();
                Tensor logits = (h * w2).Sum(new[] { 1 }, false) + b2;
                Tensor loss = (logits.Softplus(1, 20) - y * logits).Mean(null, false);
                loss.Backward();
                if (step % 100 == 0)
                {
                    using (ctx.NoGrad())
                        acc = logits.Gt(ctx.Scalar(0)).ToDtype(F32).Eq(y).ToDtype(F32).Mean(null, false).Item();
                    Console.WriteLine(string.Format("step {0,4}  loss {1:F4}  accuracy {2:F3}", step, loss.Item(), acc));
                }
                w1 = Sgd(ctx, w1, lr); b1 = Sgd(ctx, b1, lr);
                w2 = Sgd(ctx, w2, lr); b2 = Sgd(ctx, b2, lr);
            }
            Console.WriteLine("first-layer gradient clipped in " + clipped + " steps");
            return acc > 0.9 ? 0 : 1;
        }
    }
}
