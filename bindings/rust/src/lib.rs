//! Safe Rust bindings to FLAME, a GPU tensor library with autograd.
//!
//! # Loading
//!
//! The library is loaded at run time with `dlopen` on the first call that needs it: from
//! `$FLAME_LIBRARY` when set, else `libflame.so.1` (then `libflame.so`) through the system search
//! path (`LD_LIBRARY_PATH`, ldconfig); [`load_from`] picks a file explicitly. Every symbol of
//! `include/flame.h` is resolved once into [`sys::Api`] and the ABI version is compared with
//! [`sys::FLAME_ABI_VERSION`] before anything else is called. A missing library, a missing symbol
//! or another ABI version is an [`Error`] with status [`Status::LOAD_FAILED`], never a panic; its
//! message lists every path tried with the loader's reason and says how to point at the library.
//!
//! # Context and tensors
//!
//! A [`Context`] is one GPU with its stream, memory pool and kernel cache ([`ContextOptions`] for
//! the device, seed, memory limit...). A [`Tensor`] is a reference-counted strided view: `Clone`
//! retains, `Drop` releases, so intermediates go away when they leave scope. Host data goes in with
//! [`Context::from_slice`] and comes back with [`Tensor::to_vec`] (which waits for the GPU).
//! Operations are methods returning `Result<Tensor>`; `+ - * /` work on `&Tensor` and `f64` and
//! return `Result` too. Arguments that the C header lets be NULL are `Option<&Tensor>`; enums are
//! Rust enums ([`DType::BF16`], [`OptimizerKind::AdamW`]) converted from raw values with `TryFrom`.
//!
//! ```no_run
//! use flame::{Activation, Context, DType};
//! # fn main() -> flame::Result<()> {
//! let ctx = Context::new()?;
//! let x = ctx.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = ctx.randn(&[3, 2], DType::F32)?;
//! let y = x.linear(&w, None, Activation::Relu)?;   // bias may be None
//! assert_eq!(y.shape()?, vec![2, 3]);
//! # Ok(()) }
//! ```
//!
//! # Autograd
//!
//! Mark leaves with [`Tensor::set_requires_grad`]; [`Tensor::backward`] fills their `.grad`
//! ([`Tensor::grad`]); [`Context::grad`] returns gradients without touching `.grad`;
//! [`Context::no_grad`] runs a closure with recording off. Hooks are closures
//! ([`Tensor::register_hook`]), and so are checkpointed blocks ([`Context::checkpoint`]); a panic
//! inside one is caught and becomes an error status with the panic's message.
//!
//! ```no_run
//! # fn main() -> flame::Result<()> {
//! let ctx = flame::Context::new()?;
//! let x = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//! x.set_requires_grad(true)?;
//! let hook = x.register_hook(|g| Ok(Some((g * 0.5)?)))?;   // halves the gradient
//! (&x * &x)?.sum_all()?.backward()?;
//! assert_eq!(x.grad()?.unwrap().to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
//! hook.remove();
//! # Ok(()) }
//! ```
//!
//! # Errors
//!
//! Every call returns [`Result`]; an [`Error`] holds the [`Status`] and the library's message, and
//! displays as `STATUS_NAME: message` (also through `Debug`, which is what `fn main() ->
//! flame::Result<()>` prints). Without a GPU, [`Context::new`] fails with
//! [`Status::ERROR_NO_DRIVER`] or [`Status::ERROR_NO_DEVICE`]; the examples exit with status 2 then.
//!
//! ```no_run
//! match flame::Context::new() {
//!     Ok(ctx) => println!("running on {}", ctx.device_name().unwrap()),
//!     Err(e) if e.status == flame::Status::ERROR_NO_DRIVER => eprintln!("no GPU driver: {}", e),
//!     Err(e) => eprintln!("{}", e),   // e.g. "LOAD_FAILED: cannot load the FLAME library; tried: ..."
//! }
//! ```
//!
//! # A training loop
//!
//! [`Optimizer`] (SGD, Adam, AdamW, Lion with [`OptimizerOptions`]) updates the parameters in place;
//! its state goes to a file with [`Optimizer::save_state`]. [`GradScaler`] adds dynamic loss scaling
//! for f16 training.
//!
//! ```no_run
//! use flame::{Activation, Context, DType, Optimizer, OptimizerKind, OptimizerOptions, Reduction};
//! # fn main() -> flame::Result<()> {
//! let ctx = Context::new()?;
//! let w = (&ctx.randn(&[1, 4], DType::F32)? * 0.1)?;
//! w.set_requires_grad(true)?;
//! let mut options = OptimizerOptions::new(OptimizerKind::AdamW)?;
//! options.lr = 1e-2;
//! let opt = Optimizer::new(&ctx, &options, &[&w])?;
//! let x = ctx.randn(&[64, 4], DType::F32)?;
//! let y = x.sum(&[1], true)?;                             // the target: the sum of the inputs
//! for step in 0..200 {
//!     let loss = x.linear(&w, None, Activation::None)?.mse_loss(&y, Reduction::Mean)?;
//!     loss.backward()?;
//!     opt.step()?;
//!     opt.zero_grad(true)?;
//!     if step % 50 == 0 {
//!         println!("step {} loss {:.4}", step, loss.item()?);
//!     }
//! }                                                       // each step's tensors drop here
//! opt.save_state("adamw.state")?;
//! # Ok(()) }
//! ```
//!
//! # Beyond the basics
//!
//! Convolution and pooling ([`Tensor::conv2d`], [`ConvOptions`], [`Pool2dOptions`]), RoPE
//! ([`RopeOptions`]), attention ([`AttentionOptions`]), LoRA adapters ([`Lora`]), safetensors files
//! ([`SafetensorsFile`], [`save_safetensors`]), CUDA graphs ([`Context::capture_graph`], [`Graph`]),
//! fused elementwise expressions ([`Fused`]), NCCL communicators and data parallelism ([`Comm`],
//! [`DataParallel`]), models with named parameters and forward passes ([`Model`]). Every export of
//! the C ABI has a safe wrapper: [`WRAPPED`] (generated) and [`HAND_WRAPPED`] name it, and a test
//! checks that none is missing. The raw table stays available
//! through [`api`] for what the safe layer does not express (the C log callback).
//!
//! Threads: the C contract serialises calls on one context with a lock inside the context, so
//! [`Context`] and [`Tensor`] are `Send` and `Sync`. Hook closures must be `Send`: backward may run
//! on any thread.

#![allow(clippy::missing_safety_doc)]

pub mod sys;
mod attention;
mod model;
mod ops;
mod optim;
mod safetensors;
mod toolkit;

pub use attention::AttentionOptions;
pub use model::{estimate_memory, known_architectures, known_architectures_json, parse_json_string_array, MemoryEstimate, Model};
pub use ops::{Activation, DType, LogLevel, OptimizerKind, PadMode, ReduceOp, Reduction, WRAPPED};
pub use optim::{Optimizer, OptimizerOptions};
pub use safetensors::{save_safetensors, Params, ParamsLoad, SafetensorsFile};
pub use toolkit::{
    unwrapped, Comm, CommId, CommOptions, ConvOptions, DataParallel, DataParallelOptions, Zero, ZeroOptions, Fused, Graph, GradScaler,
    GradScalerOptions, Lora, Pool2dOptions, RopeOptions, HAND_WRAPPED, NOT_WRAPPED_BY_DESIGN, STAT_COLUMNS,
};
pub use sys::Status;

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

// ---------------------------------------------------------------------------------------------
// dlopen
// ---------------------------------------------------------------------------------------------

#[link(name = "dl")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

/// Default library name: the SONAME, so that only the runtime package is needed.
pub const DEFAULT_LIBRARY: &str = "libflame.so.1";
/// Environment variable naming the library path to load instead of [`DEFAULT_LIBRARY`].
pub const LIBRARY_ENV: &str = "FLAME_LIBRARY";

struct Library {
    api: sys::Api,
    path: String,
}
// The handle is never closed; the table holds plain function pointers.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

// The outcome of the first load, written once under LIBRARY_ONCE (std::sync::OnceLock needs Rust
// 1.70; Debian 12 ships 1.63) and only read afterwards.
static LIBRARY_ONCE: Once = Once::new();
static mut LIBRARY: Option<std::result::Result<Library, Error>> = None;

fn library(init: impl FnOnce() -> std::result::Result<Library, Error>) -> &'static std::result::Result<Library, Error> {
    LIBRARY_ONCE.call_once(|| unsafe { *std::ptr::addr_of_mut!(LIBRARY) = Some(init()) });
    // Safe: written once inside call_once, which every reader passes first.
    unsafe { (*std::ptr::addr_of!(LIBRARY)).as_ref().expect("library initialised by call_once") }
}

/// Loads the first candidate that opens; the error lists every candidate with its dlerror and
/// says how to point at the library.
fn open_first(candidates: &[String]) -> std::result::Result<Library, Error> {
    let mut tried = Vec::new();
    for path in candidates {
        match open_library(path) {
            Ok(lib) => return Ok(lib),
            // A library that opened but is not FLAME's (missing symbol, other ABI): report it as is.
            Err(e) if !e.message.starts_with("cannot load ") => return Err(e),
            Err(e) => tried.push(format!("  {}", &e.message["cannot load ".len()..])),
        }
    }
    Err(Error::load(format!(
        "cannot load the FLAME library; tried:\n{}\nSet {}=/path/to/libflame.so.1 (the file of a build: build/libflame.so.1) \
         or add its directory to LD_LIBRARY_PATH.",
        tried.join("\n"),
        LIBRARY_ENV
    )))
}

/// The paths [`api`] tries, in order: `$FLAME_LIBRARY` alone when set, else [`DEFAULT_LIBRARY`]
/// and `libflame.so` (a development install) through the dynamic loader's search path.
pub fn library_candidates() -> Vec<String> {
    match std::env::var(LIBRARY_ENV) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec![DEFAULT_LIBRARY.to_string(), "libflame.so".to_string()],
    }
}

fn last_dlerror() -> String {
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn open_library(path: &str) -> std::result::Result<Library, Error> {
    let cpath = CString::new(path).map_err(|_| Error::load(format!("library path {path:?} contains NUL")))?;
    let handle = unsafe {
        dlerror();
        dlopen(cpath.as_ptr(), RTLD_NOW | RTLD_LOCAL)
    };
    if handle.is_null() {
        return Err(Error::load(format!("cannot load {path}: {}", last_dlerror())));
    }
    let mut resolve = |name: &'static [u8]| -> std::result::Result<*mut c_void, String> {
        let p = unsafe {
            dlerror();
            dlsym(handle, name.as_ptr() as *const c_char)
        };
        if p.is_null() {
            let n = String::from_utf8_lossy(&name[..name.len() - 1]).into_owned();
            Err(format!("{path} lacks symbol {n} ({}): library older than these bindings?", last_dlerror()))
        } else {
            Ok(p)
        }
    };
    let api = unsafe { sys::Api::load(&mut resolve) }.map_err(Error::load)?;
    let abi = unsafe { (api.flame_abi_version)() };
    if abi != sys::FLAME_ABI_VERSION {
        return Err(Error::load(format!(
            "{path} has ABI version {abi}, these bindings need {}",
            sys::FLAME_ABI_VERSION
        )));
    }
    Ok(Library { api, path: path.to_string() })
}

/// Loads the library (once; later calls return the first outcome) and returns the raw table.
/// Called implicitly by everything that needs the library.
pub fn api() -> Result<&'static sys::Api> {
    match library(|| open_first(&library_candidates())) {
        Ok(lib) => Ok(&lib.api),
        Err(e) => Err(e.clone()),
    }
}

/// Loads the library from `path` unless one is loaded already. Returns an error when another
/// library was loaded before or the load fails.
pub fn load_from(path: &str) -> Result<()> {
    let lib = library(|| open_library(path));
    match lib {
        Ok(l) if l.path == path => Ok(()),
        Ok(l) => Err(Error::load(format!("{} is loaded already", l.path))),
        Err(e) => Err(e.clone()),
    }
}

/// The path or name the library was loaded from.
pub fn library_path() -> Result<String> {
    api()?;
    Ok(library(|| unreachable!()).as_ref().map(|l| l.path.clone()).unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

impl Status {
    /// Not a FLAME status: the library could not be loaded, lacked a symbol or had another ABI
    /// version. Negative, so it can never collide with a status of the C ABI.
    pub const LOAD_FAILED: Status = Status(-1);

    /// The library's name for the status (`flame_status_string`), or the C name known to these
    /// bindings when the library is not loaded.
    pub fn name(self) -> String {
        if self == Status::LOAD_FAILED {
            return "LOAD_FAILED".to_string();
        }
        match api() {
            Ok(api) => unsafe { cstr((api.flame_status_string)(self.0)) },
            Err(_) => self.c_name().map(str::to_string).unwrap_or_else(|| format!("Status({})", self.0)),
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A failed FLAME call: its status and the library's message (`flame_last_error_message`).
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    fn load(message: String) -> Error {
        Error { status: Status::LOAD_FAILED, message }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // What `fn main() -> flame::Result<()>` prints: the status name and the message, as Display.
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

#[doc(hidden)]
pub fn check(status: sys::flame_status_t) -> Result<()> {
    if status == sys::FLAME_OK {
        return Ok(());
    }
    let message = match api() {
        Ok(api) => unsafe { cstr((api.flame_last_error_message)()) },
        Err(_) => String::new(),
    };
    Err(Error { status: Status(status), message })
}

#[doc(hidden)]
pub fn len_as<T: TryFrom<usize>>(n: usize) -> Result<T> {
    T::try_from(n).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("length {n} too large")))
}

/// Empty slices go to C as NULL (the header's "NULL with count 0" case).
#[doc(hidden)]
pub fn slice_ptr<T>(s: &[T]) -> *const T {
    if s.is_empty() {
        std::ptr::null()
    } else {
        s.as_ptr()
    }
}

// ---------------------------------------------------------------------------------------------
// Library-wide functions
// ---------------------------------------------------------------------------------------------

/// `flame_version_string()`: "MAJOR.MINOR.PATCH" of the loaded library.
pub fn version() -> Result<String> {
    let api = api()?;
    Ok(unsafe { cstr((api.flame_version_string)()) })
}

/// `flame_abi_version()` of the loaded library (equal to [`sys::FLAME_ABI_VERSION`] once loaded).
pub fn abi_version() -> Result<i32> {
    let api = api()?;
    Ok(unsafe { (api.flame_abi_version)() })
}

/// `flame_last_error_message()` of this thread.
pub fn last_error_message() -> Result<String> {
    let api = api()?;
    Ok(unsafe { cstr((api.flame_last_error_message)()) })
}

/// `flame_set_error_message()`: sets this thread's message (interior NULs are cut).
pub fn set_error_message(msg: &str) -> Result<()> {
    let api = api()?;
    let m = CString::new(msg.split('\0').next().unwrap_or("")).unwrap();
    unsafe { (api.flame_set_error_message)(m.as_ptr()) };
    Ok(())
}

/// `flame_device_count()`.
pub fn device_count() -> Result<i32> {
    let api = api()?;
    let mut n = 0;
    check(unsafe { (api.flame_device_count)(&mut n) })?;
    Ok(n)
}

impl DType {
    /// `flame_dtype_size`: bytes per element, 0 for an unknown dtype.
    pub fn size(self) -> Result<usize> {
        let api = api()?;
        Ok(unsafe { (api.flame_dtype_size)(self.raw()) })
    }
    /// `flame_dtype_name`: "f32", "bf16", ... or "unknown".
    pub fn name(self) -> Result<String> {
        let api = api()?;
        Ok(unsafe { cstr((api.flame_dtype_name)(self.raw())) })
    }
}

/// Host element types that map to a FLAME dtype.
pub trait Element: Copy + Default + 'static {
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------

/// Options of [`Context::with_options`]; `Default` matches `flame_ctx_options_init`.
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    pub device: i32,
    pub seed: u64,
    /// None: the library's default; Some("") disables the disk cache.
    pub kernel_cache_dir: Option<String>,
    /// Bytes of tensor memory the context may hold; 0 = no limit.
    pub memory_limit: u64,
    pub allow_tf32: bool,
    /// Always cuBLASLt's first heuristic choice instead of timing its top candidates per shape.
    pub gemm_heuristic_only: bool,
    /// The least level of the library's messages printed to stderr (set right after creation with
    /// [`Context::set_log_level`]); None: `$FLAME_LOG`, else info.
    pub log_level: Option<LogLevel>,
}

/// Memory statistics of a context (`flame_memory_stats_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_in_use: u64,
    pub bytes_reserved: u64,
    pub peak_bytes_in_use: u64,
    pub live_tensors: u64,
}

/// Counts of the work a context issued from the host (`flame_ctx_counters_t`; flame.h says what
/// each counts, and that a graph replay is one launch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub launches: u64,
    pub cast_kernels: u64,
    pub host_syncs: u64,
    pub driver_allocations: u64,
}

/// A FLAME context: one GPU, its stream, memory pool and kernels. Drop destroys the caller's
/// reference; tensors keep the context alive.
///
/// ```no_run
/// use flame::{Context, ContextOptions, DType};
/// # fn main() -> flame::Result<()> {
/// let ctx = Context::with_options(&ContextOptions { seed: 42, ..Default::default() })?;
/// let noise = ctx.randn(&[2, 3], DType::F32)?;
/// let mean = ctx.no_grad(|| noise.mean(&[0, 1], false))?.item()?;
/// println!("{}: {} MiB in use, mean {}", ctx.device_name()?, ctx.memory_stats()?.bytes_in_use >> 20, mean);
/// # Ok(()) }
/// ```
pub struct Context {
    pub(crate) raw: sys::flame_ctx_t,
    owned: bool,
}

// The C contract: calls on one context are serialised by its internal lock.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// A context on device 0 with default options.
    pub fn new() -> Result<Context> {
        Self::create(None)
    }

    pub fn with_options(opts: &ContextOptions) -> Result<Context> {
        Self::create(Some(opts))
    }

    fn create(opts: Option<&ContextOptions>) -> Result<Context> {
        let api = api()?;
        let mut raw: sys::flame_ctx_t = std::ptr::null_mut();
        let status = match opts {
            None => unsafe { (api.flame_ctx_create)(std::ptr::null(), &mut raw) },
            Some(o) => {
                let mut c: sys::flame_ctx_options_t = unsafe { std::mem::zeroed() };
                check(unsafe { (api.flame_ctx_options_init)(&mut c) })?;
                c.device = o.device;
                c.seed = o.seed;
                c.memory_limit = o.memory_limit;
                c.allow_tf32 = o.allow_tf32 as i32;
                c.gemm_heuristic_only = o.gemm_heuristic_only as i32;
                let dir = match &o.kernel_cache_dir {
                    Some(d) => Some(CString::new(d.as_str()).map_err(|_| {
                        Error::new(Status::ERROR_INVALID_ARGUMENT, "kernel_cache_dir contains NUL")
                    })?),
                    None => None,
                };
                c.kernel_cache_dir = dir.as_ref().map_or(std::ptr::null(), |d| d.as_ptr());
                unsafe { (api.flame_ctx_create)(&c, &mut raw) }
            }
        };
        check(status)?;
        let ctx = Context { raw, owned: true };
        if let Some(l) = opts.and_then(|o| o.log_level) {
            ctx.set_log_level(l)?;
        }
        Ok(ctx)
    }

    /// The least level of this context's messages printed to stderr (`flame_ctx_set_log` without a
    /// callback). The C callback is not wrapped: its user data must outlive the context's last
    /// tensor, which a closure owned here cannot guarantee; call [`sys::Api::flame_ctx_set_log`] if
    /// you need it.
    pub fn set_log_level(&self, level: LogLevel) -> Result<()> {
        check(unsafe { (api()?.flame_ctx_set_log)(self.raw, level.raw(), None, std::ptr::null_mut()) })
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_ctx_t {
        self.raw
    }

    /// `flame_ctx_device_name`.
    pub fn device_name(&self) -> Result<String> {
        let api = api()?;
        let mut buf = vec![0u8; 256];
        check(unsafe { (api.flame_ctx_device_name)(self.raw, buf.as_mut_ptr() as *mut c_char, buf.len()) })?;
        let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// `flame_ctx_memory_stats`.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let api = api()?;
        let mut s: sys::flame_memory_stats_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::flame_memory_stats_t>();
        check(unsafe { (api.flame_ctx_memory_stats)(self.raw, &mut s) })?;
        Ok(MemoryStats {
            bytes_in_use: s.bytes_in_use,
            bytes_reserved: s.bytes_reserved,
            peak_bytes_in_use: s.peak_bytes_in_use,
            live_tensors: s.live_tensors,
        })
    }

    /// `flame_ctx_counters`: launches, cast kernels, host syncs and driver allocations since the
    /// context's creation or the last `reset_counters`.
    pub fn counters(&self) -> Result<Counters> {
        let api = api()?;
        let mut s: sys::flame_ctx_counters_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::flame_ctx_counters_t>();
        check(unsafe { (api.flame_ctx_counters)(self.raw, &mut s) })?;
        Ok(Counters {
            launches: s.launches,
            cast_kernels: s.cast_kernels,
            host_syncs: s.host_syncs,
            driver_allocations: s.driver_allocations,
        })
    }

    /// `flame_ctx_stream`: the CUstream, borrowed while the context lives.
    pub fn stream(&self) -> Result<*mut c_void> {
        let api = api()?;
        let mut s = std::ptr::null_mut();
        check(unsafe { (api.flame_ctx_stream)(self.raw, &mut s) })?;
        Ok(s)
    }

    /// `flame_ctx_set_grad_enabled`; returns the previous mode.
    pub fn set_grad_enabled(&self, enabled: bool) -> Result<bool> {
        let api = api()?;
        let mut prev = 0;
        check(unsafe { (api.flame_ctx_set_grad_enabled)(self.raw, enabled as i32, &mut prev) })?;
        Ok(prev != 0)
    }

    /// `flame_ctx_set_inference_mode`; returns the previous mode.
    pub fn set_inference_mode(&self, enabled: bool) -> Result<bool> {
        let api = api()?;
        let mut prev = 0;
        check(unsafe { (api.flame_ctx_set_inference_mode)(self.raw, enabled as i32, &mut prev) })?;
        Ok(prev != 0)
    }

    /// Runs `f` with grad mode off, restoring the previous mode afterwards (also on error).
    pub fn no_grad<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let prev = self.set_grad_enabled(false)?;
        let r = f();
        let restored = self.set_grad_enabled(prev);
        let v = r?;
        restored?;
        Ok(v)
    }

    /// A tensor with a copy of `data` (row-major) and the given shape.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[i64]) -> Result<Tensor> {
        let api = api()?;
        let mut out = std::ptr::null_mut();
        check(unsafe {
            (api.flame_from_host)(
                self.raw,
                data.as_ptr() as *const c_void,
                std::mem::size_of_val(data),
                slice_ptr(shape),
                len_as::<i32>(shape.len())?,
                T::DTYPE.raw(),
                &mut out,
            )
        })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// A 0-d tensor holding `value`.
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor> {
        self.full(&[], dtype, value)
    }

    /// `flame_grad`: gradients of `outputs` (weighted by `grad_outputs`, None = ones) with respect
    /// to `inputs`; None for an unused input when `flags` has `FLAME_GRAD_ALLOW_UNUSED`.
    pub fn grad(
        &self,
        outputs: &[&Tensor],
        grad_outputs: Option<&[Option<&Tensor>]>,
        inputs: &[&Tensor],
        flags: u32,
    ) -> Result<Vec<Option<Tensor>>> {
        let api = api()?;
        let outs: Vec<sys::flame_tensor_t> = outputs.iter().map(|t| t.raw).collect();
        let gos: Option<Vec<sys::flame_tensor_t>> = grad_outputs.map(|g| {
            g.iter().map(|t| t.map_or(std::ptr::null_mut(), |t| t.raw)).collect()
        });
        if let Some(g) = &gos {
            if g.len() != outs.len() {
                return Err(Error::new(Status::ERROR_INVALID_ARGUMENT, "grad_outputs must match outputs"));
            }
        }
        let ins: Vec<sys::flame_tensor_t> = inputs.iter().map(|t| t.raw).collect();
        let mut results: Vec<sys::flame_tensor_t> = vec![std::ptr::null_mut(); ins.len()];
        check(unsafe {
            (api.flame_grad)(
                self.raw,
                slice_ptr(&outs),
                gos.as_ref().map_or(std::ptr::null(), |g| slice_ptr(g)),
                len_as::<i32>(outs.len())?,
                slice_ptr(&ins),
                len_as::<i32>(ins.len())?,
                flags,
                if results.is_empty() { std::ptr::null_mut() } else { results.as_mut_ptr() },
            )
        })?;
        Ok(results.into_iter().map(|r| if r.is_null() { None } else { Some(unsafe { Tensor::from_raw(r) }) }).collect())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            if let Ok(api) = api() {
                unsafe { (api.flame_ctx_destroy)(self.raw) };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor
// ---------------------------------------------------------------------------------------------

/// A reference to a FLAME tensor. Clone retains, Drop releases (neither panics).
///
/// ```no_run
/// # fn main() -> flame::Result<()> {
/// let ctx = flame::Context::new()?;
/// let a = ctx.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = (&a.matmul(&a.transpose(0, 1)?)? + 1.0)?;     // operators return Result too
/// assert_eq!(b.shape()?, vec![2, 2]);
/// assert_eq!(b.to_vec::<f32>()?, vec![6.0, 12.0, 12.0, 26.0]);
/// # Ok(()) }
/// ```
pub struct Tensor {
    pub(crate) raw: sys::flame_tensor_t,
}

unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    /// Takes over a new reference (for example an OUT handle of a raw call).
    ///
    /// # Safety
    /// `raw` must be a valid, owned tensor reference of the loaded library.
    pub unsafe fn from_raw(raw: sys::flame_tensor_t) -> Tensor {
        Tensor { raw }
    }

    /// Retains a borrowed handle and wraps the new reference.
    ///
    /// # Safety
    /// `raw` must be a valid tensor handle of the loaded library.
    pub unsafe fn from_borrowed(raw: sys::flame_tensor_t) -> Result<Tensor> {
        let api = api()?;
        check((api.flame_tensor_retain)(raw))?;
        Ok(Tensor { raw })
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_tensor_t {
        self.raw
    }

    /// Gives up ownership of the reference without releasing it.
    pub fn into_raw(self) -> sys::flame_tensor_t {
        let r = self.raw;
        std::mem::forget(self);
        r
    }

    /// A tensor with a copy of `data` (row-major).
    pub fn from_slice<T: Element>(ctx: &Context, data: &[T], shape: &[i64]) -> Result<Tensor> {
        ctx.from_slice(data, shape)
    }

    /// Copies the elements to the host in row-major order. `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let dt = self.dtype()?;
        if dt != T::DTYPE {
            return Err(Error::new(
                Status::ERROR_DTYPE_MISMATCH,
                format!("to_vec: tensor is {dt:?}, requested {:?}", T::DTYPE),
            ));
        }
        let n = self.numel()? as usize;
        let mut v = vec![T::default(); n];
        let api = api()?;
        check(unsafe { (api.flame_to_host)(self.raw, v.as_mut_ptr() as *mut c_void, std::mem::size_of_val(&v[..])) })?;
        Ok(v)
    }

    /// Copies raw bytes to the host (any dtype; f16/bf16 as their bit patterns).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let api = api()?;
        let n = self.numel()? as usize * self.dtype()?.size()?;
        let mut v = vec![0u8; n];
        check(unsafe { (api.flame_to_host)(self.raw, v.as_mut_ptr() as *mut c_void, n) })?;
        Ok(v)
    }

    /// `flame_tensor_shape`.
    pub fn shape(&self) -> Result<Vec<i64>> {
        let api = api()?;
        let mut d = [0i64; sys::FLAME_MAX_DIMS as usize];
        let n = self.ndim()?;
        check(unsafe { (api.flame_tensor_shape)(self.raw, d.as_mut_ptr(), d.len() as i32) })?;
        Ok(d[..n as usize].to_vec())
    }

    /// `flame_tensor_strides`, in elements.
    pub fn strides(&self) -> Result<Vec<i64>> {
        let api = api()?;
        let mut d = [0i64; sys::FLAME_MAX_DIMS as usize];
        let n = self.ndim()?;
        check(unsafe { (api.flame_tensor_strides)(self.raw, d.as_mut_ptr(), d.len() as i32) })?;
        Ok(d[..n as usize].to_vec())
    }

    /// `flame_tensor_data_ptr`: the device address, valid while `self` lives.
    pub fn data_ptr(&self) -> Result<*mut c_void> {
        let api = api()?;
        let mut p = std::ptr::null_mut();
        check(unsafe { (api.flame_tensor_data_ptr)(self.raw, &mut p) })?;
        Ok(p)
    }

    /// `flame_tensor_to_dlpack`: a new `DLManagedTensor` sharing this tensor's memory (no copy;
    /// FLAME's stream is synchronised first). The caller owns it: hand it to a consumer or call its
    /// deleter exactly once (from any thread). Read it through a dlpack.h binding of your own.
    pub fn to_dlpack(&self) -> Result<*mut sys::DLManagedTensor> {
        let api = api()?;
        let mut p = std::ptr::null_mut();
        check(unsafe { (api.flame_tensor_to_dlpack)(self.raw, &mut p) })?;
        Ok(p)
    }

    /// `flame_tensor_to_dlpack_versioned`: as [`Tensor::to_dlpack`] with `DLManagedTensorVersioned`
    /// (an `ERROR_UNSUPPORTED` error from a library built with a pre-1.0 dlpack.h).
    pub fn to_dlpack_versioned(&self) -> Result<*mut sys::DLManagedTensorVersioned> {
        let api = api()?;
        let mut p = std::ptr::null_mut();
        check(unsafe { (api.flame_tensor_to_dlpack_versioned)(self.raw, &mut p) })?;
        Ok(p)
    }

    /// `flame_tensor_from_dlpack`: a tensor of `ctx` over `src`'s CUDA memory (no copy). On `Ok`
    /// FLAME owns `src` and calls its deleter once when the last reference goes; on `Err` `src`
    /// is still the caller's.
    ///
    /// # Safety
    /// `src` must point to a valid `DLManagedTensor` whose data is ready (the producer's work on it
    /// finished) and stays valid until its deleter is called.
    pub unsafe fn from_dlpack(ctx: &Context, src: *mut sys::DLManagedTensor) -> Result<Tensor> {
        let api = api()?;
        let mut t = std::ptr::null_mut();
        check((api.flame_tensor_from_dlpack)(ctx.raw, src, &mut t))?;
        Ok(Tensor::from_raw(t))
    }

    /// `flame_tensor_from_dlpack_versioned`: as [`Tensor::from_dlpack`] for the versioned struct.
    ///
    /// # Safety
    /// As for [`Tensor::from_dlpack`].
    pub unsafe fn from_dlpack_versioned(ctx: &Context, src: *mut sys::DLManagedTensorVersioned) -> Result<Tensor> {
        let api = api()?;
        let mut t = std::ptr::null_mut();
        check((api.flame_tensor_from_dlpack_versioned)(ctx.raw, src, &mut t))?;
        Ok(Tensor::from_raw(t))
    }

    /// The tensor's context (a non-owning wrapper: dropping it does not destroy the context).
    pub fn context(&self) -> Result<Context> {
        let api = api()?;
        let mut c = std::ptr::null_mut();
        check(unsafe { (api.flame_tensor_context)(self.raw, &mut c) })?;
        Ok(Context { raw: c, owned: false })
    }

    /// The accumulated gradient, None when there is none.
    pub fn grad(&self) -> Result<Option<Tensor>> {
        let api = api()?;
        let mut g = std::ptr::null_mut();
        check(unsafe { (api.flame_tensor_grad)(self.raw, &mut g) })?;
        Ok(if g.is_null() { None } else { Some(unsafe { Tensor::from_raw(g) }) })
    }

    /// Replaces (Some) or clears (None) the gradient.
    pub fn set_grad(&self, grad: Option<&Tensor>) -> Result<()> {
        let api = api()?;
        check(unsafe { (api.flame_tensor_set_grad)(self.raw, grad.map_or(std::ptr::null_mut(), |g| g.raw)) })
    }

    /// Backward from a one-element tensor (gradient 1), freeing the graph.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, 0)
    }

    /// `flame_backward` with an explicit root gradient and `FLAME_BACKWARD_*` flags.
    pub fn backward_with(&self, grad: Option<&Tensor>, flags: u32) -> Result<()> {
        let ctx = self.context()?;
        let api = api()?;
        check(unsafe { (api.flame_backward)(ctx.raw, self.raw, grad.map_or(std::ptr::null_mut(), |g| g.raw), flags) })
    }

    fn collect_pieces(&self, pieces: Vec<sys::flame_tensor_t>, count: usize) -> Vec<Tensor> {
        pieces.into_iter().take(count).map(|p| unsafe { Tensor::from_raw(p) }).collect()
    }

    /// `flame_split`: views of `split_size` elements along `dim`.
    pub fn split(&self, split_size: i64, dim: i32) -> Result<Vec<Tensor>> {
        let api = api()?;
        let shape = self.shape()?;
        let d = if dim < 0 { dim + shape.len() as i32 } else { dim };
        let size = shape.get(d as usize).copied().unwrap_or(0);
        let cap = if split_size > 0 { ((size + split_size - 1) / split_size).max(1) } else { 1 };
        let mut outs = vec![std::ptr::null_mut(); cap as usize];
        let mut count = 0;
        check(unsafe { (api.flame_split)(self.raw, split_size, dim, outs.as_mut_ptr(), cap as i32, &mut count) })?;
        Ok(self.collect_pieces(outs, count as usize))
    }

    /// `flame_split_sizes`: views with the given sizes along `dim`.
    pub fn split_sizes(&self, sizes: &[i64], dim: i32) -> Result<Vec<Tensor>> {
        let api = api()?;
        let mut outs = vec![std::ptr::null_mut(); sizes.len()];
        check(unsafe {
            (api.flame_split_sizes)(self.raw, slice_ptr(sizes), len_as::<i32>(sizes.len())?, dim, if outs.is_empty() { std::ptr::null_mut() } else { outs.as_mut_ptr() })
        })?;
        Ok(self.collect_pieces(outs, sizes.len()))
    }

    /// `flame_chunk`: at most `chunks` views along `dim`.
    pub fn chunk(&self, chunks: i32, dim: i32) -> Result<Vec<Tensor>> {
        let api = api()?;
        let cap = chunks.max(1);
        let mut outs = vec![std::ptr::null_mut(); cap as usize];
        let mut count = 0;
        check(unsafe { (api.flame_chunk)(self.raw, chunks, dim, outs.as_mut_ptr(), cap, &mut count) })?;
        Ok(self.collect_pieces(outs, count as usize))
    }

    /// Registers a gradient hook. `f` gets the incoming gradient and returns `Ok(None)` to keep it
    /// or `Ok(Some(t))` to replace it; an `Err` stops backward with its status and message. A
    /// panic in `f` is caught and stops backward with `ERROR_INTERNAL`. The closure is dropped
    /// when the hook goes (removed, or its tensor freed).
    pub fn register_hook<F>(&self, f: F) -> Result<Hook>
    where
        F: FnMut(&Tensor) -> Result<Option<Tensor>> + Send + 'static,
    {
        let api = api()?;
        let boxed: Box<TensorHookFn> = Box::new(Box::new(f));
        let ud = Box::into_raw(boxed) as *mut c_void;
        let mut h = std::ptr::null_mut();
        let st = unsafe {
            (api.flame_tensor_register_hook)(self.raw, Some(tensor_hook_trampoline), ud, Some(drop_box::<TensorHookFn>), &mut h)
        };
        finish_register(st, h, ud, drop_box::<TensorHookFn>)
    }

    /// Registers a post-accumulate hook on a leaf: `f` gets the leaf after its `.grad` changed.
    pub fn register_post_accumulate_grad_hook<F>(&self, f: F) -> Result<Hook>
    where
        F: FnMut(&Tensor) -> Result<()> + Send + 'static,
    {
        let api = api()?;
        let boxed: Box<PostHookFn> = Box::new(Box::new(f));
        let ud = Box::into_raw(boxed) as *mut c_void;
        let mut h = std::ptr::null_mut();
        let st = unsafe {
            (api.flame_tensor_register_post_accumulate_grad_hook)(self.raw, Some(post_hook_trampoline), ud, Some(drop_box::<PostHookFn>), &mut h)
        };
        finish_register(st, h, ud, drop_box::<PostHookFn>)
    }
}

impl Clone for Tensor {
    /// Retains the handle. Cloning a handle the library rejects gives a null tensor (whose
    /// operations fail with an error) instead of panicking.
    fn clone(&self) -> Tensor {
        match api() {
            Ok(api) if unsafe { (api.flame_tensor_retain)(self.raw) } == sys::FLAME_OK => Tensor { raw: self.raw },
            _ => Tensor { raw: std::ptr::null_mut() },
        }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_tensor_release)(self.raw) };
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.shape(), self.dtype()) {
            (Ok(s), Ok(d)) => write!(f, "Tensor({:?}, {:?})", s, d),
            _ => write!(f, "Tensor({:p})", self.raw),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hooks
// ---------------------------------------------------------------------------------------------

type TensorHookFn = Box<dyn FnMut(&Tensor) -> Result<Option<Tensor>> + Send>;
type PostHookFn = Box<dyn FnMut(&Tensor) -> Result<()> + Send>;

/// A registered hook. Dropping it removes the hook (`flame_hook_remove`); call
/// [`Hook::keep`] to leave it registered for as long as its tensor lives.
#[must_use = "dropping a Hook removes it; use Hook::keep to keep it registered"]
pub struct Hook {
    raw: sys::flame_hook_t,
}
unsafe impl Send for Hook {}
unsafe impl Sync for Hook {}

impl Hook {
    /// Removes the hook now (its closure is dropped).
    pub fn remove(self) {}

    /// Keeps the hook registered until its tensor goes. The handle itself is leaked.
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_hook_remove)(self.raw) };
        }
    }
}

fn finish_register(
    st: sys::flame_status_t,
    h: sys::flame_hook_t,
    ud: *mut c_void,
    destroy: unsafe extern "C" fn(*mut c_void),
) -> Result<Hook> {
    if st != sys::FLAME_OK {
        let e = check(st).unwrap_err();
        // The C contract: on failure the hook was not registered, so destroy was not called.
        // Free the closure ourselves.
        unsafe { destroy(ud) };
        return Err(e);
    }
    Ok(Hook { raw: h })
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

fn hook_failure(r: std::thread::Result<Result<()>>) -> sys::flame_status_t {
    callback_failure(r, "hook")
}

/// The status a Rust callback returns to C: OK, its error's status (its message set as the thread's
/// error message), or ERROR_INTERNAL with the panic's message. `what` names the callback.
fn callback_failure(r: std::thread::Result<Result<()>>, what: &str) -> sys::flame_status_t {
    match r {
        Ok(Ok(())) => sys::FLAME_OK,
        Ok(Err(e)) => {
            let _ = set_error_message(&format!("{} failed: {}", what, e.message));
            if e.status == Status::OK || e.status.0 < 0 {
                sys::FLAME_ERROR_INTERNAL
            } else {
                e.status.0
            }
        }
        Err(p) => {
            let _ = set_error_message(&format!("Rust {} panicked: {}", what, panic_message(&*p)));
            sys::FLAME_ERROR_INTERNAL
        }
    }
}

unsafe extern "C" fn tensor_hook_trampoline(
    ud: *mut c_void,
    grad: sys::flame_tensor_t,
    replacement: *mut sys::flame_tensor_t,
) -> sys::flame_status_t {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        let f = &mut *(ud as *mut TensorHookFn);
        let g = Tensor::from_borrowed(grad)?;
        if let Some(t) = f(&g)? {
            if replacement.is_null() {
                return Err(Error::new(Status::ERROR_INTERNAL, "no replacement slot"));
            }
            *replacement = t.into_raw();
        }
        Ok(())
    }));
    hook_failure(r)
}

unsafe extern "C" fn post_hook_trampoline(ud: *mut c_void, leaf: sys::flame_tensor_t) -> sys::flame_status_t {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        let f = &mut *(ud as *mut PostHookFn);
        let t = Tensor::from_borrowed(leaf)?;
        f(&t)
    }));
    hook_failure(r)
}

unsafe extern "C" fn drop_box<T>(ud: *mut c_void) {
    if !ud.is_null() {
        // A panicking Drop of a captured value must not unwind into C.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(Box::from_raw(ud as *mut T))));
    }
}

// ---------------------------------------------------------------------------------------------
// Operators: `&a + &b` is `a.add(&b)` and gives Result<Tensor>; scalars use the *_scalar ops.
// ---------------------------------------------------------------------------------------------

macro_rules! binop {
    ($tr:ident, $m:ident, $f:ident, $fs:ident, $rfs:expr) => {
        impl std::ops::$tr<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $m(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$f(self, rhs)
            }
        }
        impl std::ops::$tr<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $m(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$f(&self, &rhs)
            }
        }
        impl std::ops::$tr<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $m(self, rhs: f64) -> Result<Tensor> {
                Tensor::$fs(self, rhs)
            }
        }
        impl std::ops::$tr<&Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $m(self, rhs: &Tensor) -> Result<Tensor> {
                let f: fn(f64, &Tensor) -> Result<Tensor> = $rfs;
                f(self, rhs)
            }
        }
    };
}

binop!(Add, add, add, add_scalar, |s, t| t.add_scalar(s));
binop!(Sub, sub, sub, sub_scalar, |s, t| t.rsub_scalar(s));
binop!(Mul, mul, mul, mul_scalar, |s, t| t.mul_scalar(s));
binop!(Div, div, div, div_scalar, |s, t| t.reciprocal()?.mul_scalar(s));

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
