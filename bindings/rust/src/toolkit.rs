//! Hand-written safe wrappers for the exports whose shape the generator cannot express (ops.rs
//! covers the regular ones): convolution, pooling and RoPE with options structs, host copies into
//! existing tensors, optimizer state files, gradient statistics on the host, the grad scaler, LoRA
//! adapters, gradient checkpointing with a closure, CUDA graph capture, NCCL communicators and data
//! parallelism, fused expressions.
//!
//! Each native handle lives in an owning struct whose `Drop` calls the C release function once.
//! Options structs are plain Rust structs whose `Default` calls the C `*_options_init` (so the
//! library's defaults are used); the struct_size field is filled in when they cross. Checkpoint
//! closures run behind a trampoline that catches panics and returns them as `ERROR_INTERNAL` with
//! the panic's message. [`HAND_WRAPPED`] names the wrapper of every export wrapped here or in the
//! other hand-written modules; the coverage test checks it together with the generated
//! [`crate::WRAPPED`] against [`crate::sys::SYMBOLS`].

use crate::{api, check, len_as, slice_ptr, sys, Context, DType, Error, Model, Optimizer, Params, ReduceOp, Result, Status, Tensor};
use std::ffi::CString;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn raws(ts: &[&Tensor]) -> Vec<sys::flame_tensor_t> {
    ts.iter().map(|t| t.raw).collect()
}

fn opt_raw(t: Option<&Tensor>) -> sys::flame_tensor_t {
    t.map_or(std::ptr::null_mut(), |t| t.raw)
}

fn path_cstring(path: &std::path::Path) -> Result<CString> {
    let s = path
        .to_str()
        .ok_or_else(|| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("path {:?} is not UTF-8", path)))?;
    CString::new(s).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("path {:?} contains NUL", s)))
}

/// Runs a C `*_options_init` on a zeroed struct; on failure (library missing) the struct stays
/// zeroed with `struct_size` 0, which every call that reads it rejects, after reporting the load
/// error first.
fn init_raw<T>(init: impl FnOnce(&sys::Api, *mut T) -> sys::flame_status_t) -> T {
    let mut raw = std::mem::MaybeUninit::<T>::zeroed();
    if let Ok(api) = api() {
        let _ = init(api, raw.as_mut_ptr());
    }
    unsafe { raw.assume_init() }
}

// ---------------------------------------------------------------------------------------------
// Convolution, pooling, RoPE
// ---------------------------------------------------------------------------------------------

/// Options of the convolutions (`flame_conv_options_t`); `Default` gives the library's defaults
/// (`flame_conv_options_init`): stride 1, padding 0, dilation 1, groups 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvOptions {
    pub stride: [i64; 2],
    pub padding: [i64; 2],
    pub dilation: [i64; 2],
    pub groups: i64,
    /// `conv_transpose2d` only.
    pub output_padding: [i64; 2],
    /// PyTorch's `padding='same'` (stride 1, not for `conv_transpose2d`).
    pub padding_same: bool,
}

impl Default for ConvOptions {
    fn default() -> Self {
        let r: sys::flame_conv_options_t = init_raw(|a, p| unsafe { (a.flame_conv_options_init)(p) });
        ConvOptions {
            stride: r.stride,
            padding: r.padding,
            dilation: r.dilation,
            groups: r.groups,
            output_padding: r.output_padding,
            padding_same: r.padding_same != 0,
        }
    }
}

impl ConvOptions {
    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_conv_options_t {
        sys::flame_conv_options_t {
            struct_size: std::mem::size_of::<sys::flame_conv_options_t>(),
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            groups: self.groups,
            output_padding: self.output_padding,
            padding_same: self.padding_same as i32,
        }
    }
}

/// Options of [`Tensor::max_pool2d`] and [`Tensor::avg_pool2d`] (`flame_pool2d_options_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2dOptions {
    pub kernel_size: [i64; 2],
    pub stride: [i64; 2],
    pub padding: [i64; 2],
    pub dilation: [i64; 2],
    pub ceil_mode: bool,
    pub count_include_pad: bool,
    pub divisor_override: i64,
}

impl Pool2dOptions {
    /// `flame_pool2d_options_init`: the defaults for a `kernel_h` x `kernel_w` window (stride =
    /// kernel size, padding 0, dilation 1, floor mode, count_include_pad).
    pub fn new(kernel_h: i64, kernel_w: i64) -> Pool2dOptions {
        let r: sys::flame_pool2d_options_t =
            init_raw(|a, p| unsafe { (a.flame_pool2d_options_init)(p, kernel_h, kernel_w) });
        Pool2dOptions {
            kernel_size: r.kernel_size,
            stride: r.stride,
            padding: r.padding,
            dilation: r.dilation,
            ceil_mode: r.ceil_mode != 0,
            count_include_pad: r.count_include_pad != 0,
            divisor_override: r.divisor_override,
        }
    }

    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_pool2d_options_t {
        sys::flame_pool2d_options_t {
            struct_size: std::mem::size_of::<sys::flame_pool2d_options_t>(),
            kernel_size: self.kernel_size,
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            ceil_mode: self.ceil_mode as i32,
            count_include_pad: self.count_include_pad as i32,
            divisor_override: self.divisor_override,
        }
    }
}

/// Options of [`Tensor::rope`] (`flame_rope_options_t`); `Default` calls `flame_rope_options_init`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeOptions {
    pub theta: f64,
    /// 0: all of the last dim.
    pub rotary_dim: i64,
    pub position_offset: i64,
    /// Pairs (2i, 2i + 1) (GPT-J, llama) instead of (i, i + rotary_dim / 2).
    pub interleaved: bool,
    pub seq_dim: i32,
}

impl Default for RopeOptions {
    fn default() -> Self {
        let r: sys::flame_rope_options_t = init_raw(|a, p| unsafe { (a.flame_rope_options_init)(p) });
        RopeOptions {
            theta: r.theta,
            rotary_dim: r.rotary_dim,
            position_offset: r.position_offset,
            interleaved: r.interleaved != 0,
            seq_dim: r.seq_dim,
        }
    }
}

impl RopeOptions {
    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_rope_options_t {
        sys::flame_rope_options_t {
            struct_size: std::mem::size_of::<sys::flame_rope_options_t>(),
            theta: self.theta,
            rotary_dim: self.rotary_dim,
            position_offset: self.position_offset,
            interleaved: self.interleaved as i32,
            seq_dim: self.seq_dim,
        }
    }
}

type ConvFn = unsafe extern "C" fn(
    sys::flame_tensor_t,
    sys::flame_tensor_t,
    sys::flame_tensor_t,
    *const sys::flame_conv_options_t,
    *mut sys::flame_tensor_t,
) -> sys::flame_status_t;

fn conv(f: ConvFn, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
    let raw = opts.to_raw();
    let mut out = std::ptr::null_mut();
    check(unsafe { f(x.raw, weight.raw, opt_raw(bias), &raw, &mut out) })?;
    Ok(unsafe { Tensor::from_raw(out) })
}

impl Tensor {
    /// 2-D convolution (`flame_conv2d`): self [N, C, H, W], weight [O, C / groups, kh, kw].
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        conv(api()?.flame_conv2d, self, weight, bias, opts)
    }

    /// 2-D transposed convolution (`flame_conv_transpose2d`).
    pub fn conv_transpose2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        conv(api()?.flame_conv_transpose2d, self, weight, bias, opts)
    }

    /// 1-D convolution (`flame_conv1d`): self [N, C, L], weight [O, C / groups, k].
    pub fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvOptions) -> Result<Tensor> {
        conv(api()?.flame_conv1d, self, weight, bias, opts)
    }

    /// `torch.nn.functional.max_pool2d` (`flame_max_pool2d`).
    pub fn max_pool2d(&self, opts: &Pool2dOptions) -> Result<Tensor> {
        let api = api()?;
        let raw = opts.to_raw();
        let mut out = std::ptr::null_mut();
        check(unsafe { (api.flame_max_pool2d)(self.raw, &raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// `torch.nn.functional.avg_pool2d` (`flame_avg_pool2d`).
    pub fn avg_pool2d(&self, opts: &Pool2dOptions) -> Result<Tensor> {
        let api = api()?;
        let raw = opts.to_raw();
        let mut out = std::ptr::null_mut();
        check(unsafe { (api.flame_avg_pool2d)(self.raw, &raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// Rotary position embeddings (`flame_rope`); `positions` may be `None` (positions
    /// `position_offset + t`).
    pub fn rope(&self, positions: Option<&Tensor>, opts: &RopeOptions) -> Result<Tensor> {
        let api = api()?;
        let raw = opts.to_raw();
        let mut out = std::ptr::null_mut();
        check(unsafe { (api.flame_rope)(self.raw, opt_raw(positions), &raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// Writes `data` (row-major, the tensor's dtype) into this existing contiguous tensor, in
    /// stream order (`flame_copy_from_host`): the static-input pattern of graphs.
    pub fn copy_from_slice<T: crate::Element>(&self, data: &[T]) -> Result<()> {
        let api = api()?;
        let nbytes = std::mem::size_of_val(data);
        check(unsafe { (api.flame_copy_from_host)(self.raw, data.as_ptr() as *const c_void, nbytes) })
    }
}

// ---------------------------------------------------------------------------------------------
// Optimizer state, gradient statistics
// ---------------------------------------------------------------------------------------------

impl Optimizer {
    /// Saves the optimizer's state (moments, step counts, groups) to a file
    /// (`flame_optimizer_save_state`).
    pub fn save_state(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let api = api()?;
        let p = path_cstring(path.as_ref())?;
        check(unsafe { (api.flame_optimizer_save_state)(self.as_raw(), p.as_ptr()) })
    }

    /// Restores a state written by [`Optimizer::save_state`] (`flame_optimizer_load_state`).
    pub fn load_state(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let api = api()?;
        let p = path_cstring(path.as_ref())?;
        check(unsafe { (api.flame_optimizer_load_state)(self.as_raw(), p.as_ptr()) })
    }
}

/// Columns of a row of [`Context::grad_stats_host`] (`FLAME_STAT_COLUMNS` values per row).
pub const STAT_COLUMNS: usize = sys::FLAME_STAT_COLUMNS as usize;

impl Context {
    /// `flame_grad_stats_host`: the statistics of each tensor and of all together, one row of
    /// [`STAT_COLUMNS`] values each (`tensors.len() + 1` rows). Waits for the device.
    pub fn grad_stats_host(&self, tensors: &[&Tensor]) -> Result<Vec<[f64; STAT_COLUMNS]>> {
        let api = api()?;
        let r = raws(tensors);
        let rows = tensors.len() + 1;
        let mut values = vec![0f64; rows * STAT_COLUMNS];
        check(unsafe {
            (api.flame_grad_stats_host)(
                self.raw,
                slice_ptr(&r),
                len_as::<i64>(r.len())?,
                values.as_mut_ptr(),
                len_as::<i64>(values.len())?,
            )
        })?;
        Ok(values
            .chunks(STAT_COLUMNS)
            .map(|c| {
                let mut row = [0f64; STAT_COLUMNS];
                row.copy_from_slice(c);
                row
            })
            .collect())
    }
}

// ---------------------------------------------------------------------------------------------
// Autocast
// ---------------------------------------------------------------------------------------------

fn autocast_from_raw(v: i32) -> Result<Option<DType>> {
    if v == sys::FLAME_AUTOCAST_OFF {
        Ok(None)
    } else {
        DType::try_from(v).map(Some)
    }
}

impl Context {
    /// Sets mixed precision for this context (`flame_ctx_set_autocast`): `Some(DType::BF16)` or
    /// `Some(DType::F16)`, or `None` for off; returns the previous setting, to restore later.
    pub fn set_autocast(&self, dtype: Option<DType>) -> Result<Option<DType>> {
        let mut prev = sys::FLAME_AUTOCAST_OFF;
        let raw = dtype.map_or(sys::FLAME_AUTOCAST_OFF, |d| d.raw());
        check(unsafe { (api()?.flame_ctx_set_autocast)(self.raw, raw, &mut prev) })?;
        autocast_from_raw(prev)
    }

    /// The autocast setting (`flame_ctx_get_autocast`); `None` when off.
    pub fn autocast(&self) -> Result<Option<DType>> {
        let mut v = sys::FLAME_AUTOCAST_OFF;
        check(unsafe { (api()?.flame_ctx_get_autocast)(self.raw, &mut v) })?;
        autocast_from_raw(v)
    }
}

// ---------------------------------------------------------------------------------------------
// Grad scaler
// ---------------------------------------------------------------------------------------------

/// Options of [`GradScaler`] (`flame_grad_scaler_options_t`); `Default` calls
/// `flame_grad_scaler_options_init` (init_scale 65536, growth 2, backoff 0.5, interval 2000).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScalerOptions {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
    pub enabled: bool,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        let r: sys::flame_grad_scaler_options_t = init_raw(|a, p| unsafe { (a.flame_grad_scaler_options_init)(p) });
        GradScalerOptions {
            init_scale: r.init_scale,
            growth_factor: r.growth_factor,
            backoff_factor: r.backoff_factor,
            growth_interval: r.growth_interval,
            enabled: r.enabled != 0,
        }
    }
}

impl GradScalerOptions {
    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_grad_scaler_options_t {
        sys::flame_grad_scaler_options_t {
            struct_size: std::mem::size_of::<sys::flame_grad_scaler_options_t>(),
            init_scale: self.init_scale,
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            enabled: self.enabled as i32,
        }
    }
}

/// Dynamic loss scaling as `torch.cuda.amp.GradScaler` (`flame_grad_scaler_t`). Drop releases it.
///
/// ```no_run
/// use flame::{GradScaler, GradScalerOptions, Optimizer};
/// # fn step(ctx: &flame::Context, opt: &Optimizer, loss: &flame::Tensor) -> flame::Result<()> {
/// let scaler = GradScaler::new(ctx, &GradScalerOptions::default())?;
/// scaler.scale(loss)?.backward()?;
/// let stepped = scaler.step(opt)?;                        // false: Inf/NaN found, step skipped
/// scaler.update()?;
/// # let _ = stepped; Ok(()) }
/// ```
pub struct GradScaler {
    raw: sys::flame_grad_scaler_t,
}
unsafe impl Send for GradScaler {}

impl GradScaler {
    /// `flame_grad_scaler_create` on `ctx`.
    pub fn new(ctx: &Context, opts: &GradScalerOptions) -> Result<GradScaler> {
        let api = api()?;
        let raw_opts = opts.to_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api.flame_grad_scaler_create)(ctx.raw, &raw_opts, &mut raw) })?;
        Ok(GradScaler { raw })
    }

    /// `loss * scale`, recorded in the graph (`flame_grad_scaler_scale`).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        let api = api()?;
        let mut out = std::ptr::null_mut();
        check(unsafe { (api.flame_grad_scaler_scale)(self.raw, loss.raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// Divides `opt`'s gradients by the scale in place (`flame_grad_scaler_unscale`).
    pub fn unscale(&self, opt: &Optimizer) -> Result<()> {
        check(unsafe { (api()?.flame_grad_scaler_unscale)(self.raw, opt.as_raw()) })
    }

    /// As [`GradScaler::unscale`] for tensors of your own loop (`flame_grad_scaler_unscale_tensors`).
    pub fn unscale_tensors(&self, tensors: &[&Tensor]) -> Result<()> {
        let api = api()?;
        let r = raws(tensors);
        check(unsafe { (api.flame_grad_scaler_unscale_tensors)(self.raw, slice_ptr(&r), len_as::<i64>(r.len())?) })
    }

    /// Steps `opt` unless an Inf/NaN was found; returns whether it stepped (`flame_grad_scaler_step`).
    pub fn step(&self, opt: &Optimizer) -> Result<bool> {
        let mut stepped = 0i32;
        check(unsafe { (api()?.flame_grad_scaler_step)(self.raw, opt.as_raw(), &mut stepped) })?;
        Ok(stepped != 0)
    }

    /// Grows or backs off the scale (`flame_grad_scaler_update`).
    pub fn update(&self) -> Result<()> {
        check(unsafe { (api()?.flame_grad_scaler_update)(self.raw) })
    }

    /// The current scale (`flame_grad_scaler_get_scale`; waits for the device).
    pub fn get_scale(&self) -> Result<f64> {
        let mut s = 0f64;
        check(unsafe { (api()?.flame_grad_scaler_get_scale)(self.raw, &mut s) })?;
        Ok(s)
    }

    /// A 0-d f32 tensor, 1 when an Inf/NaN was found since the last update (`flame_grad_scaler_found_inf`).
    pub fn found_inf(&self) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(unsafe { (api()?.flame_grad_scaler_found_inf)(self.raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// (scale, growth tracker) to checkpoint (`flame_grad_scaler_get_state`).
    pub fn state(&self) -> Result<(f64, i64)> {
        let (mut s, mut g) = (0f64, 0i64);
        check(unsafe { (api()?.flame_grad_scaler_get_state)(self.raw, &mut s, &mut g) })?;
        Ok((s, g))
    }

    /// Restores a state from [`GradScaler::state`] (`flame_grad_scaler_set_state`).
    pub fn set_state(&self, scale: f64, growth_tracker: i64) -> Result<()> {
        check(unsafe { (api()?.flame_grad_scaler_set_state)(self.raw, scale, growth_tracker) })
    }
}

impl Drop for GradScaler {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_grad_scaler_release)(self.raw) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LoRA
// ---------------------------------------------------------------------------------------------

/// A low-rank adapter over a frozen linear layer (`flame_lora_t`). Drop releases it (A and B stay
/// alive as long as you hold them).
///
/// ```no_run
/// use flame::{DType, Lora, Optimizer, OptimizerKind, OptimizerOptions};
/// # fn main() -> flame::Result<()> {
/// let ctx = flame::Context::new()?;
/// let weight = ctx.randn(&[8, 16], DType::F32)?;           // frozen: does not require grad
/// let lora = Lora::new(&weight, None, 4, 8.0)?;
/// let (a, b) = lora.adapters()?;
/// let opt = Optimizer::new(&ctx, &OptimizerOptions::new(OptimizerKind::AdamW)?, &[&a, &b])?;
/// let x = ctx.randn(&[2, 16], DType::F32)?;
/// lora.forward(&x)?.sum_all()?.backward()?;
/// opt.step()?;
/// lora.merge()?;                                          // fold into the weight for inference
/// # Ok(()) }
/// ```
pub struct Lora {
    raw: sys::flame_lora_t,
}
unsafe impl Send for Lora {}

impl Lora {
    /// `flame_lora_create` over `weight` [out, in] (must not require grad) and optional `bias`.
    pub fn new(weight: &Tensor, bias: Option<&Tensor>, rank: i64, alpha: f64) -> Result<Lora> {
        let api = api()?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api.flame_lora_create)(weight.raw, opt_raw(bias), rank, alpha, &mut raw) })?;
        Ok(Lora { raw })
    }

    /// `linear(x, W, b) + scale * B A x` (`flame_lora_forward`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(unsafe { (api()?.flame_lora_forward)(self.raw, x.raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// The trainable (A [rank, in], B [out, rank]) (`flame_lora_adapters`).
    pub fn adapters(&self) -> Result<(Tensor, Tensor)> {
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        check(unsafe { (api()?.flame_lora_adapters)(self.raw, &mut a, &mut b) })?;
        Ok(unsafe { (Tensor::from_raw(a), Tensor::from_raw(b)) })
    }

    /// Folds the adapter into the weight (`flame_lora_merge`).
    pub fn merge(&self) -> Result<()> {
        check(unsafe { (api()?.flame_lora_merge)(self.raw) })
    }

    /// Restores the weight bit for bit (`flame_lora_unmerge`).
    pub fn unmerge(&self) -> Result<()> {
        check(unsafe { (api()?.flame_lora_unmerge)(self.raw) })
    }

    /// Whether the adapter is merged (`flame_lora_is_merged`).
    pub fn is_merged(&self) -> Result<bool> {
        let mut m = 0i32;
        check(unsafe { (api()?.flame_lora_is_merged)(self.raw, &mut m) })?;
        Ok(m != 0)
    }
}

impl Drop for Lora {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_lora_release)(self.raw) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gradient checkpointing
// ---------------------------------------------------------------------------------------------

type CheckpointFn = Box<dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>> + Send>;

unsafe extern "C" fn checkpoint_trampoline(
    ud: *mut c_void,
    inputs: *const sys::flame_tensor_t,
    n_inputs: i32,
    outputs: *mut sys::flame_tensor_t,
    n_outputs: i32,
) -> sys::flame_status_t {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        let f = &mut *(ud as *mut CheckpointFn);
        let mut ins = Vec::with_capacity(n_inputs.max(0) as usize);
        for i in 0..n_inputs.max(0) as usize {
            ins.push(Tensor::from_borrowed(*inputs.add(i))?);
        }
        let outs = f(&ins)?;
        if outs.len() != n_outputs.max(0) as usize {
            return Err(Error::new(
                Status::ERROR_INVALID_ARGUMENT,
                format!("checkpoint closure returned {} tensors, {} expected", outs.len(), n_outputs),
            ));
        }
        for (i, t) in outs.into_iter().enumerate() {
            *outputs.add(i) = t.into_raw();
        }
        Ok(())
    }));
    crate::callback_failure(r, "checkpoint closure")
}

impl Context {
    /// Gradient checkpointing (`flame_checkpoint`): runs `f(inputs)` without keeping its
    /// intermediates and runs it again during backward. `f` must return `n_outputs` tensors and
    /// compute the same shapes both times; an `Err` becomes its status, a panic
    /// `ERROR_INTERNAL` with the panic message. The closure is dropped when FLAME no longer needs it.
    pub fn checkpoint<F>(&self, inputs: &[&Tensor], n_outputs: usize, f: F) -> Result<Vec<Tensor>>
    where
        F: FnMut(&[Tensor]) -> Result<Vec<Tensor>> + Send + 'static,
    {
        let api = api()?;
        let r = raws(inputs);
        let n_in = len_as::<i32>(r.len())?;
        let n_out = len_as::<i32>(n_outputs)?;
        let mut outs: Vec<sys::flame_tensor_t> = vec![std::ptr::null_mut(); n_outputs];
        let boxed: Box<CheckpointFn> = Box::new(Box::new(f));
        let ud = Box::into_raw(boxed) as *mut c_void;
        // destroy is called exactly once by the library, also on failure.
        check(unsafe {
            (api.flame_checkpoint)(
                self.raw,
                Some(checkpoint_trampoline),
                ud,
                Some(crate::drop_box::<CheckpointFn>),
                slice_ptr(&r),
                n_in,
                outs.as_mut_ptr(),
                n_out,
            )
        })?;
        Ok(outs.into_iter().map(|t| unsafe { Tensor::from_raw(t) }).collect())
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs
// ---------------------------------------------------------------------------------------------

/// A captured CUDA graph (`flame_graph_t`). Drop releases it.
pub struct Graph {
    raw: sys::flame_graph_t,
}
unsafe impl Send for Graph {}

impl Context {
    /// Ends the capture begun with [`Context::graph_capture_begin`] (`flame_graph_capture_end`).
    pub fn graph_capture_end(&self) -> Result<Graph> {
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_graph_capture_end)(self.raw, &mut raw) })?;
        Ok(Graph { raw })
    }

    /// Begins a capture whose private memory pool is `share_pool_with`'s (`None`: a pool of its
    /// own), `flame_graph_capture_begin_shared`: graphs of one step at several input shapes then hold
    /// about what the largest needs. A tensor kept from one graph's capture may be overwritten by a
    /// replay of another graph of the pool: read it before replaying another one.
    pub fn graph_capture_begin_shared(&self, share_pool_with: Option<&Graph>) -> Result<()> {
        let other = share_pool_with.map_or(std::ptr::null_mut(), |g| g.raw);
        check(unsafe { (api()?.flame_graph_capture_begin_shared)(self.raw, other) })
    }

    /// Captures the work `f` queues on this context into a graph (begin, `f`, end; the capture is
    /// ended also when `f` fails or panics, and the error is returned).
    pub fn capture_graph(&self, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.capture_graph_shared(None, f)
    }

    /// [`Context::capture_graph`] into the memory pool of `share_pool_with`
    /// ([`Context::graph_capture_begin_shared`]).
    pub fn capture_graph_shared(&self, share_pool_with: Option<&Graph>, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.graph_capture_begin_shared(share_pool_with)?;
        let r = catch_unwind(AssertUnwindSafe(f));
        let g = self.graph_capture_end();
        match r {
            Ok(Ok(())) => g,
            Ok(Err(e)) => Err(e),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Graph {
    /// Runs the captured work once more (`flame_graph_replay`).
    pub fn replay(&self) -> Result<()> {
        check(unsafe { (api()?.flame_graph_replay)(self.raw) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_graph_release)(self.raw) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NCCL communicators and data parallelism
// ---------------------------------------------------------------------------------------------

/// Options of [`Comm`] (`flame_comm_options_t`); `Default` calls `flame_comm_options_init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    pub timeout_ms: i64,
}

impl Default for CommOptions {
    fn default() -> Self {
        let r: sys::flame_comm_options_t = init_raw(|a, p| unsafe { (a.flame_comm_options_init)(p) });
        CommOptions { timeout_ms: r.timeout_ms }
    }
}

impl CommOptions {
    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_comm_options_t {
        sys::flame_comm_options_t {
            struct_size: std::mem::size_of::<sys::flame_comm_options_t>(),
            timeout_ms: self.timeout_ms,
        }
    }
}

/// The identity of a communicator to create: 128 opaque bytes to hand to every rank.
pub type CommId = sys::flame_comm_id_t;

/// One rank of an NCCL communicator (`flame_comm_t`). Drop releases it (release every rank
/// concurrently, as the C header says).
pub struct Comm {
    raw: sys::flame_comm_t,
}
unsafe impl Send for Comm {}

impl Context {
    /// A new communicator identity (`flame_comm_unique_id`).
    pub fn comm_unique_id(&self) -> Result<CommId> {
        let mut id = sys::flame_comm_id_t { internal: [0; 128] };
        check(unsafe { (api()?.flame_comm_unique_id)(self.raw, &mut id) })?;
        Ok(id)
    }
}

impl Comm {
    /// Hands rank 0's `id` to every rank over TCP (`flame_comm_rendezvous`; needs no GPU). Rank 0
    /// listens on `master_addr:master_port` and returns `id`; every other rank returns rank 0's
    /// bytes (its `id` is ignored). Fails with `ERROR_IO` naming the ranks that did not arrive.
    pub fn rendezvous(master_addr: &str, master_port: i32, rank: i32, world_size: i32, timeout_seconds: f64, id: &CommId) -> Result<CommId> {
        let addr = CString::new(master_addr)
            .map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("master_addr {master_addr:?} contains NUL")))?;
        let mut out = *id;
        check(unsafe { (api()?.flame_comm_rendezvous)(addr.as_ptr(), master_port, rank, world_size, timeout_seconds, &mut out) })?;
        Ok(out)
    }

    /// Rank `rank` of `world_size` on `ctx`'s GPU (`flame_comm_create`; waits for every rank).
    pub fn new(ctx: &Context, id: &CommId, rank: i32, world_size: i32, opts: &CommOptions) -> Result<Comm> {
        let raw_opts = opts.to_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_comm_create)(ctx.raw, id, rank, world_size, &raw_opts, &mut raw) })?;
        Ok(Comm { raw })
    }

    /// `LOCAL_RANK` of a launched job (`flame_comm_env_local_rank`; needs no GPU): the device to
    /// create this process's [`Context`] on. Fails naming a missing or malformed launch variable.
    pub fn env_local_rank() -> Result<i32> {
        let mut v = 0i32;
        check(unsafe { (api()?.flame_comm_env_local_rank)(&mut v) })?;
        Ok(v)
    }

    /// This process's rank of a launched job (`flame_comm_create_from_env`): reads RANK,
    /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and FLAME_RENDEZVOUS_TIMEOUT), meets the
    /// other ranks over TCP and creates the communicator on `ctx` (which must be on LOCAL_RANK).
    pub fn from_env(ctx: &Context, opts: &CommOptions) -> Result<Comm> {
        let raw_opts = opts.to_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_comm_create_from_env)(ctx.raw, &raw_opts, &mut raw) })?;
        Ok(Comm { raw })
    }

    /// Every rank of one communicator, rank i on `ctxs[i]`, from one thread (`flame_comm_create_group`).
    pub fn create_group(ctxs: &[&Context], opts: &CommOptions) -> Result<Vec<Comm>> {
        let api = api()?;
        let r: Vec<sys::flame_ctx_t> = ctxs.iter().map(|c| c.raw).collect();
        let raw_opts = opts.to_raw();
        let mut out: Vec<sys::flame_comm_t> = vec![std::ptr::null_mut(); r.len()];
        check(unsafe { (api.flame_comm_create_group)(slice_ptr(&r), len_as::<i32>(r.len())?, &raw_opts, out.as_mut_ptr()) })?;
        Ok(out.into_iter().map(|raw| Comm { raw }).collect())
    }

    /// This rank (`flame_comm_rank`).
    pub fn rank(&self) -> Result<i32> {
        let mut v = 0i32;
        check(unsafe { (api()?.flame_comm_rank)(self.raw, &mut v) })?;
        Ok(v)
    }

    /// The world size (`flame_comm_size`).
    pub fn size(&self) -> Result<i32> {
        let mut v = 0i32;
        check(unsafe { (api()?.flame_comm_size)(self.raw, &mut v) })?;
        Ok(v)
    }

    /// Waits, with the timeout, for the context's stream (`flame_comm_synchronize`).
    pub fn synchronize(&self) -> Result<()> {
        check(unsafe { (api()?.flame_comm_synchronize)(self.raw) })
    }

    /// In-place reduction over all ranks (`flame_comm_all_reduce`).
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        check(unsafe { (api()?.flame_comm_all_reduce)(self.raw, t.raw, op.raw()) })
    }

    /// Replaces `t` with rank `root`'s (`flame_comm_broadcast`).
    pub fn broadcast(&self, t: &Tensor, root: i32) -> Result<()> {
        check(unsafe { (api()?.flame_comm_broadcast)(self.raw, t.raw, root) })
    }

    /// The inputs of all ranks concatenated along dim 0 (`flame_comm_all_gather`).
    pub fn all_gather(&self, input: &Tensor) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(unsafe { (api()?.flame_comm_all_gather)(self.raw, input.raw, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// This rank's block of the reduction (`flame_comm_reduce_scatter`).
    pub fn reduce_scatter(&self, input: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(unsafe { (api()?.flame_comm_reduce_scatter)(self.raw, input.raw, op.raw(), &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_comm_release)(self.raw) };
        }
    }
}

/// Options of [`DataParallel`] (`flame_dp_options_t`); `Default` calls `flame_dp_options_init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataParallelOptions {
    pub bucket_bytes: u64,
    pub broadcast_parameters: bool,
}

impl Default for DataParallelOptions {
    fn default() -> Self {
        let r: sys::flame_dp_options_t = init_raw(|a, p| unsafe { (a.flame_dp_options_init)(p) });
        DataParallelOptions { bucket_bytes: r.bucket_bytes, broadcast_parameters: r.broadcast_parameters != 0 }
    }
}

impl DataParallelOptions {
    /// The C struct with `struct_size` set.
    pub fn to_raw(&self) -> sys::flame_dp_options_t {
        sys::flame_dp_options_t {
            struct_size: std::mem::size_of::<sys::flame_dp_options_t>(),
            bucket_bytes: self.bucket_bytes,
            broadcast_parameters: self.broadcast_parameters as i32,
        }
    }
}

/// Data-parallel gradient averaging as torch DDP (`flame_dp_t`). Drop removes its hooks.
pub struct DataParallel {
    raw: sys::flame_dp_t,
}
unsafe impl Send for DataParallel {}

impl DataParallel {
    /// Collective: `flame_dp_create` over `params` (contiguous leaves requiring grad).
    pub fn new(comm: &Comm, params: &[&Tensor], opts: &DataParallelOptions) -> Result<DataParallel> {
        let api = api()?;
        let r = raws(params);
        let raw_opts = opts.to_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api.flame_dp_create)(comm.raw, slice_ptr(&r), len_as::<i64>(r.len())?, &raw_opts, &mut raw) })?;
        Ok(DataParallel { raw })
    }

    /// Turns gradient synchronisation of the next backwards on or off (`flame_dp_set_sync`).
    pub fn set_sync(&self, sync: bool) -> Result<()> {
        check(unsafe { (api()?.flame_dp_set_sync)(self.raw, sync as i32) })
    }

    /// Finishes the round: `.grad` becomes the average over ranks (`flame_dp_wait`).
    pub fn wait(&self) -> Result<()> {
        check(unsafe { (api()?.flame_dp_wait)(self.raw) })
    }
}

impl Drop for DataParallel {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_dp_release)(self.raw) };
        }
    }
}

/// Options of [`Zero`] (`flame_zero_options_t`); `Default` calls `flame_zero_options_init`. The
/// model of stage 3 is an argument of [`Zero::with_model`], not an option.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroOptions {
    /// 1: all-reduce the gradients; 2: reduce-scatter them (full gradients freed after the step);
    /// 3: also shard a model's block parameters ([`Zero::with_model`] sets it).
    pub stage: i32,
    pub broadcast_parameters: bool,
    /// > 0: clip the gradients by their global 2-norm; 0: no clipping.
    pub max_grad_norm: f64,
    /// Stage 3: device buffers of gathered blocks, in [2, 64].
    pub gather_slots: i32,
    /// The dtype gradients are averaged in over the ranks: `sys::FLAME_ZERO_PARAM_DTYPE` (each
    /// parameter's own, the default), `sys::FLAME_DTYPE_F32` or `sys::FLAME_DTYPE_BF16` (cast
    /// before the collective, the average cast back to the parameter's dtype).
    pub reduce_dtype: i32,
    /// Stage 3: the dtype of the parameter all-gather: `sys::FLAME_ZERO_PARAM_DTYPE` (default) or
    /// `sys::FLAME_DTYPE_BF16` (f32 blocks gathered as bf16 and widened back to f32).
    pub gather_dtype: i32,
}

impl Default for ZeroOptions {
    fn default() -> Self {
        let r: sys::flame_zero_options_t = init_raw(|a, p| unsafe { (a.flame_zero_options_init)(p) });
        ZeroOptions {
            stage: r.stage,
            broadcast_parameters: r.broadcast_parameters != 0,
            max_grad_norm: r.max_grad_norm,
            gather_slots: r.gather_slots,
            reduce_dtype: r.reduce_dtype,
            gather_dtype: r.gather_dtype,
        }
    }
}

impl ZeroOptions {
    /// The C struct with `struct_size` set (and no model).
    pub fn to_raw(&self) -> sys::flame_zero_options_t {
        sys::flame_zero_options_t {
            struct_size: std::mem::size_of::<sys::flame_zero_options_t>(),
            stage: self.stage,
            broadcast_parameters: self.broadcast_parameters as i32,
            max_grad_norm: self.max_grad_norm,
            model: std::ptr::null_mut(),
            gather_slots: self.gather_slots,
            reduce_dtype: self.reduce_dtype,
            gather_dtype: self.gather_dtype,
        }
    }
}

/// Optimizer state sharded over the ranks of a communicator (`flame_zero_t`, ZeRO-1 / ZeRO-2),
/// and with [`Zero::with_model`] a model's parameters too (ZeRO-3). [`Zero::step`] replaces
/// [`DataParallel::wait`] + `Optimizer::step`. Drop releases it (the optimizer stays sharded).
pub struct Zero {
    raw: sys::flame_zero_t,
}
unsafe impl Send for Zero {}

impl Zero {
    /// Collective: shards `opt` (not stepped yet) over `comm` (`flame_zero_create`).
    pub fn new(comm: &Comm, opt: &Optimizer, opts: &ZeroOptions) -> Result<Zero> {
        let raw_opts = opts.to_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_zero_create)(comm.raw, opt.as_raw(), &raw_opts, &mut raw) })?;
        Ok(Zero { raw })
    }

    /// Collective, stage 3 (`flame_zero_create` with `opts->model`): shards `model`'s block
    /// parameters as well as `opt` over `comm`. The model must have run one forward (gradients
    /// may be off) so that it knows its blocks; its sharded parameters then hold no values of their
    /// own ([`Zero::gather_params`] gathers them). `opts.stage` is ignored (3).
    pub fn with_model(comm: &Comm, opt: &Optimizer, model: &Model, opts: &ZeroOptions) -> Result<Zero> {
        let mut raw_opts = opts.to_raw();
        raw_opts.stage = 3;
        raw_opts.model = model.as_raw();
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_zero_create)(comm.raw, opt.as_raw(), &raw_opts, &mut raw) })?;
        Ok(Zero { raw })
    }

    /// Collective, stage 3 (`flame_zero_gather_params`): every parameter of the model with its
    /// values, the sharded ones gathered into new tensors.
    pub fn gather_params(&self) -> Result<Params> {
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_zero_gather_params)(self.raw, &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// Collective (`flame_zero_save_full`): gathers every rank's parameters and optimizer state;
    /// rank 0 writes them to one safetensors file (loadable with [`Zero::load`] on any number of ranks).
    pub fn save_full(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let api = api()?;
        let p = path_cstring(path.as_ref())?;
        check(unsafe { (api.flame_zero_save_full)(self.raw, p.as_ptr()) })
    }

    /// Every rank writes its shard file `<prefix>-<rank>-of-<world>.safetensors`
    /// (`flame_zero_save_shards`); no communication.
    pub fn save_shards(&self, path_prefix: impl AsRef<std::path::Path>) -> Result<()> {
        let api = api()?;
        let p = path_cstring(path_prefix.as_ref())?;
        check(unsafe { (api.flame_zero_save_shards)(self.raw, p.as_ptr()) })
    }

    /// Loads a gathered file or a shard set saved on any number of ranks (`flame_zero_load`; `path`
    /// is any file of the set): this rank's parameters, optimizer state, step and learning rates.
    pub fn load(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let api = api()?;
        let p = path_cstring(path.as_ref())?;
        check(unsafe { (api.flame_zero_load)(self.raw, p.as_ptr()) })
    }

    /// Collective: one sharded optimizer step (`flame_zero_step`); returns the global gradient
    /// norm (0-d f32) when `want_norm`.
    pub fn step(&self, want_norm: bool) -> Result<Option<Tensor>> {
        let api = api()?;
        if !want_norm {
            check(unsafe { (api.flame_zero_step)(self.raw, std::ptr::null_mut()) })?;
            return Ok(None);
        }
        let mut norm = std::ptr::null_mut();
        check(unsafe { (api.flame_zero_step)(self.raw, &mut norm) })?;
        Ok(Some(unsafe { Tensor::from_raw(norm) }))
    }
}

impl Drop for Zero {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_zero_release)(self.raw) };
        }
    }
}

impl Optimizer {
    /// Device bytes of this rank's optimizer state (`flame_optimizer_state_bytes`).
    pub fn state_bytes(&self) -> Result<u64> {
        let mut n = 0u64;
        check(unsafe { (api()?.flame_optimizer_state_bytes)(self.as_raw(), &mut n) })?;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------------
// Fused expressions
// ---------------------------------------------------------------------------------------------

/// A compiled elementwise expression over `x0 .. x{n-1}` (`flame_fused_t`). Drop releases it.
///
/// ```no_run
/// # fn main() -> flame::Result<()> {
/// let ctx = flame::Context::new()?;
/// let modulate = flame::Fused::compile(&ctx, "x0 * (1 + x1) + x2", 3)?;
/// let (x, scale, shift) = (ctx.ones(&[4], flame::DType::F32)?, ctx.ones(&[4], flame::DType::F32)?, ctx.ones(&[4], flame::DType::F32)?);
/// assert_eq!(modulate.call(&[&x, &scale, &shift])?.to_vec::<f32>()?, vec![3.0; 4]);
/// # Ok(()) }
/// ```
pub struct Fused {
    raw: sys::flame_fused_t,
}
unsafe impl Send for Fused {}
unsafe impl Sync for Fused {}

impl Fused {
    /// Parses `expr` over `n_inputs` inputs (`flame_fused_compile`).
    pub fn compile(ctx: &Context, expr: &str, n_inputs: i32) -> Result<Fused> {
        let api = api()?;
        let e = CString::new(expr).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, "expression contains NUL"))?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api.flame_fused_compile)(ctx.raw, e.as_ptr(), n_inputs, &mut raw) })?;
        Ok(Fused { raw })
    }

    /// Applies the expression (`flame_fused_call`).
    pub fn call(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let api = api()?;
        let r = raws(inputs);
        let mut out = std::ptr::null_mut();
        check(unsafe { (api.flame_fused_call)(self.raw, slice_ptr(&r), len_as::<i32>(r.len())?, &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }
}

impl Drop for Fused {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_fused_release)(self.raw) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coverage
// ---------------------------------------------------------------------------------------------

/// (export, safe wrapper) for every export wrapped by hand: here, in lib.rs, optim.rs,
/// safetensors.rs and attention.rs. Exports that are not methods (library information, the raw
/// tensor reference counting) name the item that uses them.
pub const HAND_WRAPPED: &[(&str, &str)] = &[
    // toolkit.rs
    ("flame_conv_options_init", "ConvOptions::default"),
    ("flame_conv2d", "Tensor::conv2d"),
    ("flame_conv_transpose2d", "Tensor::conv_transpose2d"),
    ("flame_conv1d", "Tensor::conv1d"),
    ("flame_pool2d_options_init", "Pool2dOptions::new"),
    ("flame_max_pool2d", "Tensor::max_pool2d"),
    ("flame_avg_pool2d", "Tensor::avg_pool2d"),
    ("flame_rope_options_init", "RopeOptions::default"),
    ("flame_rope", "Tensor::rope"),
    ("flame_optimizer_save_state", "Optimizer::save_state"),
    ("flame_optimizer_load_state", "Optimizer::load_state"),
    ("flame_grad_stats_host", "Context::grad_stats_host"),
    ("flame_ctx_set_autocast", "Context::set_autocast"),
    ("flame_ctx_get_autocast", "Context::autocast"),
    ("flame_grad_scaler_options_init", "GradScalerOptions::default"),
    ("flame_grad_scaler_create", "GradScaler::new"),
    ("flame_grad_scaler_release", "GradScaler::drop"),
    ("flame_grad_scaler_scale", "GradScaler::scale"),
    ("flame_grad_scaler_unscale", "GradScaler::unscale"),
    ("flame_grad_scaler_unscale_tensors", "GradScaler::unscale_tensors"),
    ("flame_grad_scaler_step", "GradScaler::step"),
    ("flame_grad_scaler_update", "GradScaler::update"),
    ("flame_grad_scaler_get_scale", "GradScaler::get_scale"),
    ("flame_grad_scaler_found_inf", "GradScaler::found_inf"),
    ("flame_grad_scaler_get_state", "GradScaler::state"),
    ("flame_grad_scaler_set_state", "GradScaler::set_state"),
    ("flame_lora_create", "Lora::new"),
    ("flame_lora_release", "Lora::drop"),
    ("flame_lora_forward", "Lora::forward"),
    ("flame_lora_adapters", "Lora::adapters"),
    ("flame_lora_merge", "Lora::merge"),
    ("flame_lora_unmerge", "Lora::unmerge"),
    ("flame_lora_is_merged", "Lora::is_merged"),
    ("flame_checkpoint", "Context::checkpoint"),
    ("flame_graph_capture_end", "Context::graph_capture_end"),
    ("flame_graph_capture_begin_shared", "Context::graph_capture_begin_shared"),
    ("flame_graph_replay", "Graph::replay"),
    ("flame_graph_release", "Graph::drop"),
    ("flame_copy_from_host", "Tensor::copy_from_slice"),
    ("flame_comm_options_init", "CommOptions::default"),
    ("flame_comm_unique_id", "Context::comm_unique_id"),
    ("flame_comm_rendezvous", "Comm::rendezvous"),
    ("flame_comm_create", "Comm::new"),
    ("flame_comm_create_group", "Comm::create_group"),
    ("flame_comm_env_local_rank", "Comm::env_local_rank"),
    ("flame_comm_create_from_env", "Comm::from_env"),
    ("flame_comm_release", "Comm::drop"),
    ("flame_comm_rank", "Comm::rank"),
    ("flame_comm_size", "Comm::size"),
    ("flame_comm_synchronize", "Comm::synchronize"),
    ("flame_comm_all_reduce", "Comm::all_reduce"),
    ("flame_comm_broadcast", "Comm::broadcast"),
    ("flame_comm_all_gather", "Comm::all_gather"),
    ("flame_comm_reduce_scatter", "Comm::reduce_scatter"),
    ("flame_dp_options_init", "DataParallelOptions::default"),
    ("flame_dp_create", "DataParallel::new"),
    ("flame_dp_set_sync", "DataParallel::set_sync"),
    ("flame_dp_wait", "DataParallel::wait"),
    ("flame_dp_release", "DataParallel::drop"),
    ("flame_zero_options_init", "ZeroOptions::default"),
    ("flame_zero_create", "Zero::new"),
    ("flame_zero_step", "Zero::step"),
    ("flame_zero_release", "Zero::drop"),
    ("flame_zero_gather_params", "Zero::gather_params"),
    ("flame_optimizer_state_bytes", "Optimizer::state_bytes"),
    ("flame_zero_save_full", "Zero::save_full"),
    ("flame_zero_save_shards", "Zero::save_shards"),
    ("flame_zero_load", "Zero::load"),
    ("flame_fused_compile", "Fused::compile"),
    ("flame_fused_call", "Fused::call"),
    ("flame_fused_release", "Fused::drop"),
    // lib.rs
    ("flame_version_string", "version"),
    ("flame_abi_version", "abi_version"),
    ("flame_status_string", "Status::name"),
    ("flame_last_error_message", "last_error_message"),
    ("flame_set_error_message", "set_error_message"),
    ("flame_dtype_size", "DType::size"),
    ("flame_dtype_name", "DType::name"),
    ("flame_device_count", "device_count"),
    ("flame_ctx_options_init", "Context::with_options"),
    ("flame_ctx_create", "Context::with_options"),
    ("flame_ctx_destroy", "Context::drop"),
    ("flame_ctx_device_name", "Context::device_name"),
    ("flame_ctx_memory_stats", "Context::memory_stats"),
    ("flame_ctx_counters", "Context::counters"),
    ("flame_ctx_stream", "Context::stream"),
    ("flame_ctx_set_grad_enabled", "Context::set_grad_enabled"),
    ("flame_ctx_set_inference_mode", "Context::set_inference_mode"),
    ("flame_from_host", "Context::from_slice"),
    ("flame_to_host", "Tensor::to_vec"),
    ("flame_grad", "Context::grad"),
    ("flame_tensor_retain", "Tensor::clone"),
    ("flame_tensor_release", "Tensor::drop"),
    ("flame_tensor_context", "Tensor::context"),
    ("flame_tensor_shape", "Tensor::shape"),
    ("flame_tensor_strides", "Tensor::strides"),
    ("flame_tensor_data_ptr", "Tensor::data_ptr"),
    ("flame_tensor_grad", "Tensor::grad"),
    ("flame_tensor_set_grad", "Tensor::set_grad"),
    ("flame_backward", "Tensor::backward_with"),
    ("flame_split", "Tensor::split"),
    ("flame_split_sizes", "Tensor::split_sizes"),
    ("flame_chunk", "Tensor::chunk"),
    ("flame_tensor_register_hook", "Tensor::register_hook"),
    ("flame_tensor_register_post_accumulate_grad_hook", "Tensor::register_post_accumulate_grad_hook"),
    ("flame_hook_remove", "Hook::drop"),
    ("flame_tensor_to_dlpack", "Tensor::to_dlpack"),
    ("flame_tensor_to_dlpack_versioned", "Tensor::to_dlpack_versioned"),
    ("flame_tensor_from_dlpack", "Tensor::from_dlpack"),
    ("flame_tensor_from_dlpack_versioned", "Tensor::from_dlpack_versioned"),
    // optim.rs
    ("flame_optimizer_options_init", "OptimizerOptions::new"),
    ("flame_optimizer_create", "Optimizer::new"),
    ("flame_optimizer_add_param_group", "Optimizer::add_param_group"),
    ("flame_optimizer_step", "Optimizer::step"),
    ("flame_optimizer_zero_grad", "Optimizer::zero_grad"),
    ("flame_optimizer_set_lr", "Optimizer::set_lr"),
    ("flame_optimizer_set_state_bits", "Optimizer::set_state_bits"),
    ("flame_optimizer_get_lr", "Optimizer::lr"),
    ("flame_optimizer_step_count", "Optimizer::step_count"),
    ("flame_optimizer_release", "Optimizer::drop"),
    // safetensors.rs
    ("flame_safetensors_load", "SafetensorsFile::open"),
    ("flame_safetensors_release", "SafetensorsFile::drop"),
    ("flame_safetensors_count", "SafetensorsFile::names"),
    ("flame_safetensors_name", "SafetensorsFile::names"),
    ("flame_safetensors_info", "SafetensorsFile::info"),
    ("flame_safetensors_get", "SafetensorsFile::get"),
    ("flame_safetensors_metadata_count", "SafetensorsFile::metadata"),
    ("flame_safetensors_metadata_key", "SafetensorsFile::metadata"),
    ("flame_safetensors_metadata", "SafetensorsFile::metadata"),
    ("flame_safetensors_save", "save_safetensors"),
    ("flame_ctx_set_log", "Context::set_log_level"),
    ("flame_params_create", "Params::new"),
    ("flame_params_release", "Params::drop"),
    ("flame_params_add", "Params::add"),
    ("flame_params_count", "Params::len"),
    ("flame_params_name", "Params::name"),
    ("flame_params_tensor", "Params::tensor"),
    ("flame_params_tensors", "Params::tensors"),
    ("flame_params_find", "Params::find"),
    ("flame_params_save_safetensors", "Params::save_safetensors"),
    ("flame_params_load_safetensors", "Params::load_safetensors"),
    // model.rs
    ("flame_model_known_architectures", "known_architectures"),
    ("flame_model_estimate_memory", "estimate_memory"),
    ("flame_model_create", "Model::create"),
    ("flame_model_load", "Model::load"),
    ("flame_model_save", "Model::save"),
    ("flame_model_release", "Model::drop"),
    ("flame_model_architecture", "Model::architecture"),
    ("flame_model_config", "Model::config_json"),
    ("flame_model_params", "Model::params"),
    ("flame_model_forward", "Model::forward"),
    ("flame_model_set_training", "Model::set_training"),
    ("flame_model_set_checkpointing", "Model::set_checkpointing"),
    ("flame_model_add_lora", "Model::add_lora"),
    ("flame_model_lora_params", "Model::lora_params"),
    ("flame_model_save_lora", "Model::save_lora"),
    ("flame_model_load_lora", "Model::load_lora"),
    ("flame_model_remove_lora", "Model::remove_lora"),
    ("flame_model_merge_lora", "Model::merge_lora"),
    // attention.rs
    ("flame_attention_options_init", "AttentionOptions::to_raw"),
    ("flame_scaled_dot_product_attention", "Tensor::scaled_dot_product_attention"),
];

const SCOPE_REASON: &str = "a C handle scope releases the handles it recorded when it ends, but every Rust \
    Tensor owns its handle and releases it on drop, so the two would release them twice; Rust's scopes (drop at \
    the end of a block) already release intermediates";

/// Exports with no Rust wrapper on purpose, with the reason (the coverage test accepts exactly these,
/// and only the C handle scope's functions may be here).
pub const NOT_WRAPPED_BY_DESIGN: &[(&str, &str)] = &[
    ("flame_scope_begin", SCOPE_REASON),
    ("flame_scope_end", SCOPE_REASON),
    ("flame_scope_keep", SCOPE_REASON),
    ("flame_scope_count", SCOPE_REASON),
];

/// The exports of `symbols` that neither [`crate::WRAPPED`] (generated) nor [`HAND_WRAPPED`]
/// names, nor [`NOT_WRAPPED_BY_DESIGN`] excuses: empty for [`crate::sys::SYMBOLS`] (the coverage
/// test checks it).
pub fn unwrapped(symbols: &[&str]) -> Vec<String> {
    symbols
        .iter()
        .filter(|s| !NOT_WRAPPED_BY_DESIGN.iter().any(|(e, _)| e == *s))
        .filter(|s| !crate::WRAPPED.iter().chain(HAND_WRAPPED.iter()).any(|(e, _)| e == *s))
        .map(|s| s.to_string())
        .collect()
}
