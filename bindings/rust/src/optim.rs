//! Optimizers (flame.h "Optimizers"): [`Optimizer`] updates the parameters that have a `.grad`, in
//! place, with the formulas of torch.optim (SGD, Adam, AdamW) or Lion; [`OptimizerOptions`] holds
//! the hyper-parameters of one parameter group. Group indices cross as `int32_t`; the optimizer
//! keeps its own references to the parameters.

use crate::{api, check, len_as, slice_ptr, sys, Context, Error, Result, Status, Tensor};
use crate::OptimizerKind;

/// Hyper-parameters of one parameter group (`flame_optimizer_options_t`). Start from
/// [`OptimizerOptions::new`], which fills in the defaults of the kind, then change fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerOptions {
    pub kind: OptimizerKind,
    pub lr: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub amsgrad: bool,
    pub maximize: bool,
    pub master_weights: bool,
    pub stochastic_rounding: bool,
}

impl OptimizerOptions {
    /// `flame_optimizer_options_init`: the defaults of `kind` (an unknown kind is
    /// `ERROR_INVALID_ARGUMENT`).
    pub fn new(kind: OptimizerKind) -> Result<OptimizerOptions> {
        let api = api()?;
        let mut raw = std::mem::MaybeUninit::<sys::flame_optimizer_options_t>::zeroed();
        check(unsafe { (api.flame_optimizer_options_init)(raw.as_mut_ptr(), kind.raw()) })?;
        let r = unsafe { raw.assume_init() };
        Ok(OptimizerOptions {
            kind: OptimizerKind::try_from(r.kind)?,
            lr: r.lr,
            weight_decay: r.weight_decay,
            beta1: r.beta1,
            beta2: r.beta2,
            eps: r.eps,
            momentum: r.momentum,
            dampening: r.dampening,
            nesterov: r.nesterov != 0,
            amsgrad: r.amsgrad != 0,
            maximize: r.maximize != 0,
            master_weights: r.master_weights != 0,
            stochastic_rounding: r.stochastic_rounding != 0,
        })
    }

    /// The C struct, with `struct_size` set to this header's size.
    pub fn to_raw(&self) -> sys::flame_optimizer_options_t {
        sys::flame_optimizer_options_t {
            struct_size: std::mem::size_of::<sys::flame_optimizer_options_t>(),
            kind: self.kind.raw(),
            lr: self.lr,
            weight_decay: self.weight_decay,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            momentum: self.momentum,
            dampening: self.dampening,
            nesterov: self.nesterov as i32,
            amsgrad: self.amsgrad as i32,
            maximize: self.maximize as i32,
            master_weights: self.master_weights as i32,
            stochastic_rounding: self.stochastic_rounding as i32,
        }
    }
}

/// A FLAME optimizer (`flame_optimizer_t`). Drop releases it (never panics); the parameters stay.
pub struct Optimizer {
    raw: sys::flame_optimizer_t,
}

// The C contract: optimizer calls lock the optimizer's context like tensor calls.
unsafe impl Send for Optimizer {}
unsafe impl Sync for Optimizer {}

fn raws(params: &[&Tensor]) -> Vec<sys::flame_tensor_t> {
    params.iter().map(|t| t.raw).collect()
}

fn group_index(group: usize) -> Result<i32> {
    i32::try_from(group).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("group {group} out of range")))
}

impl Optimizer {
    /// `flame_optimizer_create`: an optimizer whose group 0 is `params` (contiguous floating leaves
    /// of `ctx`, each at most once in the optimizer) with `options`.
    pub fn new(ctx: &Context, options: &OptimizerOptions, params: &[&Tensor]) -> Result<Optimizer> {
        let api = api()?;
        let o = options.to_raw();
        let p = raws(params);
        let mut raw: sys::flame_optimizer_t = std::ptr::null_mut();
        check(unsafe { (api.flame_optimizer_create)(ctx.raw, &o, slice_ptr(&p), len_as::<i64>(p.len())?, &mut raw) })?;
        Ok(Optimizer { raw })
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_optimizer_t {
        self.raw
    }

    /// `flame_optimizer_add_param_group`: a new group with its own options (same kind); returns
    /// its index.
    pub fn add_param_group(&self, options: &OptimizerOptions, params: &[&Tensor]) -> Result<usize> {
        let api = api()?;
        let o = options.to_raw();
        let p = raws(params);
        let mut group: i32 = -1;
        check(unsafe { (api.flame_optimizer_add_param_group)(self.raw, &o, slice_ptr(&p), len_as::<i64>(p.len())?, &mut group) })?;
        Ok(group as usize)
    }

    /// `flame_optimizer_step`: one update of every parameter with a gradient.
    pub fn step(&self) -> Result<()> {
        let api = api()?;
        check(unsafe { (api.flame_optimizer_step)(self.raw) })
    }

    /// `flame_optimizer_zero_grad`: drops the gradients (`set_to_none`) or fills them with 0.
    pub fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        let api = api()?;
        check(unsafe { (api.flame_optimizer_zero_grad)(self.raw, set_to_none as i32) })
    }

    /// `flame_optimizer_set_state_bits`: 8 for blockwise 8-bit moments (bitsandbytes' AdamW8bit /
    /// Lion8bit), 32 for f32 (the default); before the first step.
    pub fn set_state_bits(&self, bits: i32) -> Result<()> {
        let api = api()?;
        check(unsafe { (api.flame_optimizer_set_state_bits)(self.raw, bits) })
    }

    /// `flame_optimizer_set_lr`: the learning rate of one group, or of every group for None.
    pub fn set_lr(&self, group: Option<usize>, lr: f64) -> Result<()> {
        let api = api()?;
        let g = match group {
            Some(g) => group_index(g)?,
            None => -1,
        };
        check(unsafe { (api.flame_optimizer_set_lr)(self.raw, g, lr) })
    }

    /// `flame_optimizer_get_lr`: the learning rate of `group`.
    pub fn lr(&self, group: usize) -> Result<f64> {
        let api = api()?;
        let mut lr = 0.0f64;
        check(unsafe { (api.flame_optimizer_get_lr)(self.raw, group_index(group)?, &mut lr) })?;
        Ok(lr)
    }

    /// `flame_optimizer_step_count`: the number of completed steps.
    pub fn step_count(&self) -> Result<i64> {
        let api = api()?;
        let mut n: i64 = 0;
        check(unsafe { (api.flame_optimizer_step_count)(self.raw, &mut n) })?;
        Ok(n)
    }
}

impl Drop for Optimizer {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_optimizer_release)(self.raw) };
        }
    }
}
