//! safetensors files (flame.h "safetensors"): [`SafetensorsFile`] reads one, [`save_safetensors`]
//! writes one. Strings cross as UTF-8; a Rust string holding NUL is an `ERROR_INVALID_ARGUMENT`.

use crate::{api, check, len_as, sys, Context, DType, Error, Result, Status, Tensor};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::path::Path;

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("{what} {s:?} contains NUL")))
}

// key0, value0, key1, ... as C strings (the metadata_kv arrays of flame.h).
fn metadata_strings(metadata: &[(&str, &str)]) -> Result<Vec<CString>> {
    let mut kv = Vec::with_capacity(2 * metadata.len());
    for (k, v) in metadata {
        kv.push(c_string(k, "metadata key")?);
        kv.push(c_string(v, "metadata value")?);
    }
    Ok(kv)
}

fn c_path(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::new(Status::ERROR_INVALID_ARGUMENT, format!("path {p:?} contains NUL")))
}

// A string the library owns (borrowed from the file handle).
unsafe fn owned(p: *const c_char) -> String {
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

/// An open safetensors file (`flame_safetensors_t`): memory-mapped, header validated. Drop releases
/// it; tensors read from it stay valid.
pub struct SafetensorsFile {
    raw: sys::flame_safetensors_t,
}

// The C contract: queries only read the handle, and reads lock the file's context.
unsafe impl Send for SafetensorsFile {}
unsafe impl Sync for SafetensorsFile {}

impl SafetensorsFile {
    /// `flame_safetensors_load`: opens the file at `path` for reading on `ctx`.
    pub fn open(ctx: &Context, path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let api = api()?;
        let p = c_path(path.as_ref())?;
        let mut raw: sys::flame_safetensors_t = std::ptr::null_mut();
        check(unsafe { (api.flame_safetensors_load)(ctx.raw, p.as_ptr(), &mut raw) })?;
        Ok(SafetensorsFile { raw })
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_safetensors_t {
        self.raw
    }

    /// The tensor names, in byte order.
    pub fn names(&self) -> Result<Vec<String>> {
        let api = api()?;
        let mut n: i64 = 0;
        check(unsafe { (api.flame_safetensors_count)(self.raw, &mut n) })?;
        (0..n)
            .map(|i| {
                let mut s: *const c_char = std::ptr::null();
                check(unsafe { (api.flame_safetensors_name)(self.raw, i, &mut s) })?;
                Ok(unsafe { owned(s) })
            })
            .collect()
    }

    /// The dtype and shape of tensor `name` (`ERROR_UNSUPPORTED` for a dtype FLAME lacks).
    pub fn info(&self, name: &str) -> Result<(DType, Vec<i64>)> {
        let api = api()?;
        let n = c_string(name, "name")?;
        let mut dt: sys::flame_dtype_t = 0;
        let mut nd: i32 = 0;
        check(unsafe { (api.flame_safetensors_info)(self.raw, n.as_ptr(), &mut dt, std::ptr::null_mut(), 0, &mut nd) })?;
        let mut shape = vec![0i64; nd.max(0) as usize];
        check(unsafe { (api.flame_safetensors_info)(self.raw, n.as_ptr(), &mut dt, shape.as_mut_ptr(), nd, &mut nd) })?;
        Ok((DType::try_from(dt)?, shape))
    }

    /// `flame_safetensors_get`: tensor `name` as a new device tensor on the file's context.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let api = api()?;
        let n = c_string(name, "name")?;
        let mut out: sys::flame_tensor_t = std::ptr::null_mut();
        check(unsafe { (api.flame_safetensors_get)(self.raw, n.as_ptr(), &mut out) })?;
        Ok(unsafe { Tensor::from_raw(out) })
    }

    /// Every `__metadata__` entry, sorted by key.
    pub fn metadata(&self) -> Result<Vec<(String, String)>> {
        let api = api()?;
        let mut n: i64 = 0;
        check(unsafe { (api.flame_safetensors_metadata_count)(self.raw, &mut n) })?;
        (0..n)
            .map(|i| {
                let mut k: *const c_char = std::ptr::null();
                check(unsafe { (api.flame_safetensors_metadata_key)(self.raw, i, &mut k) })?;
                let key = unsafe { owned(k) };
                let value = self.metadata_value(&key)?.unwrap_or_default();
                Ok((key, value))
            })
            .collect()
    }

    /// The metadata value under `key`, or None when the file has no such key.
    pub fn metadata_value(&self, key: &str) -> Result<Option<String>> {
        let api = api()?;
        let k = c_string(key, "key")?;
        let mut v: *const c_char = std::ptr::null();
        check(unsafe { (api.flame_safetensors_metadata)(self.raw, k.as_ptr(), &mut v) })?;
        Ok(if v.is_null() { None } else { Some(unsafe { owned(v) }) })
    }
}

impl Drop for SafetensorsFile {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_safetensors_release)(self.raw) };
        }
    }
}

/// `flame_safetensors_save`: writes `tensors` (name, tensor; any dtype and strides, all on `ctx`)
/// and `metadata` to `path`, atomically (temporary file, then rename).
pub fn save_safetensors(ctx: &Context, path: impl AsRef<Path>, tensors: &[(&str, &Tensor)], metadata: &[(&str, &str)]) -> Result<()> {
    let api = api()?;
    let p = c_path(path.as_ref())?;
    let names = tensors.iter().map(|(n, _)| c_string(n, "name")).collect::<Result<Vec<_>>>()?;
    let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
    let raws: Vec<sys::flame_tensor_t> = tensors.iter().map(|(_, t)| t.raw).collect();
    let kv = metadata_strings(metadata)?;
    let kv_ptrs: Vec<*const c_char> = kv.iter().map(|c| c.as_ptr()).collect();
    check(unsafe {
        (api.flame_safetensors_save)(
            ctx.raw,
            p.as_ptr(),
            crate::slice_ptr(&name_ptrs),
            crate::slice_ptr(&raws),
            len_as::<i64>(raws.len())?,
            crate::slice_ptr(&kv_ptrs),
            len_as::<i64>(metadata.len())?,
        )
    })
}

/// Flags of [`Params::load_safetensors`] (bitwise or; [`ParamsLoad::STRICT`] is PyTorch's
/// `load_state_dict(strict=True)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamsLoad(pub u32);

impl ParamsLoad {
    /// Every entry must be in the file and every file tensor an entry; dtypes equal.
    pub const STRICT: ParamsLoad = ParamsLoad(0);
    /// A parameter the file lacks keeps its value.
    pub const ALLOW_MISSING: ParamsLoad = ParamsLoad(sys::FLAME_PARAMS_LOAD_ALLOW_MISSING);
    /// A file tensor no parameter is named after is ignored.
    pub const ALLOW_UNEXPECTED: ParamsLoad = ParamsLoad(sys::FLAME_PARAMS_LOAD_ALLOW_UNEXPECTED);
    /// Both (PyTorch's `strict=False`).
    pub const NON_STRICT: ParamsLoad = ParamsLoad(sys::FLAME_PARAMS_LOAD_NON_STRICT);
    /// A file tensor of another dtype is converted to the parameter's.
    pub const CONVERT_DTYPE: ParamsLoad = ParamsLoad(sys::FLAME_PARAMS_LOAD_CONVERT_DTYPE);
}

impl std::ops::BitOr for ParamsLoad {
    type Output = ParamsLoad;
    fn bitor(self, o: ParamsLoad) -> ParamsLoad {
        ParamsLoad(self.0 | o.0)
    }
}

/// An ordered list of named tensors of one context (`flame_params_t`): a model's parameters, saved
/// to and loaded from a safetensors file in one call each. The list holds references of its own;
/// tensors taken from it are new [`Tensor`]s.
pub struct Params {
    raw: sys::flame_params_t,
}
unsafe impl Send for Params {}

impl Params {
    /// Takes over a list the library made (an OUT handle of a raw call).
    ///
    /// # Safety
    /// `raw` must be a valid, owned `flame_params_t` of the loaded library.
    pub unsafe fn from_raw(raw: sys::flame_params_t) -> Params {
        Params { raw }
    }

    /// The raw handle (borrowed).
    pub fn as_raw(&self) -> sys::flame_params_t {
        self.raw
    }

    /// Every entry as (name, tensor), in order (new references).
    pub fn entries(&self) -> Result<Vec<(String, Tensor)>> {
        (0..self.len()?).map(|i| Ok((self.name(i)?, self.tensor(i)?))).collect()
    }

    /// `flame_params_create`: an empty list on `ctx`.
    pub fn new(ctx: &Context) -> Result<Params> {
        let mut raw = std::ptr::null_mut();
        check(unsafe { (api()?.flame_params_create)(ctx.raw, &mut raw) })?;
        Ok(Params { raw })
    }

    /// `flame_params_add`: appends `t` under `name` (unique, non-empty).
    pub fn add(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let n = c_string(name, "name")?;
        check(unsafe { (api()?.flame_params_add)(self.raw, n.as_ptr(), t.raw) })
    }

    /// `flame_params_count`: the number of entries.
    pub fn len(&self) -> Result<usize> {
        let mut n = 0i64;
        check(unsafe { (api()?.flame_params_count)(self.raw, &mut n) })?;
        Ok(n.max(0) as usize)
    }

    /// Whether the list has no entries.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// `flame_params_name`: the name of entry `index`.
    pub fn name(&self, index: usize) -> Result<String> {
        let mut p = std::ptr::null();
        check(unsafe { (api()?.flame_params_name)(self.raw, len_as::<i64>(index)?, &mut p) })?;
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// `flame_params_tensor`: the tensor of entry `index` (a new reference).
    pub fn tensor(&self, index: usize) -> Result<Tensor> {
        let mut t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_params_tensor)(self.raw, len_as::<i64>(index)?, &mut t) })?;
        unsafe { Tensor::from_borrowed(t) }
    }

    /// `flame_params_tensors`: every entry's tensor in order (new references; e.g. for an optimizer).
    pub fn tensors(&self) -> Result<Vec<Tensor>> {
        let n = self.len()?;
        let mut p = std::ptr::null();
        check(unsafe { (api()?.flame_params_tensors)(self.raw, &mut p) })?;
        (0..n).map(|i| unsafe { Tensor::from_borrowed(*p.add(i)) }).collect()
    }

    /// `flame_params_find`: the tensor called `name`, or `None`.
    pub fn find(&self, name: &str) -> Result<Option<Tensor>> {
        let n = c_string(name, "name")?;
        let mut t = std::ptr::null_mut();
        check(unsafe { (api()?.flame_params_find)(self.raw, n.as_ptr(), &mut t) })?;
        if t.is_null() {
            Ok(None)
        } else {
            unsafe { Tensor::from_borrowed(t) }.map(Some)
        }
    }

    /// `flame_params_save_safetensors`: every entry under its name, with `metadata`.
    pub fn save_safetensors(&self, path: impl AsRef<Path>, metadata: &[(&str, &str)]) -> Result<()> {
        let p = c_path(path.as_ref())?;
        let kv = metadata_strings(metadata)?;
        let kv_ptrs: Vec<*const c_char> = kv.iter().map(|c| c.as_ptr()).collect();
        check(unsafe {
            (api()?.flame_params_save_safetensors)(self.raw, p.as_ptr(), crate::slice_ptr(&kv_ptrs), len_as::<i64>(metadata.len())?)
        })
    }

    /// `flame_params_load_safetensors`: copies the file's tensors into the entries of the same names,
    /// in place; nothing changes on an error.
    pub fn load_safetensors(&self, path: impl AsRef<Path>, flags: ParamsLoad) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { (api()?.flame_params_load_safetensors)(self.raw, p.as_ptr(), flags.0) })
    }
}

impl Drop for Params {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            unsafe { (api.flame_params_release)(self.raw) };
        }
    }
}
