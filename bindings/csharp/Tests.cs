// Console test runner for the C# bindings (NUnit is not assumed). Exit code 0 = all passed.
// CPU tests: loading, version, status strings, error paths. GPU tests run when a context can be
// created; with FLAME_REQUIRE_GPU=1 a missing GPU is a failure instead of a skip.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Threading;
using Flame;
using Flame.Interop;

static class Tests
{
    sealed class SkipException : Exception { public SkipException(string m) : base(m) { } }

    static void Assert(bool cond, string what)
    {
        if (!cond) throw new Exception("assertion failed: " + what);
    }

    static void Eq<T>(T a, T b, string what)
    {
        if (!EqualityComparer<T>.Default.Equals(a, b))
            throw new Exception(what + ": expected " + b + ", got " + a);
    }

    static void Close(float[] a, float[] b, string what)
    {
        bool ok = a.Length == b.Length;
        for (int i = 0; ok && i < a.Length; i++)
            ok = Math.Abs(a[i] - b[i]) <= 1e-5 + 1e-5 * Math.Abs(b[i]);
        if (!ok) throw new Exception(what + ": expected [" + string.Join(", ", b) + "], got [" + string.Join(", ", a) + "]");
    }

    static FlameException Throws(Action a, string what)
    {
        try { a(); }
        catch (FlameException e) { return e; }
        throw new Exception(what + ": expected a FlameException");
    }

    static bool RequireGpu { get { return Environment.GetEnvironmentVariable("FLAME_REQUIRE_GPU") == "1"; } }

    static Context Gpu()
    {
        try { return new Context(); }
        catch (FlameException e)
        {
            if (RequireGpu) throw new Exception("FLAME_REQUIRE_GPU=1 but no context: " + e);
            throw new SkipException(e.ToString());
        }
    }

    // ---------------------------------------------------------------- CPU tests

    static void CpuVersion()
    {
        Eq(Library.Version, Native.FLAME_VERSION_MAJOR + "." + Native.FLAME_VERSION_MINOR + "." + Native.FLAME_VERSION_PATCH, "version");
        Eq(Library.AbiVersion, Native.FLAME_ABI_VERSION, "abi");
    }

    static void CpuStatusStrings()
    {
        foreach (flame_status_t s in Enum.GetValues(typeof(flame_status_t)))
            Eq(Library.StatusName(s), s.ToString(), "flame_status_string");
        Eq(Library.DTypeSize(flame_dtype_t.FLAME_DTYPE_F32), 4L, "f32 size");
        Eq(Library.DTypeName(flame_dtype_t.FLAME_DTYPE_F32), "f32", "f32 name");
        Eq(Library.DTypeName((flame_dtype_t)999), "unknown", "unknown dtype");
    }

    static void CpuErrorMessage()
    {
        Library.SetErrorMessage("hello from C#");
        Eq(Library.LastErrorMessage, "hello from C#", "message");
        Library.SetErrorMessage(null);
        Eq(Library.LastErrorMessage, "", "cleared");
    }

    static void CpuContextErrors()
    {
        Context ctx = null;
        try { ctx = new Context(); }
        catch (FlameException e)
        {
            Assert(!RequireGpu, "FLAME_REQUIRE_GPU=1 but " + e);
            Assert(e.Status == flame_status_t.FLAME_ERROR_NO_DRIVER || e.Status == flame_status_t.FLAME_ERROR_NO_DEVICE, "status " + e.Status);
            Assert(e.Message.Length > 0, "message carried");
        }
        if (ctx != null) { Assert(ctx.DeviceName().Length > 0, "device name"); ctx.Dispose(); }
        var e2 = Throws(() => new Context(new ContextOptions { Device = 4096, KernelCacheDir = "" }), "device 4096");
        Assert(e2.Status == flame_status_t.FLAME_ERROR_NO_DRIVER || e2.Status == flame_status_t.FLAME_ERROR_NO_DEVICE, "status " + e2.Status);
    }

    static void CpuNullHandles()
    {
        var t = new Tensor(IntPtr.Zero);
        var e = Throws(() => t.Add(t), "add(NULL)");
        Eq(e.Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        Assert(e.Message.Length > 0, "message");
        Eq(Throws(() => { Tensor x = t * 2.0; x.Dispose(); }, "mul_scalar").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        Eq(Throws(() => t.Sum(new[] { 0 }, false), "sum").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        Throws(() => t.RegisterHook(g => null), "register_hook on NULL");
        t.Dispose(); // release(NULL): no-op
    }

    static void CpuDlpackErrors()
    {
        var t = new Tensor(IntPtr.Zero);
        Eq(Throws(() => t.ToDlpack(), "to_dlpack(NULL)").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        Eq(Throws(() => t.ToDlpackVersioned(), "to_dlpack_versioned(NULL)").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        var e = Throws(() => Tensor.FromDlpack(null, IntPtr.Zero), "from_dlpack(NULL)");
        Eq(e.Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        Assert(e.Message.Contains("flame_tensor_from_dlpack"), "message names the function: " + e.Message);
        Eq(Throws(() => Tensor.FromDlpackVersioned(null, IntPtr.Zero), "from_dlpack_versioned(NULL)").Status,
           flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
        t.Dispose();
    }

    static void CpuDisposed()
    {
        var t = new Tensor(IntPtr.Zero);
        t.Dispose();
        try { t.Numel(); throw new Exception("expected ObjectDisposedException"); }
        catch (ObjectDisposedException) { }
    }

    // ---------------------------------------------------------------- GPU tests

    static void GpuRoundtrip()
    {
        using (var ctx = Gpu())
        using (var t = ctx.FromArray(new float[] { 0, 1, 2, 3, 4, 5 }, 2, 3))
        {
            Eq(string.Join(",", t.Shape()), "2,3", "shape");
            Eq(string.Join(",", t.Strides()), "3,1", "strides");
            Eq(t.Dtype(), flame_dtype_t.FLAME_DTYPE_F32, "dtype");
            Close(t.ToFloatArray(), new float[] { 0, 1, 2, 3, 4, 5 }, "roundtrip");
            using (var tt = t.Transpose(0, 1))
                Close(tt.ToFloatArray(), new float[] { 0, 3, 1, 4, 2, 5 }, "transpose");
            Eq(Throws(() => t.ToDoubleArray(), "dtype").Status, flame_status_t.FLAME_ERROR_DTYPE_MISMATCH, "status");
            Assert(ctx.DeviceName().Length > 0, "device name");
        }
    }

    static void GpuArithmetic()
    {
        using (var ctx = Gpu())
        {
            var a = ctx.FromArray(new float[] { 1, 2, 3, 4 }, 2, 2);
            var b = ctx.FromArray(new float[] { 10, 20 }, 2);
            Close((a + b).ToFloatArray(), new float[] { 11, 22, 13, 24 }, "+");
            Close((a - b).ToFloatArray(), new float[] { -9, -18, -7, -16 }, "-");
            Close((a * b).ToFloatArray(), new float[] { 10, 40, 30, 80 }, "*");
            Close((a / b).ToFloatArray(), new float[] { 0.1f, 0.1f, 0.3f, 0.2f }, "/");
            Close((1.0 - a).ToFloatArray(), new float[] { 0, -1, -2, -3 }, "rsub");
            Close((-a).ToFloatArray(), new float[] { -1, -2, -3, -4 }, "neg");
            Close(a.Sum(new[] { 0 }, false).ToFloatArray(), new float[] { 4, 6 }, "sum");
            Eq(a.SumAll().Item(), 10.0, "sum_all");
            Eq(a.Argmax(Native.FLAME_DIM_ALL, false).ToLongArray()[0], 3L, "argmax");
            var bad = ctx.FromArray(new float[] { 1, 2, 3 }, 3);
            var e = Throws(() => { Tensor x = a + bad; x.Dispose(); }, "shape mismatch");
            Eq(e.Status, flame_status_t.FLAME_ERROR_SHAPE_MISMATCH, "status");
            var cat = Tensor.Cat(new[] { a, a }, 0);
            Eq(string.Join(",", cat.Shape()), "4,2", "cat");
            Eq(cat.Split(3, 0).Length, 2, "split");
        }
    }

    static void GpuAutogradAndHooks()
    {
        using (var ctx = Gpu())
        {
            var x = ctx.FromArray(new float[] { 1, 2 }, 2);
            x.SetRequiresGrad(true);
            int calls = 0, post = 0;
            var hook = x.RegisterHook(g => { calls++; return g * 10.0; });
            var ph = x.RegisterPostAccumulateGradHook(leaf => { Assert(leaf.Grad != null, "grad set"); post++; });
            x.Mul(x).SumAll().Backward();
            Eq(calls, 1, "hook calls");
            Eq(post, 1, "post hook calls");
            Close(x.Grad.ToFloatArray(), new float[] { 20, 40 }, "hooked grad");
            hook.Dispose();
            ph.Dispose();

            x.Grad = null;
            using (x.RegisterHook(g => { throw new FlameException(flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "nope from C#"); }))
            {
                var e = Throws(() => (x * 2.0).SumAll().Backward(), "hook error");
                Eq(e.Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
                Assert(e.Message.Contains("nope from C#"), e.Message);
            }
            using (x.RegisterHook(g => { throw new InvalidOperationException("boom"); }))
            {
                var e = Throws(() => (x * 2.0).SumAll().Backward(), "hook exception");
                Eq(e.Status, flame_status_t.FLAME_ERROR_INTERNAL, "status");
                Assert(e.Message.Contains("boom"), e.Message);
            }
            // An unreferenced hook stays registered across GCs until its tensor goes.
            int kept = 0;
            x.Grad = null;
            x.RegisterHook(g => { kept++; return null; });
            GC.Collect(); GC.WaitForPendingFinalizers(); GC.Collect();
            x.MulScalar(2.0).SumAll().Backward();
            Eq(kept, 1, "kept hook ran after GC");

            var z = (x * 3.0).SumAll();
            var gr = ctx.Grad(new[] { z }, null, new[] { x });
            Close(gr[0].ToFloatArray(), new float[] { 3, 3 }, "flame_grad");
            using (ctx.NoGrad())
                Assert(!(x * 2.0).RequiresGrad(), "no_grad");
            Assert(ctx.IsGradEnabled(), "grad mode restored");
        }
    }

    static void GpuTrainingLoop()
    {
        using (var ctx = Gpu())
        {
            var xs = new float[64]; var ys = new float[64];
            for (int i = 0; i < 64; i++) { xs[i] = i / 32f - 1; ys[i] = 3 * xs[i] - 1; }
            var x = ctx.FromArray(xs, 64);
            var y = ctx.FromArray(ys, 64);
            var w = ctx.Zeros(new long[] { 1 }, flame_dtype_t.FLAME_DTYPE_F32);
            var b = ctx.Zeros(new long[] { 1 }, flame_dtype_t.FLAME_DTYPE_F32);
            int hookCalls = 0;
            double loss = double.PositiveInfinity;
            for (int step = 0; step < 300; step++)
            {
                w.SetRequiresGrad(true); b.SetRequiresGrad(true);
                w.RegisterHook(g => { Interlocked.Increment(ref hookCalls); return g.Clamp(-5, 5); });
                var l = ((x * w + b) - y).Square().Mean(null, false);
                l.Backward();
                loss = l.Item();
                using (ctx.NoGrad())
                {
                    w = (w - w.Grad * 0.3).Detach();
                    b = (b - b.Grad * 0.3).Detach();
                }
            }
            Eq(hookCalls, 300, "hook calls");
            Assert(loss < 1e-3, "loss " + loss);
            Assert(Math.Abs(w.Item() - 3) < 0.05 && Math.Abs(b.Item() + 1) < 0.05, "fit");
        }
    }

    static void GpuSafetensors()
    {
        using (var ctx = Gpu())
        using (var w = ctx.FromArray(new float[] { 1, -2, 3.5f, 4, 5, -6 }, 2, 3))
        using (var wt = w.Transpose(0, 1))
        {
            string dir = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame-cs-st-" + System.Diagnostics.Process.GetCurrentProcess().Id);
            System.IO.Directory.CreateDirectory(dir);
            string path = System.IO.Path.Combine(dir, "m.safetensors");
            SafetensorsFile.Save(ctx, path, new[] { "w", "wt" }, new[] { w, wt },
                                 new Dictionary<string, string> { { "format", "pt" }, { "\u00e9t\u00e9", "\u2713" } });
            using (var f = SafetensorsFile.Open(ctx, path))
            {
                Eq(string.Join(",", f.Names()), "w,wt", "names");
                flame_dtype_t dt;
                Eq(string.Join(",", f.Info("wt", out dt)), "3,2", "info shape");
                Eq(dt, flame_dtype_t.FLAME_DTYPE_F32, "info dtype");
                using (var got = f.Get("wt"))
                    Close(got.ToFloatArray(), new float[] { 1, 4, -2, 5, 3.5f, -6 }, "values");
                Eq(f.MetadataValue("\u00e9t\u00e9"), "\u2713", "metadata");
                Eq(f.MetadataValue("absent"), null, "absent metadata");
                Eq(f.Metadata().Length, 2, "metadata count");
                Eq(Throws(() => f.Get("absent"), "absent").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "status");
            }
            Eq(Throws(() => SafetensorsFile.Open(ctx, System.IO.Path.Combine(dir, "missing")), "missing").Status,
               flame_status_t.FLAME_ERROR_IO, "io status");
            System.IO.Directory.Delete(dir, true);
        }
    }

    static void CpuOptimizerOptions()
    {
        var sgd = new OptimizerOptions(flame_optimizer_kind_t.FLAME_OPTIMIZER_SGD);
        Eq(sgd.Kind, flame_optimizer_kind_t.FLAME_OPTIMIZER_SGD, "kind");
        Eq(sgd.Lr, 1e-3, "sgd lr"); Eq(sgd.WeightDecay, 0.0, "sgd weight_decay");
        Eq(sgd.Momentum, 0.0, "sgd momentum"); Eq(sgd.Dampening, 0.0, "sgd dampening");
        Assert(!sgd.Nesterov && !sgd.Amsgrad && !sgd.Maximize && !sgd.MasterWeights && !sgd.StochasticRounding, "sgd flags");
        Eq((long)sgd.Raw.struct_size, (long)System.Runtime.InteropServices.Marshal.SizeOf(typeof(flame_optimizer_options_t)), "struct_size");
        var adamw = new OptimizerOptions(flame_optimizer_kind_t.FLAME_OPTIMIZER_ADAMW);
        Eq(adamw.WeightDecay, 1e-2, "adamw weight_decay"); Eq(adamw.Beta1, 0.9, "adamw beta1");
        Eq(adamw.Beta2, 0.999, "adamw beta2"); Eq(adamw.Eps, 1e-8, "adamw eps");
        var lion = new OptimizerOptions(flame_optimizer_kind_t.FLAME_OPTIMIZER_LION);
        Eq(lion.Beta2, 0.99, "lion beta2");
        lion.Lr = 0.5; lion.Nesterov = true;
        Eq(lion.Raw.lr, 0.5, "lr set"); Eq(lion.Raw.nesterov, 1, "nesterov set");
        var e = Throws(() => new OptimizerOptions((flame_optimizer_kind_t)42), "unknown kind");
        Eq(e.Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "unknown kind status");
    }

    static void GpuOptimizerSgd()
    {
        using (var ctx = Gpu())
        using (var p = ctx.FromArray(new float[] { 1, -2, 3, 0.5f }, 4))
        using (var q = ctx.FromArray(new float[] { 7 }, 1))
        using (var g = ctx.FromArray(new float[] { 0.5f, -1, 2, 4 }, 4))
        {
            p.SetRequiresGrad(true); q.SetRequiresGrad(true);
            var opts = new OptimizerOptions(flame_optimizer_kind_t.FLAME_OPTIMIZER_SGD) { Lr = 0.1 };
            using (var opt = new Optimizer(ctx, opts, p))
            {
                opts.Lr = 0.25;
                Eq(opt.AddParamGroup(opts, q), 1, "group index");
                Eq(opt.GetLr(0), 0.1, "lr 0"); Eq(opt.GetLr(1), 0.25, "lr 1");
                Eq(opt.StepCount(), 0L, "steps before");
                var loss = (p * g).SumAll();
                loss.Backward();  // d/dp sum(p * g) = g; q has no gradient and is skipped
                opt.Step();
                Eq(opt.StepCount(), 1L, "steps after");
                Close(p.ToFloatArray(), new float[] { 1 - 0.05f, -2 + 0.1f, 3 - 0.2f, 0.5f - 0.4f }, "p - lr * g");
                Close(q.ToFloatArray(), new float[] { 7 }, "q unchanged");
                opt.ZeroGrad(false);
                Close(p.Grad.ToFloatArray(), new float[] { 0, 0, 0, 0 }, "zeroed grad");
                opt.ZeroGrad(true);
                Assert(p.Grad == null, "grad dropped");
                opt.SetLr(0.5);
                Eq(opt.GetLr(0), 0.5, "lr all 0"); Eq(opt.GetLr(1), 0.5, "lr all 1");
                opt.SetLr(0.05, 1);
                Eq(opt.GetLr(1), 0.05, "lr group 1");
                Eq(Throws(() => opt.SetLr(0.1, 2), "bad group").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "bad group status");
                Eq(Throws(() => opt.SetLr(-1), "negative lr").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "negative lr status");
                Eq(Throws(() => opt.AddParamGroup(opts, p), "duplicate").Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "duplicate status");
                opt.Dispose();
                try { opt.Step(); throw new Exception("Step after Dispose did not throw"); }
                catch (ObjectDisposedException) { }
            }
            Close(p.ToFloatArray(), new float[] { 0.95f, -1.9f, 2.8f, 0.1f }, "parameters outlive the optimizer");
        }
    }

    static void CpuAttentionOptions()
    {
        var o = new AttentionOptions();
        Assert(!o.Causal, "not causal by default");
        Eq(o.Scale, 0.0, "default scale"); Eq(o.DropoutP, 0.0, "default dropout");
        Eq((long)o.Raw.struct_size, (long)System.Runtime.InteropServices.Marshal.SizeOf(typeof(flame_attention_options_t)), "struct_size");
        o.Causal = true; o.Scale = 0.5;
        Eq(o.Raw.flags, Native.FLAME_ATTENTION_CAUSAL, "causal flag"); Eq(o.Raw.scale, 0.5, "scale set");
        o.Causal = false;
        Eq(o.Raw.flags, 0u, "causal cleared");
    }

    static void GpuAttention()
    {
        // q = k = 0: every score is equal, so each output row is the mean of the visible values.
        using (var ctx = Gpu())
        using (var q = ctx.FromArray(new float[8], 1, 1, 2, 4))
        using (var k = ctx.FromArray(new float[12], 1, 1, 3, 4))
        using (var v = ctx.FromArray(new float[] { 1, 10, 2, 20, 6, 60 }, 1, 1, 3, 2))
        using (var mask = ctx.FromArray(new float[] { 0, 0, float.NegativeInfinity }, 3))
        {
            using (var o = q.ScaledDotProductAttention(k, v))
                Close(o.ToFloatArray(), new float[] { 3, 30, 3, 30 }, "uniform attention");
            using (var o = q.ScaledDotProductAttention(k, v, null, new AttentionOptions { Causal = true }))
                Close(o.ToFloatArray(), new float[] { 1, 10, 1.5f, 15 }, "causal attention");
            using (var o = q.ScaledDotProductAttention(k, v, mask))
                Close(o.ToFloatArray(), new float[] { 1.5f, 15, 1.5f, 15 }, "masked attention");
            var e = Throws(() => q.ScaledDotProductAttention(k, v, null, new AttentionOptions { DropoutP = 1 }), "dropout 1");
            Eq(e.Status, flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "dropout 1 status");
        }
    }

    static int Main()
    {
        int failed = 0, passed = 0, skipped = 0;
        try { Library.EnsureLoaded(); }
        catch (FlameLoadException e)
        {
            Console.Error.WriteLine("FAIL load: " + e);
            return 1;
        }
        foreach (MethodInfo m in typeof(Tests).GetMethods(BindingFlags.Static | BindingFlags.NonPublic))
        {
            if (!(m.Name.StartsWith("Cpu") || m.Name.StartsWith("Gpu")) || m.GetParameters().Length != 0 || m.ReturnType != typeof(void))
                continue;
            try
            {
                m.Invoke(null, null);
                Console.WriteLine("ok      " + m.Name);
                passed++;
            }
            catch (TargetInvocationException ex)
            {
                if (ex.InnerException is SkipException)
                {
                    Console.WriteLine("skipped " + m.Name + ": " + ex.InnerException.Message);
                    skipped++;
                }
                else
                {
                    Console.WriteLine("FAIL    " + m.Name + ": " + ex.InnerException);
                    failed++;
                }
            }
        }
        GC.Collect();
        GC.WaitForPendingFinalizers();
        Console.WriteLine(string.Format("{0} passed, {1} failed, {2} skipped", passed, failed, skipped));
        return failed == 0 ? 0 : 1;
    }
}
