//! Safe Rust interface to libdstransformer, a fused BERT-style Transformer layer (DeepSpeed's
//! Transformer Kernel re-implemented) with forward and backward, on a CPU reference backend and CUDA.
//!
//! The crate wraps the C API of `dstransformer-sys`: handles become owned values freed on drop
//! ([`Context`], [`Layer`], [`Saved`], [`DeviceBuffer`]), status codes become [`Result`] with an
//! [`Error`] carrying the [`Status`] and the library's message, and tensors are slices in host memory
//! (`f32`, `f64`, or `u16` holding FP16/BF16 bits) whose lengths are checked before each call.
//!
//! ```no_run
//! use dstransformer::{Context, GradMode, Layer, LayerConfig, Mask};
//!
//! let ctx = Context::cpu()?;
//! let cfg = LayerConfig::builder().hidden_size(64).heads(4).max_batch_tokens(256).max_seq_len(64).build()?;
//! let mut layer = Layer::new(&ctx, &cfg)?;
//! let (b, s, h) = (2, 16, 64);
//! let x = vec![0.5f32; b * s * h];
//! let mut y = vec![0f32; b * s * h];
//! layer.forward(&x, &mut y, b, s, &Mask::KeyLengths(&[16, 11]))?;
//! let dy = vec![1f32; b * s * h];
//! let mut dx = vec![0f32; b * s * h];
//! layer.backward(&dy, &mut dx, b, s, GradMode::Write)?;
//! let g_qkvw: Vec<f32> = layer.get_grad("attn_qkvw")?;
//! # let _ = g_qkvw;
//! # Ok::<(), dstransformer::Error>(())
//! ```
//!
//! # Threads
//! [`Context`], [`Layer`] and [`Saved`] are `Send` and not `Sync`; see [`Context`] for why.
#![warn(missing_docs)]

mod checkpoint;
mod config;
mod context;
mod engine;
mod error;
mod layer;
mod layernorm;
mod types;
mod util;

pub use dstransformer_sys as sys;

pub use checkpoint::{
    convert_checkpoint, describe_checkpoint, load_checkpoint, save_checkpoint, CheckpointOptions,
};
pub use config::{LayerConfig, LayerConfigBuilder};
pub use context::{cuda_device_count, Context, DeviceBuffer};
pub use engine::{validate_engine_config, Engine, EngineState, ParamGroup};
pub use error::{Error, Result, Status};
pub use layer::{Layer, Mask, ParamInfo, Saved};
pub use layernorm::{layernorm_backward, layernorm_forward};
pub use types::{Backend, DType, Element, Gelu, GradMode, IndexChecks, Param, WeightLayout};

/// Version of the header this crate was generated from, as major·10000 + minor·100 + patch.
pub const VERSION_NUMBER: u32 = sys::DST_VERSION_NUMBER;

/// Version of the library loaded at run time (`dst_version`); compare with [`VERSION_NUMBER`].
pub fn version() -> u32 {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::dst_version() as u32 }
}

/// Version of the library loaded at run time as "major.minor.patch" (`dst_version_string`).
pub fn version_string() -> &'static str {
    // SAFETY: returns a static NUL-terminated string owned by the library.
    let ptr = unsafe { sys::dst_version_string() };
    if ptr.is_null() {
        return "";
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_str()
        .unwrap_or("")
}
