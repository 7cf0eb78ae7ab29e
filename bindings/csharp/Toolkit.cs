// Hand-written safe wrappers for the exports whose ownership the generator cannot express
// (Ops.g.cs covers the regular ones): convolution / pooling / RoPE with options objects, host
// copies into existing tensors, optimizer state files, gradient statistics, the grad scaler, LoRA
// adapters, gradient checkpointing with a delegate, CUDA graph capture, NCCL communicators and data
// parallelism, fused expressions; and Scope, which disposes the tensors created while it is open.
//
// Each native handle lives in a ReleasingHandle (a SafeHandle calling the C release function once);
// each wrapper carries [Wraps("flame_...")] for the coverage test. Callbacks (checkpoint functions)
// go through static thunks that catch every exception and return it as a status: nothing managed
// unwinds into native code, and the user's delegate stays in a GCHandle until the library calls
// destroy.
using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using Flame.Interop;

namespace Flame
{
    /// <summary>An owned native handle released once by its C release function (flame_*_release).</summary>
    public sealed class ReleasingHandle : SafeHandle
    {
        readonly Action<IntPtr> release;

        /// <summary>Takes over raw; release is called with it exactly once (Dispose or finalizer).</summary>
        public ReleasingHandle(IntPtr raw, Action<IntPtr> release) : base(IntPtr.Zero, true)
        {
            this.release = release;
            SetHandle(raw);
        }

        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        /// <summary>Calls the release function.</summary>
        protected override bool ReleaseHandle() { release(handle); return true; }

        internal IntPtr Get(string what)
        {
            if (IsClosed)
                throw new ObjectDisposedException(what);
            return DangerousGetHandle();
        }
    }

    /// The release functions as delegates. Lambdas in their own class, not method groups of Native:
    /// Mono may bind a P/Invoke when the method naming it is compiled, and the constructors that
    /// take these run before the library is loaded (Library.EnsureLoaded, with $FLAME_LIBRARY).
    static class Releasers
    {
        public static readonly Action<IntPtr> Comm = h => Native.flame_comm_release(h);
        public static readonly Action<IntPtr> Dp = h => Native.flame_dp_release(h);
        public static readonly Action<IntPtr> Zero = h => Native.flame_zero_release(h);
        public static readonly Action<IntPtr> Fused = h => Native.flame_fused_release(h);
        public static readonly Action<IntPtr> GradScaler = h => Native.flame_grad_scaler_release(h);
        public static readonly Action<IntPtr> Graph = h => Native.flame_graph_release(h);
        public static readonly Action<IntPtr> Lora = h => Native.flame_lora_release(h);
        public static readonly Action<IntPtr> Params = h => Native.flame_params_release(h);
        public static readonly Action<IntPtr> Model = h => Native.flame_model_release(h);
    }

    // ------------------------------------------------------------------------------------------
    // Scope
    // ------------------------------------------------------------------------------------------

    /// <summary>Disposes the tensors created on this thread while it is open (the C# counterpart of
    /// a handle scope): <c>using (var s = new Scope()) { var y = ...; return s.Keep(y); }</c>. Keep
    /// hands a tensor to the enclosing scope (or to nobody when there is none). Scopes nest; dispose
    /// them in reverse order of creation. Tensors from other threads are not tracked.</summary>
    public sealed class Scope : IDisposable
    {
        [ThreadStatic] static Scope current;

        readonly Scope parent;
        readonly List<Tensor> owned = new List<Tensor>();                              // in creation order
        readonly Dictionary<Tensor, bool> ownedSet = new Dictionary<Tensor, bool>();  // sets: mscorlib only
        readonly Dictionary<Tensor, bool> kept = new Dictionary<Tensor, bool>();
        bool disposed;

        /// <summary>Opens a scope on this thread; it becomes the innermost one.</summary>
        public Scope()
        {
            parent = current;
            current = this;
        }

        /// <summary>The innermost open scope of this thread, or null.</summary>
        public static Scope Current { get { return current; } }

        /// <summary>The number of tensors the scope will dispose.</summary>
        public int Count { get { return owned.Count - kept.Count; } }

        internal static void Track(Tensor t)
        {
            Scope s = current;
            if (s != null)
                s.Adopt(t);
        }

        void Adopt(Tensor t)
        {
            if (ownedSet.ContainsKey(t))
                return;
            ownedSet[t] = true;
            owned.Add(t);
        }

        /// <summary>Lets t outlive the scope: a tensor this scope tracks moves to the enclosing scope
        /// (or to nobody when there is none); any other tensor is left alone. Returns t.</summary>
        public Tensor Keep(Tensor t)
        {
            if (t == null)
                return null;
            if (disposed)
                throw new ObjectDisposedException("Scope");
            if (ownedSet.ContainsKey(t) && !kept.ContainsKey(t))
            {
                kept[t] = true;
                if (parent != null)
                    parent.Adopt(t);
            }
            return t;
        }

        /// <summary>Keeps every tensor of ts; returns ts.</summary>
        public Tensor[] Keep(params Tensor[] ts)
        {
            if (ts != null)
                foreach (Tensor t in ts)
                    Keep(t);
            return ts;
        }

        /// <summary>Disposes every tracked tensor that was not kept and closes the scope.</summary>
        public void Dispose()
        {
            if (disposed)
                return;
            disposed = true;
            if (current == this)
                current = parent;
            foreach (Tensor t in owned)
                if (!kept.ContainsKey(t))
                    t.Dispose();
            owned.Clear();
            ownedSet.Clear();
            kept.Clear();
        }
    }

    // ------------------------------------------------------------------------------------------
    // Convolution, pooling, RoPE, host copies
    // ------------------------------------------------------------------------------------------

    public sealed partial class Tensor
    {
        unsafe Tensor Conv(string name, Tensor weight, Tensor bias, ConvOptions options)
        {
            IntPtr o = IntPtr.Zero;
            flame_conv_options_t opts = options == null ? default(flame_conv_options_t) : options.O;
            flame_conv_options_t* po = options == null ? null : &opts;
            flame_status_t s;
            if (name == "conv2d") s = Native.flame_conv2d(Raw, RawOf(weight), RawOf(bias), po, &o);
            else if (name == "conv1d") s = Native.flame_conv1d(Raw, RawOf(weight), RawOf(bias), po, &o);
            else s = Native.flame_conv_transpose2d(Raw, RawOf(weight), RawOf(bias), po, &o);
            Status.Check(s);
            GC.KeepAlive(this); GC.KeepAlive(weight); GC.KeepAlive(bias);
            return new Tensor(o);
        }

        /// <summary>flame_conv2d: this is x [N, C, H, W], weight [O, C / groups, kh, kw]; bias [O]
        /// may be null (no bias); options null means the defaults of <see cref="ConvOptions"/>.</summary>
        [Wraps("flame_conv2d")]
        public Tensor Conv2d(Tensor weight, Tensor bias = null, ConvOptions options = null) { return Conv("conv2d", weight, bias, options); }

        /// <summary>flame_conv_transpose2d: this is x [N, C, H, W], weight [C, C_out / groups, kh, kw];
        /// bias [C_out] may be null; options null means the defaults.</summary>
        [Wraps("flame_conv_transpose2d")]
        public Tensor ConvTranspose2d(Tensor weight, Tensor bias = null, ConvOptions options = null) { return Conv("conv_transpose2d", weight, bias, options); }

        /// <summary>flame_conv1d: this is x [N, C, L], weight [O, C / groups, k]; bias [O] may be null;
        /// options null means the defaults (element 0 of each pair is used).</summary>
        [Wraps("flame_conv1d")]
        public Tensor Conv1d(Tensor weight, Tensor bias = null, ConvOptions options = null) { return Conv("conv1d", weight, bias, options); }

        /// <summary>flame_max_pool2d of this [N, C, H, W] or [C, H, W] with options (not null: it holds
        /// the kernel size, e.g. <c>new Pool2dOptions(2, 2)</c>).</summary>
        [Wraps("flame_max_pool2d")]
        public unsafe Tensor MaxPool2d(Pool2dOptions options)
        {
            if (options == null) throw new ArgumentNullException("options");
            flame_pool2d_options_t opts = options.O;
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_max_pool2d(Raw, &opts, &o));
            GC.KeepAlive(this);
            return new Tensor(o);
        }

        /// <summary>flame_avg_pool2d of this [N, C, H, W] or [C, H, W] with options (not null).</summary>
        [Wraps("flame_avg_pool2d")]
        public unsafe Tensor AvgPool2d(Pool2dOptions options)
        {
            if (options == null) throw new ArgumentNullException("options");
            flame_pool2d_options_t opts = options.O;
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_avg_pool2d(Raw, &opts, &o));
            GC.KeepAlive(this);
            return new Tensor(o);
        }

        /// <summary>flame_rope: rotary position embeddings of this; positions (i64 / i32, [T] or [B, T])
        /// may be null (position_offset + t); options null means the defaults of <see cref="RopeOptions"/>.</summary>
        [Wraps("flame_rope")]
        public unsafe Tensor Rope(Tensor positions = null, RopeOptions options = null)
        {
            flame_rope_options_t opts = (options ?? new RopeOptions()).O;
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_rope(Raw, RawOf(positions), &opts, &o));
            GC.KeepAlive(this); GC.KeepAlive(positions);
            return new Tensor(o);
        }

        unsafe void CopyFromHost(void* p, long nbytes)
        {
            Status.Check(Native.flame_copy_from_host(Raw, (IntPtr)p, (UIntPtr)(ulong)nbytes));
            GC.KeepAlive(this);
        }

        /// <summary>flame_copy_from_host: overwrites this contiguous f32 tensor with data (numel values),
        /// in stream order (the static-input pattern of graphs).</summary>
        [Wraps("flame_copy_from_host")]
        public unsafe void CopyFrom(float[] data) { CheckDtype(DType.F32); fixed (float* p = data) CopyFromHost(p, 4L * data.Length); }
        /// <summary>flame_copy_from_host for an f64 tensor.</summary>
        public unsafe void CopyFrom(double[] data) { CheckDtype(DType.F64); fixed (double* p = data) CopyFromHost(p, 8L * data.Length); }
        /// <summary>flame_copy_from_host for an i32 tensor.</summary>
        public unsafe void CopyFrom(int[] data) { CheckDtype(DType.I32); fixed (int* p = data) CopyFromHost(p, 4L * data.Length); }
        /// <summary>flame_copy_from_host for an i64 tensor.</summary>
        public unsafe void CopyFrom(long[] data) { CheckDtype(DType.I64); fixed (long* p = data) CopyFromHost(p, 8L * data.Length); }
    }

    // ------------------------------------------------------------------------------------------
    // Optimizer state files, gradient statistics, checkpointing, graphs (Context / Optimizer)
    // ------------------------------------------------------------------------------------------

    public sealed partial class Optimizer
    {
        /// <summary>flame_optimizer_save_state: writes the optimizer's complete state to a safetensors
        /// file at path (atomically); the parameters are not written.</summary>
        [Wraps("flame_optimizer_save_state")]
        public void SaveState(string path)
        {
            Status.Check(Native.flame_optimizer_save_state(Raw, path));
            GC.KeepAlive(this);
        }

        /// <summary>flame_optimizer_load_state: replaces the state with the one SaveState wrote to path
        /// (same kind, groups and parameter shapes); on any error the optimizer is unchanged.</summary>
        [Wraps("flame_optimizer_load_state")]
        public void LoadState(string path)
        {
            Status.Check(Native.flame_optimizer_load_state(Raw, path));
            GC.KeepAlive(this);
        }
    }

    /// <summary>Columns of a row of <see cref="Context.GradStatsHost"/> (FLAME_STAT_*).</summary>
    public enum GradStat
    {
        /// <summary>L2 norm.</summary>
        Norm = Native.FLAME_STAT_NORM,
        /// <summary>Minimum of the non-NaN values.</summary>
        Min = Native.FLAME_STAT_MIN,
        /// <summary>Maximum of the non-NaN values.</summary>
        Max = Native.FLAME_STAT_MAX,
        /// <summary>Mean.</summary>
        Mean = Native.FLAME_STAT_MEAN,
        /// <summary>Number of NaN values.</summary>
        NanCount = Native.FLAME_STAT_NAN_COUNT,
        /// <summary>Number of infinite values.</summary>
        InfCount = Native.FLAME_STAT_INF_COUNT,
    }

    public sealed partial class Context
    {
        /// <summary>flame_grad_stats_host: statistics of each tensor and of all together, waiting for
        /// the device. Row i &lt; n describes tensors[i], row n the whole list; index a row with
        /// <see cref="GradStat"/>: <c>rows[i][(int)GradStat.Norm]</c>.</summary>
        [Wraps("flame_grad_stats_host")]
        public unsafe double[][] GradStatsHost(params Tensor[] tensors)
        {
            IntPtr[] t = Tensor.RawArray(tensors);
            int cols = Native.FLAME_STAT_COLUMNS;
            var values = new double[(t.Length + 1) * cols];
            fixed (IntPtr* pt = t)
            fixed (double* pv = values)
                Status.Check(Native.flame_grad_stats_host(Raw, t.Length == 0 ? null : pt, t.Length, pv, values.Length));
            GC.KeepAlive(this); GC.KeepAlive(tensors);
            var rows = new double[t.Length + 1][];
            for (int i = 0; i < rows.Length; i++)
            {
                rows[i] = new double[cols];
                Array.Copy(values, i * cols, rows[i], 0, cols);
            }
            return rows;
        }

        // ---- gradient checkpointing ----

        sealed class CheckpointState
        {
            public Func<Tensor[], Tensor[]> Fn;
        }

        static readonly unsafe flame_checkpoint_fn CheckpointThunk = CheckpointCall;
        static readonly flame_destroy_fn CheckpointDestroyThunk = CheckpointDestroy;

        static unsafe flame_status_t CheckpointCall(IntPtr ud, IntPtr* inputs, int nInputs, IntPtr* outputs, int nOutputs)
        {
            try
            {
                var st = (CheckpointState)GCHandle.FromIntPtr(ud).Target;
                using (var scope = new Scope())  // the block's intermediates and input wrappers go at the end
                {
                    var ins = new Tensor[nInputs];
                    for (int i = 0; i < nInputs; i++)
                        ins[i] = Tensor.FromBorrowed(inputs[i]);
                    Tensor[] outs = st.Fn(ins);
                    if (outs == null || outs.Length != nOutputs)
                        throw new FlameException(StatusCode.InvalidArgument, "the function returned " +
                            (outs == null ? "null" : outs.Length.ToString()) + " tensors, expected " + nOutputs);
                    for (int i = 0; i < nOutputs; i++)
                    {
                        if (outs[i] == null)
                            throw new FlameException(StatusCode.InvalidArgument, "output " + i + " is null");
                        Status.Check(Native.flame_tensor_retain(outs[i].Raw));  // a new reference for FLAME
                        outputs[i] = outs[i].Raw;
                    }
                    GC.KeepAlive(outs);
                }
                return flame_status_t.FLAME_OK;
            }
            catch (Exception e)
            {
                return Status.FromException("C# checkpoint function", e);
            }
        }

        static void CheckpointDestroy(IntPtr ud)
        {
            try { GCHandle.FromIntPtr(ud).Free(); }
            catch { }
        }

        /// <summary>flame_checkpoint: runs fn(inputs) without keeping its intermediates and runs it
        /// again during backward to rebuild them. fn must return nOutputs tensors and compute the same
        /// thing both times; tensors it creates are disposed after each run (outputs are handed to
        /// FLAME), tensors it captures are not. An exception in fn becomes the call's (or the
        /// backward's) status: its FlameException status, else FLAME_ERROR_INTERNAL, with its message.
        /// fn is kept alive until FLAME no longer needs it.</summary>
        [Wraps("flame_checkpoint")]
        public unsafe Tensor[] Checkpoint(Func<Tensor[], Tensor[]> fn, int nOutputs, params Tensor[] inputs)
        {
            if (fn == null) throw new ArgumentNullException("fn");
            IntPtr[] ins = Tensor.RawArray(inputs);
            var outs = new IntPtr[Math.Max(nOutputs, 1)];
            GCHandle gh = GCHandle.Alloc(new CheckpointState { Fn = fn });
            flame_status_t s;
            fixed (IntPtr* pi = ins)
            fixed (IntPtr* po = outs)
                s = Native.flame_checkpoint(Raw, CheckpointThunk, GCHandle.ToIntPtr(gh), CheckpointDestroyThunk,
                                            ins.Length == 0 ? null : pi, ins.Length, po, nOutputs);
            // destroy frees gh in every case (also on failure), so it is not touched here.
            GC.KeepAlive(this); GC.KeepAlive(inputs);
            Status.Check(s);
            var r = new Tensor[nOutputs];
            for (int i = 0; i < nOutputs; i++)
                r[i] = new Tensor(outs[i]);
            return r;
        }

        // ---- CUDA graphs ----

        /// <summary>flame_graph_capture_begin: the context's calls from now on are captured, not run,
        /// until <see cref="EndCapture"/>. Prefer <see cref="Capture(Action)"/>.</summary>
        [Wraps("flame_graph_capture_begin")]
        public void BeginCapture()
        {
            Status.Check(Native.flame_graph_capture_begin(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_graph_capture_begin_shared: begins a capture whose private memory pool is
        /// sharePoolWith's (null: a pool of its own), so that graphs of one step at several input
        /// shapes hold about what the largest needs. A tensor kept from one graph's capture may be
        /// overwritten by a replay of another graph of the pool: read it before replaying another.</summary>
        [Wraps("flame_graph_capture_begin_shared")]
        public void BeginCapture(Graph sharePoolWith)
        {
            Status.Check(Native.flame_graph_capture_begin_shared(Raw, sharePoolWith == null ? IntPtr.Zero : sharePoolWith.Raw));
            GC.KeepAlive(this);
            GC.KeepAlive(sharePoolWith);
        }

        /// <summary>flame_graph_capture_end: the captured work as a graph to replay. When a call
        /// failed during the capture this throws its status and the capture is discarded.</summary>
        [Wraps("flame_graph_capture_end")]
        public unsafe Graph EndCapture()
        {
            IntPtr g = IntPtr.Zero;
            Status.Check(Native.flame_graph_capture_end(Raw, &g));
            GC.KeepAlive(this);
            return new Graph(g);
        }

        /// <summary>Captures what body does on this context into a graph (begin, body, end). When body
        /// throws, the capture is ended and discarded and the exception propagates.</summary>
        public Graph Capture(Action body) { return Capture(null, body); }

        /// <summary><see cref="Capture(Action)"/> into the memory pool of sharePoolWith (null: a pool
        /// of its own; see <see cref="BeginCapture(Graph)"/>).</summary>
        public Graph Capture(Graph sharePoolWith, Action body)
        {
            if (body == null) throw new ArgumentNullException("body");
            BeginCapture(sharePoolWith);
            try
            {
                body();
            }
            catch
            {
                DiscardCapture();
                throw;
            }
            return EndCapture();
        }

        unsafe void DiscardCapture()
        {
            IntPtr g = IntPtr.Zero;
            if (Native.flame_graph_capture_end(Raw, &g) == flame_status_t.FLAME_OK && g != IntPtr.Zero)
                Native.flame_graph_release(g);
            GC.KeepAlive(this);
        }
    }

    /// <summary>A captured CUDA graph (flame_graph_t). Dispose releases it; tensors created during
    /// its capture stay valid.</summary>
    public sealed class Graph : IDisposable
    {
        readonly ReleasingHandle h;

        internal Graph(IntPtr raw) { h = new ReleasingHandle(raw, Releasers.Graph); }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Graph"); } }

        /// <summary>flame_graph_replay: runs the captured work once more, asynchronously in stream order.</summary>
        [Wraps("flame_graph_replay")]
        public void Replay()
        {
            Status.Check(Native.flame_graph_replay(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_graph_release.</summary>
        [Wraps("flame_graph_release")]
        public void Dispose() { h.Dispose(); }
    }

    // ------------------------------------------------------------------------------------------
    // Grad scaler
    // ------------------------------------------------------------------------------------------

    /// <summary>Dynamic loss scaling (flame_grad_scaler_t, as torch.cuda.amp.GradScaler):
    /// <c>Scale(loss).Backward(); scaler.Step(opt); scaler.Update();</c>. Dispose releases it.</summary>
    public sealed class GradScaler : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_grad_scaler_create on ctx; options null means the defaults.</summary>
        [Wraps("flame_grad_scaler_create")]
        public GradScaler(Context ctx, GradScalerOptions options = null)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Create(ctx, options), Releasers.GradScaler);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Context ctx, GradScalerOptions options)
        {
            if (ctx == null) throw new ArgumentNullException("ctx");
            flame_grad_scaler_options_t o = options == null ? default(flame_grad_scaler_options_t) : options.O;
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_grad_scaler_create(ctx.Raw, options == null ? null : &o, &raw));
            GC.KeepAlive(ctx);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("GradScaler"); } }

        /// <summary>flame_grad_scaler_release.</summary>
        [Wraps("flame_grad_scaler_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_grad_scaler_scale: loss * scale, recorded in the graph.</summary>
        [Wraps("flame_grad_scaler_scale")]
        public unsafe Tensor Scale(Tensor loss)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_grad_scaler_scale(Raw, Tensor.RawOf(loss), &o));
            GC.KeepAlive(this); GC.KeepAlive(loss);
            return new Tensor(o);
        }

        /// <summary>flame_grad_scaler_unscale: divides the optimizer's gradients by the scale in place.</summary>
        [Wraps("flame_grad_scaler_unscale")]
        public void Unscale(Optimizer optimizer)
        {
            if (optimizer == null) throw new ArgumentNullException("optimizer");
            Status.Check(Native.flame_grad_scaler_unscale(Raw, optimizer.Raw));
            GC.KeepAlive(this); GC.KeepAlive(optimizer);
        }

        /// <summary>flame_grad_scaler_unscale_tensors: as Unscale for tensors (edited in place).</summary>
        [Wraps("flame_grad_scaler_unscale_tensors")]
        public unsafe void UnscaleTensors(params Tensor[] tensors)
        {
            IntPtr[] t = Tensor.RawArray(tensors);
            fixed (IntPtr* p = t)
                Status.Check(Native.flame_grad_scaler_unscale_tensors(Raw, t.Length == 0 ? null : p, t.Length));
            GC.KeepAlive(this); GC.KeepAlive(tensors);
        }

        /// <summary>flame_grad_scaler_step: steps the optimizer unless its gradients held an Inf or NaN;
        /// returns whether it stepped. Waits for the device once.</summary>
        [Wraps("flame_grad_scaler_step")]
        public unsafe bool Step(Optimizer optimizer)
        {
            if (optimizer == null) throw new ArgumentNullException("optimizer");
            int stepped = 0;
            Status.Check(Native.flame_grad_scaler_step(Raw, optimizer.Raw, &stepped));
            GC.KeepAlive(this); GC.KeepAlive(optimizer);
            return stepped != 0;
        }

        /// <summary>flame_grad_scaler_update: backs the scale off or grows it.</summary>
        [Wraps("flame_grad_scaler_update")]
        public void Update()
        {
            Status.Check(Native.flame_grad_scaler_update(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_grad_scaler_get_scale: the current scale (1 when disabled). Waits for the device.</summary>
        [Wraps("flame_grad_scaler_get_scale")]
        public unsafe double CurrentScale
        {
            get
            {
                double s = 0;
                Status.Check(Native.flame_grad_scaler_get_scale(Raw, &s));
                GC.KeepAlive(this);
                return s;
            }
        }

        /// <summary>flame_grad_scaler_found_inf: a 0-d f32 tensor, 1 when an unscaled gradient since the
        /// last update held an Inf or NaN.</summary>
        [Wraps("flame_grad_scaler_found_inf")]
        public unsafe Tensor FoundInf()
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_grad_scaler_found_inf(Raw, &o));
            GC.KeepAlive(this);
            return new Tensor(o);
        }

        /// <summary>flame_grad_scaler_get_state: the scale and the growth tracker, to checkpoint.</summary>
        [Wraps("flame_grad_scaler_get_state")]
        public unsafe void GetState(out double scale, out long growthTracker)
        {
            double s = 0;
            long g = 0;
            Status.Check(Native.flame_grad_scaler_get_state(Raw, &s, &g));
            GC.KeepAlive(this);
            scale = s;
            growthTracker = g;
        }

        /// <summary>flame_grad_scaler_set_state: restores a state from GetState.</summary>
        [Wraps("flame_grad_scaler_set_state")]
        public void SetState(double scale, long growthTracker)
        {
            Status.Check(Native.flame_grad_scaler_set_state(Raw, scale, growthTracker));
            GC.KeepAlive(this);
        }
    }

    // ------------------------------------------------------------------------------------------
    // LoRA
    // ------------------------------------------------------------------------------------------

    /// <summary>A LoRA adapter (flame_lora_t) over a frozen linear weight [out, in] and an optional
    /// bias: Forward(x) = linear(x, weight, bias) + alpha / rank * x A^T B^T. Train
    /// <see cref="Adapters"/> with an optimizer; Merge folds the adapter into the weight. Dispose
    /// releases the adapter (A and B stay alive while referenced).</summary>
    public sealed class Lora : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_lora_create over weight (must not require grad) and bias (may be null).</summary>
        [Wraps("flame_lora_create")]
        public Lora(Tensor weight, Tensor bias, long rank, double alpha)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Create(weight, bias, rank, alpha), Releasers.Lora);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Tensor weight, Tensor bias, long rank, double alpha)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_lora_create(Tensor.RawOf(weight), Tensor.RawOf(bias), rank, alpha, &raw));
            GC.KeepAlive(weight); GC.KeepAlive(bias);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Lora"); } }

        /// <summary>flame_lora_release.</summary>
        [Wraps("flame_lora_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_lora_forward of x [..., in].</summary>
        [Wraps("flame_lora_forward")]
        public unsafe Tensor Forward(Tensor x)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_lora_forward(Raw, Tensor.RawOf(x), &o));
            GC.KeepAlive(this); GC.KeepAlive(x);
            return new Tensor(o);
        }

        /// <summary>flame_lora_adapters: A [rank, in] and B [out, rank] themselves (new references to
        /// the trainable leaves).</summary>
        [Wraps("flame_lora_adapters")]
        public unsafe Tensor[] Adapters()
        {
            IntPtr a = IntPtr.Zero, b = IntPtr.Zero;
            Status.Check(Native.flame_lora_adapters(Raw, &a, &b));
            GC.KeepAlive(this);
            return new[] { new Tensor(a), new Tensor(b) };
        }

        /// <summary>flame_lora_merge: adds scale * B A to the weight in place (keeping a copy).</summary>
        [Wraps("flame_lora_merge")]
        public void Merge()
        {
            Status.Check(Native.flame_lora_merge(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_lora_unmerge: restores the weight bit for bit.</summary>
        [Wraps("flame_lora_unmerge")]
        public void Unmerge()
        {
            Status.Check(Native.flame_lora_unmerge(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_lora_is_merged.</summary>
        [Wraps("flame_lora_is_merged")]
        public unsafe bool IsMerged
        {
            get
            {
                int m = 0;
                Status.Check(Native.flame_lora_is_merged(Raw, &m));
                GC.KeepAlive(this);
                return m != 0;
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Fused expressions
    // ------------------------------------------------------------------------------------------

    /// <summary>A compiled elementwise expression over x0 .. x{n-1} (flame_fused_t), e.g.
    /// <c>new FusedFunction(ctx, "x0 * (1 + x1) + x2", 3)</c>. Dispose releases it.</summary>
    public sealed class FusedFunction : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_fused_compile: parses expr over nInputs inputs (syntax errors name the column).</summary>
        [Wraps("flame_fused_compile")]
        public FusedFunction(Context ctx, string expr, int nInputs)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Compile(ctx, expr, nInputs), Releasers.Fused);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Compile(Context ctx, string expr, int nInputs)
        {
            if (ctx == null) throw new ArgumentNullException("ctx");
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_fused_compile(ctx.Raw, expr, nInputs, &raw));
            GC.KeepAlive(ctx);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("FusedFunction"); } }

        /// <summary>flame_fused_release (graphs built with it stay differentiable).</summary>
        [Wraps("flame_fused_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_fused_call: the expression applied to inputs (broadcast and promoted).</summary>
        [Wraps("flame_fused_call")]
        public unsafe Tensor Call(params Tensor[] inputs)
        {
            IntPtr[] t = Tensor.RawArray(inputs);
            IntPtr o = IntPtr.Zero;
            fixed (IntPtr* p = t)
                Status.Check(Native.flame_fused_call(Raw, t.Length == 0 ? null : p, t.Length, &o));
            GC.KeepAlive(this); GC.KeepAlive(inputs);
            return new Tensor(o);
        }
    }

    // ------------------------------------------------------------------------------------------
    // NCCL communicators and data parallelism
    // ------------------------------------------------------------------------------------------

    /// <summary>One rank of an NCCL communicator (flame_comm_t) bound to one context. Dispose
    /// releases it (on every rank concurrently, as creation).</summary>
    public sealed class Communicator : IDisposable
    {
        readonly ReleasingHandle h;

        Communicator(IntPtr raw) { h = new ReleasingHandle(raw, Releasers.Comm); }

        /// <summary>flame_comm_unique_id: a new communicator identity (128 bytes) to give to every rank.</summary>
        [Wraps("flame_comm_unique_id")]
        public static byte[] UniqueId(Context ctx)
        {
            Library.EnsureLoaded();
            return UniqueIdImpl(ctx);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe byte[] UniqueIdImpl(Context ctx)
        {
            if (ctx == null) throw new ArgumentNullException("ctx");
            flame_comm_id_t id;
            Status.Check(Native.flame_comm_unique_id(ctx.Raw, &id));
            GC.KeepAlive(ctx);
            var r = new byte[Native.FLAME_COMM_ID_BYTES];
            for (int i = 0; i < r.Length; i++) r[i] = id.@internal[i];
            return r;
        }

        /// <summary>flame_comm_rendezvous: hands rank 0's id (128 bytes) to every rank over TCP; needs
        /// no GPU. Rank 0 listens on masterAddr:masterPort and returns id; every other rank returns
        /// rank 0's bytes (id may be null there). Fails (FLAME_ERROR_IO) naming missing ranks.</summary>
        [Wraps("flame_comm_rendezvous")]
        public static byte[] Rendezvous(string masterAddr, int masterPort, int rank, int worldSize, double timeoutSeconds, byte[] id)
        {
            Library.EnsureLoaded();
            return RendezvousImpl(masterAddr, masterPort, rank, worldSize, timeoutSeconds, id);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe byte[] RendezvousImpl(string masterAddr, int masterPort, int rank, int worldSize, double timeoutSeconds, byte[] id)
        {
            if (masterAddr == null) throw new ArgumentNullException("masterAddr");
            if (id != null && id.Length != Native.FLAME_COMM_ID_BYTES)
                throw new ArgumentException("id must hold " + Native.FLAME_COMM_ID_BYTES + " bytes", "id");
            flame_comm_id_t raw;
            for (int i = 0; i < Native.FLAME_COMM_ID_BYTES; i++) raw.@internal[i] = id == null ? (byte)0 : id[i];
            Status.Check(Native.flame_comm_rendezvous(masterAddr, masterPort, rank, worldSize, timeoutSeconds, &raw));
            var r = new byte[Native.FLAME_COMM_ID_BYTES];
            for (int i = 0; i < r.Length; i++) r[i] = raw.@internal[i];
            return r;
        }

        /// <summary>flame_comm_create: rank `rank` of worldSize ranks on ctx's GPU, waiting until all
        /// joined; id from <see cref="UniqueId"/>; options null means the defaults.</summary>
        [Wraps("flame_comm_create")]
        public static Communicator Create(Context ctx, byte[] id, int rank, int worldSize, CommOptions options = null)
        {
            Library.EnsureLoaded();
            return new Communicator(CreateImpl(ctx, id, rank, worldSize, options));
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr CreateImpl(Context ctx, byte[] id, int rank, int worldSize, CommOptions options)
        {
            if (ctx == null) throw new ArgumentNullException("ctx");
            if (id == null || id.Length != Native.FLAME_COMM_ID_BYTES)
                throw new ArgumentException("id must hold " + Native.FLAME_COMM_ID_BYTES + " bytes (Communicator.UniqueId)");
            flame_comm_id_t cid;
            for (int i = 0; i < id.Length; i++) cid.@internal[i] = id[i];
            flame_comm_options_t o = options == null ? default(flame_comm_options_t) : options.O;
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_comm_create(ctx.Raw, &cid, rank, worldSize, options == null ? null : &o, &raw));
            GC.KeepAlive(ctx);
            return raw;
        }

        /// <summary>flame_comm_env_local_rank: LOCAL_RANK of a launched job (flame-run, torchrun),
        /// the device to create this process's context on; needs no GPU. Fails naming a missing or
        /// malformed launch variable.</summary>
        [Wraps("flame_comm_env_local_rank")]
        public static int EnvLocalRank()
        {
            Library.EnsureLoaded();
            return EnvLocalRankImpl();
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe int EnvLocalRankImpl()
        {
            int v = 0;
            Status.Check(Native.flame_comm_env_local_rank(&v));
            return v;
        }

        /// <summary>flame_comm_create_from_env: this process's rank of a launched job (RANK,
        /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; FLAME_RENDEZVOUS_TIMEOUT), meeting the
        /// other ranks over TCP; ctx must be on device LOCAL_RANK; options null means the defaults.</summary>
        [Wraps("flame_comm_create_from_env")]
        public static Communicator CreateFromEnv(Context ctx, CommOptions options = null)
        {
            Library.EnsureLoaded();
            return new Communicator(CreateFromEnvImpl(ctx, options));
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr CreateFromEnvImpl(Context ctx, CommOptions options)
        {
            if (ctx == null) throw new ArgumentNullException("ctx");
            flame_comm_options_t o = options == null ? default(flame_comm_options_t) : options.O;
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_comm_create_from_env(ctx.Raw, options == null ? null : &o, &raw));
            GC.KeepAlive(ctx);
            return raw;
        }

        /// <summary>flame_comm_create_group: the ranks of one communicator from one thread, rank i on
        /// contexts[i] (distinct GPUs).</summary>
        [Wraps("flame_comm_create_group")]
        public static Communicator[] CreateGroup(Context[] contexts, CommOptions options = null)
        {
            Library.EnsureLoaded();
            IntPtr[] raws = CreateGroupImpl(contexts, options);
            var r = new Communicator[raws.Length];
            for (int i = 0; i < raws.Length; i++) r[i] = new Communicator(raws[i]);
            return r;
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr[] CreateGroupImpl(Context[] contexts, CommOptions options)
        {
            if (contexts == null || contexts.Length == 0) throw new ArgumentException("contexts must not be empty");
            var c = new IntPtr[contexts.Length];
            for (int i = 0; i < c.Length; i++) c[i] = contexts[i].Raw;
            var outs = new IntPtr[c.Length];
            flame_comm_options_t o = options == null ? default(flame_comm_options_t) : options.O;
            fixed (IntPtr* pc = c)
            fixed (IntPtr* po = outs)
                Status.Check(Native.flame_comm_create_group(pc, c.Length, options == null ? null : &o, po));
            GC.KeepAlive(contexts);
            return outs;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Communicator"); } }

        /// <summary>flame_comm_release.</summary>
        [Wraps("flame_comm_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_comm_rank.</summary>
        [Wraps("flame_comm_rank")]
        public unsafe int Rank { get { int r = 0; Status.Check(Native.flame_comm_rank(Raw, &r)); GC.KeepAlive(this); return r; } }

        /// <summary>flame_comm_size: the world size.</summary>
        [Wraps("flame_comm_size")]
        public unsafe int Size { get { int r = 0; Status.Check(Native.flame_comm_size(Raw, &r)); GC.KeepAlive(this); return r; } }

        /// <summary>flame_comm_synchronize: waits (up to the timeout) until the context's stream is idle.</summary>
        [Wraps("flame_comm_synchronize")]
        public void Synchronize() { Status.Check(Native.flame_comm_synchronize(Raw)); GC.KeepAlive(this); }

        /// <summary>flame_comm_all_reduce: t (contiguous) becomes the reduction of t over all ranks.</summary>
        [Wraps("flame_comm_all_reduce")]
        public void AllReduce(Tensor t, ReduceOp op = ReduceOp.Sum)
        {
            Status.Check(Native.flame_comm_all_reduce(Raw, Tensor.RawOf(t), (int)op));
            GC.KeepAlive(this); GC.KeepAlive(t);
        }

        /// <summary>flame_comm_broadcast: t (contiguous) becomes rank root's t.</summary>
        [Wraps("flame_comm_broadcast")]
        public void Broadcast(Tensor t, int root)
        {
            Status.Check(Native.flame_comm_broadcast(Raw, Tensor.RawOf(t), root));
            GC.KeepAlive(this); GC.KeepAlive(t);
        }

        /// <summary>flame_comm_all_gather: every rank's input concatenated along dim 0.</summary>
        [Wraps("flame_comm_all_gather")]
        public unsafe Tensor AllGather(Tensor input)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_comm_all_gather(Raw, Tensor.RawOf(input), &o));
            GC.KeepAlive(this); GC.KeepAlive(input);
            return new Tensor(o);
        }

        /// <summary>flame_comm_reduce_scatter: this rank's block of the reduction of input over all ranks.</summary>
        [Wraps("flame_comm_reduce_scatter")]
        public unsafe Tensor ReduceScatter(Tensor input, ReduceOp op = ReduceOp.Sum)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_comm_reduce_scatter(Raw, Tensor.RawOf(input), (int)op, &o));
            GC.KeepAlive(this); GC.KeepAlive(input);
            return new Tensor(o);
        }
    }

    /// <summary>Data-parallel gradient synchronisation over a communicator (flame_dp_t, as torch DDP):
    /// after each backward with Sync on, call Wait on every rank, then step. Dispose releases it.</summary>
    public sealed class DataParallel : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_dp_create (collective): parameters are contiguous floating leaves that require
        /// grad; options null means the defaults.</summary>
        [Wraps("flame_dp_create")]
        public DataParallel(Communicator comm, Tensor[] parameters, DpOptions options = null)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Create(comm, parameters, options), Releasers.Dp);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Communicator comm, Tensor[] parameters, DpOptions options)
        {
            if (comm == null) throw new ArgumentNullException("comm");
            IntPtr[] p = Tensor.RawArray(parameters);
            flame_dp_options_t o = options == null ? default(flame_dp_options_t) : options.O;
            IntPtr raw = IntPtr.Zero;
            fixed (IntPtr* pp = p)
                Status.Check(Native.flame_dp_create(comm.Raw, p.Length == 0 ? null : pp, p.Length, options == null ? null : &o, &raw));
            GC.KeepAlive(comm); GC.KeepAlive(parameters);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("DataParallel"); } }

        /// <summary>flame_dp_release.</summary>
        [Wraps("flame_dp_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_dp_set_sync: whether backward all-reduces (true, the default) or only accumulates.</summary>
        [Wraps("flame_dp_set_sync")]
        public void SetSync(bool sync)
        {
            Status.Check(Native.flame_dp_set_sync(Raw, sync ? 1 : 0));
            GC.KeepAlive(this);
        }

        /// <summary>flame_dp_wait: finishes the round; .grad of every parameter becomes the average.</summary>
        [Wraps("flame_dp_wait")]
        public void Wait()
        {
            Status.Check(Native.flame_dp_wait(Raw));
            GC.KeepAlive(this);
        }
    }

    /// <summary>Optimizer state sharded over the ranks of a communicator (flame_zero_t, ZeRO-1 or
    /// ZeRO-2), and with a model a model's block parameters too (ZeRO-3); Step replaces
    /// DataParallel.Wait + Optimizer.Step. Dispose releases it (the optimizer stays sharded).</summary>
    public sealed class Zero : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_zero_create (collective): shards opt (not stepped yet) over comm; options
        /// null means the defaults (stage 1, parameters broadcast from rank 0, no clipping).</summary>
        [Wraps("flame_zero_create")]
        public Zero(Communicator comm, Optimizer opt, ZeroOptions options = null)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Create(comm, opt, options), Releasers.Zero);
        }

        /// <summary>flame_zero_create with stage 3 (collective): shards model's block parameters as
        /// well as opt over comm. The model must have run one forward (gradients may be off) so that
        /// it knows its blocks; its sharded parameters then hold no values of their own (GatherParams
        /// gathers them). options null means the defaults; its Stage is ignored (3).</summary>
        [Wraps("flame_zero_create")]
        public Zero(Communicator comm, Optimizer opt, Model model, ZeroOptions options = null)
        {
            Library.EnsureLoaded();
            if (model == null) throw new ArgumentNullException("model");
            h = new ReleasingHandle(Create(comm, opt, options, model), Releasers.Zero);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Communicator comm, Optimizer opt, ZeroOptions options, Model model = null)
        {
            if (comm == null) throw new ArgumentNullException("comm");
            if (opt == null) throw new ArgumentNullException("opt");
            flame_zero_options_t o = options == null ? new ZeroOptions().O : options.O;
            if (model != null)
            {
                o.stage = 3;
                o.model = model.Raw;
            }
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_zero_create(comm.Raw, opt.Raw, options == null && model == null ? null : &o, &raw));
            GC.KeepAlive(comm); GC.KeepAlive(opt); GC.KeepAlive(model);
            return raw;
        }

        /// <summary>flame_zero_gather_params (collective, stage 3): every parameter of the model with
        /// its values, the sharded ones gathered into new tensors (dispose the list).</summary>
        [Wraps("flame_zero_gather_params")]
        public unsafe Params GatherParams()
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_zero_gather_params(Raw, &raw));
            GC.KeepAlive(this);
            return new Params(raw);
        }

        /// <summary>flame_zero_save_full (collective): gathers every rank's parameters and optimizer
        /// state; rank 0 writes them to one safetensors file at path (loadable on any number of ranks).</summary>
        [Wraps("flame_zero_save_full")]
        public void SaveFull(string path)
        {
            Status.Check(Native.flame_zero_save_full(Raw, path));
            GC.KeepAlive(this);
        }

        /// <summary>flame_zero_save_shards: this rank writes its shard file
        /// "&lt;pathPrefix&gt;-&lt;rank&gt;-of-&lt;world&gt;.safetensors"; no communication.</summary>
        [Wraps("flame_zero_save_shards")]
        public void SaveShards(string pathPrefix)
        {
            Status.Check(Native.flame_zero_save_shards(Raw, pathPrefix));
            GC.KeepAlive(this);
        }

        /// <summary>flame_zero_load: loads a gathered file or a shard set saved on any number of ranks
        /// (path: any file of the set) into this rank's parameters and optimizer state.</summary>
        [Wraps("flame_zero_load")]
        public void Load(string path)
        {
            Status.Check(Native.flame_zero_load(Raw, path));
            GC.KeepAlive(this);
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Zero"); } }

        /// <summary>flame_zero_release.</summary>
        [Wraps("flame_zero_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_zero_step (collective): averages the gradients over the ranks, clips them
        /// (MaxGradNorm), steps this rank's shard and all-gathers the parameters. Returns the global
        /// gradient norm (a 0-d f32 tensor) when wantNorm, else null.</summary>
        [Wraps("flame_zero_step")]
        public unsafe Tensor Step(bool wantNorm = false)
        {
            IntPtr norm = IntPtr.Zero;
            Status.Check(Native.flame_zero_step(Raw, wantNorm ? &norm : null));
            GC.KeepAlive(this);
            return wantNorm ? new Tensor(norm) : null;
        }
    }

    public sealed partial class Optimizer
    {
        /// <summary>flame_optimizer_state_bytes: device bytes of this rank's optimizer state.</summary>
        [Wraps("flame_optimizer_state_bytes")]
        public unsafe ulong StateBytes()
        {
            ulong n = 0;
            Status.Check(Native.flame_optimizer_state_bytes(Raw, &n));
            GC.KeepAlive(this);
            return n;
        }
    }

    // ------------------------------------------------------------------------------------------
    // Named parameter lists
    // ------------------------------------------------------------------------------------------

    /// <summary>Flags of <see cref="Params.LoadSafetensors"/> (0 is strict, as PyTorch's load_state_dict).</summary>
    [Flags]
    public enum ParamsLoad : uint
    {
        /// <summary>Every entry must be in the file and every file tensor an entry; dtypes equal.</summary>
        Strict = 0,
        /// <summary>A parameter the file lacks keeps its value.</summary>
        AllowMissing = 1,
        /// <summary>A file tensor no parameter is named after is ignored.</summary>
        AllowUnexpected = 2,
        /// <summary>Both (PyTorch's strict=False).</summary>
        NonStrict = 3,
        /// <summary>A file tensor of another dtype is converted to the parameter's.</summary>
        ConvertDType = 4,
    }

    /// <summary>An ordered list of named tensors of one context (flame_params_t): a model's parameters,
    /// saved to and loaded from a safetensors file in one call each. The list holds its own references;
    /// tensors taken from it are new C# handles the caller disposes.</summary>
    public sealed class Params : IDisposable
    {
        readonly ReleasingHandle h;

        /// <summary>flame_params_create: an empty list on ctx.</summary>
        [Wraps("flame_params_create")]
        public Params(Context ctx)
        {
            Library.EnsureLoaded();
            h = new ReleasingHandle(Create(ctx), Releasers.Params);
        }

        // Takes over a list the library made (an OUT handle).
        internal Params(IntPtr owned)
        {
            h = new ReleasingHandle(owned, Releasers.Params);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Context ctx)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_params_create(ctx.Raw, &raw));
            GC.KeepAlive(ctx);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Params"); } }

        /// <summary>flame_params_release.</summary>
        [Wraps("flame_params_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_params_add: appends t under name (the list takes a reference of its own).</summary>
        [Wraps("flame_params_add")]
        public void Add(string name, Tensor t)
        {
            Status.Check(Native.flame_params_add(Raw, name, Tensor.RawOf(t)));
            GC.KeepAlive(this); GC.KeepAlive(t);
        }

        /// <summary>flame_params_count: the number of entries.</summary>
        [Wraps("flame_params_count")]
        public unsafe long Count
        {
            get
            {
                long n = 0;
                Status.Check(Native.flame_params_count(Raw, &n));
                GC.KeepAlive(this);
                return n;
            }
        }

        /// <summary>flame_params_name: the name of entry index.</summary>
        [Wraps("flame_params_name")]
        public unsafe string Name(long index)
        {
            byte* n = null;
            Status.Check(Native.flame_params_name(Raw, index, &n));
            string name = Utf8.Read(n);
            GC.KeepAlive(this);
            return name;
        }

        /// <summary>flame_params_tensor: the tensor of entry index, as a new handle (dispose it).</summary>
        [Wraps("flame_params_tensor")]
        public unsafe Tensor TensorAt(long index)
        {
            IntPtr t = IntPtr.Zero;
            Status.Check(Native.flame_params_tensor(Raw, index, &t));
            Tensor r = Tensor.FromBorrowed(t);
            GC.KeepAlive(this);
            return r;
        }

        /// <summary>flame_params_tensors: every entry's tensor in order, as new handles (dispose them;
        /// e.g. for an optimizer).</summary>
        [Wraps("flame_params_tensors")]
        public unsafe Tensor[] Tensors()
        {
            long n = Count;
            IntPtr* ts = null;
            Status.Check(Native.flame_params_tensors(Raw, &ts));
            var r = new Tensor[n];
            for (long i = 0; i < n; ++i) r[i] = Tensor.FromBorrowed(ts[i]);
            GC.KeepAlive(this);
            return r;
        }

        /// <summary>flame_params_find: the tensor called name as a new handle, or null when there is none.</summary>
        [Wraps("flame_params_find")]
        public unsafe Tensor Find(string name)
        {
            IntPtr t = IntPtr.Zero;
            Status.Check(Native.flame_params_find(Raw, name, &t));
            Tensor r = t == IntPtr.Zero ? null : Tensor.FromBorrowed(t);
            GC.KeepAlive(this);
            return r;
        }

        /// <summary>flame_params_save_safetensors: every entry under its name, with metadata (may be null).</summary>
        [Wraps("flame_params_save_safetensors")]
        public unsafe void SaveSafetensors(string path, IDictionary<string, string> metadata = null)
        {
            var strings = new List<IntPtr>();
            try
            {
                var kv = new IntPtr[Math.Max(2 * (metadata == null ? 0 : metadata.Count), 1)];
                int nm = 0;
                if (metadata != null)
                    foreach (var e in metadata)
                    {
                        kv[2 * nm] = Utf8.Alloc(e.Key); strings.Add(kv[2 * nm]);
                        kv[2 * nm + 1] = Utf8.Alloc(e.Value); strings.Add(kv[2 * nm + 1]);
                        ++nm;
                    }
                fixed (IntPtr* m = kv)
                    Status.Check(Native.flame_params_save_safetensors(Raw, path, nm == 0 ? null : (byte**)m, nm));
                GC.KeepAlive(this);
            }
            finally
            {
                foreach (IntPtr q in strings) Utf8.Free(q);
            }
        }

        /// <summary>flame_params_load_safetensors: copies the file's tensors into the entries of the same
        /// names, in place; nothing changes on an error.</summary>
        [Wraps("flame_params_load_safetensors")]
        public void LoadSafetensors(string path, ParamsLoad flags = ParamsLoad.Strict)
        {
            Status.Check(Native.flame_params_load_safetensors(Raw, path, (uint)flags));
            GC.KeepAlive(this);
        }
    }

    // ------------------------------------------------------------------------------------------
    // Models (flame.h "Models"): one handle for every architecture; parameters and forward inputs
    // and outputs are named Params lists. KnownArchitectures parses the library's JSON array with a
    // small reader (Mono's profile here has no JSON library).
    // ------------------------------------------------------------------------------------------

    /// <summary>flame_memory_estimate_t: Model.EstimateMemory's parts of a training step's peak, in bytes.</summary>
    public struct MemoryEstimate
    {
        /// <summary>The model's parameters on the device (exact).</summary>
        public ulong WeightsBytes;
        /// <summary>The LoRA tensors (exact).</summary>
        public ulong AdapterBytes;
        /// <summary>Gradients of what is trained (exact).</summary>
        public ulong GradientBytes;
        /// <summary>Optimizer state (exact).</summary>
        public ulong OptimizerBytes;
        /// <summary>What the forward keeps for backward, and backward's transients (estimated).</summary>
        public ulong ActivationBytes;
        /// <summary>cuBLASLt's workspace.</summary>
        public ulong WorkspaceBytes;
        /// <summary>The expected peak: the sum of the parts.</summary>
        public ulong TotalBytes;
        /// <summary>Elements of the model's parameters.</summary>
        public ulong ParameterCount;
        /// <summary>Elements trained.</summary>
        public ulong TrainableCount;
    }

    /// <summary>A diffusion or text-encoder model (flame_model_t): the architecture of diffusers' or
    /// transformers' class of that name, made from a config or loaded from checkpoint files. Its
    /// parameters are ordinary tensors under the reference's names; its forward pass takes and
    /// returns named tensors and is recorded for backward:
    /// <code>
    /// using (var m = Model.Create(ctx, "CLIPTextModel", configJson))
    /// using (var outs = m.Forward(new Dictionary&lt;string, Tensor&gt; { { "input_ids", ids } }))
    ///     outs.Find("last_hidden_state").SumAll().Backward();
    /// </code>
    /// Use a model from one thread at a time; it keeps its context alive.</summary>
    public sealed class Model : IDisposable
    {
        readonly ReleasingHandle h;

        Model(IntPtr owned) { h = new ReleasingHandle(owned, Releasers.Model); }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw { get { return h.Get("Model"); } }

        /// <summary>flame_model_release.</summary>
        [Wraps("flame_model_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_model_known_architectures as the library returns it: a JSON array of strings.</summary>
        [Wraps("flame_model_known_architectures")]
        public static unsafe string KnownArchitecturesJson()
        {
            Library.EnsureLoaded();
            return Known();
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe string Known()
        {
            byte* p = null;
            Status.Check(Native.flame_model_known_architectures(&p));
            return Utf8.Read(p);
        }

        /// <summary>flame_model_estimate_memory: the expected peak device memory of a training step
        /// (bytes per part; TotalBytes the peak), from a request JSON object ("architecture" and
        /// "config", or "path"; "options", "lora", "batch", "height", "width", "text_tokens",
        /// "checkpointing", "optimizer": flame.h documents them). Needs no GPU and reads no weights.</summary>
        [Wraps("flame_model_estimate_memory")]
        public static MemoryEstimate EstimateMemory(string requestJson)
        {
            Library.EnsureLoaded();
            return Estimate(requestJson);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe MemoryEstimate Estimate(string requestJson)
        {
            flame_memory_estimate_t e = default(flame_memory_estimate_t);
            e.struct_size = (UIntPtr)sizeof(flame_memory_estimate_t);
            Status.Check(Native.flame_model_estimate_memory(requestJson, &e));
            return new MemoryEstimate
            {
                WeightsBytes = e.weights_bytes, AdapterBytes = e.adapter_bytes, GradientBytes = e.gradient_bytes,
                OptimizerBytes = e.optimizer_bytes, ActivationBytes = e.activation_bytes,
                WorkspaceBytes = e.workspace_bytes, TotalBytes = e.total_bytes, ParameterCount = e.parameter_count,
                TrainableCount = e.trainable_count,
            };
        }

        /// <summary>The architecture names Create knows ("CLIPTextModel", "UNet2DConditionModel", ...).
        /// Needs no GPU.</summary>
        public static string[] KnownArchitectures()
        {
            string json = KnownArchitecturesJson();
            string[] names = ParseJsonStringArray(json);
            if (names == null)
                throw new FormatException("flame_model_known_architectures returned " + json);
            return names;
        }

        /// <summary>Parses a JSON array of strings (escapes decoded); null for anything else.</summary>
        public static string[] ParseJsonStringArray(string json)
        {
            var r = new List<string>();
            int i = 0;
            Func<bool> ws = () => { while (i < json.Length && char.IsWhiteSpace(json[i])) ++i; return i < json.Length; };
            if (json == null || !ws() || json[i++] != '[') return null;
            if (!ws()) return null;
            if (json[i] == ']') { ++i; ws(); return i == json.Length ? r.ToArray() : null; }
            while (true)
            {
                if (!ws() || json[i++] != '"') return null;
                var sb = new System.Text.StringBuilder();
                while (true)
                {
                    if (i >= json.Length) return null;
                    char c = json[i++];
                    if (c == '"') break;
                    if (c < 0x20) return null;
                    if (c != '\\') { sb.Append(c); continue; }
                    if (i >= json.Length) return null;
                    char e = json[i++];
                    switch (e)
                    {
                        case '"': sb.Append('"'); break;
                        case '\\': sb.Append('\\'); break;
                        case '/': sb.Append('/'); break;
                        case 'b': sb.Append('\b'); break;
                        case 'f': sb.Append('\f'); break;
                        case 'n': sb.Append('\n'); break;
                        case 'r': sb.Append('\r'); break;
                        case 't': sb.Append('\t'); break;
                        case 'u':
                            int v;
                            if (i + 4 > json.Length || !int.TryParse(json.Substring(i, 4), System.Globalization.NumberStyles.AllowHexSpecifier, null, out v)) return null;
                            i += 4;
                            sb.Append((char)v); // UTF-16 code units: surrogate pairs join by themselves
                            break;
                        default: return null;
                    }
                }
                r.Add(sb.ToString());
                if (!ws()) return null;
                char sep = json[i++];
                if (sep == ']') break;
                if (sep != ',') return null;
            }
            ws();
            return i == json.Length ? r.ToArray() : null;
        }

        /// <summary>flame_model_create: a new model of architecture (a name KnownArchitectures lists) with
        /// configJson (a JSON object as the reference's config.json; null for the class's defaults) and
        /// optionsJson ({"dtype": "f32"|"f16"|"bf16"|"f64", "compute_dtype": ...}; null for f32).</summary>
        [Wraps("flame_model_create")]
        public static unsafe Model Create(Context ctx, string architecture, string configJson = null, string optionsJson = null)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_create(ctx.Raw, architecture, configJson, optionsJson, &raw));
            GC.KeepAlive(ctx);
            return new Model(raw);
        }

        /// <summary>flame_model_load: a model from a diffusers model or pipeline folder, or a single
        /// safetensors file; optionsJson may name "architecture", "config", "component" and "dtype".</summary>
        [Wraps("flame_model_load")]
        public static unsafe Model Load(Context ctx, string path, string optionsJson = null)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_load(ctx.Raw, path, optionsJson, &raw));
            GC.KeepAlive(ctx);
            return new Model(raw);
        }

        /// <summary>flame_model_save: the parameters in one safetensors file at path (atomic
        /// replacement) in layout: "diffusers" (the default: the reference's diffusers / transformers
        /// names, as Params lists them), "original" (the class's usual single-file layout: BFL names for
        /// Flux, SGM / LDM names for the UNet and the VAE, ...) or an explicit one ("bfl", "comfyui",
        /// "sgm", "ldm", "sd3"; flame.h lists them per class). A layout the class does not have throws
        /// naming the layout and the class.</summary>
        [Wraps("flame_model_save")]
        public void Save(string path, string layout = "diffusers")
        {
            if (layout == null) throw new ArgumentNullException(nameof(layout));
            Status.Check(Native.flame_model_save(Raw, path, layout));
            GC.KeepAlive(this);
        }

        /// <summary>flame_model_architecture: the architecture's name.</summary>
        [Wraps("flame_model_architecture")]
        public unsafe string Architecture
        {
            get
            {
                byte* p = null;
                Status.Check(Native.flame_model_architecture(Raw, &p));
                string r = Utf8.Read(p);
                GC.KeepAlive(this);
                return r;
            }
        }

        /// <summary>flame_model_config: the complete configuration as a JSON object.</summary>
        [Wraps("flame_model_config")]
        public unsafe string ConfigJson
        {
            get
            {
                byte* p = null;
                Status.Check(Native.flame_model_config(Raw, &p));
                string r = Utf8.Read(p);
                GC.KeepAlive(this);
                return r;
            }
        }

        /// <summary>flame_model_params: the parameters under the reference's names, in state_dict order
        /// (a new list: dispose it). The tensors are the model's own.</summary>
        [Wraps("flame_model_params")]
        public unsafe Params Params()
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_params(Raw, &raw));
            GC.KeepAlive(this);
            return new Params(raw);
        }

        /// <summary>flame_model_forward on an input list: the named outputs (dispose the list).</summary>
        [Wraps("flame_model_forward")]
        public unsafe Params Forward(Params inputs)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_forward(Raw, inputs == null ? IntPtr.Zero : inputs.Raw, &raw));
            GC.KeepAlive(this); GC.KeepAlive(inputs);
            return new Params(raw);
        }

        /// <summary>flame_model_forward on named inputs (the names the reference's forward() takes,
        /// e.g. input_ids, sample, timestep, encoder_hidden_states).</summary>
        public Params Forward(IDictionary<string, Tensor> inputs)
        {
            if (inputs == null || inputs.Count == 0)
                throw new ArgumentException("Model.Forward: no inputs");
            Context ctx = null;
            foreach (var e in inputs) { ctx = e.Value.GetContext(); break; }
            using (var list = new Params(ctx))
            {
                foreach (var e in inputs) list.Add(e.Key, e.Value);
                return Forward(list);
            }
        }

        /// <summary>flame_model_set_training: training mode (true) or evaluation mode (false, initial).</summary>
        [Wraps("flame_model_set_training")]
        public void SetTraining(bool training)
        {
            Status.Check(Native.flame_model_set_training(Raw, training ? 1 : 0));
            GC.KeepAlive(this);
        }

        /// <summary>flame_model_set_checkpointing: gradient checkpointing of every everyNBlocks-th block
        /// (0 off, the initial policy; 1 every block).</summary>
        [Wraps("flame_model_set_checkpointing")]
        public void SetCheckpointing(long everyNBlocks)
        {
            Status.Check(Native.flame_model_set_checkpointing(Raw, everyNBlocks));
            GC.KeepAlive(this);
        }

        /// <summary>flame_model_add_lora: a LoRA adapter on the model's linear layers beside the frozen
        /// weights (optionsJson as flame.h documents it, e.g. {"rank": 16, "alpha": 16}; null for the
        /// defaults). Returns the adapter's tensors for an optimizer.</summary>
        [Wraps("flame_model_add_lora")]
        public unsafe Params AddLora(string optionsJson = null)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_add_lora(Raw, optionsJson, &raw));
            GC.KeepAlive(this);
            return new Params(raw);
        }

        /// <summary>flame_model_lora_params: the tensors of the adapter name (null: "default").</summary>
        [Wraps("flame_model_lora_params")]
        public unsafe Params LoraParams(string name = null)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_lora_params(Raw, name, &raw));
            GC.KeepAlive(this);
            return new Params(raw);
        }

        /// <summary>flame_model_save_lora: the adapter name (null: "default") as a LoRA file
        /// (optionsJson: {"format": "kohya"|"peft", "component", "dtype", "metadata"}; null: kohya).</summary>
        [Wraps("flame_model_save_lora")]
        public void SaveLora(string name, string path, string optionsJson = null)
        {
            Status.Check(Native.flame_model_save_lora(Raw, name, path, optionsJson));
            GC.KeepAlive(this);
        }

        /// <summary>flame_model_load_lora: a LoRA file (kohya or peft) as a new adapter (optionsJson:
        /// {"name", "component", "multiplier", "dtype", "trainable"}). Returns its tensors.</summary>
        [Wraps("flame_model_load_lora")]
        public unsafe Params LoadLora(string path, string optionsJson = null)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_model_load_lora(Raw, path, optionsJson, &raw));
            GC.KeepAlive(this);
            return new Params(raw);
        }

        /// <summary>flame_model_remove_lora: removes the adapter name (null: "default").</summary>
        [Wraps("flame_model_remove_lora")]
        public void RemoveLora(string name = null)
        {
            Status.Check(Native.flame_model_remove_lora(Raw, name));
            GC.KeepAlive(this);
        }

        /// <summary>flame_model_merge_lora: folds the adapter name (null: "default") into the model's
        /// weights (W + multiplier * scale * B A, or DoRA's normalised weight; f32 on the device, stored
        /// in the weight's dtype) and removes it.</summary>
        [Wraps("flame_model_merge_lora")]
        public void MergeLora(string name = null)
        {
            Status.Check(Native.flame_model_merge_lora(Raw, name));
            GC.KeepAlive(this);
        }
    }

    /// <summary>Exports that have no C# wrapper on purpose, with the reason (Tests.cs CpuCoverage
    /// accepts exactly these).</summary>
    public static class NotWrapped
    {
        const string ScopeReason = "a C handle scope releases the handles it recorded when it ends, but each " +
            "C# Tensor owns and releases its handle itself, so the two would release them twice: use Flame.Scope, " +
            "which disposes the C# tensors made while it is open";

        /// <summary>Export name to the reason it is not wrapped.</summary>
        public static readonly IDictionary<string, string> ByDesign = new Dictionary<string, string>
        {
            { "flame_scope_begin", ScopeReason },
            { "flame_scope_end", ScopeReason },
            { "flame_scope_keep", ScopeReason },
            { "flame_scope_count", ScopeReason },
        };
    }
}
