//! Models (flame.h "Models"): [`Model`] is a diffusion or text-encoder architecture (diffusers' or
//! transformers' class, by name) made from a config or loaded from the files users have. Its
//! parameters are ordinary tensors under the reference's names ([`Model::params`]); its forward pass
//! takes and returns named tensors ([`Model::forward`]), recorded for backward like any operation.
//! Design: a thin owner of `flame_model_t`; every architecture goes through the same calls, so a new
//! one needs nothing here. [`known_architectures`] parses the library's JSON array with a small
//! string-array reader, as the crate has no dependencies.
//!
//! ```no_run
//! use flame::{Context, DType, Model};
//! let ctx = Context::new()?;
//! let config = r#"{"vocab_size":100,"hidden_size":32,"intermediate_size":64,
//!                  "num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":16}"#;
//! let model = Model::create(&ctx, "CLIPTextModel", Some(config), None)?;
//! let ids = ctx.from_slice(&[1i64, 5, 7, 99], &[1, 4])?;
//! let out = model.forward(&[("input_ids", &ids)])?;
//! let hidden = out.find("last_hidden_state")?.expect("an output of CLIPTextModel");
//! hidden.sum_all()?.backward()?;
//! for (name, p) in model.params()?.entries()? {
//!     println!("{name}: {:?} grad {}", p.shape()?, p.grad()?.is_some());
//! }
//! # Ok::<(), flame::Error>(())
//! ```

use crate::{api, check, sys, Context, Error, Params, Result, Status, Tensor};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::path::Path;

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("{what} {s:?} contains NUL")))
}

fn opt_c_string(s: Option<&str>, what: &str) -> Result<Option<CString>> {
    s.map(|s| c_string(s, what)).transpose()
}

fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

fn c_path(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("path {p:?} contains NUL")))
}

/// `flame_model_known_architectures` as the library returns it: a JSON array of strings.
pub fn known_architectures_json() -> Result<String> {
    let mut p: *const c_char = std::ptr::null();
    check(unsafe { (api()?.flame_model_known_architectures)(&mut p) })?;
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The preflight memory estimate of a training step (`flame_memory_estimate_t`), in bytes: see
/// [`estimate_memory`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    pub weights_bytes: u64,
    pub adapter_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_bytes: u64,
    pub activation_bytes: u64,
    pub workspace_bytes: u64,
    /// The expected peak of `peak_bytes_in_use` over a step: the sum of the above.
    pub total_bytes: u64,
    pub parameter_count: u64,
    pub trainable_count: u64,
}

/// `flame_model_estimate_memory`: the expected peak device memory of a training step, from a request
/// JSON object ("architecture" and "config", or "path"; "options", "lora", "batch", "height",
/// "width", "text_tokens", "checkpointing", "optimizer": flame.h documents them). Needs no GPU and
/// reads no weights.
pub fn estimate_memory(request_json: &str) -> Result<MemoryEstimate> {
    let api = api()?;
    let r = c_string(request_json, "request_json")?;
    let mut e: sys::flame_memory_estimate_t = unsafe { std::mem::zeroed() };
    e.struct_size = std::mem::size_of::<sys::flame_memory_estimate_t>();
    check(unsafe { (api.flame_model_estimate_memory)(r.as_ptr(), &mut e) })?;
    Ok(MemoryEstimate {
        weights_bytes: e.weights_bytes,
        adapter_bytes: e.adapter_bytes,
        gradient_bytes: e.gradient_bytes,
        optimizer_bytes: e.optimizer_bytes,
        activation_bytes: e.activation_bytes,
        workspace_bytes: e.workspace_bytes,
        total_bytes: e.total_bytes,
        parameter_count: e.parameter_count,
        trainable_count: e.trainable_count,
    })
}

/// The architecture names [`Model::create`] knows ("CLIPTextModel", "UNet2DConditionModel", ...).
/// Needs no GPU.
pub fn known_architectures() -> Result<Vec<String>> {
    let json = known_architectures_json()?;
    parse_json_string_array(&json)
        .ok_or_else(|| Error::new(Status::ERROR_INVALID_FORMAT, format!("flame_model_known_architectures returned {json:?}")))
}

/// Parses a JSON array of strings (`["a", "b\"c"]`); None for anything else.
pub fn parse_json_string_array(json: &str) -> Option<Vec<String>> {
    let mut chars = json.trim().chars().peekable();
    let skip_ws = |c: &mut std::iter::Peekable<std::str::Chars>| {
        while c.peek().map_or(false, |ch| ch.is_whitespace()) {
            c.next();
        }
    };
    if chars.next()? != '[' {
        return None;
    }
    let mut out = Vec::new();
    skip_ws(&mut chars);
    if chars.peek() == Some(&']') {
        chars.next();
        return if chars.next().is_none() { Some(out) } else { None };
    }
    loop {
        skip_ws(&mut chars);
        if chars.next()? != '"' {
            return None;
        }
        out.push(read_json_string_body(&mut chars)?);
        skip_ws(&mut chars);
        match chars.next()? {
            ',' => continue,
            ']' => break,
            _ => return None,
        }
    }
    if chars.next().is_none() {
        Some(out)
    } else {
        None
    }
}

// The rest of a JSON string after its opening quote, escapes decoded (surrogate pairs included).
fn read_json_string_body(chars: &mut impl Iterator<Item = char>) -> Option<String> {
    let mut s = String::new();
    let hex4 = |chars: &mut dyn Iterator<Item = char>| -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            v = v * 16 + chars.next()?.to_digit(16)?;
        }
        Some(v)
    };
    loop {
        match chars.next()? {
            '"' => return Some(s),
            '\\' => match chars.next()? {
                '"' => s.push('"'),
                '\\' => s.push('\\'),
                '/' => s.push('/'),
                'b' => s.push('\u{8}'),
                'f' => s.push('\u{c}'),
                'n' => s.push('\n'),
                'r' => s.push('\r'),
                't' => s.push('\t'),
                'u' => {
                    let hi = hex4(chars)?;
                    let code = if (0xD800..0xDC00).contains(&hi) {
                        if chars.next()? != '\\' || chars.next()? != 'u' {
                            return None;
                        }
                        let lo = hex4(chars)?;
                        if !(0xDC00..0xE000).contains(&lo) {
                            return None;
                        }
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    } else {
                        hi
                    };
                    s.push(char::from_u32(code)?);
                }
                _ => return None,
            },
            c if (c as u32) < 0x20 => return None,
            c => s.push(c),
        }
    }
}

/// A model (`flame_model_t`). Drop releases it; parameter tensors taken from it live on. It keeps its
/// context alive, as tensors do. Use it from one thread at a time (it is `Send`, not `Sync`).
pub struct Model {
    raw: sys::flame_model_t,
}
unsafe impl Send for Model {}

impl Model {
    /// `flame_model_create`: a new model of `architecture` (a name [`known_architectures`] lists)
    /// with `config_json` (a JSON object as the reference's config.json; None for the class's
    /// defaults) and `options_json` (`{"dtype": "f32"|"f16"|"bf16"|"f64", "compute_dtype": ...}`;
    /// None for f32). Parameters are initialised from the context's generator.
    pub fn create(ctx: &Context, architecture: &str, config_json: Option<&str>, options_json: Option<&str>) -> Result<Model> {
        let api = api()?;
        let a = c_string(architecture, "architecture")?;
        let c = opt_c_string(config_json, "config")?;
        let o = opt_c_string(options_json, "options")?;
        let mut raw: sys::flame_model_t = std::ptr::null_mut();
        check(unsafe { (api.flame_model_create)(ctx.raw, a.as_ptr(), opt_ptr(&c), opt_ptr(&o), &mut raw) })?;
        Ok(Model { raw })
    }

    /// `flame_model_load`: a model from a diffusers model or pipeline folder, or a single
    /// safetensors file (original or diffusers names). `options_json` may name the "architecture",
    /// "config", "component" (of a pipeline or a multi-component single file) and "dtype".
    ///
    /// ```no_run
    /// # let ctx = flame::Context::new()?;
    /// let unet = flame::Model::load(&ctx, "sdxl-base", Some(r#"{"component":"unet","dtype":"bf16"}"#))?;
    /// # Ok::<(), flame::Error>(())
    /// ```
    pub fn load(ctx: &Context, path: impl AsRef<Path>, options_json: Option<&str>) -> Result<Model> {
        let api = api()?;
        let p = c_path(path.as_ref())?;
        let o = opt_c_string(options_json, "options")?;
        let mut raw: sys::flame_model_t = std::ptr::null_mut();
        check(unsafe { (api.flame_model_load)(ctx.raw, p.as_ptr(), opt_ptr(&o), &mut raw) })?;
        Ok(Model { raw })
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_model_t {
        self.raw
    }

    /// `flame_model_save`: the parameters in one safetensors file at `path` (atomic replacement),
    /// under the reference's (diffusers / transformers) names, as [`Model::params`] lists them.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { (api()?.flame_model_save)(self.raw, p.as_ptr(), std::ptr::null()) })
    }

    /// `flame_model_save` in `layout`: `"diffusers"` (as [`Model::save`]), `"original"` (the class's
    /// usual single-file layout: BFL names for Flux, SGM / LDM names for the UNet and the VAE, ...)
    /// or an explicit one (`"bfl"`, `"comfyui"`, `"sgm"`, `"ldm"`, `"sd3"`; flame.h lists them per
    /// class). A layout the class does not have is an [`Error`] naming the layout and the class.
    pub fn save_layout(&self, path: impl AsRef<Path>, layout: &str) -> Result<()> {
        let p = c_path(path.as_ref())?;
        let l = c_string(layout, "layout")?;
        check(unsafe { (api()?.flame_model_save)(self.raw, p.as_ptr(), l.as_ptr()) })
    }

    /// `flame_model_architecture`: the architecture's name.
    pub fn architecture(&self) -> Result<String> {
        let mut p: *const c_char = std::ptr::null();
        check(unsafe { (api()?.flame_model_architecture)(self.raw, &mut p) })?;
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// `flame_model_config`: the complete configuration as a JSON object (defaults filled in).
    pub fn config_json(&self) -> Result<String> {
        let mut p: *const c_char = std::ptr::null();
        check(unsafe { (api()?.flame_model_config)(self.raw, &mut p) })?;
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// `flame_model_params`: the parameters under the reference's names, in state_dict order. The
    /// tensors are the model's own: an optimizer step or [`Params::load_safetensors`] on them
    /// changes the model.
    pub fn params(&self) -> Result<Params> {
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_model_params)(self.raw, &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// `flame_model_forward` on named inputs (the names the reference's forward() takes, e.g.
    /// `input_ids`, `sample`, `timestep`, `encoder_hidden_states`): the named outputs. With grad mode
    /// on, backward works through them.
    pub fn forward(&self, inputs: &[(&str, &Tensor)]) -> Result<Params> {
        let ctx = match inputs.first() {
            Some((_, t)) => t.context()?,
            None => return Err(Error::new(Status::ERROR_INVALID_ARGUMENT, "Model::forward: no inputs".to_string())),
        };
        let mut list = Params::new(&ctx)?;
        for (name, t) in inputs {
            list.add(name, t)?;
        }
        self.forward_params(&list)
    }

    /// `flame_model_forward` on an input list built already.
    pub fn forward_params(&self, inputs: &Params) -> Result<Params> {
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_model_forward)(self.raw, inputs.as_raw(), &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// `flame_model_set_training`: training mode (true) or evaluation mode (false, the initial one).
    pub fn set_training(&self, training: bool) -> Result<()> {
        check(unsafe { (api()?.flame_model_set_training)(self.raw, i32::from(training)) })
    }

    /// `flame_model_set_checkpointing`: gradient checkpointing of every `every_n_blocks`-th block
    /// (0 turns it off, the initial policy; 1 checkpoints every block).
    pub fn set_checkpointing(&self, every_n_blocks: i64) -> Result<()> {
        check(unsafe { (api()?.flame_model_set_checkpointing)(self.raw, every_n_blocks) })
    }

    /// `flame_model_add_lora`: a LoRA adapter on the model's linear layers, beside the frozen weights.
    /// `options_json` (flame.h lists the keys): e.g. `{"rank": 16, "alpha": 16}`, `"targets"`,
    /// `"preset": "kohya"`, `"name"`. Returns the adapter's tensors (`<module>.lora_A.weight`,
    /// `<module>.lora_B.weight`) to hand to an optimizer.
    ///
    /// ```no_run
    /// # let ctx = flame::Context::new()?;
    /// # let flux = flame::Model::load(&ctx, "flux1-dev.safetensors", Some(r#"{"dtype":"bf16"}"#))?;
    /// let lora = flux.add_lora(Some(r#"{"rank": 16, "alpha": 16}"#))?;
    /// // ... train lora's tensors ...
    /// flux.save_lora(None, "my_lora.safetensors", Some(r#"{"format": "kohya"}"#))?;
    /// # Ok::<(), flame::Error>(())
    /// ```
    pub fn add_lora(&self, options_json: Option<&str>) -> Result<Params> {
        let o = opt_c_string(options_json, "options")?;
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_model_add_lora)(self.raw, opt_ptr(&o), &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// `flame_model_lora_params`: the tensors of the adapter `name` (None: "default").
    pub fn lora_params(&self, name: Option<&str>) -> Result<Params> {
        let n = opt_c_string(name, "name")?;
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_model_lora_params)(self.raw, opt_ptr(&n), &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// `flame_model_save_lora`: the adapter `name` (None: "default") as a LoRA file ComfyUI,
    /// diffusers and kohya read; `options_json`: `{"format": "kohya" | "peft", "component", "dtype",
    /// "metadata"}` (None: kohya, f32).
    pub fn save_lora(&self, name: Option<&str>, path: impl AsRef<Path>, options_json: Option<&str>) -> Result<()> {
        let n = opt_c_string(name, "name")?;
        let p = c_path(path.as_ref())?;
        let o = opt_c_string(options_json, "options")?;
        check(unsafe { (api()?.flame_model_save_lora)(self.raw, opt_ptr(&n), p.as_ptr(), opt_ptr(&o)) })
    }

    /// `flame_model_load_lora`: a LoRA file (kohya or peft) as a new adapter; `options_json`:
    /// `{"name", "component", "multiplier", "dtype", "trainable"}`. Returns its tensors.
    pub fn load_lora(&self, path: impl AsRef<Path>, options_json: Option<&str>) -> Result<Params> {
        let p = c_path(path.as_ref())?;
        let o = opt_c_string(options_json, "options")?;
        let mut raw: sys::flame_params_t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_model_load_lora)(self.raw, p.as_ptr(), opt_ptr(&o), &mut raw) })?;
        Ok(unsafe { Params::from_raw(raw) })
    }

    /// `flame_model_remove_lora`: removes the adapter `name` (None: "default").
    pub fn remove_lora(&self, name: Option<&str>) -> Result<()> {
        let n = opt_c_string(name, "name")?;
        check(unsafe { (api()?.flame_model_remove_lora)(self.raw, opt_ptr(&n)) })
    }

    /// `flame_model_merge_lora`: folds the adapter `name` (None: "default") into the model's
    /// weights (W + multiplier * scale * B A, or DoRA's normalised weight; f32 on the device, stored
    /// in the weight's dtype) and removes it.
    pub fn merge_lora(&self, name: Option<&str>) -> Result<()> {
        let n = opt_c_string(name, "name")?;
        check(unsafe { (api()?.flame_model_merge_lora)(self.raw, opt_ptr(&n)) })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_model_release)(self.raw) };
        }
    }
}
