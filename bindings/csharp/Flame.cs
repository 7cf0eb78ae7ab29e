// Safe C# layer over the generated P/Invoke declarations (Native.g.cs, Ops.g.cs).
//
// Loading: DllImport("flame") is mapped to libflame.so.1 by Flame.dll.config (Mono dllmap) and
// found through LD_LIBRARY_PATH / ldconfig. When FLAME_LIBRARY names a file, that file is loaded
// first (dlopen RTLD_GLOBAL) and the dllmap'd name resolves to it through its SONAME.
// The ABI version is checked before the first call; failures are FlameLoadException.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Text;
using Flame.Interop;

namespace Flame
{
    /// <summary>Marks the safe wrapper of an exported C function. Every export of Native.Symbols
    /// has at least one public member carrying its name (checked by Tests.cs CpuCoverage).</summary>
    [AttributeUsage(AttributeTargets.Method | AttributeTargets.Constructor | AttributeTargets.Property, AllowMultiple = true)]
    public sealed class WrapsAttribute : Attribute
    {
        /// <summary>The C name of the wrapped function, e.g. "flame_conv2d".</summary>
        public string Function { get; private set; }

        /// <summary>The member wraps the C function named function.</summary>
        public WrapsAttribute(string function) { Function = function; }
    }

    /// <summary>A failed FLAME call. Message is "STATUS_NAME: the library's message", e.g.
    /// "FLAME_ERROR_SHAPE_MISMATCH: flame_add: shapes [2, 3] and [4] do not broadcast".</summary>
    public class FlameException : Exception
    {
        /// <summary>The status the call returned.</summary>
        public StatusCode Status { get; private set; }

        /// <summary>The library's message alone (this thread's last error message at the failure).</summary>
        public string LibraryMessage { get; private set; }

        /// <summary>An exception for status with the library's message.</summary>
        public FlameException(StatusCode status, string message)
            : base(Library.StatusName(status) + ": " + message)
        {
            Status = status;
            LibraryMessage = message;
        }
    }

    /// <summary>The library could not be loaded, lacks a symbol, or has another ABI version. Status is
    /// <see cref="LoadFailed"/> (-1, outside the C ABI's range); the message says where the library
    /// was looked for and how to point at it.</summary>
    public sealed class FlameLoadException : FlameException
    {
        /// <summary>The status of load failures: -1, named "LOAD_FAILED".</summary>
        public const StatusCode LoadFailed = (StatusCode)(-1);

        /// <summary>A load failure; inner (may be null) is the runtime's exception.</summary>
        public FlameLoadException(string message, Exception inner = null)
            : base(LoadFailed, message + (inner != null ? " (" + inner.GetType().Name + ": " + inner.Message + ")" : ""))
        {
        }
    }

    /// <summary>Loading, version and library-wide functions.</summary>
    public static class Library
    {
        static readonly object Lock = new object();
        static bool loaded;
        static FlameLoadException failure;

        [DllImport("libdl.so.2")]
        static extern IntPtr dlopen(string file, int mode);

        [DllImport("libdl.so.2")]
        static extern IntPtr dlerror();

        const int RTLD_NOW = 2, RTLD_GLOBAL = 0x100;

        /// <summary>Loads the library once and checks its ABI version; throws FlameLoadException.</summary>
        public static void EnsureLoaded()
        {
            if (loaded)
                return;
            lock (Lock)
            {
                if (loaded)
                    return;
                if (failure == null)
                    failure = Load();
                if (failure != null)
                    throw failure;
                loaded = true;
            }
        }

        static FlameLoadException Load()
        {
            string path = Environment.GetEnvironmentVariable("FLAME_LIBRARY");
            if (!string.IsNullOrEmpty(path))
            {
                IntPtr h;
                try
                {
                    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
                }
                catch (Exception e)
                {
                    return new FlameLoadException("cannot dlopen FLAME_LIBRARY=" + path + " (libdl.so.2 missing?)", e);
                }
                if (h == IntPtr.Zero)
                    return new FlameLoadException("cannot load FLAME_LIBRARY=" + path + ": " + Marshal.PtrToStringAnsi(dlerror()) +
                        "; point FLAME_LIBRARY at an existing libflame.so.1, or unset it to use LD_LIBRARY_PATH");
            }
            int abi;
            try
            {
                abi = AbiVersionNoInline();
            }
            catch (Exception e)
            {
                return new FlameLoadException(WhereLooked(), e);
            }
            if (abi != Native.FLAME_ABI_VERSION)
                return new FlameLoadException("library has ABI version " + abi + ", these bindings need " + Native.FLAME_ABI_VERSION);
            // Resolve every declared symbol now, so that a missing one fails here and not mid-way.
            foreach (MethodInfo m in typeof(Native).GetMethods(BindingFlags.Public | BindingFlags.Static))
            {
                if (m.GetCustomAttributes(typeof(DllImportAttribute), false).Length == 0)
                    continue;
                try
                {
                    Marshal.Prelink(m);
                }
                catch (EntryPointNotFoundException e)
                {
                    return new FlameLoadException("the loaded libflame lacks symbol " + m.Name + ": it is older than these bindings (" +
                        (string.IsNullOrEmpty(path) ? "found through Flame.dll.config / LD_LIBRARY_PATH" : "FLAME_LIBRARY=" + path) + ")", e);
                }
                catch (NotImplementedException)
                {
                    break; // runtime without Prelink: symbols resolve on first call instead
                }
            }
            return null;
        }

        /// <summary>Where the library was looked for, and how to point at it.</summary>
        static string WhereLooked()
        {
            string asm = typeof(Library).Assembly.Location;
            string dir = string.IsNullOrEmpty(asm) ? "." : System.IO.Path.GetDirectoryName(asm);
            string config = System.IO.Path.Combine(dir, "Flame.dll.config");
            string ldPath = Environment.GetEnvironmentVariable("LD_LIBRARY_PATH");
            return "cannot load libflame.so.1: DllImport(\"flame\") is mapped to libflame.so.1 by " + config +
                (System.IO.File.Exists(config) ? "" : " (MISSING: copy bindings/csharp/Flame.dll.config next to Flame.dll)") +
                " and looked up on LD_LIBRARY_PATH=" + (string.IsNullOrEmpty(ldPath) ? "(unset)" : ldPath) +
                " and the ldconfig cache; FLAME_LIBRARY is unset. Set FLAME_LIBRARY=/path/to/libflame.so.1," +
                " or add its directory to LD_LIBRARY_PATH";
        }

        // Separate, non-inlined: Mono binds a P/Invoke when the calling method is compiled, which
        // must happen after the dlopen of $FLAME_LIBRARY above.
        [MethodImpl(MethodImplOptions.NoInlining)]
        static int AbiVersionNoInline()
        {
            return Native.flame_abi_version();
        }

        /// <summary>flame_version_string(): "MAJOR.MINOR.PATCH".</summary>
        [Wraps("flame_version_string")]
        public static string Version
        {
            get { EnsureLoaded(); return VersionImpl(); }
        }

        /// <summary>flame_abi_version() of the loaded library.</summary>
        [Wraps("flame_abi_version")]
        public static int AbiVersion
        {
            get { EnsureLoaded(); return AbiVersionNoInline(); }
        }

        /// <summary>The C name of status (flame_status_string), e.g. "FLAME_ERROR_SHAPE_MISMATCH";
        /// "LOAD_FAILED" for <see cref="FlameLoadException.LoadFailed"/>.</summary>
        [Wraps("flame_status_string")]
        public static string StatusName(StatusCode status)
        {
            if (status == FlameLoadException.LoadFailed)
                return "LOAD_FAILED";
            if (!loaded)
            {
                try { EnsureLoaded(); }
                catch (FlameLoadException) { return status.ToString(); }
            }
            return StatusNameImpl(status);
        }

        /// <summary>This thread's last error message (flame_last_error_message).</summary>
        [Wraps("flame_last_error_message")]
        public static string LastErrorMessage
        {
            get { EnsureLoaded(); return LastErrorImpl(); }
        }

        /// <summary>flame_set_error_message (hooks call it before returning an error).</summary>
        [Wraps("flame_set_error_message")]
        public static void SetErrorMessage(string message)
        {
            EnsureLoaded();
            SetErrorImpl(message);
        }

        /// <summary>The number of CUDA devices (flame_device_count).</summary>
        [Wraps("flame_device_count")]
        public static int DeviceCount()
        {
            EnsureLoaded();
            return DeviceCountImpl();
        }

        /// <summary>Bytes per element of dtype (flame_dtype_size); 0 for an unknown dtype.</summary>
        [Wraps("flame_dtype_size")]
        public static long DTypeSize(DType dtype)
        {
            EnsureLoaded();
            return DTypeSizeImpl(dtype);
        }

        /// <summary>The name of dtype (flame_dtype_name), e.g. "f32"; "unknown" for an unknown one.</summary>
        [Wraps("flame_dtype_name")]
        public static string DTypeName(DType dtype)
        {
            EnsureLoaded();
            return DTypeNameImpl(dtype);
        }

        // The *Impl methods hold the P/Invoke calls, apart from the methods that load: Mono binds
        // a P/Invoke when its caller is compiled, which must come after the dlopen in Load().
        const MethodImplOptions NI = MethodImplOptions.NoInlining;
        [MethodImpl(NI)] static string VersionImpl() { return Marshal.PtrToStringAnsi(Native.flame_version_string()); }
        [MethodImpl(NI)] static string StatusNameImpl(StatusCode s) { return Marshal.PtrToStringAnsi(Native.flame_status_string((flame_status_t)s)); }
        [MethodImpl(NI)] static string LastErrorImpl() { return Marshal.PtrToStringAnsi(Native.flame_last_error_message()) ?? ""; }
        [MethodImpl(NI)] static void SetErrorImpl(string m) { Native.flame_set_error_message(m); }
        [MethodImpl(NI)] static unsafe int DeviceCountImpl() { int n = 0; Status.Check(Native.flame_device_count(&n)); return n; }
        [MethodImpl(NI)] static long DTypeSizeImpl(DType d) { return (long)Native.flame_dtype_size((flame_dtype_t)d).ToUInt64(); }
        [MethodImpl(NI)] static string DTypeNameImpl(DType d) { return Marshal.PtrToStringAnsi(Native.flame_dtype_name((flame_dtype_t)d)); }
    }

    /// <summary>Status to exception.</summary>
    public static class Status
    {
        /// <summary>Throws a FlameException with this thread's last error message unless s is FLAME_OK.</summary>
        public static void Check(flame_status_t s)
        {
            if (s != flame_status_t.FLAME_OK)
                throw new FlameException((StatusCode)s, Marshal.PtrToStringAnsi(Native.flame_last_error_message()) ?? "");
        }

        /// <summary>A status for native code from an exception caught in a callback: its
        /// FlameException status (else FLAME_ERROR_INTERNAL), with the message set as this thread's
        /// error message (prefixed with what). Never throws.</summary>
        internal static flame_status_t FromException(string what, Exception e)
        {
            var fe = e as FlameException;
            try
            {
                Native.flame_set_error_message(what + " failed: " + (fe != null ? fe.LibraryMessage : e.GetType().Name + ": " + e.Message));
            }
            catch { }
            if (fe != null && fe.Status > StatusCode.Ok)
                return (flame_status_t)fe.Status;
            return flame_status_t.FLAME_ERROR_INTERNAL;
        }
    }

    // ------------------------------------------------------------------------------------------
    // SafeHandles
    // ------------------------------------------------------------------------------------------

    /// <summary>SafeHandle owning a native handle, released once.</summary>
    public sealed class ContextHandle : SafeHandle
    {
        /// <summary>Takes over the raw handle h.</summary>
        public ContextHandle(IntPtr h, bool owns) : base(IntPtr.Zero, owns) { SetHandle(h); }
        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        /// <summary>Takes over the raw handle h.</summary>
        protected override bool ReleaseHandle() { Native.flame_ctx_destroy(handle); return true; }
    }

    /// <summary>SafeHandle owning a native handle, released once.</summary>
    public sealed class TensorHandle : SafeHandle
    {
        /// <summary>Takes over the raw handle h.</summary>
        public TensorHandle(IntPtr h) : base(IntPtr.Zero, true) { SetHandle(h); }
        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        /// <summary>Takes over the raw handle h.</summary>
        protected override bool ReleaseHandle() { Native.flame_tensor_release(handle); return true; }
    }

    /// <summary>SafeHandle owning a native handle, released once.</summary>
    public sealed class HookHandle : SafeHandle
    {
        /// <summary>Takes over the raw handle h.</summary>
        public HookHandle(IntPtr h) : base(IntPtr.Zero, true) { SetHandle(h); }
        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        /// <summary>Takes over the raw handle h.</summary>
        protected override bool ReleaseHandle() { Native.flame_hook_remove(handle); return true; }
    }

    // ------------------------------------------------------------------------------------------
    // Context
    // ------------------------------------------------------------------------------------------

    /// <summary>Options of a new context (flame_ctx_options_t); unset fields keep the library's defaults.</summary>
    public sealed class ContextOptions
    {
        /// <summary>The CUDA device ordinal.</summary>
        public int Device;
        /// <summary>The seed of the context's random generator.</summary>
        public ulong Seed;
        /// <summary>null: library default; "": no disk cache.</summary>
        public string KernelCacheDir;
        /// <summary>Bytes the pool may hold; 0: no limit.</summary>
        public ulong MemoryLimit;
        /// <summary>Let f32 matmuls and convolutions use TF32.</summary>
        public bool AllowTf32;
        /// <summary>Always cuBLASLt's first heuristic choice instead of timing its top candidates per shape.</summary>
        public bool GemmHeuristicOnly;
    }

    /// <summary>flame_ctx_counters_t: work a context issued from the host (flame.h: a graph replay is one launch).</summary>
    public struct Counters
    {
        /// <summary>Kernels, GEMMs, cuDNN executions, memsets, copies and graph launches.</summary>
        public ulong Launches;
        /// <summary>The launches that convert a dtype.</summary>
        public ulong CastKernels;
        /// <summary>Waits of the host for the device.</summary>
        public ulong HostSyncs;
        /// <summary>Allocations asked of the driver's pool (FLAME's free-list hits excluded).</summary>
        public ulong DriverAllocations;
    }

    /// <summary>flame_memory_stats_t.</summary>
    public struct MemoryStats
    {
        /// <summary>Bytes held by live tensors.</summary>
        public ulong BytesInUse;
        /// <summary>Bytes the pool reserved from the driver.</summary>
        public ulong BytesReserved;
        /// <summary>The most bytes in use so far.</summary>
        public ulong PeakBytesInUse;
        /// <summary>The number of live tensors.</summary>
        public ulong LiveTensors;
    }

    /// <summary>A FLAME context (one GPU). Dispose drops the reference; tensors keep it alive.</summary>
    public sealed partial class Context : IDisposable
    {
        internal readonly ContextHandle H;

        internal Context(ContextHandle h) { H = h; }

        /// <summary>flame_ctx_set_log without a callback: the least level of this context's messages
        /// printed to stderr (LogLevel.Default: $FLAME_LOG, else Info). Set it right after creating the
        /// context to see the first kernel compile. The C callback is not wrapped: its user data must
        /// outlive the context's last tensor.</summary>
        [Wraps("flame_ctx_set_log")]
        public void SetLogLevel(LogLevel level)
        {
            Status.Check(Native.flame_ctx_set_log(Raw, (flame_log_level_t)level, null, IntPtr.Zero));
            GC.KeepAlive(this);
        }

        /// <summary>flame_ctx_create with the default options (device 0).</summary>
        [Wraps("flame_ctx_create")]
        public Context() : this((ContextOptions)null) { }

        /// <summary>flame_ctx_create with opts (null: the defaults of flame_ctx_options_init).</summary>
        [Wraps("flame_ctx_options_init")]
        public Context(ContextOptions opts)
        {
            Library.EnsureLoaded();
            H = new ContextHandle(Create(opts), true);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(ContextOptions opts)
        {
            IntPtr raw = IntPtr.Zero;
            if (opts == null)
            {
                Status.Check(Native.flame_ctx_create(null, &raw));
            }
            else
            {
                flame_ctx_options_t o;
                Status.Check(Native.flame_ctx_options_init(&o));
                o.device = opts.Device;
                o.seed = opts.Seed;
                o.memory_limit = opts.MemoryLimit;
                o.allow_tf32 = opts.AllowTf32 ? 1 : 0;
                o.gemm_heuristic_only = opts.GemmHeuristicOnly ? 1 : 0;
                IntPtr dir = opts.KernelCacheDir == null ? IntPtr.Zero : StringToUtf8(opts.KernelCacheDir);
                try
                {
                    o.kernel_cache_dir = dir;
                    Status.Check(Native.flame_ctx_create(&o, &raw));
                }
                finally
                {
                    if (dir != IntPtr.Zero)
                        Marshal.FreeHGlobal(dir);
                }
            }
            return raw;
        }

        static IntPtr StringToUtf8(string s)
        {
            byte[] b = Encoding.UTF8.GetBytes(s);
            IntPtr p = Marshal.AllocHGlobal(b.Length + 1);
            Marshal.Copy(b, 0, p, b.Length);
            Marshal.WriteByte(p, b.Length, 0);
            return p;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw
        {
            get
            {
                if (H.IsClosed)
                    throw new ObjectDisposedException("Context");
                return H.DangerousGetHandle();
            }
        }

        /// <summary>Drops this reference (flame_ctx_destroy); tensors keep the context alive.</summary>
        [Wraps("flame_ctx_destroy")]
        public void Dispose() { H.Dispose(); }

        /// <summary>flame_ctx_device_name: the GPU's name.</summary>
        [Wraps("flame_ctx_device_name")]
        public unsafe string DeviceName()
        {
            byte[] buf = new byte[256];
            fixed (byte* p = buf)
                Status.Check(Native.flame_ctx_device_name(Raw, p, (UIntPtr)buf.Length));
            GC.KeepAlive(this);
            int n = Array.IndexOf(buf, (byte)0);
            return Encoding.UTF8.GetString(buf, 0, n < 0 ? buf.Length : n);
        }

        /// <summary>flame_ctx_memory_stats: the memory pool's statistics.</summary>
        [Wraps("flame_ctx_memory_stats")]
        public unsafe MemoryStats GetMemoryStats()
        {
            flame_memory_stats_t s = default(flame_memory_stats_t);
            s.struct_size = (UIntPtr)Marshal.SizeOf(typeof(flame_memory_stats_t));
            Status.Check(Native.flame_ctx_memory_stats(Raw, &s));
            GC.KeepAlive(this);
            return new MemoryStats { BytesInUse = s.bytes_in_use, BytesReserved = s.bytes_reserved, PeakBytesInUse = s.peak_bytes_in_use, LiveTensors = s.live_tensors };
        }

        /// <summary>flame_ctx_counters: the work issued since creation or the last ResetCounters.</summary>
        [Wraps("flame_ctx_counters")]
        public unsafe Counters GetCounters()
        {
            flame_ctx_counters_t s = default(flame_ctx_counters_t);
            s.struct_size = (UIntPtr)Marshal.SizeOf(typeof(flame_ctx_counters_t));
            Status.Check(Native.flame_ctx_counters(Raw, &s));
            GC.KeepAlive(this);
            return new Counters { Launches = s.launches, CastKernels = s.cast_kernels, HostSyncs = s.host_syncs, DriverAllocations = s.driver_allocations };
        }

        /// <summary>flame_ctx_stream: the context's CUstream (borrowed).</summary>
        [Wraps("flame_ctx_stream")]
        public unsafe IntPtr Stream()
        {
            IntPtr s = IntPtr.Zero;
            Status.Check(Native.flame_ctx_stream(Raw, &s));
            GC.KeepAlive(this);
            return s;
        }

        /// <summary>Sets grad mode; returns the previous mode.</summary>
        [Wraps("flame_ctx_set_grad_enabled")]
        public unsafe bool SetGradEnabled(bool enabled)
        {
            int prev = 0;
            Status.Check(Native.flame_ctx_set_grad_enabled(Raw, enabled ? 1 : 0, &prev));
            GC.KeepAlive(this);
            return prev != 0;
        }

        /// <summary>flame_ctx_set_inference_mode; returns the previous mode.</summary>
        [Wraps("flame_ctx_set_inference_mode")]
        public unsafe bool SetInferenceMode(bool enabled)
        {
            int prev = 0;
            Status.Check(Native.flame_ctx_set_inference_mode(Raw, enabled ? 1 : 0, &prev));
            GC.KeepAlive(this);
            return prev != 0;
        }

        sealed class GradModeGuard : IDisposable
        {
            readonly Context ctx;
            readonly bool prev;
            bool done;
            public GradModeGuard(Context c) { ctx = c; prev = c.SetGradEnabled(false); }
            public void Dispose() { if (!done) { done = true; ctx.SetGradEnabled(prev); } }
        }

        /// <summary>using (ctx.NoGrad()) { ... }: grad mode off inside, restored after.</summary>
        public IDisposable NoGrad() { return new GradModeGuard(this); }

        /// <summary>A new f32 tensor of this context (Tensor.FromArray).</summary>
        public Tensor FromArray(float[] data, params long[] shape) { return Tensor.FromArray(this, data, shape); }
        /// <summary>A new f64 tensor of this context.</summary>
        public Tensor FromArray(double[] data, params long[] shape) { return Tensor.FromArray(this, data, shape); }
        /// <summary>A new i32 tensor of this context.</summary>
        public Tensor FromArray(int[] data, params long[] shape) { return Tensor.FromArray(this, data, shape); }
        /// <summary>A new i64 tensor of this context.</summary>
        public Tensor FromArray(long[] data, params long[] shape) { return Tensor.FromArray(this, data, shape); }

        /// <summary>A 0-d tensor.</summary>
        public Tensor Scalar(double value, DType dtype = DType.F32)
        {
            return Full(new long[0], dtype, value);
        }

        /// <summary>flame_grad: gradients of outputs w.r.t. inputs (null entries for unused inputs
        /// with FLAME_GRAD_ALLOW_UNUSED). gradOutputs may be null or hold nulls (ones).</summary>
        [Wraps("flame_grad")]
        public unsafe Tensor[] Grad(Tensor[] outputs, Tensor[] gradOutputs, Tensor[] inputs, uint flags = 0)
        {
            IntPtr[] o = Tensor.RawArray(outputs);
            IntPtr[] g = gradOutputs == null ? null : Tensor.RawArray(gradOutputs);
            if (g != null && g.Length != o.Length)
                throw new FlameException(StatusCode.InvalidArgument, "gradOutputs must match outputs");
            IntPtr[] i = Tensor.RawArray(inputs);
            IntPtr[] r = new IntPtr[i.Length];
            fixed (IntPtr* po = o, pg = g, pi = i, pr = r)
                Status.Check(Native.flame_grad(Raw, po, g == null ? null : pg, o.Length, pi, i.Length, flags, r.Length == 0 ? null : pr));
            GC.KeepAlive(outputs); GC.KeepAlive(gradOutputs); GC.KeepAlive(inputs); GC.KeepAlive(this);
            Tensor[] res = new Tensor[r.Length];
            for (int k = 0; k < r.Length; k++)
                res[k] = r[k] == IntPtr.Zero ? null : new Tensor(r[k]);
            return res;
        }
    }

    // ------------------------------------------------------------------------------------------
    // Tensor
    // ------------------------------------------------------------------------------------------

    /// <summary>A reference to a FLAME tensor; Dispose (or the finalizer) releases it.</summary>
    public sealed partial class Tensor : IDisposable
    {
        internal readonly TensorHandle H;

        /// <summary>Takes over a new reference.</summary>
        public Tensor(IntPtr ownedReference)
        {
            H = new TensorHandle(ownedReference);
            Scope.Track(this);
        }

        /// <summary>Retains a borrowed handle and wraps the new reference.</summary>
        [Wraps("flame_tensor_retain")]
        public static Tensor FromBorrowed(IntPtr borrowed)
        {
            Library.EnsureLoaded();
            return RetainImpl(borrowed);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static Tensor RetainImpl(IntPtr borrowed)
        {
            Status.Check(Native.flame_tensor_retain(borrowed));
            return new Tensor(borrowed);
        }

        /// <summary>The raw handle (borrowed; valid while this object is not disposed).</summary>
        public IntPtr Raw
        {
            get
            {
                if (H.IsClosed)
                    throw new ObjectDisposedException("Tensor");
                return H.DangerousGetHandle();
            }
        }

        internal static IntPtr RawOf(Tensor t) { return t == null ? IntPtr.Zero : t.Raw; }

        internal static IntPtr[] RawArray(Tensor[] ts)
        {
            if (ts == null)
                return new IntPtr[0];
            IntPtr[] r = new IntPtr[ts.Length];
            for (int i = 0; i < ts.Length; i++)
                r[i] = RawOf(ts[i]);
            return r;
        }

        /// <summary>Releases this reference (flame_tensor_release); a second Dispose does nothing.</summary>
        [Wraps("flame_tensor_release")]
        public void Dispose() { H.Dispose(); }

        /// <summary>A new reference to the same tensor (flame_tensor_retain).</summary>
        public Tensor Retain() { return FromBorrowed(Raw); }

        // ---- host data ----

        static unsafe Tensor FromHost(Context ctx, void* p, long nbytes, long[] shape, DType dt)
        {
            IntPtr o = IntPtr.Zero;
            long[] s = shape ?? new long[0];
            fixed (long* ps = s)
                Status.Check(Native.flame_from_host(ctx.Raw, (IntPtr)p, (UIntPtr)(ulong)nbytes, s.Length == 0 ? null : ps, s.Length, (flame_dtype_t)dt, &o));
            GC.KeepAlive(ctx);
            return new Tensor(o);
        }

        /// <summary>flame_from_host: a new f32 tensor of ctx with shape holding d (row-major).</summary>
        [Wraps("flame_from_host")]
        public static unsafe Tensor FromArray(Context ctx, float[] d, params long[] shape) { fixed (float* p = d) return FromHost(ctx, p, 4L * d.Length, shape, DType.F32); }
        /// <summary>flame_from_host: a new f64 tensor.</summary>
        public static unsafe Tensor FromArray(Context ctx, double[] d, params long[] shape) { fixed (double* p = d) return FromHost(ctx, p, 8L * d.Length, shape, DType.F64); }
        /// <summary>flame_from_host: a new i32 tensor.</summary>
        public static unsafe Tensor FromArray(Context ctx, int[] d, params long[] shape) { fixed (int* p = d) return FromHost(ctx, p, 4L * d.Length, shape, DType.I32); }
        /// <summary>flame_from_host: a new i64 tensor.</summary>
        public static unsafe Tensor FromArray(Context ctx, long[] d, params long[] shape) { fixed (long* p = d) return FromHost(ctx, p, 8L * d.Length, shape, DType.I64); }

        void CheckDtype(DType want)
        {
            DType dt = Dtype();
            if (dt != want)
                throw new FlameException(StatusCode.DtypeMismatch, "tensor is " + Library.DTypeName(dt) + ", requested " + Library.DTypeName(want));
        }

        unsafe void ToHost(void* p, long nbytes)
        {
            Status.Check(Native.flame_to_host(Raw, (IntPtr)p, (UIntPtr)(ulong)nbytes));
            GC.KeepAlive(this);
        }

        /// <summary>flame_to_host: the values of this f32 tensor (row-major); waits for the device.</summary>
        [Wraps("flame_to_host")]
        public unsafe float[] ToFloatArray() { CheckDtype(DType.F32); var a = new float[Numel()]; fixed (float* p = a) ToHost(p, 4L * a.Length); return a; }
        /// <summary>flame_to_host of an f64 tensor.</summary>
        public unsafe double[] ToDoubleArray() { CheckDtype(DType.F64); var a = new double[Numel()]; fixed (double* p = a) ToHost(p, 8L * a.Length); return a; }
        /// <summary>flame_to_host of an i32 tensor.</summary>
        public unsafe int[] ToIntArray() { CheckDtype(DType.I32); var a = new int[Numel()]; fixed (int* p = a) ToHost(p, 4L * a.Length); return a; }
        /// <summary>flame_to_host of an i64 tensor.</summary>
        public unsafe long[] ToLongArray() { CheckDtype(DType.I64); var a = new long[Numel()]; fixed (long* p = a) ToHost(p, 8L * a.Length); return a; }

        // ---- queries ----

        /// <summary>flame_tensor_shape: the sizes of the dims.</summary>
        [Wraps("flame_tensor_shape")]
        public unsafe long[] Shape()
        {
            long* d = stackalloc long[Native.FLAME_MAX_DIMS];
            int n = Ndim();
            Status.Check(Native.flame_tensor_shape(Raw, d, Native.FLAME_MAX_DIMS));
            GC.KeepAlive(this);
            var r = new long[n];
            for (int i = 0; i < n; i++) r[i] = d[i];
            return r;
        }

        /// <summary>flame_tensor_strides: the strides in elements.</summary>
        [Wraps("flame_tensor_strides")]
        public unsafe long[] Strides()
        {
            long* d = stackalloc long[Native.FLAME_MAX_DIMS];
            int n = Ndim();
            Status.Check(Native.flame_tensor_strides(Raw, d, Native.FLAME_MAX_DIMS));
            GC.KeepAlive(this);
            var r = new long[n];
            for (int i = 0; i < n; i++) r[i] = d[i];
            return r;
        }

        /// <summary>flame_tensor_data_ptr: the device address of the first element (borrowed).</summary>
        [Wraps("flame_tensor_data_ptr")]
        public unsafe IntPtr DataPtr()
        {
            IntPtr p = IntPtr.Zero;
            Status.Check(Native.flame_tensor_data_ptr(Raw, &p));
            GC.KeepAlive(this);
            return p;
        }

        /// <summary>flame_tensor_to_dlpack: a new DLManagedTensor* sharing this tensor's memory (no
        /// copy). The caller owns it: hand it to a consumer or call its deleter exactly once.</summary>
        [Wraps("flame_tensor_to_dlpack")]
        public unsafe IntPtr ToDlpack()
        {
            IntPtr p = IntPtr.Zero;
            Status.Check(Native.flame_tensor_to_dlpack(Raw, &p));
            GC.KeepAlive(this);
            return p;
        }

        /// <summary>flame_tensor_to_dlpack_versioned: as ToDlpack with DLManagedTensorVersioned*.</summary>
        [Wraps("flame_tensor_to_dlpack_versioned")]
        public unsafe IntPtr ToDlpackVersioned()
        {
            IntPtr p = IntPtr.Zero;
            Status.Check(Native.flame_tensor_to_dlpack_versioned(Raw, &p));
            GC.KeepAlive(this);
            return p;
        }

        /// <summary>flame_tensor_from_dlpack: a tensor of ctx over src's CUDA memory (a
        /// DLManagedTensor*; no copy). On success FLAME owns src and calls its deleter once; when
        /// this throws, src is still the caller's.</summary>
        [Wraps("flame_tensor_from_dlpack")]
        public static unsafe Tensor FromDlpack(Context ctx, IntPtr src)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_tensor_from_dlpack(ctx == null ? IntPtr.Zero : ctx.Raw, src, &o));
            GC.KeepAlive(ctx);
            return new Tensor(o);
        }

        /// <summary>flame_tensor_from_dlpack_versioned: as FromDlpack for DLManagedTensorVersioned*.</summary>
        [Wraps("flame_tensor_from_dlpack_versioned")]
        public static unsafe Tensor FromDlpackVersioned(Context ctx, IntPtr src)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_tensor_from_dlpack_versioned(ctx == null ? IntPtr.Zero : ctx.Raw, src, &o));
            GC.KeepAlive(ctx);
            return new Tensor(o);
        }

        /// <summary>The tensor's context, as a non-owning wrapper.</summary>
        [Wraps("flame_tensor_context")]
        public unsafe Context GetContext()
        {
            IntPtr c = IntPtr.Zero;
            Status.Check(Native.flame_tensor_context(Raw, &c));
            GC.KeepAlive(this);
            return new Context(new ContextHandle(c, false));
        }

        // ---- autograd ----

        /// <summary>The accumulated gradient, or null.</summary>
        [Wraps("flame_tensor_grad")]
        [Wraps("flame_tensor_set_grad")]
        public unsafe Tensor Grad
        {
            get
            {
                IntPtr g = IntPtr.Zero;
                Status.Check(Native.flame_tensor_grad(Raw, &g));
                GC.KeepAlive(this);
                return g == IntPtr.Zero ? null : new Tensor(g);
            }
            set
            {
                Status.Check(Native.flame_tensor_set_grad(Raw, RawOf(value)));
                GC.KeepAlive(this); GC.KeepAlive(value);
            }
        }

        /// <summary>Whether the tensor requires grad (flame_tensor_requires_grad / flame_tensor_set_requires_grad).</summary>
        public bool RequiresGradFlag
        {
            get { return RequiresGrad(); }
            set { SetRequiresGrad(value); }
        }

        /// <summary>flame_backward from this tensor; grad null means ones (one-element root).</summary>
        [Wraps("flame_backward")]
        public void Backward(Tensor grad = null, uint flags = 0)
        {
            using (Context ctx = GetContext())
            {
                Status.Check(Native.flame_backward(ctx.Raw, Raw, RawOf(grad), flags));
            }
            GC.KeepAlive(this); GC.KeepAlive(grad);
        }

        unsafe Tensor[] Pieces(IntPtr[] outs, int count)
        {
            var r = new Tensor[count];
            for (int i = 0; i < count; i++) r[i] = new Tensor(outs[i]);
            return r;
        }

        /// <summary>flame_split: views of splitSize along dim (the last may be smaller).</summary>
        [Wraps("flame_split")]
        public unsafe Tensor[] Split(long splitSize, int dim)
        {
            long[] shape = Shape();
            int d = dim < 0 ? dim + shape.Length : dim;
            long size = d >= 0 && d < shape.Length ? shape[d] : 0;
            int cap = splitSize > 0 ? (int)Math.Max(1, (size + splitSize - 1) / splitSize) : 1;
            var outs = new IntPtr[cap];
            int count = 0;
            fixed (IntPtr* p = outs)
                Status.Check(Native.flame_split(Raw, splitSize, dim, p, cap, &count));
            GC.KeepAlive(this);
            return Pieces(outs, count);
        }

        /// <summary>flame_split_sizes: views of the given sizes along dim.</summary>
        [Wraps("flame_split_sizes")]
        public unsafe Tensor[] SplitSizes(long[] sizes, int dim)
        {
            var outs = new IntPtr[Math.Max(1, sizes.Length)];
            fixed (long* ps = sizes)
            fixed (IntPtr* p = outs)
                Status.Check(Native.flame_split_sizes(Raw, sizes.Length == 0 ? null : ps, sizes.Length, dim, p));
            GC.KeepAlive(this);
            return Pieces(outs, sizes.Length);
        }

        /// <summary>flame_chunk: at most chunks views along dim.</summary>
        [Wraps("flame_chunk")]
        public unsafe Tensor[] Chunk(int chunks, int dim)
        {
            int cap = Math.Max(1, chunks);
            var outs = new IntPtr[cap];
            int count = 0;
            fixed (IntPtr* p = outs)
                Status.Check(Native.flame_chunk(Raw, chunks, dim, p, cap, &count));
            GC.KeepAlive(this);
            return Pieces(outs, count);
        }

        // ---- hooks ----
        // The user's delegate lives in a GCHandle passed as user_data; the native side calls the
        // static thunks below and the destroy thunk frees the GCHandle exactly once. The Hook
        // object is kept reachable from that state, so it (and the hook) live until Dispose or
        // until the tensor goes; only after destroy may its finalizer free the native handle.

        sealed class HookState
        {
            public Func<Tensor, Tensor> TensorFn;
            public Action<Tensor> PostFn;
            public Hook Owner;
        }

        static unsafe readonly flame_tensor_hook_fn TensorThunk = TensorHookThunk;
        static readonly flame_post_accumulate_hook_fn PostThunk = PostHookThunk;
        static readonly flame_destroy_fn DestroyThunk = DestroyHookThunk;

        static flame_status_t Fail(Exception e) { return Status.FromException("C# hook", e); }

        static unsafe flame_status_t TensorHookThunk(IntPtr ud, IntPtr grad, IntPtr* replacement)
        {
            try
            {
                var st = (HookState)GCHandle.FromIntPtr(ud).Target;
                using (Tensor g = FromBorrowed(grad))
                {
                    Tensor r = st.TensorFn(g);
                    if (r != null)
                    {
                        // Hand a new reference to the engine; the caller's object stays usable.
                        Status.Check(Native.flame_tensor_retain(r.Raw));
                        *replacement = r.Raw;
                        GC.KeepAlive(r);
                    }
                }
                return flame_status_t.FLAME_OK;
            }
            catch (Exception e)
            {
                return Fail(e);
            }
        }

        static flame_status_t PostHookThunk(IntPtr ud, IntPtr leaf)
        {
            try
            {
                var st = (HookState)GCHandle.FromIntPtr(ud).Target;
                using (Tensor t = FromBorrowed(leaf))
                    st.PostFn(t);
                return flame_status_t.FLAME_OK;
            }
            catch (Exception e)
            {
                return Fail(e);
            }
        }

        static void DestroyHookThunk(IntPtr ud)
        {
            try
            {
                GCHandle h = GCHandle.FromIntPtr(ud);
                var st = (HookState)h.Target;
                if (st.Owner != null)
                    st.Owner.MarkDestroyed();
                h.Free();
            }
            catch { }
        }

        /// <summary>Registers a gradient hook: fn gets the incoming gradient and returns a
        /// replacement, or null to keep it. An exception stops backward (its FlameException
        /// status, else FLAME_ERROR_INTERNAL) with its message.</summary>
        [Wraps("flame_tensor_register_hook")]
        public unsafe Hook RegisterHook(Func<Tensor, Tensor> fn)
        {
            if (fn == null) throw new ArgumentNullException("fn");
            var st = new HookState { TensorFn = fn };
            GCHandle gh = GCHandle.Alloc(st);
            IntPtr h = IntPtr.Zero;
            flame_status_t s = Native.flame_tensor_register_hook(Raw, TensorThunk, GCHandle.ToIntPtr(gh), DestroyThunk, &h);
            GC.KeepAlive(this);
            return Finish(s, h, gh, st);
        }

        /// <summary>Registers a post-accumulate hook on a leaf: fn gets the leaf after .grad changed.</summary>
        [Wraps("flame_tensor_register_post_accumulate_grad_hook")]
        public unsafe Hook RegisterPostAccumulateGradHook(Action<Tensor> fn)
        {
            if (fn == null) throw new ArgumentNullException("fn");
            var st = new HookState { PostFn = fn };
            GCHandle gh = GCHandle.Alloc(st);
            IntPtr h = IntPtr.Zero;
            flame_status_t s = Native.flame_tensor_register_post_accumulate_grad_hook(Raw, PostThunk, GCHandle.ToIntPtr(gh), DestroyThunk, &h);
            GC.KeepAlive(this);
            return Finish(s, h, gh, st);
        }

        static Hook Finish(flame_status_t s, IntPtr h, GCHandle gh, HookState st)
        {
            if (s != flame_status_t.FLAME_OK)
            {
                string msg = Marshal.PtrToStringAnsi(Native.flame_last_error_message()) ?? "";
                gh.Free(); // not registered: destroy will not be called
                throw new FlameException((StatusCode)s, msg);
            }
            var hook = new Hook(new HookHandle(h));
            st.Owner = hook; // keeps the Hook reachable until destroy fires
            return hook;
        }

        // ---- operators ----

        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator +(Tensor a, Tensor b) { return a.Add(b); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator -(Tensor a, Tensor b) { return a.Sub(b); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator *(Tensor a, Tensor b) { return a.Mul(b); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator /(Tensor a, Tensor b) { return a.Div(b); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator +(Tensor a, double s) { return a.AddScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator -(Tensor a, double s) { return a.SubScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator *(Tensor a, double s) { return a.MulScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator /(Tensor a, double s) { return a.DivScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator +(double s, Tensor a) { return a.AddScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator -(double s, Tensor a) { return a.RsubScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator *(double s, Tensor a) { return a.MulScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator /(double s, Tensor a) { using (Tensor r = a.Reciprocal()) return r.MulScalar(s); }
        /// <summary>Operator form of the elementwise method (Add, Sub, Mul, Div, the *Scalar forms, Neg); a new tensor.</summary>
        public static Tensor operator -(Tensor a) { return a.Neg(); }

        /// <summary>"Tensor([shape], dtype)".</summary>
        public override string ToString()
        {
            try { return "Tensor([" + string.Join(", ", Shape()) + "], " + Library.DTypeName(Dtype()) + ")"; }
            catch (Exception) { return "Tensor(?)"; }
        }
    }

    /// <summary>A registered hook. Dispose removes it; otherwise it stays until its tensor goes.</summary>
    public sealed class Hook : IDisposable
    {
        readonly HookHandle h;
        internal Hook(HookHandle handle) { h = handle; }
        internal void MarkDestroyed() { }
        /// <summary>Removes the hook now (flame_hook_remove); the delegate is released.</summary>
        [Wraps("flame_hook_remove")]
        public void Dispose() { h.Dispose(); }
    }

    // ------------------------------------------------------------------------------------------
    // safetensors (flame.h "safetensors")
    // ------------------------------------------------------------------------------------------

    /// <summary>SafeHandle owning a native handle, released once.</summary>
    public sealed class SafetensorsHandle : SafeHandle
    {
        /// <summary>Takes over the raw handle h.</summary>
        public SafetensorsHandle(IntPtr h) : base(IntPtr.Zero, true) { SetHandle(h); }
        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        /// <summary>Takes over the raw handle h.</summary>
        protected override bool ReleaseHandle() { Native.flame_safetensors_release(handle); return true; }
    }

    /// <summary>An open safetensors file (memory-mapped, header validated). Dispose releases it;
    /// tensors read from it stay valid. Strings cross as UTF-8.</summary>
    public sealed class SafetensorsFile : IDisposable
    {
        readonly SafetensorsHandle h;
        SafetensorsFile(IntPtr raw) { h = new SafetensorsHandle(raw); }

        /// <summary>flame_safetensors_load: opens the file at path for reading on ctx.</summary>
        [Wraps("flame_safetensors_load")]
        public static SafetensorsFile Open(Context ctx, string path)
        {
            Library.EnsureLoaded();
            return OpenImpl(ctx, path);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe SafetensorsFile OpenImpl(Context ctx, string path)
        {
            IntPtr raw = IntPtr.Zero;
            Status.Check(Native.flame_safetensors_load(ctx.Raw, path, &raw));  // string: UTF-8 on Mono/Linux
            GC.KeepAlive(ctx);
            return new SafetensorsFile(raw);
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw
        {
            get
            {
                if (h.IsClosed)
                    throw new ObjectDisposedException("SafetensorsFile");
                return h.DangerousGetHandle();
            }
        }

        /// <summary>flame_safetensors_release; tensors read from the file stay valid.</summary>
        [Wraps("flame_safetensors_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>The tensor names, in byte order.</summary>
        [Wraps("flame_safetensors_count")]
        [Wraps("flame_safetensors_name")]
        public unsafe string[] Names()
        {
            long n = 0;
            Status.Check(Native.flame_safetensors_count(Raw, &n));
            var names = new string[n];
            for (long i = 0; i < n; ++i)
            {
                byte* s = null;
                Status.Check(Native.flame_safetensors_name(Raw, i, &s));
                names[i] = Utf8.Read(s);
            }
            GC.KeepAlive(this);
            return names;
        }

        /// <summary>The dtype and shape of tensor name (FLAME_ERROR_UNSUPPORTED for a dtype FLAME lacks).</summary>
        [Wraps("flame_safetensors_info")]
        public unsafe long[] Info(string name, out DType dtype)
        {
            flame_dtype_t dt = 0;
            int nd = 0;
            Status.Check(Native.flame_safetensors_info(Raw, name, &dt, null, 0, &nd));
            var shape = new long[nd];
            fixed (long* sp = shape)
                Status.Check(Native.flame_safetensors_info(Raw, name, &dt, nd == 0 ? null : sp, nd, &nd));
            GC.KeepAlive(this);
            dtype = (DType)dt;
            return shape;
        }

        /// <summary>flame_safetensors_get: tensor name as a new device tensor on the file's context.</summary>
        [Wraps("flame_safetensors_get")]
        public unsafe Tensor Get(string name)
        {
            IntPtr o = IntPtr.Zero;
            Status.Check(Native.flame_safetensors_get(Raw, name, &o));
            GC.KeepAlive(this);
            return new Tensor(o);
        }

        /// <summary>Every __metadata__ entry, sorted by key.</summary>
        [Wraps("flame_safetensors_metadata_count")]
        [Wraps("flame_safetensors_metadata_key")]
        public unsafe KeyValuePair<string, string>[] Metadata()
        {
            long n = 0;
            Status.Check(Native.flame_safetensors_metadata_count(Raw, &n));
            var md = new KeyValuePair<string, string>[n];
            for (long i = 0; i < n; ++i)
            {
                byte* k = null;
                Status.Check(Native.flame_safetensors_metadata_key(Raw, i, &k));
                string key = Utf8.Read(k);
                md[i] = new KeyValuePair<string, string>(key, MetadataValue(key));
            }
            GC.KeepAlive(this);
            return md;
        }

        /// <summary>The metadata value under key, or null when the file has no such key.</summary>
        [Wraps("flame_safetensors_metadata")]
        public unsafe string MetadataValue(string key)
        {
            byte* v = null;
            Status.Check(Native.flame_safetensors_metadata(Raw, key, &v));
            string value = Utf8.Read(v);  // copied before the handle may go
            GC.KeepAlive(this);
            return value;
        }

        /// <summary>flame_safetensors_save: writes tensors under names (any dtype and strides, all on
        /// ctx) with metadata (may be null) to path, atomically.</summary>
        [Wraps("flame_safetensors_save")]
        public static void Save(Context ctx, string path, string[] names, Tensor[] tensors, IDictionary<string, string> metadata)
        {
            Library.EnsureLoaded();
            SaveImpl(ctx, path, names ?? new string[0], tensors ?? new Tensor[0], metadata);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe void SaveImpl(Context ctx, string path, string[] names, Tensor[] tensors, IDictionary<string, string> metadata)
        {
            if (names.Length != tensors.Length)
                throw new ArgumentException("names and tensors differ in length");
            var strings = new List<IntPtr>();
            try
            {
                var np = new IntPtr[Math.Max(names.Length, 1)];
                for (int i = 0; i < names.Length; ++i) { np[i] = Utf8.Alloc(names[i]); strings.Add(np[i]); }
                var kv = new IntPtr[Math.Max(2 * (metadata == null ? 0 : metadata.Count), 1)];
                int nm = 0;
                if (metadata != null)
                    foreach (var e in metadata)
                    {
                        kv[2 * nm] = Utf8.Alloc(e.Key); strings.Add(kv[2 * nm]);
                        kv[2 * nm + 1] = Utf8.Alloc(e.Value); strings.Add(kv[2 * nm + 1]);
                        ++nm;
                    }
                IntPtr[] raws = Tensor.RawArray(tensors);
                if (raws.Length == 0) raws = new IntPtr[1];
                fixed (IntPtr* n = np)
                fixed (IntPtr* t = raws)
                fixed (IntPtr* m = kv)
                    Status.Check(Native.flame_safetensors_save(ctx.Raw, path, (byte**)n, t, names.Length, (byte**)m, nm));
                GC.KeepAlive(ctx);
                GC.KeepAlive(tensors);
            }
            finally
            {
                foreach (IntPtr q in strings) Utf8.Free(q);
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Optimizers (flame.h "Optimizers")
    // ------------------------------------------------------------------------------------------

    /// <summary>SafeHandle owning a native handle, released once.</summary>
    public sealed class OptimizerHandle : SafeHandle
    {
        /// <summary>Takes over the raw handle h.</summary>
        public OptimizerHandle(IntPtr h) : base(IntPtr.Zero, true) { SetHandle(h); }
        /// <summary>Whether the handle is NULL.</summary>
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        /// <summary>Takes over the raw handle h.</summary>
        protected override bool ReleaseHandle() { Native.flame_optimizer_release(handle); return true; }
    }

    /// <summary>Hyper-parameters of one parameter group (flame_optimizer_options_t), starting from
    /// the defaults of the kind (flame_optimizer_options_init).</summary>
    public sealed class OptimizerOptions
    {
        internal flame_optimizer_options_t O;

        /// <summary>The defaults of kind; an unknown kind is FLAME_ERROR_INVALID_ARGUMENT.</summary>
        [Wraps("flame_optimizer_options_init")]
        public OptimizerOptions(OptimizerKind kind)
        {
            Library.EnsureLoaded();
            O = Init(kind);
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe flame_optimizer_options_t Init(OptimizerKind kind)
        {
            flame_optimizer_options_t o;
            Status.Check(Native.flame_optimizer_options_init(&o, (int)kind));
            return o;
        }

        /// <summary>A copy of the C struct (struct_size set by flame_optimizer_options_init).</summary>
        public flame_optimizer_options_t Raw { get { return O; } }

        /// <summary>The optimizer kind of the defaults.</summary>
        public OptimizerKind Kind { get { return (OptimizerKind)O.kind; } }
        /// <summary>Learning rate.</summary>
        public double Lr { get { return O.lr; } set { O.lr = value; } }
        /// <summary>Weight decay (L2 for SGD / Adam, decoupled for AdamW / Lion).</summary>
        public double WeightDecay { get { return O.weight_decay; } set { O.weight_decay = value; } }
        /// <summary>First moment decay.</summary>
        public double Beta1 { get { return O.beta1; } set { O.beta1 = value; } }
        /// <summary>Second moment decay.</summary>
        public double Beta2 { get { return O.beta2; } set { O.beta2 = value; } }
        /// <summary>Denominator epsilon.</summary>
        public double Eps { get { return O.eps; } set { O.eps = value; } }
        /// <summary>SGD momentum.</summary>
        public double Momentum { get { return O.momentum; } set { O.momentum = value; } }
        /// <summary>SGD dampening.</summary>
        public double Dampening { get { return O.dampening; } set { O.dampening = value; } }
        /// <summary>SGD Nesterov momentum.</summary>
        public bool Nesterov { get { return O.nesterov != 0; } set { O.nesterov = value ? 1 : 0; } }
        /// <summary>Adam / AdamW AMSGrad.</summary>
        public bool Amsgrad { get { return O.amsgrad != 0; } set { O.amsgrad = value ? 1 : 0; } }
        /// <summary>Maximize instead of minimize.</summary>
        public bool Maximize { get { return O.maximize != 0; } set { O.maximize = value ? 1 : 0; } }
        /// <summary>Keep f32 master weights for f16 / bf16 parameters.</summary>
        public bool MasterWeights { get { return O.master_weights != 0; } set { O.master_weights = value ? 1 : 0; } }
        /// <summary>Round updates of bf16 parameters stochastically.</summary>
        public bool StochasticRounding { get { return O.stochastic_rounding != 0; } set { O.stochastic_rounding = value ? 1 : 0; } }
    }

    /// <summary>A FLAME optimizer: updates the parameters that have a .grad, in place. Dispose
    /// releases it and its state; the parameters stay.</summary>
    public sealed partial class Optimizer : IDisposable
    {
        readonly OptimizerHandle h;

        /// <summary>flame_optimizer_create: group 0 is parameters (contiguous floating leaves of ctx,
        /// each at most once in the optimizer).</summary>
        [Wraps("flame_optimizer_create")]
        public Optimizer(Context ctx, OptimizerOptions options, params Tensor[] parameters)
        {
            Library.EnsureLoaded();
            h = new OptimizerHandle(Create(ctx, options, parameters));
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe IntPtr Create(Context ctx, OptimizerOptions options, Tensor[] parameters)
        {
            if (options == null)
                throw new ArgumentNullException("options");
            flame_optimizer_options_t o = options.O;
            IntPtr[] p = Tensor.RawArray(parameters);
            IntPtr raw = IntPtr.Zero;
            fixed (IntPtr* pp = p)
                Status.Check(Native.flame_optimizer_create(ctx.Raw, &o, p.Length == 0 ? null : pp, p.Length, &raw));
            GC.KeepAlive(ctx); GC.KeepAlive(parameters);
            return raw;
        }

        /// <summary>The raw handle (borrowed).</summary>
        public IntPtr Raw
        {
            get
            {
                if (h.IsClosed)
                    throw new ObjectDisposedException("Optimizer");
                return h.DangerousGetHandle();
            }
        }

        /// <summary>flame_optimizer_release: frees the optimizer and its state; the parameters stay.</summary>
        [Wraps("flame_optimizer_release")]
        public void Dispose() { h.Dispose(); }

        /// <summary>flame_optimizer_add_param_group: a new group with its own options (same kind);
        /// returns its index.</summary>
        [Wraps("flame_optimizer_add_param_group")]
        public unsafe int AddParamGroup(OptimizerOptions options, params Tensor[] parameters)
        {
            if (options == null)
                throw new ArgumentNullException("options");
            flame_optimizer_options_t o = options.O;
            IntPtr[] p = Tensor.RawArray(parameters);
            int group = -1;
            fixed (IntPtr* pp = p)
                Status.Check(Native.flame_optimizer_add_param_group(Raw, &o, p.Length == 0 ? null : pp, p.Length, &group));
            GC.KeepAlive(parameters); GC.KeepAlive(this);
            return group;
        }

        /// <summary>flame_optimizer_step: one update of every parameter with a gradient.</summary>
        [Wraps("flame_optimizer_step")]
        public void Step()
        {
            Status.Check(Native.flame_optimizer_step(Raw));
            GC.KeepAlive(this);
        }

        /// <summary>flame_optimizer_zero_grad: drops the gradients (setToNone) or fills them with 0.</summary>
        [Wraps("flame_optimizer_zero_grad")]
        public void ZeroGrad(bool setToNone = true)
        {
            Status.Check(Native.flame_optimizer_zero_grad(Raw, setToNone ? 1 : 0));
            GC.KeepAlive(this);
        }

        /// <summary>flame_optimizer_set_state_bits: 8 for blockwise 8-bit moments (bitsandbytes'
        /// AdamW8bit / Lion8bit), 32 for f32 (the default); before the first step.</summary>
        [Wraps("flame_optimizer_set_state_bits")]
        public void SetStateBits(int bits)
        {
            Status.Check(Native.flame_optimizer_set_state_bits(Raw, bits));
            GC.KeepAlive(this);
        }

        /// <summary>flame_optimizer_set_lr: the learning rate of group, or of every group for -1.</summary>
        [Wraps("flame_optimizer_set_lr")]
        public void SetLr(double lr, int group = -1)
        {
            Status.Check(Native.flame_optimizer_set_lr(Raw, group, lr));
            GC.KeepAlive(this);
        }

        /// <summary>flame_optimizer_get_lr: the learning rate of group.</summary>
        [Wraps("flame_optimizer_get_lr")]
        public unsafe double GetLr(int group = 0)
        {
            double lr = 0;
            Status.Check(Native.flame_optimizer_get_lr(Raw, group, &lr));
            GC.KeepAlive(this);
            return lr;
        }

        /// <summary>flame_optimizer_step_count: the number of completed steps.</summary>
        [Wraps("flame_optimizer_step_count")]
        public unsafe long StepCount()
        {
            long n = 0;
            Status.Check(Native.flame_optimizer_step_count(Raw, &n));
            GC.KeepAlive(this);
            return n;
        }
    }

    // ------------------------------------------------------------------------------------------
    // Attention (flame.h "Attention")
    // ------------------------------------------------------------------------------------------

    /// <summary>Options of scaled-dot-product attention (flame_attention_options_t), starting from
    /// the defaults of flame_attention_options_init: not causal, scale 1 / sqrt(head dim), no dropout.</summary>
    public sealed class AttentionOptions
    {
        internal flame_attention_options_t O;

        /// <summary>The defaults of flame_attention_options_init.</summary>
        [Wraps("flame_attention_options_init")]
        public AttentionOptions()
        {
            Library.EnsureLoaded();
            O = Init();
        }

        [MethodImpl(MethodImplOptions.NoInlining)]
        static unsafe flame_attention_options_t Init()
        {
            flame_attention_options_t o;
            Status.Check(Native.flame_attention_options_init(&o));
            return o;
        }

        /// <summary>A copy of the C struct (struct_size set by flame_attention_options_init).</summary>
        public flame_attention_options_t Raw { get { return O; } }

        /// <summary>Query i attends to keys j &lt;= i only (top-left aligned, as PyTorch's is_causal).</summary>
        public bool Causal
        {
            get { return (O.flags & Native.FLAME_ATTENTION_CAUSAL) != 0; }
            set { O.flags = value ? (O.flags | Native.FLAME_ATTENTION_CAUSAL) : (O.flags & ~Native.FLAME_ATTENTION_CAUSAL); }
        }
        /// <summary>The factor of q k^T; 0 means 1 / sqrt(head dim).</summary>
        public double Scale { get { return O.scale; } set { O.scale = value; } }
        /// <summary>Probability of zeroing each attention weight, in [0, 1).</summary>
        public double DropoutP { get { return O.dropout_p; } set { O.dropout_p = value; } }
    }

    public sealed partial class Tensor
    {
        /// <summary>flame_scaled_dot_product_attention: this is q [B, H, Lq, D]; k [B, H, Lk, D], v
        /// [B, H, Lk, Dv]; mask (may be null: bool, or additive in q's dtype) broadcasts to
        /// [B, H, Lq, Lk]; options null means the defaults. Returns [B, H, Lq, Dv].</summary>
        [Wraps("flame_scaled_dot_product_attention")]
        public unsafe Tensor ScaledDotProductAttention(Tensor k, Tensor v, Tensor mask = null, AttentionOptions options = null)
        {
            IntPtr o = IntPtr.Zero;
            if (options == null)
            {
                Status.Check(Native.flame_scaled_dot_product_attention(Raw, RawOf(k), RawOf(v), RawOf(mask), null, &o));
            }
            else
            {
                flame_attention_options_t opts = options.O;
                Status.Check(Native.flame_scaled_dot_product_attention(Raw, RawOf(k), RawOf(v), RawOf(mask), &opts, &o));
            }
            GC.KeepAlive(this); GC.KeepAlive(k); GC.KeepAlive(v); GC.KeepAlive(mask);
            return new Tensor(o);
        }
    }

    /// <summary>NUL-terminated UTF-8 strings for the C side (a string holding NUL ends there).</summary>
    static class Utf8
    {
        public static IntPtr Alloc(string s)
        {
            if (s == null)
                return IntPtr.Zero;  // the C side reports the NULL argument
            byte[] b = Encoding.UTF8.GetBytes(s);
            IntPtr p = Marshal.AllocHGlobal(b.Length + 1);
            Marshal.Copy(b, 0, p, b.Length);
            Marshal.WriteByte(p, b.Length, 0);
            return p;
        }

        public static void Free(IntPtr p)
        {
            if (p != IntPtr.Zero)
                Marshal.FreeHGlobal(p);
        }

        public static unsafe string Read(byte* p)
        {
            if (p == null)
                return null;
            int n = 0;
            while (p[n] != 0) ++n;
            var b = new byte[n];
            Marshal.Copy((IntPtr)p, b, 0, n);
            return Encoding.UTF8.GetString(b);
        }
    }
}
