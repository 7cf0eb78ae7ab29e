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
            throw new SkipException(e.Message);
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
        foreach (StatusCode s in Enum.GetValues(typeof(StatusCode)))
            Eq(Library.StatusName(s), ((flame_status_t)s).ToString(), "flame_status_string");
        Eq(Library.DTypeSize(DType.F32), 4L, "f32 size");
        Eq(Library.DTypeName(DType.F32), "f32", "f32 name");
        Eq(Library.DTypeName((DType)999), "unknown", "unknown dtype");
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
            Assert(e.Status == StatusCode.NoDriver || e.Status == StatusCode.NoDevice, "status " + e.Status);
            Assert(e.Message.Length > 0, "message carried");
        }
        if (ctx != null) { Assert(ctx.DeviceName().Length > 0, "device name"); ctx.Dispose(); }
        var e2 = Throws(() => new Context(new ContextOptions { Device = 4096, KernelCacheDir = "" }), "device 4096");
        Assert(e2.Status == StatusCode.NoDriver || e2.Status == StatusCode.NoDevice, "status " + e2.Status);
    }

    static void CpuNullHandles()
    {
        var t = new Tensor(IntPtr.Zero);
        var e = Throws(() => t.Add(t), "add(NULL)");
        Eq(e.Status, StatusCode.InvalidArgument, "status");
        Assert(e.Message.Length > 0, "message");
        Eq(Throws(() => { Tensor x = t * 2.0; x.Dispose(); }, "mul_scalar").Status, StatusCode.InvalidArgument, "status");
        Eq(Throws(() => t.Sum(new[] { 0 }, false), "sum").Status, StatusCode.InvalidArgument, "status");
        Throws(() => t.RegisterHook(g => null), "register_hook on NULL");
        t.Dispose(); // release(NULL): no-op
    }

    static void CpuDlpackErrors()
    {
        var t = new Tensor(IntPtr.Zero);
        Eq(Throws(() => t.ToDlpack(), "to_dlpack(NULL)").Status, StatusCode.InvalidArgument, "status");
        Eq(Throws(() => t.ToDlpackVersioned(), "to_dlpack_versioned(NULL)").Status, StatusCode.InvalidArgument, "status");
        var e = Throws(() => Tensor.FromDlpack(null, IntPtr.Zero), "from_dlpack(NULL)");
        Eq(e.Status, StatusCode.InvalidArgument, "status");
        Assert(e.Message.Contains("flame_tensor_from_dlpack"), "message names the function: " + e.Message);
        Eq(Throws(() => Tensor.FromDlpackVersioned(null, IntPtr.Zero), "from_dlpack_versioned(NULL)").Status,
           StatusCode.InvalidArgument, "status");
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
            Eq(t.Dtype(), DType.F32, "dtype");
            Close(t.ToFloatArray(), new float[] { 0, 1, 2, 3, 4, 5 }, "roundtrip");
            using (var tt = t.Transpose(0, 1))
                Close(tt.ToFloatArray(), new float[] { 0, 3, 1, 4, 2, 5 }, "transpose");
            Eq(Throws(() => t.ToDoubleArray(), "dtype").Status, StatusCode.DtypeMismatch, "status");
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
            Eq(e.Status, StatusCode.ShapeMismatch, "status");
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
            using (x.RegisterHook(g => { throw new FlameException(StatusCode.InvalidArgument, "nope from C#"); }))
            {
                var e = Throws(() => (x * 2.0).SumAll().Backward(), "hook error");
                Eq(e.Status, StatusCode.InvalidArgument, "status");
                Assert(e.Message.Contains("nope from C#"), e.Message);
            }
            using (x.RegisterHook(g => { throw new InvalidOperationException("boom"); }))
            {
                var e = Throws(() => (x * 2.0).SumAll().Backward(), "hook exception");
                Eq(e.Status, StatusCode.Internal, "status");
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
            var w = ctx.Zeros(new long[] { 1 }, DType.F32);
            var b = ctx.Zeros(new long[] { 1 }, DType.F32);
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
                DType dt;
                Eq(string.Join(",", f.Info("wt", out dt)), "3,2", "info shape");
                Eq(dt, DType.F32, "info dtype");
                using (var got = f.Get("wt"))
                    Close(got.ToFloatArray(), new float[] { 1, 4, -2, 5, 3.5f, -6 }, "values");
                Eq(f.MetadataValue("\u00e9t\u00e9"), "\u2713", "metadata");
                Eq(f.MetadataValue("absent"), null, "absent metadata");
                Eq(f.Metadata().Length, 2, "metadata count");
                Eq(Throws(() => f.Get("absent"), "absent").Status, StatusCode.InvalidArgument, "status");
            }
            Eq(Throws(() => SafetensorsFile.Open(ctx, System.IO.Path.Combine(dir, "missing")), "missing").Status,
               StatusCode.Io, "io status");
            System.IO.Directory.Delete(dir, true);
        }
    }

    static void CpuOptimizerOptions()
    {
        var sgd = new OptimizerOptions(OptimizerKind.Sgd);
        Eq(sgd.Kind, OptimizerKind.Sgd, "kind");
        Eq(sgd.Lr, 1e-3, "sgd lr"); Eq(sgd.WeightDecay, 0.0, "sgd weight_decay");
        Eq(sgd.Momentum, 0.0, "sgd momentum"); Eq(sgd.Dampening, 0.0, "sgd dampening");
        Assert(!sgd.Nesterov && !sgd.Amsgrad && !sgd.Maximize && !sgd.MasterWeights && !sgd.StochasticRounding, "sgd flags");
        Eq((long)sgd.Raw.struct_size, (long)System.Runtime.InteropServices.Marshal.SizeOf(typeof(flame_optimizer_options_t)), "struct_size");
        var adamw = new OptimizerOptions(OptimizerKind.AdamW);
        Eq(adamw.WeightDecay, 1e-2, "adamw weight_decay"); Eq(adamw.Beta1, 0.9, "adamw beta1");
        Eq(adamw.Beta2, 0.999, "adamw beta2"); Eq(adamw.Eps, 1e-8, "adamw eps");
        var lion = new OptimizerOptions(OptimizerKind.Lion);
        Eq(lion.Beta2, 0.99, "lion beta2");
        lion.Lr = 0.5; lion.Nesterov = true;
        Eq(lion.Raw.lr, 0.5, "lr set"); Eq(lion.Raw.nesterov, 1, "nesterov set");
        var e = Throws(() => new OptimizerOptions((OptimizerKind)42), "unknown kind");
        Eq(e.Status, StatusCode.InvalidArgument, "unknown kind status");
    }

    static void GpuOptimizerSgd()
    {
        using (var ctx = Gpu())
        using (var p = ctx.FromArray(new float[] { 1, -2, 3, 0.5f }, 4))
        using (var q = ctx.FromArray(new float[] { 7 }, 1))
        using (var g = ctx.FromArray(new float[] { 0.5f, -1, 2, 4 }, 4))
        {
            p.SetRequiresGrad(true); q.SetRequiresGrad(true);
            var opts = new OptimizerOptions(OptimizerKind.Sgd) { Lr = 0.1 };
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
                Eq(Throws(() => opt.SetLr(0.1, 2), "bad group").Status, StatusCode.InvalidArgument, "bad group status");
                Eq(Throws(() => opt.SetLr(-1), "negative lr").Status, StatusCode.InvalidArgument, "negative lr status");
                Eq(Throws(() => opt.AddParamGroup(opts, p), "duplicate").Status, StatusCode.InvalidArgument, "duplicate status");
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
            Eq(e.Status, StatusCode.InvalidArgument, "dropout 1 status");
        }
    }


    // ---------------------------------------------------------------- issue 33: coverage, enums, options, errors, scope

    /// Exports of symbols that no public member of the Flame assembly marks with [Wraps].
    static List<string> Unwrapped(IEnumerable<string> symbols)
    {
        var covered = new Dictionary<string, bool>();
        const BindingFlags all = BindingFlags.Public | BindingFlags.Instance | BindingFlags.Static | BindingFlags.DeclaredOnly;
        foreach (Type t in typeof(Tensor).Assembly.GetTypes())
        {
            if (!t.IsPublic && !t.IsNestedPublic) continue;
            foreach (MemberInfo m in t.GetMembers(all))
                foreach (WrapsAttribute w in m.GetCustomAttributes(typeof(WrapsAttribute), false))
                    covered[w.Function] = true;
        }
        var missing = new List<string>();
        foreach (string s in symbols)
            if (!covered.ContainsKey(s) && !NotWrapped.ByDesign.ContainsKey(s)) missing.Add(s);
        return missing;
    }

    static void CpuCoverage()
    {
        // The check itself can fail: a symbol nobody wraps is reported.
        Eq(string.Join(",", Unwrapped(new[] { "flame_add", "flame_no_such_export" })), "flame_no_such_export", "self-check");
        var missing = Unwrapped(Native.Symbols);
        Assert(missing.Count == 0, "exports without a safe C# wrapper ([Wraps] attribute): " + string.Join(", ", missing));
        // and every [Wraps] names a real export; the by-design list holds only the C handle scope
        var symbols = new List<string>(Native.Symbols);
        foreach (string s in NotWrapped.ByDesign.Keys)
            Assert(symbols.Contains(s) && s.StartsWith("flame_scope_"), "NotWrapped.ByDesign lists " + s);
        foreach (Type t in typeof(Tensor).Assembly.GetTypes())
            foreach (MemberInfo m in t.GetMembers(BindingFlags.Public | BindingFlags.Instance | BindingFlags.Static | BindingFlags.DeclaredOnly))
                foreach (WrapsAttribute w in m.GetCustomAttributes(typeof(WrapsAttribute), false))
                    Assert(symbols.Contains(w.Function), t.Name + "." + m.Name + " wraps unknown " + w.Function);
    }

    static string Values(Type enumType)
    {
        var v = new List<string>();
        foreach (object o in Enum.GetValues(enumType)) v.Add(Convert.ToInt32(o).ToString());
        return string.Join(",", v);
    }

    static void CpuEnums()
    {
        Eq((int)OptimizerKind.AdamW, (int)flame_optimizer_kind_t.FLAME_OPTIMIZER_ADAMW, "AdamW");
        Eq((int)DType.BF16, (int)flame_dtype_t.FLAME_DTYPE_BF16, "BF16");
        Eq((int)StatusCode.InvalidArgument, (int)flame_status_t.FLAME_ERROR_INVALID_ARGUMENT, "InvalidArgument");
        Eq((int)PadMode.Reflect, (int)flame_pad_mode_t.FLAME_PAD_REFLECT, "Reflect");
        Eq((int)ReduceOp.Avg, (int)flame_reduce_op_t.FLAME_REDUCE_AVG, "Avg");
        Eq((int)Reduction.Mean, (int)flame_reduction_t.FLAME_REDUCTION_MEAN, "Mean");
        Eq((int)Activation.GeluTanh, (int)flame_activation_t.FLAME_ACTIVATION_GELU_TANH, "GeluTanh");
        // every C enum has an idiomatic twin with the same values
        var pairs = new[] { typeof(StatusCode), typeof(DType), typeof(OptimizerKind), typeof(PadMode), typeof(ReduceOp), typeof(Reduction), typeof(Activation) };
        var cs = new[] { typeof(flame_status_t), typeof(flame_dtype_t), typeof(flame_optimizer_kind_t), typeof(flame_pad_mode_t), typeof(flame_reduce_op_t), typeof(flame_reduction_t), typeof(flame_activation_t) };
        for (int i = 0; i < pairs.Length; i++)
            Eq(Values(pairs[i]), Values(cs[i]), pairs[i].Name + " values");
        Eq(Library.DTypeName(DType.BF16), "bf16", "bf16 name");
    }

    static void CpuOptionDefaults()
    {
        var conv = new ConvOptions();
        Eq(string.Join(",", conv.Stride), "1,1", "conv stride"); Eq(string.Join(",", conv.Padding), "0,0", "conv padding");
        Eq(string.Join(",", conv.Dilation), "1,1", "conv dilation"); Eq(conv.Groups, 1L, "conv groups");
        Assert(!conv.PaddingSame, "padding_same off");
        Eq((long)conv.Raw.struct_size, (long)System.Runtime.InteropServices.Marshal.SizeOf(typeof(flame_conv_options_t)), "conv struct_size");
        conv.Stride = new long[] { 2, 3 };
        Eq(string.Join(",", conv.Stride), "2,3", "stride set");
        try { conv.Padding = new long[] { 1 }; throw new Exception("expected ArgumentException"); }
        catch (ArgumentException) { }
        var pool = new Pool2dOptions(3, 2);
        Eq(string.Join(",", pool.KernelSize), "3,2", "kernel"); Eq(string.Join(",", pool.Stride), "3,2", "pool stride = kernel");
        Assert(pool.CountIncludePad && !pool.CeilMode, "pool flags");
        var rope = new RopeOptions();
        Eq(rope.Theta, 10000.0, "theta"); Eq(rope.SeqDim, -2, "seq_dim"); Assert(!rope.Interleaved, "not interleaved");
        var gs = new GradScalerOptions();
        Eq(gs.InitScale, 65536.0, "init_scale"); Eq(gs.GrowthFactor, 2.0, "growth"); Eq(gs.BackoffFactor, 0.5, "backoff");
        Eq(gs.GrowthInterval, 2000L, "interval"); Assert(gs.Enabled, "enabled");
        Eq(new CommOptions().TimeoutMs, 600000L, "comm timeout");
        var dp = new DpOptions();
        Eq(dp.BucketBytes, 64UL << 20, "bucket bytes"); Assert(dp.BroadcastParameters, "broadcast");
    }

    static void CpuExceptionMessages()
    {
        var t = new Tensor(IntPtr.Zero);
        var e = Throws(() => t.Add(t), "add(NULL)");
        Assert(e.Message.StartsWith("FLAME_ERROR_INVALID_ARGUMENT: "), "status name leads the message: " + e.Message);
        Assert(e.LibraryMessage.Length > 0 && e.Message.EndsWith(e.LibraryMessage), "library message: " + e.Message);
        Eq(Throws(() => t.Conv2d(t), "conv2d(NULL)").Status, StatusCode.InvalidArgument, "conv2d status");
        Eq(Throws(() => t.Rope(), "rope(NULL)").Status, StatusCode.InvalidArgument, "rope status");
        Eq(Throws(() => new Lora(t, null, 4, 1.0), "lora(NULL)").Status, StatusCode.InvalidArgument, "lora status");
        Eq(Throws(() => t.CopyFrom(new float[1]), "copy_from_host(NULL)").Status, StatusCode.InvalidArgument, "copy status");
        try { t.MaxPool2d(null); throw new Exception("expected ArgumentNullException"); }
        catch (ArgumentNullException) { }
        t.Dispose();
    }

    /// Runs this test program as a child with env set and returns what its load probe printed.
    static string LoadProbe(string flameLibrary, string ldLibraryPath)
    {
        var psi = new System.Diagnostics.ProcessStartInfo("mono", "\"" + Assembly.GetExecutingAssembly().Location + "\" --load-probe");
        psi.UseShellExecute = false;
        psi.RedirectStandardOutput = true;
        psi.EnvironmentVariables.Remove("FLAME_LIBRARY");
        if (flameLibrary != null) psi.EnvironmentVariables["FLAME_LIBRARY"] = flameLibrary;
        psi.EnvironmentVariables["LD_LIBRARY_PATH"] = ldLibraryPath;
        using (var p = System.Diagnostics.Process.Start(psi))
        {
            string o = p.StandardOutput.ReadToEnd();
            p.WaitForExit();
            Eq(p.ExitCode, 3, "probe exit code (3: load failed) with output " + o);
            return o;
        }
    }

    static void CpuLoadFailureMessages()
    {
        string o = LoadProbe("/nonexistent/libflame.so.1", "");
        Assert(o.Contains("LOAD_FAILED: ") && o.Contains("FLAME_LIBRARY=/nonexistent/libflame.so.1"), "names FLAME_LIBRARY: " + o);
        o = LoadProbe(null, "/nonexistent-dir");
        Assert(o.Contains("Flame.dll.config") && o.Contains("LD_LIBRARY_PATH=/nonexistent-dir") && o.Contains("FLAME_LIBRARY"),
               "says where it looked and how to point at the library: " + o);
    }

    static void CpuScope()
    {
        Tensor a, b, c, kept;
        using (var outer = new Scope())
        {
            using (var inner = new Scope())
            {
                Assert(Scope.Current == inner, "innermost");
                a = new Tensor(IntPtr.Zero);
                b = new Tensor(IntPtr.Zero);
                kept = inner.Keep(b);
                Eq(inner.Count, 1, "one to dispose");
            }
            Assert(Scope.Current == outer, "inner closed");
            Throws<ObjectDisposedException>(() => { var r = a.Raw; }, "a disposed by the inner scope");
            Eq(kept.Raw, IntPtr.Zero, "b kept past the inner scope");
            c = new Tensor(IntPtr.Zero);
        }
        Assert(Scope.Current == null, "no scope");
        Throws<ObjectDisposedException>(() => { var r = b.Raw; }, "b handed to the outer scope and disposed there");
        Throws<ObjectDisposedException>(() => { var r = c.Raw; }, "c disposed");
        var free = new Tensor(IntPtr.Zero);
        Eq(free.Raw, IntPtr.Zero, "no scope: not tracked");
        using (var outer = new Scope())
        using (var inner = new Scope())
        {
            inner.Keep(free);  // created outside: neither scope may dispose it
            Eq(inner.Count, 0, "nothing tracked");
        }
        Eq(free.Raw, IntPtr.Zero, "a tensor from outside survives Keep");
        free.Dispose();
    }

    static void Throws<E>(Action a, string what) where E : Exception
    {
        try { a(); }
        catch (E) { return; }
        throw new Exception(what + ": expected " + typeof(E).Name);
    }

    // ---------------------------------------------------------------- issue 33: GPU tests of the hand-written families

    static void GpuConvPool()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var x = ctx.FromArray(new float[] { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 1, 1, 3, 3);
            var w = ctx.FromArray(new float[] { 1, 1, 1, 1 }, 1, 1, 2, 2);
            var b = ctx.FromArray(new float[] { 0.5f }, 1);
            Close(x.Conv2d(w).ToFloatArray(), new float[] { 12, 16, 24, 28 }, "conv2d without bias");
            Close(x.Conv2d(w, b).ToFloatArray(), new float[] { 12.5f, 16.5f, 24.5f, 28.5f }, "conv2d with bias");
            var o = new ConvOptions { Padding = new long[] { 1, 1 }, Stride = new long[] { 2, 2 } };
            Close(x.Conv2d(w, null, o).ToFloatArray(), new float[] { 1, 5, 11, 28 }, "conv2d padding 1 stride 2");
            var x1 = ctx.FromArray(new float[] { 1, 2, 3, 4 }, 1, 1, 4);
            var w1 = ctx.FromArray(new float[] { 1, -1 }, 1, 1, 2);
            Close(x1.Conv1d(w1).ToFloatArray(), new float[] { -1, -1, -1 }, "conv1d");
            Close(x.ConvTranspose2d(ctx.FromArray(new float[] { 1 }, 1, 1, 1, 1)).ToFloatArray(), x.ToFloatArray(), "1x1 transpose");
            var y = ctx.FromArray(new float[] { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 }, 1, 1, 4, 4);
            Close(y.MaxPool2d(new Pool2dOptions(2, 2)).ToFloatArray(), new float[] { 5, 7, 13, 15 }, "max pool");
            Close(y.AvgPool2d(new Pool2dOptions(2, 2)).ToFloatArray(), new float[] { 2.5f, 4.5f, 10.5f, 12.5f }, "avg pool");
            var e = Throws(() => y.AvgPool2d(new Pool2dOptions(2, 2) { Dilation = new long[] { 2, 2 } }), "avg dilation");
            Eq(e.Status, StatusCode.InvalidArgument, "avg dilation status");
            // RoPE at position 0 is the identity
            var q = ctx.FromArray(new float[] { 1, 2, 3, 4 }, 1, 1, 1, 4);
            Close(q.Rope().ToFloatArray(), new float[] { 1, 2, 3, 4 }, "rope at 0");
            Eq(string.Join(",", q.Rope(null, new RopeOptions { PositionOffset = 5 }).Shape()), "1,1,1,4", "rope shape");
        }
    }

    static void GpuNullableArguments()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var x = ctx.FromArray(new float[] { 1, 2, 3 }, 1, 3);
            var w = ctx.FromArray(new float[] { 1, 0, 2, 0, 1, -1 }, 2, 3);
            Close(x.Linear(w, null, Activation.None).ToFloatArray(), new float[] { 7, -1 }, "linear without bias");
            Close(x.LayerNorm(new long[] { 3 }, null, null, 0).ToFloatArray(), new float[] { -1.2247449f, 0, 1.2247449f }, "layer_norm without affine");
            Close(x.RmsNorm(new long[] { 3 }, null, 0).ToFloatArray(), new float[] { 0.46291005f, 0.9258201f, 1.3887301f }, "rms_norm without weight");
            // int32_t parameters that hold enum values take the C# enum; autocast's previous is a dtype, not a flag
            Close(x.Pad(new long[] { 1, 1 }, PadMode.Replicate, 0).ToFloatArray(), new float[] { 1, 1, 2, 3, 3 }, "pad replicate");
            Eq(ctx.SetAutocast((int)DType.BF16), Native.FLAME_AUTOCAST_OFF, "autocast was off");
            Eq(ctx.SetAutocast(Native.FLAME_AUTOCAST_OFF), (int)DType.BF16, "previous autocast dtype");
        }
    }

    static void GpuParams()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            string path = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame_cs_params_" + System.Diagnostics.Process.GetCurrentProcess().Id + ".safetensors");
            var a = ctx.FromArray(new float[] { 1, 2, 3 }, 3);
            using (var p = new Params(ctx))
            {
                p.Add("a", a);
                Eq(Throws(() => p.Add("a", a), "duplicate name").Status, StatusCode.InvalidArgument, "status");
                Eq(p.Count, 1L, "count");
                Eq(p.Name(0), "a", "name");
                Assert(p.Find("b") == null, "find of a missing name");
                p.SaveSafetensors(path, new Dictionary<string, string> { { "format", "pt" } });
            }
            var a2 = ctx.Zeros(new long[] { 3 }, DType.F32);
            using (var q = new Params(ctx))
            {
                q.Add("a", a2);
                q.LoadSafetensors(path);
                Close(a2.ToFloatArray(), new float[] { 1, 2, 3 }, "loaded in place");
                Eq(q.Tensors().Length, 1, "tensors");
                q.Add("extra", ctx.Zeros(new long[] { 1 }, DType.F32));
                Eq(Throws(() => q.LoadSafetensors(path), "strict load").Status, StatusCode.InvalidArgument, "status");
                q.LoadSafetensors(path, ParamsLoad.AllowMissing);
            }
            System.IO.File.Delete(path);
        }
    }

    static void GpuLora()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var w = ctx.FromArray(new float[] { 1, 0, 2, 0, 1, -1 }, 2, 3);
            var x = ctx.FromArray(new float[] { 1, 2, 3 }, 1, 3);
            using (var lora = new Lora(w, null, 2, 4.0))
            {
                Close(lora.Forward(x).ToFloatArray(), new float[] { 7, -1 }, "B = 0: the base layer");
                Tensor[] ab = lora.Adapters();
                Eq(string.Join(",", ab[0].Shape()), "2,3", "A shape"); Eq(string.Join(",", ab[1].Shape()), "2,2", "B shape");
                Assert(ab[0].RequiresGrad() && ab[1].RequiresGrad(), "adapters train");
                Assert(!lora.IsMerged, "not merged");
                lora.Merge();
                Assert(lora.IsMerged, "merged");
                Eq(Throws(() => lora.Merge(), "merge twice").Status, StatusCode.InvalidArgument, "merge twice status");
                lora.Unmerge();
                Close(w.ToFloatArray(), new float[] { 1, 0, 2, 0, 1, -1 }, "weight restored");
            }
            var wg = ctx.FromArray(new float[] { 1, 2 }, 1, 2);
            wg.SetRequiresGrad(true);
            Eq(Throws(() => new Lora(wg, null, 1, 1), "trainable base").Status, StatusCode.InvalidArgument, "base requires grad");
        }
    }

    static void GpuGradScaler()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var p = ctx.FromArray(new float[] { 1, 2 }, 2);
            p.SetRequiresGrad(true);
            var g = ctx.FromArray(new float[] { 0.5f, -1 }, 2);
            using (var opt = new Optimizer(ctx, new OptimizerOptions(OptimizerKind.Sgd) { Lr = 1 }, p))
            using (var scaler = new GradScaler(ctx, new GradScalerOptions { InitScale = 4 }))
            {
                var scaled = scaler.Scale((p * g).SumAll());
                Close(scaled.ToFloatArray(), new float[] { 4 * (0.5f - 2) }, "scaled loss");
                scaled.Backward();
                Assert(scaler.Step(opt), "stepped");
                Close(p.ToFloatArray(), new float[] { 0.5f, 3 }, "p - g (unscaled)");
                scaler.Update();
                Eq(scaler.CurrentScale, 4.0, "scale kept");
                double sc; long tracker;
                scaler.GetState(out sc, out tracker);
                Eq(sc, 4.0, "state scale"); Eq(tracker, 1L, "growth tracker");
                opt.ZeroGrad();
                var bad = ctx.FromArray(new float[] { float.PositiveInfinity, 1 }, 2);
                scaler.Scale((p * bad).SumAll()).Backward();
                Assert(!scaler.Step(opt), "inf: step skipped");
                Close(scaler.FoundInf().ToFloatArray(), new float[] { 1 }, "found inf");
                scaler.Update();
                Eq(scaler.CurrentScale, 2.0, "backed off");
                scaler.SetState(8, 0);
                Eq(scaler.CurrentScale, 8.0, "set state");
                Eq(Throws(() => scaler.SetState(-1, 0), "bad scale").Status, StatusCode.InvalidArgument, "bad scale status");
            }
        }
    }

    static void GpuOptimizerStateRoundTrip()
    {
        string path = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame-cs-opt-" + System.Diagnostics.Process.GetCurrentProcess().Id + ".safetensors");
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var g = ctx.FromArray(new float[] { 0.5f, -1, 2 }, 3);
            var p = ctx.FromArray(new float[] { 1, 2, 3 }, 3);
            p.SetRequiresGrad(true);
            float[] afterOne, afterTwo;
            using (var opt = new Optimizer(ctx, new OptimizerOptions(OptimizerKind.AdamW) { Lr = 0.1 }, p))
            {
                p.Mul(g).SumAll().Backward(); opt.Step(); opt.ZeroGrad();
                afterOne = p.ToFloatArray();
                opt.SaveState(path);
                p.Mul(g).SumAll().Backward(); opt.Step(); opt.ZeroGrad();
                afterTwo = p.ToFloatArray();
            }
            var q = ctx.FromArray(afterOne, 3);
            q.SetRequiresGrad(true);
            using (var opt = new Optimizer(ctx, new OptimizerOptions(OptimizerKind.AdamW) { Lr = 0.7 }, q))
            {
                opt.LoadState(path);
                Eq(opt.StepCount(), 1L, "step count restored");
                Eq(opt.GetLr(), 0.1, "lr restored");
                q.Mul(g).SumAll().Backward(); opt.Step();
                Close(q.ToFloatArray(), afterTwo, "resumed step equals the uninterrupted one");
            }
            using (var sgd = new Optimizer(ctx, new OptimizerOptions(OptimizerKind.Sgd), q))
                Eq(Throws(() => sgd.LoadState(path), "other kind").Status, StatusCode.InvalidArgument, "other kind status");
            System.IO.File.Delete(path);
        }
    }

    static void GpuCheckpoint()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var x = ctx.FromArray(new float[] { 1, 2, 3 }, 3);
            x.SetRequiresGrad(true);
            int calls = 0;
            Tensor[] y = ctx.Checkpoint(ins => { calls++; return new[] { ins[0] * ins[0] }; }, 1, x);
            Eq(calls, 1, "ran once");
            y[0].SumAll().Backward();
            Eq(calls, 2, "ran again in backward");
            Close(x.Grad.ToFloatArray(), new float[] { 2, 4, 6 }, "d(x^2)/dx");
            var e = Throws(() => ctx.Checkpoint(ins => { throw new InvalidOperationException("boom"); }, 1, x), "throwing fn");
            Eq(e.Status, StatusCode.Internal, "an exception becomes FLAME_ERROR_INTERNAL");
            Assert(e.Message.Contains("boom") && e.Message.Contains("InvalidOperationException"), "message carried: " + e.Message);
            e = Throws(() => ctx.Checkpoint(ins => { throw new FlameException(StatusCode.ShapeMismatch, "mine"); }, 1, x), "flame exception");
            Eq(e.Status, StatusCode.ShapeMismatch, "a FlameException keeps its status");
            e = Throws(() => ctx.Checkpoint(ins => new Tensor[0], 1, x), "wrong count");
            Eq(e.Status, StatusCode.InvalidArgument, "wrong output count");
            // a throw during the backward's re-run stops the backward with the status
            int n = 0;
            Tensor[] z = ctx.Checkpoint(ins => { if (++n == 2) throw new InvalidOperationException("second run"); return new[] { ins[0] * 2.0 }; }, 1, x);
            e = Throws(() => z[0].SumAll().Backward(), "backward re-run throws");
            Assert(e.Message.Contains("second run"), "backward message: " + e.Message);
        }
    }

    static void GpuGraphCapture()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var x = ctx.FromArray(new float[4], 4);
            x.CopyFrom(new float[] { 1, 2, 3, 4 });
            Tensor y = null;
            using (Graph graph = ctx.Capture(() => { y = x * 2.0 + 1.0; }))
            {
                graph.Replay();
                Close(y.ToFloatArray(), new float[] { 3, 5, 7, 9 }, "first replay");
                x.CopyFrom(new float[] { 10, 20, 30, 40 });
                graph.Replay();
                Close(y.ToFloatArray(), new float[] { 21, 41, 61, 81 }, "replay reads the new input");
            }
            try { ctx.Capture(() => { throw new InvalidOperationException("in capture"); }); throw new Exception("no throw"); }
            catch (InvalidOperationException) { }
            using (var z = x + 1.0)
                Close(z.ToFloatArray(), new float[] { 11, 21, 31, 41 }, "context usable after a failed capture");
            Eq(Throws(() => x.CopyFrom(new float[3]), "wrong size").Status, StatusCode.InvalidArgument, "copy size");
        }
    }

    static void GpuFused()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        using (var f = new FusedFunction(ctx, "x0 * (1 + x1) + x2", 3))
        {
            var a = ctx.FromArray(new float[] { 1, 2 }, 2);
            var b = ctx.FromArray(new float[] { 0.5f, -1 }, 2);
            var c = ctx.FromArray(new float[] { 10 }, 1);
            Close(f.Call(a, b, c).ToFloatArray(), new float[] { 11.5f, 10 }, "fused");
            var e = Throws(() => new FusedFunction(ctx, "x0 +* x1", 2), "syntax error");
            Eq(e.Status, StatusCode.InvalidArgument, "syntax status");
            Assert(e.Message.Contains("column"), "column named: " + e.Message);
        }
    }

    static void GpuGradStats()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            var a = ctx.FromArray(new float[] { 3, 4 }, 2);
            var b = ctx.FromArray(new float[] { float.NaN, 1 }, 2);
            double[][] rows = ctx.GradStatsHost(a, b);
            Eq(rows.Length, 3, "rows");
            Eq(rows[0][(int)GradStat.Norm], 5.0, "norm");
            Eq(rows[1][(int)GradStat.NanCount], 1.0, "nan count");
            Eq(rows[2][(int)GradStat.Max], 4.0, "max of all");
        }
    }

    static void GpuScopeReleases()
    {
        using (var ctx = Gpu())
        using (var x = ctx.FromArray(new float[] { 1, 2 }, 2))
        {
            ulong inside;
            Tensor kept;
            using (var s = new Scope())
            {
                var t = x * 2.0;
                var u = (t + 1.0).Exp();
                kept = s.Keep(u * 3.0);
                Eq(s.Count, 3, "three intermediates to dispose");
                inside = ctx.GetMemoryStats().LiveTensors;
            }
            ulong after = ctx.GetMemoryStats().LiveTensors;
            Eq(inside - after, 3UL, "the scope released its three intermediates");
            Close(kept.ToFloatArray(), new float[] { (float)(3 * Math.Exp(3)), (float)(3 * Math.Exp(5)) }, "the kept tensor is alive");
            kept.Dispose();
            Eq(after - ctx.GetMemoryStats().LiveTensors, 1UL, "and the kept one by its Dispose");
        }
    }

    static void GpuCommunicator()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        {
            Communicator[] comms;
            try { comms = Communicator.CreateGroup(new[] { ctx }); }
            catch (FlameException e)
            {
                Eq(e.Status, StatusCode.Unsupported, "without NCCL: unsupported");
                Assert(e.Message.Length > 30, "reason given: " + e.Message);
                return;
            }
            using (var comm = comms[0])
            {
                Eq(comm.Rank, 0, "rank"); Eq(comm.Size, 1, "size");
                var t = ctx.FromArray(new float[] { 1, 2 }, 2);
                comm.AllReduce(t, ReduceOp.Sum);
                comm.Broadcast(t, 0);
                Close(comm.AllGather(t).ToFloatArray(), new float[] { 1, 2 }, "all_gather of one rank");
                Close(comm.ReduceScatter(t, ReduceOp.Max).ToFloatArray(), new float[] { 1, 2 }, "reduce_scatter of one rank");
                comm.Synchronize();
                Close(t.ToFloatArray(), new float[] { 1, 2 }, "all_reduce of one rank");
                var p = ctx.FromArray(new float[] { 1, 2 }, 2);
                p.SetRequiresGrad(true);
                using (var dp = new DataParallel(comm, new[] { p }, new DpOptions { BroadcastParameters = false }))
                {
                    dp.SetSync(true);
                    p.MulScalar(3.0).SumAll().Backward();
                    dp.Wait();
                    Close(p.Grad.ToFloatArray(), new float[] { 3, 3 }, "averaged gradient of one rank");
                }
            }
        }
    }

    // ---------------------------------------------------------------- Models

    const string ClipConfig = "{\"vocab_size\":100,\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"max_position_embeddings\":16}";

    static void CpuModelArchitectures()
    {
        string[] names = Model.KnownArchitectures();
        Assert(Array.IndexOf(names, "CLIPTextModel") >= 0 && Array.IndexOf(names, "CLIPTextModelWithProjection") >= 0,
               "known architectures: " + string.Join(", ", names));
        Eq(Model.ParseJsonStringArray(" [ ] ").Length, 0, "empty array");
        string[] parsed = Model.ParseJsonStringArray("[\"a\", \"b\\\"c\\\\\", \"\\u00e9\\n\"]");
        Eq(string.Join("|", parsed), "a|b\"c\\|\u00e9\n", "escapes");
        foreach (string bad in new[] { "", "[", "[\"a\"", "[\"a\",]", "[1]", "{}", "[\"a\"] x", "[\"\\q\"]" })
            Assert(Model.ParseJsonStringArray(bad) == null, "accepted " + bad);
    }

    static void GpuModelClip()
    {
        using (var ctx = Gpu())
        using (var s = new Scope())
        using (var model = Model.Create(ctx, "CLIPTextModel", ClipConfig))
        using (var ps = model.Params())
        {
            Eq(model.Architecture, "CLIPTextModel", "architecture");
            Assert(model.ConfigJson.Contains("hidden_size"), "config " + model.ConfigJson);
            var emb = ps.Find("text_model.embeddings.token_embedding.weight");
            Assert(emb != null, "the transformers name");
            Eq(string.Join(",", emb.Shape()), "100,32", "embedding shape");
            model.SetTraining(true);
            model.SetCheckpointing(1);
            var ids = ctx.FromArray(new long[] { 1, 5, 7, 99, 3, 2, 8, 4 }, 2, 4);
            using (var outs = model.Forward(new Dictionary<string, Tensor> { { "input_ids", ids } }))
            {
                var hidden = outs.Find("last_hidden_state");
                Eq(string.Join(",", hidden.Shape()), "2,4,32", "last_hidden_state shape");
                Eq(string.Join(",", outs.Find("pooler_output").Shape()), "2,32", "pooler_output shape");
                hidden.SumAll().Backward();
            }
            for (long i = 0; i < ps.Count; ++i)
            {
                var p = ps.TensorAt(i);
                var g = p.Grad;
                Assert(g != null, ps.Name(i) + " has a gradient");
                Eq(string.Join(",", g.Shape()), string.Join(",", p.Shape()), ps.Name(i) + " gradient shape");
            }
            var ge = emb.Grad.ToFloatArray();
            bool used = false, unused = true;
            for (int j = 0; j < 32; ++j) { used |= ge[5 * 32 + j] != 0; unused &= ge[6 * 32 + j] == 0; }
            Assert(used && unused, "token 5 has a gradient, token 6 none");

            // save and load back (one diffusers-layout file: the architecture and config as options)
            string dir = System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame_cs_model_" + System.Diagnostics.Process.GetCurrentProcess().Id);
            System.IO.Directory.CreateDirectory(dir);
            string file = System.IO.Path.Combine(dir, "clip.safetensors");
            model.Save(file);
            using (var loaded = Model.Load(ctx, file, "{\"architecture\":\"CLIPTextModel\",\"config\":" + ClipConfig + "}"))
            using (var lp = loaded.Params())
            {
                Eq(lp.Count, ps.Count, "parameter count");
                for (long i = 0; i < ps.Count; ++i)
                {
                    Eq(lp.Name(i), ps.Name(i), "name " + i);
                    Close(lp.TensorAt(i).ToFloatArray(), ps.TensorAt(i).ToFloatArray(), ps.Name(i));
                }
            }
            System.IO.Directory.Delete(dir, true);

            // errors: the message names what is wrong
            var e = Throws(() => Model.Create(ctx, "NoSuchModel"), "unknown architecture");
            Eq(e.Status, StatusCode.InvalidArgument, "status");
            Assert(e.Message.Contains("NoSuchModel") && e.Message.Contains("CLIPTextModel"), e.Message);
            var mask = ctx.Ones(new long[] { 1, 3 }, DType.F32);
            e = Throws(() => model.Forward(new Dictionary<string, Tensor> { { "attention_mask", mask } }), "missing input");
            Eq(e.Status, StatusCode.InvalidArgument, "status");
            Assert(e.Message.Contains("input_ids"), e.Message);
            Eq(Throws(() => model.SetCheckpointing(-1), "negative").Status, StatusCode.InvalidArgument, "status");
            e = Throws(() => model.Save(System.IO.Path.Combine(System.IO.Path.GetTempPath(), "flame_cs_bad.safetensors"), "bfl"),
                       "a layout CLIPTextModel lacks");
            Eq(e.Status, StatusCode.InvalidArgument, "status");
            Assert(e.Message.Contains("bfl") && e.Message.Contains("CLIPTextModel"), e.Message);
        }
    }

    static int Main(string[] args)
    {
        if (args.Length == 1 && args[0] == "--load-probe")
        {
            try { Library.EnsureLoaded(); Console.WriteLine("loaded"); return 0; }
            catch (FlameLoadException e) { Console.WriteLine(e.Message); return 3; }
        }
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
