//! Scaled-dot-product attention (flame.h "Attention"): [`Tensor::scaled_dot_product_attention`]
//! with [`AttentionOptions`] (causal mask, scale, dropout), PyTorch's semantics.

use crate::{api, check, sys, Result, Tensor};

/// Options of [`Tensor::scaled_dot_product_attention`] (`flame_attention_options_t`). `Default`
/// gives the library's defaults: not causal, scale 1 / sqrt(head dim), no dropout.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionOptions {
    /// Query i attends to keys j <= i only (top-left aligned, as PyTorch's `is_causal`).
    pub causal: bool,
    /// The factor of q k^T; 0 means 1 / sqrt(head dim).
    pub scale: f64,
    /// Probability of zeroing each attention weight, in [0, 1).
    pub dropout_p: f64,
}

impl AttentionOptions {
    /// The C struct: `flame_attention_options_init`'s defaults with these fields set.
    pub fn to_raw(&self) -> Result<sys::flame_attention_options_t> {
        let api = api()?;
        let mut raw = std::mem::MaybeUninit::<sys::flame_attention_options_t>::zeroed();
        check(unsafe { (api.flame_attention_options_init)(raw.as_mut_ptr()) })?;
        let mut r = unsafe { raw.assume_init() };
        r.flags = if self.causal { sys::FLAME_ATTENTION_CAUSAL } else { 0 };
        r.scale = self.scale;
        r.dropout_p = self.dropout_p;
        Ok(r)
    }
}

impl Tensor {
    /// `flame_scaled_dot_product_attention`: `self` is q [B, H, Lq, D], `k` [B, H, Lk, D], `v`
    /// [B, H, Lk, Dv]; `mask` (bool, or additive in q's dtype) broadcasts to [B, H, Lq, Lk]. The
    /// result is [B, H, Lq, Dv]; gradients flow to q, k, v and an additive mask.
    pub fn scaled_dot_product_attention(&self, k: &Tensor, v: &Tensor, mask: Option<&Tensor>,
                                        opts: &AttentionOptions) -> Result<Tensor> {
        let api = api()?;
        let raw = opts.to_raw()?;
        let mut out: sys::flame_tensor_t = std::ptr::null_mut();
        check(unsafe {
            (api.flame_scaled_dot_product_attention)(self.raw, k.raw, v.raw, mask.map_or(std::ptr::null_mut(), |m| m.raw),
                                                     &raw, &mut out)
        })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }
}
