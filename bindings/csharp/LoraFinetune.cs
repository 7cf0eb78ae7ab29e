// LoRA fine-tuning from C#: the C# counterpart of examples/lora_finetune.c with the same claims,
// on a model small enough to train its own base first (the C example needs a GPT file written by
// train_gpt; this one needs nothing).
//
//   base   an MLP 4 -> 64 -> 64 -> 1 (SiLU) trained with AdamW on task A, y = sin(2 x0) + x1 x2,
//          then frozen (detached: nothing of the base requires grad)
//   LoRA   a Lora (rank --rank, alpha --alpha; A random, B zero, so the adapted model starts as the
//          base) on each of the three linear layers, trained with AdamW on task B, which adds
//          0.5 cos(3 x3) to task A
//   save   only the adapters, to safetensors (--out): "<layer>.lora_A" [rank, in] and
//          "<layer>.lora_B" [out, rank], with rank and alpha as metadata
//   reload new adapters of the same rank over the same frozen base, A and B set from the file;
//          then merged into the weights for inference
//
// The claims, checked at the end (exit status 1 when one fails):
//  1. the loss falls: task B's loss after training is at most --target-factor (default 0.9) times
//     the base model's;
//  2. the adapter file holds only adapters: 2 tensors per adapted layer, every name ending in
//     ".lora_A" or ".lora_B";
//  3. the reloaded model gives the same loss (within 1e-5 relative);
//  4. the merged model gives that loss within 1e-4 relative, and unmerging restores the weights.
// Exit status: 0 when they hold, 1 on a FLAME error or a failed claim, 2 without a GPU or driver.
//
// Build: mcs -unsafe -out:out/LoraFinetune.exe -r:out/Flame.dll LoraFinetune.cs
// Run:   FLAME_LIBRARY=/path/to/libflame.so.1 mono out/LoraFinetune.exe [--steps N] [--rank R] [--alpha A] [--lr LR] [--seed S] [--out FILE] [--target-factor F]
using System;
using System.Collections.Generic;
using System.Globalization;
using Flame;

static class LoraFinetune
{
    const int N = 2048, In = 4, Hidden = 64;
    static readonly string[] LayerNames = { "fc1", "fc2", "head" };

    static float[] Inputs(ulong seed)
    {
        var xs = new float[N * In];
        ulong s = 0x9E3779B97F4A7C15UL ^ seed;
        for (int i = 0; i < xs.Length; i++)
        {
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            xs[i] = (float)(((s * 2685821657736338717UL) >> 11) / 9007199254740992.0 * 2 - 1);
        }
        return xs;
    }

    static float[] Targets(float[] xs, bool taskB)
    {
        var ys = new float[N];
        for (int i = 0; i < N; i++)
        {
            double x0 = xs[i * In], x1 = xs[i * In + 1], x2 = xs[i * In + 2], x3 = xs[i * In + 3];
            ys[i] = (float)(Math.Sin(2 * x0) + x1 * x2 + (taskB ? 0.5 * Math.Cos(3 * x3) : 0));
        }
        return ys;
    }

    /// The three linear layers; with adapters the forward goes through them.
    static Tensor Forward(Tensor x, Tensor[] w, Tensor[] b, Lora[] lora)
    {
        Tensor h = x;
        for (int l = 0; l < 3; l++)
        {
            h = lora == null ? h.Linear(w[l], b[l], Activation.None) : lora[l].Forward(h);
            if (l < 2)
                h = h.Silu();
        }
        return h.Reshape(new long[] { -1 });
    }

    static double Loss(Context ctx, Tensor x, Tensor y, Tensor[] w, Tensor[] b, Lora[] lora)
    {
        using (ctx.NoGrad())
        using (new Scope())
            return Forward(x, w, b, lora).MseLoss(y, Reduction.Mean).Item();
    }

    static Lora[] Adapters(Tensor[] w, Tensor[] b, int rank, double alpha)
    {
        var lora = new Lora[3];
        for (int l = 0; l < 3; l++)
            lora[l] = new Lora(w[l], b[l], rank, alpha);
        return lora;
    }

    static bool Claim(bool ok, string what)
    {
        Console.WriteLine((ok ? "ok      " : "FAILED  ") + what);
        return ok;
    }

    static int Main(string[] args)
    {
        int steps = 400, rank = 4;
        double alpha = 8, lr = 1e-2, targetFactor = 0.9;
        ulong seed = 1;
        string outPath = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame-cs-lora-adapters.safetensors");
        var inv = CultureInfo.InvariantCulture;
        for (int i = 0; i + 1 < args.Length; i += 2)
        {
            string a = args[i], v = args[i + 1];
            if (a == "--steps") steps = int.Parse(v);
            else if (a == "--rank") rank = int.Parse(v);
            else if (a == "--alpha") alpha = double.Parse(v, inv);
            else if (a == "--lr") lr = double.Parse(v, inv);
            else if (a == "--seed") seed = ulong.Parse(v);
            else if (a == "--out") outPath = v;
            else if (a == "--target-factor") targetFactor = double.Parse(v, inv);
            else { args = new string[1]; break; }
        }
        if (args.Length % 2 != 0 || steps <= 0 || rank <= 0)
        {
            Console.Error.WriteLine("usage: LoraFinetune [--steps N] [--rank R] [--alpha A] [--lr LR] [--seed S] [--out FILE] [--target-factor F]");
            return 1;
        }
        Context ctx;
        try { ctx = new Context(new ContextOptions { Seed = seed }); }
        catch (FlameException e) when (e.Status == StatusCode.NoDriver || e.Status == StatusCode.NoDevice)
        {
            Console.Error.WriteLine("LoraFinetune: no GPU available: " + e.Message);
            return 2;
        }
        try
        {
            using (ctx)
                return Run(ctx, steps, rank, alpha, lr, seed, outPath, targetFactor);
        }
        catch (FlameException e)
        {
            Console.Error.WriteLine("LoraFinetune: " + e.Message);
            return 1;
        }
    }

    static void Fit(Context ctx, Tensor[] parameters, Func<Tensor> loss, int steps, double lr, string what)
    {
        using (var opt = new Optimizer(ctx, new OptimizerOptions(OptimizerKind.AdamW) { Lr = lr, WeightDecay = 0 }, parameters))
            for (int step = 0; step < steps; step++)
                using (new Scope())
                {
                    opt.SetLr(lr * 0.5 * (1 + Math.Cos(Math.PI * step / steps)));
                    Tensor l = loss();
                    l.Backward();
                    ctx.ClipGradNorm(parameters, 1.0, 2.0, 0);
                    opt.Step();
                    opt.ZeroGrad();
                    if (step % 100 == 0 || step + 1 == steps)
                        Console.WriteLine(string.Format(CultureInfo.InvariantCulture, "{0} step {1,4}  loss {2:F5}", what, step, l.Item()));
                }
    }

    static int Run(Context ctx, int steps, int rank, double alpha, double lr, ulong seed, string outPath, double targetFactor)
    {
        Console.WriteLine("LoraFinetune on " + ctx.DeviceName() + ": MLP 4-64-64-1, rank " + rank + ", alpha " + alpha);
        float[] xs = Inputs(seed);
        Tensor x = ctx.FromArray(xs, N, In), ya = ctx.FromArray(Targets(xs, false), N), yb = ctx.FromArray(Targets(xs, true), N);

        // ---- the base model, trained on task A, then frozen ----
        long[] dims = { In, Hidden, Hidden, 1 };
        var w = new Tensor[3];
        var b = new Tensor[3];
        for (int l = 0; l < 3; l++)
        {
            using (Tensor r = ctx.Randn(new[] { dims[l + 1], dims[l] }, DType.F32))
                w[l] = r * (1.0 / Math.Sqrt(dims[l]));
            b[l] = ctx.Zeros(new[] { dims[l + 1] }, DType.F32);
            w[l].SetRequiresGrad(true);
            b[l].SetRequiresGrad(true);
        }
        var trainable = new List<Tensor>(w); trainable.AddRange(b);
        Fit(ctx, trainable.ToArray(), () => Forward(x, w, b, null).MseLoss(ya, Reduction.Mean), 2 * steps, 1e-2, "base");
        for (int l = 0; l < 3; l++)
        {
            w[l] = w[l].Detach();
            b[l] = b[l].Detach();
        }
        double baseLoss = Loss(ctx, x, yb, w, b, null);
        Console.WriteLine(string.Format(CultureInfo.InvariantCulture, "base model: task A loss {0:F5}, task B loss {1:F5}", Loss(ctx, x, ya, w, b, null), baseLoss));

        // ---- adapters trained on task B ----
        Lora[] lora = Adapters(w, b, rank, alpha);
        var adapterParams = new List<Tensor>();
        foreach (Lora a in lora) adapterParams.AddRange(a.Adapters());
        Assert0(Math.Abs(Loss(ctx, x, yb, w, b, lora) - baseLoss) <= 1e-5 * baseLoss, "new adapters (B = 0) change nothing");
        Fit(ctx, adapterParams.ToArray(), () => Forward(x, w, b, lora).MseLoss(yb, Reduction.Mean), steps, lr, "lora");
        double tuned = Loss(ctx, x, yb, w, b, lora);

        // ---- save the adapters alone ----
        var names = new List<string>();
        for (int l = 0; l < 3; l++) { names.Add(LayerNames[l] + ".lora_A"); names.Add(LayerNames[l] + ".lora_B"); }
        SafetensorsFile.Save(ctx, outPath, names.ToArray(), adapterParams.ToArray(), new Dictionary<string, string> {
            { "lora.rank", rank.ToString(CultureInfo.InvariantCulture) }, { "lora.alpha", alpha.ToString(CultureInfo.InvariantCulture) } });

        // ---- reload into new adapters over the same frozen base ----
        Lora[] fresh = Adapters(w, b, rank, alpha);
        string[] stored;
        using (var f = SafetensorsFile.Open(ctx, outPath))
        {
            stored = f.Names();
            for (int l = 0; l < 3; l++)
            {
                Tensor[] ab = fresh[l].Adapters();
                using (Tensor a = f.Get(LayerNames[l] + ".lora_A")) ab[0].CopyFrom(a.ToFloatArray());
                using (Tensor bb = f.Get(LayerNames[l] + ".lora_B")) ab[1].CopyFrom(bb.ToFloatArray());
            }
        }
        double reloaded = Loss(ctx, x, yb, w, b, fresh);
        float[] before = w[1].ToFloatArray();
        foreach (Lora a in fresh) a.Merge();
        double merged = Loss(ctx, x, yb, w, b, null);
        foreach (Lora a in fresh) a.Unmerge();
        float[] after = w[1].ToFloatArray();

        Console.WriteLine(string.Format(CultureInfo.InvariantCulture, "task B loss: base {0:F5}, tuned {1:F5}, reloaded {2:F5} ({3}), merged {4:F5}",
            baseLoss, tuned, reloaded, reloaded == tuned ? "bit for bit" : "not bit for bit", merged));
        bool ok = Claim(tuned <= targetFactor * baseLoss, string.Format(CultureInfo.InvariantCulture, "1. the loss falls to {0:F3} of the base's (target {1})", tuned / baseLoss, targetFactor));
        bool onlyAdapters = stored.Length == 2 * 3;
        foreach (string n in stored) onlyAdapters &= n.EndsWith(".lora_A") || n.EndsWith(".lora_B");
        ok &= Claim(onlyAdapters, "2. the adapter file holds only adapters: " + string.Join(", ", stored));
        ok &= Claim(Math.Abs(reloaded - tuned) <= 1e-5 * tuned, "3. the reloaded model gives the same loss");
        bool restored = before.Length == after.Length;
        for (int i = 0; restored && i < before.Length; i++) restored = before[i] == after[i];
        ok &= Claim(Math.Abs(merged - tuned) <= 1e-4 * tuned && restored, "4. the merged model gives that loss, and unmerging restores the weight");
        System.IO.File.Delete(outPath);
        return ok ? 0 : 1;
    }

    static void Assert0(bool ok, string what)
    {
        if (!ok) throw new FlameException(StatusCode.Internal, "check failed: " + what);
    }
}
