//! safetensors checkpoints of one layer or a stack, in DeepSpeed or Hugging Face BERT names.

use std::ffi::CString;
use std::mem::MaybeUninit;
use std::path::Path;
use std::ptr;
use std::sync::MutexGuard;

use dstransformer_sys as sys;

use crate::error::check;
use crate::util::{cpath, cstring, text_of};
use crate::{DType, Error, Layer, Result, WeightLayout};

/// Options of [`save_checkpoint`] and [`load_checkpoint`] (`dst_checkpoint_options`); the defaults are
/// the library's (`dst_checkpoint_options_default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointOptions {
    // BEGIN GENERATED option fields (bindings/gen_fields.py from dstransformer.h; do not edit)
    /// Naming scheme. Default [`WeightLayout::DeepSpeed`].
    pub layout: WeightLayout,
    /// Prepended to `layer.<i>.`; `None` for none. Loading a Hugging Face file also accepts the prefixes
    /// `bert.encoder.` and `encoder.` when this is `None`. Default `None`.
    pub prefix: Option<String>,
    /// Save: also write the gradients. Load: also read them (they must be present). Default false.
    pub include_grads: bool,
    /// Save: the dtype to convert to; `None` keeps each layer's dtype. Default `None`.
    pub save_dtype: Option<DType>,
    /// Load: set the first layer's context RNG state from the file. Default true.
    pub restore_rng: bool,
    /// Save: opaque bytes stored with the weights (epoch, step…), kept exactly (UTF-8 text without NUL is
    /// stored as text, anything else base64-encoded). Default `None`.
    pub client_state: Option<Vec<u8>>,
    // END GENERATED option fields
}

impl Default for CheckpointOptions {
    fn default() -> CheckpointOptions {
        let mut raw = MaybeUninit::<sys::dst_checkpoint_options>::zeroed();
        // SAFETY: valid pointer to one struct (zeroed, so valid even if the call did nothing).
        let raw = unsafe {
            sys::dst_checkpoint_options_default(raw.as_mut_ptr());
            raw.assume_init()
        };
        CheckpointOptions {
            // BEGIN GENERATED option defaults (bindings/gen_fields.py from dstransformer.h; do not edit)
            layout: WeightLayout::from_raw(raw.layout).unwrap_or(WeightLayout::DeepSpeed),
            prefix: None,
            include_grads: raw.include_grads != 0,
            save_dtype: optional_dtype(raw.save_dtype),
            restore_rng: raw.restore_rng != 0,
            client_state: None,
            // END GENERATED option defaults
        }
    }
}

/// The raw options and the strings they point to (the byte strings point into the options themselves).
struct RawOptions {
    raw: sys::dst_checkpoint_options,
    _strings: Vec<Option<CString>>,
}

/// The [`DType`] of a raw `save_dtype`: `None` for -1 (keep each layer's dtype) or an unknown value.
fn optional_dtype(raw: i32) -> Option<DType> {
    u32::try_from(raw)
        .ok()
        .and_then(|v| DType::from_raw(sys::dst_dtype(v)))
}

impl CheckpointOptions {
    fn to_raw(&self) -> Result<RawOptions> {
        let mut raw = MaybeUninit::<sys::dst_checkpoint_options>::zeroed();
        // SAFETY: as in Default.
        let mut raw = unsafe {
            sys::dst_checkpoint_options_default(raw.as_mut_ptr());
            raw.assume_init()
        };
        let mut strings: Vec<Option<CString>> = Vec::new();
        // BEGIN GENERATED option to_raw (bindings/gen_fields.py from dstransformer.h; do not edit)
        raw.layout = self.layout.to_raw();
        let prefix = self.prefix.as_deref();
        let prefix = prefix.map(|s| cstring(s, "checkpoint prefix")).transpose()?;
        raw.prefix = prefix.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        strings.push(prefix);
        raw.include_grads = self.include_grads as i32;
        raw.save_dtype = self.save_dtype.map_or(-1, |d| d.to_raw().0 as i32);
        raw.restore_rng = self.restore_rng as i32;
        if let Some(c) = &self.client_state {
            raw.client_state = if c.is_empty() { b"\0".as_ptr() } else { c.as_ptr() }.cast();
            raw.client_state_len = c.len();
        }
        // END GENERATED option to_raw
        Ok(RawOptions {
            raw,
            _strings: strings,
        })
    }
}

/// Locks the contexts of `layers`, each once, in address order (so two threads never wait on each
/// other).
fn lock_all<'a>(layers: impl Iterator<Item = &'a Layer>) -> Vec<MutexGuard<'a, ()>> {
    let mut ctxs: Vec<_> = layers.map(|l| l.inner().ctx()).collect();
    ctxs.sort_by_key(|c| std::sync::Arc::as_ptr(c) as usize);
    ctxs.dedup_by_key(|c| std::sync::Arc::as_ptr(c) as usize);
    ctxs.into_iter().map(|c| c.lock()).collect()
}

fn layer_count(n: usize) -> Result<i32> {
    if n == 0 {
        return Err(Error::invalid(
            "checkpoint: at least one layer is needed".to_owned(),
        ));
    }
    i32::try_from(n).map_err(|_| Error::invalid(format!("checkpoint: {n} layers are too many")))
}

/// Writes the parameters (and, with `include_grads`, the gradients) of a stack of layers to a
/// safetensors file; layer i is stored as `layer.<i>` (`dst_checkpoint_save`). The file is replaced
/// atomically.
pub fn save_checkpoint(
    layers: &[&Layer],
    path: impl AsRef<Path>,
    options: &CheckpointOptions,
) -> Result<()> {
    let n = layer_count(layers.len())?;
    let path = cpath(path.as_ref())?;
    let opts = options.to_raw()?;
    let raws: Vec<*mut sys::dst_layer> = layers.iter().map(|l| l.as_raw()).collect();
    let _guards = lock_all(layers.iter().copied());
    // SAFETY: `raws` holds `n` live layer handles; the strings outlive the call.
    check(unsafe { sys::dst_checkpoint_save(raws.as_ptr(), n, path.as_ptr(), &opts.raw) })
}

/// Reads the parameters (and, with `include_grads`, the gradients) of a stack of layers from a
/// safetensors file (`dst_checkpoint_load`), and returns the client state stored with them (its exact
/// bytes), if any. Nothing changes on failure.
pub fn load_checkpoint(
    layers: &mut [&mut Layer],
    path: impl AsRef<Path>,
    options: &CheckpointOptions,
) -> Result<Option<Vec<u8>>> {
    let n = layer_count(layers.len())?;
    let path = cpath(path.as_ref())?;
    let opts = options.to_raw()?;
    let raws: Vec<*mut sys::dst_layer> = layers.iter().map(|l| l.as_raw()).collect();
    let _guards = lock_all(layers.iter().map(|l| &**l));
    let mut buf = vec![0u8; 4096];
    loop {
        let mut len = 0usize;
        // SAFETY: `raws` holds `n` live layer handles; `buf` has `buf.len()` writable bytes.
        check(unsafe {
            sys::dst_checkpoint_load(
                raws.as_ptr(),
                n,
                path.as_ptr(),
                &opts.raw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut len,
            )
        })?;
        if len < buf.len() {
            buf.truncate(len);
            return Ok(if len == 0 { None } else { Some(buf) });
        }
        // The client state was truncated: load again (the same data) with room for all of it.
        buf = vec![0u8; len + 1];
    }
}

/// Converts a checkpoint file between weight layouts without creating layers
/// (`dst_checkpoint_convert`) and returns the library's summary of what was read and written.
/// `in_prefix` `None` detects the source's prefix; `out_prefix` `None` keeps it.
pub fn convert_checkpoint(
    in_path: impl AsRef<Path>,
    in_layout: WeightLayout,
    in_prefix: Option<&str>,
    out_path: impl AsRef<Path>,
    out_layout: WeightLayout,
    out_prefix: Option<&str>,
) -> Result<String> {
    let in_path = cpath(in_path.as_ref())?;
    let out_path = cpath(out_path.as_ref())?;
    let in_prefix = in_prefix.map(|p| cstring(p, "in_prefix")).transpose()?;
    let out_prefix = out_prefix.map(|p| cstring(p, "out_prefix")).transpose()?;
    let mut summary = vec![0u8; 16384];
    // SAFETY: all strings are NUL-terminated and outlive the call; `summary` is writable.
    check(unsafe {
        sys::dst_checkpoint_convert(
            in_path.as_ptr(),
            in_layout.to_raw(),
            in_prefix.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            out_path.as_ptr(),
            out_layout.to_raw(),
            out_prefix.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            summary.as_mut_ptr().cast(),
            summary.len(),
        )
    })?;
    Ok(text_of(&summary))
}

/// Describes a checkpoint file without creating layers (`dst_checkpoint_describe`): sizes, tensor
/// count and dtypes, the layers found under each layout and prefix, and the metadata. Reads only the
/// header, which it validates.
pub fn describe_checkpoint(path: impl AsRef<Path>) -> Result<String> {
    let path = cpath(path.as_ref())?;
    let mut buf = vec![0u8; 16384];
    loop {
        let mut len = 0usize;
        // SAFETY: `path` is NUL-terminated and outlives the call; `buf` is writable for its length.
        check(unsafe {
            sys::dst_checkpoint_describe(
                path.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut len,
            )
        })?;
        if len < buf.len() {
            return Ok(text_of(&buf));
        }
        // Truncated: ask again with room for all of it.
        buf = vec![0u8; len + 1];
    }
}
