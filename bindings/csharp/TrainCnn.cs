// Trains a small convolutional classifier on procedurally drawn shapes: the C# twin of
// examples/train_cnn.c (same data generator, model, optimizer, schedule and claim).
//
//   data   32x32 RGB images of a filled circle, square or triangle at a random position, size and
//          colour on a noisy background (examples/shapes_data.h, ported below); a fresh batch every
//          step and a fixed held-out set from another part of the random stream
//   model  three blocks of conv 3x3 (padding 'same') -> group norm -> SiLU, the first two followed
//          by 2x2 max pooling, then adaptive average pooling to 1x1 and a linear head (3 classes)
//   train  cross-entropy, AdamW (no weight decay on biases and norm parameters), warm-up + cosine,
//          global gradient-norm clipping at 1.0; each step's intermediates live in a Scope
//
// Exit status: 0 when the held-out accuracy reaches --target (default 0.95), 1 on a FLAME error or
// a missed target, 2 without a GPU or driver.
//
// Build: mcs -unsafe -out:out/TrainCnn.exe -r:out/Flame.dll TrainCnn.cs
// Run:   FLAME_LIBRARY=/path/to/libflame.so.1 mono out/TrainCnn.exe [--steps N] [--batch B] [--width C] [--lr LR] [--seed S] [--log K] [--target A]
using System;
using System.Collections.Generic;
using System.Diagnostics;
using Flame;

static class TrainCnn
{
    const int Img = 32, Classes = 3, Blocks = 3;

    // ---- the data set of examples/shapes_data.h ----

    static ulong Next(ref ulong s)
    {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        return s * 2685821657736338717UL;
    }

    static double Uniform(ref ulong s) { return (Next(ref s) >> 11) / 9007199254740992.0; }

    static void DrawShape(ref ulong s, int c, float[] img, int off)
    {
        double cx = 8 + 16 * Uniform(ref s), cy = 8 + 16 * Uniform(ref s), r = 4 + 4 * Uniform(ref s);
        var col = new double[3];
        for (int k = 0; k < 3; ++k) col[k] = 0.3 + 0.7 * Uniform(ref s);
        double ang = 2 * Math.PI * Uniform(ref s);
        for (int y = 0; y < Img; ++y)
            for (int x = 0; x < Img; ++x)
            {
                double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
                bool inside;
                if (c == 0) inside = dx * dx + dy * dy <= r * r;
                else if (c == 1) inside = Math.Abs(dx) <= r * 0.85 && Math.Abs(dy) <= r * 0.85;
                else
                {
                    inside = true;
                    for (int e = 0; e < 3; ++e)
                    {
                        double a = ang + e * 2 * Math.PI / 3;
                        if (dx * Math.Cos(a) + dy * Math.Sin(a) > r * 0.5) inside = false;
                    }
                }
                for (int k = 0; k < 3; ++k)
                {
                    double bg = 0.15 * Uniform(ref s);
                    img[off + (k * Img + y) * Img + x] = (float)((inside ? col[k] : bg) * 2.0 - 1.0);
                }
            }
    }

    /// n images [n, 3, 32, 32] and their labels [n] (i64), uploaded.
    static void Batch(Context ctx, ref ulong s, int n, out Tensor x, out Tensor y)
    {
        var imgs = new float[n * 3 * Img * Img];
        var labels = new long[n];
        for (int i = 0; i < n; ++i)
        {
            int c = (int)(Next(ref s) % Classes);
            labels[i] = c;
            DrawShape(ref s, c, imgs, i * 3 * Img * Img);
        }
        x = ctx.FromArray(imgs, n, 3, Img, Img);
        y = ctx.FromArray(labels, n);
    }

    // ---- the model ----

    sealed class Model
    {
        public Tensor[] ConvW = new Tensor[Blocks], ConvB = new Tensor[Blocks], GnW = new Tensor[Blocks], GnB = new Tensor[Blocks];
        public Tensor HeadW, HeadB;
        public long Channels;
        readonly ConvOptions same = new ConvOptions { PaddingSame = true };
        readonly Pool2dOptions pool = new Pool2dOptions(2, 2);

        static Tensor Leaf(Context ctx, long[] shape, double scale, double fill)
        {
            Tensor t;
            if (scale > 0)
                using (Tensor r = ctx.Randn(shape, DType.F32))
                    t = r * scale;
            else
                t = ctx.Full(shape, DType.F32, fill);
            t.SetRequiresGrad(true);
            return t;
        }

        public Model(Context ctx, int width)
        {
            long[] ch = { 3, width, 2 * width, 2 * width };
            for (int b = 0; b < Blocks; ++b)
            {
                ConvW[b] = Leaf(ctx, new[] { ch[b + 1], ch[b], 3, 3 }, Math.Sqrt(2.0 / (ch[b] * 9)), 0);
                ConvB[b] = Leaf(ctx, new[] { ch[b + 1] }, 0, 0);
                GnW[b] = Leaf(ctx, new[] { ch[b + 1] }, 0, 1);
                GnB[b] = Leaf(ctx, new[] { ch[b + 1] }, 0, 0);
            }
            Channels = ch[Blocks];
            HeadW = Leaf(ctx, new long[] { Classes, Channels }, 1.0 / Math.Sqrt(Channels), 0);
            HeadB = Leaf(ctx, new long[] { Classes }, 0, 0);
        }

        /// logits [N, 3]; call inside a Scope (the intermediates are not disposed here).
        public Tensor Forward(Tensor x)
        {
            Tensor cur = x;
            for (int b = 0; b < Blocks; ++b)
            {
                cur = cur.Conv2d(ConvW[b], ConvB[b], same).GroupNorm(8, GnW[b], GnB[b], 1e-5, 0).Silu();
                if (b + 1 < Blocks)
                    cur = cur.MaxPool2d(pool);
            }
            return cur.AdaptiveAvgPool2d(1, 1).Reshape(new[] { -1, Channels }).Linear(HeadW, HeadB, Activation.None);
        }
    }

    static double Accuracy(Context ctx, Model m, Tensor x, Tensor y, int n)
    {
        using (ctx.NoGrad())
        using (new Scope())
            return m.Forward(x).Argmax(1, false).Eq(y).ToDtype(DType.F32).SumAll().Item() / n;
    }

    static int Main(string[] args)
    {
        int steps = 600, batch = 128, width = 32, logEvery = 50;
        double lr = 3e-3, target = 0.95;
        ulong seed = 1;
        for (int i = 0; i + 1 < args.Length; i += 2)
        {
            string a = args[i], v = args[i + 1];
            if (a == "--steps") steps = int.Parse(v);
            else if (a == "--batch") batch = int.Parse(v);
            else if (a == "--width") width = int.Parse(v);
            else if (a == "--lr") lr = double.Parse(v);
            else if (a == "--seed") seed = ulong.Parse(v);
            else if (a == "--log") logEvery = int.Parse(v);
            else if (a == "--target") target = double.Parse(v);
            else { Console.Error.WriteLine("usage: TrainCnn [--steps N] [--batch B] [--width C] [--lr LR] [--seed S] [--log K] [--target A]"); return 1; }
        }
        if (args.Length % 2 != 0 || steps <= 0 || batch <= 0 || width < 8 || width % 8 != 0 || logEvery <= 0 || lr <= 0)
        {
            Console.Error.WriteLine("usage: TrainCnn [--steps N] [--batch B] [--width C (a multiple of 8)] [--lr LR] [--seed S] [--log K] [--target A]");
            return 1;
        }
        Context ctx;
        try { ctx = new Context(new ContextOptions { Seed = seed }); }
        catch (FlameException e) when (e.Status == StatusCode.NoDriver || e.Status == StatusCode.NoDevice)
        {
            Console.Error.WriteLine("TrainCnn: no GPU available: " + e.Message);
            return 2;
        }
        try
        {
            using (ctx)
                return Train(ctx, steps, batch, width, lr, seed, logEvery, target);
        }
        catch (FlameException e)
        {
            Console.Error.WriteLine("TrainCnn: " + e.Message);
            return 1;
        }
    }

    static int Train(Context ctx, int steps, int batch, int width, double lr, ulong seed, int logEvery, double target)
    {
        const int heldOut = 1024;
        Console.WriteLine(string.Format("TrainCnn on {0}: shapes 32x32, batch {1}, width {2}, {3} steps, AdamW lr {4}",
                                        ctx.DeviceName(), batch, width, steps, lr));
        ulong testRng = 0xD1B54A32D192ED03UL ^ seed, trainRng = 0x8CB92BA72F3D8DD7UL ^ seed;
        Tensor xte, yte;
        Batch(ctx, ref testRng, heldOut, out xte, out yte);
        var m = new Model(ctx, width);
        var decayed = new List<Tensor>(m.ConvW) { m.HeadW };
        var plain = new List<Tensor>();
        for (int b = 0; b < Blocks; ++b) { plain.Add(m.ConvB[b]); plain.Add(m.GnW[b]); plain.Add(m.GnB[b]); }
        plain.Add(m.HeadB);
        var all = new List<Tensor>(decayed); all.AddRange(plain);
        var oo = new OptimizerOptions(OptimizerKind.AdamW) { Lr = lr, WeightDecay = 1e-4 };
        using (var opt = new Optimizer(ctx, oo, decayed.ToArray()))
        {
            oo.WeightDecay = 0;
            opt.AddParamGroup(oo, plain.ToArray());
            Tensor[] allParams = all.ToArray();
            var clock = Stopwatch.StartNew();
            int since = 0;
            for (int step = 0; step < steps; ++step)
            {
                int warm = steps / 20 + 1;
                double p = (double)(step - warm) / Math.Max(steps - warm, 1);
                double stepLr = step < warm ? lr * (step + 1) / warm : lr * (0.01 + 0.99 * 0.5 * (1.0 + Math.Cos(Math.PI * p)));
                using (new Scope())
                {
                    Tensor x, y;
                    Batch(ctx, ref trainRng, batch, out x, out y);
                    opt.SetLr(stepLr);
                    Tensor loss = m.Forward(x).CrossEntropy(y, null, -100, 0.0, Reduction.Mean);
                    loss.Backward();
                    ctx.ClipGradNorm(allParams, 1.0, 2.0, 0);
                    opt.Step();
                    opt.ZeroGrad();
                    ++since;
                    if (step % logEvery == 0 || step + 1 == steps)
                    {
                        double lv = loss.Item();
                        double sec = clock.Elapsed.TotalSeconds;
                        MemoryStats ms = ctx.GetMemoryStats();
                        Console.WriteLine(string.Format("step {0,4}  loss {1:F4}  lr {2:E2}  {3,7:F0} images/s  {4:F2} ms/step  memory {5:F1} MiB (peak {6:F1})",
                            step, lv, stepLr, since * (double)batch / sec, 1e3 * sec / since, ms.BytesInUse / 1048576.0, ms.PeakBytesInUse / 1048576.0));
                        clock.Restart();
                        since = 0;
                    }
                }
            }
        }
        double acc = Accuracy(ctx, m, xte, yte, heldOut);
        Console.WriteLine(string.Format("held-out accuracy: {0:F2}% over {1} images (target {2:F0}%)", 100 * acc, heldOut, 100 * target));
        if (acc >= target)
            return 0;
        Console.Error.WriteLine(string.Format("TrainCnn: held-out accuracy {0:F4} is below the target {1:F4}", acc, target));
        return 1;
    }
}
