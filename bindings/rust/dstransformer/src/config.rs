//! Layer configuration: every field of `dst_layer_config`, with the library's defaults.

use std::mem::MaybeUninit;

use dstransformer_sys as sys;

use crate::error::check;
use crate::{Backend, DType, Error, Gelu, Result};

/// The configuration of a layer (`dst_layer_config`).
///
/// Start from [`LayerConfig::builder`] (or [`LayerConfig::default`]), whose values are the library's
/// defaults (`dst_layer_config_default`); read fields with the getters of the same name.
///
/// ```no_run
/// use dstransformer::{DType, LayerConfig};
/// let cfg = LayerConfig::builder()
///     .hidden_size(256)
///     .heads(4)
///     .max_batch_tokens(4096)
///     .max_seq_len(512)
///     .dtype(DType::F32)
///     .build()?;
/// assert_eq!(cfg.intermediate_size(), 0); // 0 means 4·H
/// # Ok::<(), dstransformer::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct LayerConfig {
    raw: sys::dst_layer_config,
}

impl Default for LayerConfig {
    /// The library's defaults (`dst_layer_config_default`).
    fn default() -> LayerConfig {
        let mut raw = MaybeUninit::<sys::dst_layer_config>::zeroed();
        // SAFETY: valid pointer to one struct; the call cannot fail for a non-null pointer, and the
        // zeroed struct is a valid value even if it did.
        let st = unsafe { sys::dst_layer_config_default(raw.as_mut_ptr()) };
        debug_assert_eq!(st, sys::dst_status::DST_OK);
        // SAFETY: zero-initialised plain data, filled by the library.
        LayerConfig {
            raw: unsafe { raw.assume_init() },
        }
    }
}

macro_rules! config_fields {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty => |$raw_in:ident| $from_raw:expr, |$v:ident| $to_raw:expr; )*) => {
        impl LayerConfig {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> $ty {
                    let $raw_in = self.raw.$name;
                    $from_raw
                }
            )*
        }

        impl LayerConfigBuilder {
            $(
                $(#[$doc])*
                pub fn $name(mut self, $v: $ty) -> LayerConfigBuilder {
                    self.cfg.raw.$name = $to_raw;
                    self
                }
            )*
        }

        impl std::fmt::Debug for LayerConfig {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("LayerConfig")
                    $(.field(stringify!($name), &self.$name()))*
                    .finish()
            }
        }

        impl PartialEq for LayerConfig {
            fn eq(&self, other: &LayerConfig) -> bool {
                true $(&& self.$name() == other.$name())*
            }
        }
    };
}

// BEGIN GENERATED fields (bindings/gen_fields.py from dstransformer.h; do not edit)
config_fields! {
    /// H, the model width. Default 1024.
    hidden_size: i32 => |r| r, |v| v;
    /// Attention heads; must divide H. Default 16.
    heads: i32 => |r| r, |v| v;
    /// FFN width I; 0 means 4·H. Default 0.
    intermediate_size: i32 => |r| r, |v| v;
    /// Dropout on attention probabilities, in [0, 1). Default 0.1.
    attn_dropout_ratio: f32 => |r| r, |v| v;
    /// Dropout on both sub-layer outputs, in [0, 1). Default 0.1.
    hidden_dropout_ratio: f32 => |r| r, |v| v;
    /// Layers in the model (for the init rule). Default 24.
    num_hidden_layers: i32 => |r| r, |v| v;
    /// Std. deviation of weight init. Default 0.02.
    initializer_range: f32 => |r| r, |v| v;
    /// LayerNorm ε, added to the variance. Default 1e-12.
    layer_norm_eps: f32 => |r| r, |v| v;
    /// Seed of the initial weights (Philox key). Default 42.
    seed: u64 => |r| r, |v| v;
    /// Pre-LN (true) or Post-LN (false). Default true.
    pre_layer_norm: bool => |r| r != 0, |v| v as i32;
    /// LayerNorm backward from its output; drops LN inputs. Default false.
    normalize_invertible: bool => |r| r != 0, |v| v as i32;
    /// Keep only the pre-GELU value; recompute GELU. Default false.
    gelu_checkpoint: bool => |r| r != 0, |v| v as i32;
    /// Accepted for DeepSpeed configs; has no effect: attention is fused and never keeps anything S×S
    /// (docs/memory.md). Default false.
    attn_dropout_checkpoint: bool => |r| r != 0, |v| v as i32;
    /// Scale the output-projection init by 1/sqrt(2·layers). Default true.
    adjust_init_range: bool => |r| r != 0, |v| v as i32;
    /// Allow non-deterministic fast paths (CUDA: the attention backward adds its partial dQs in arrival
    /// order instead of a fixed order; results then differ in the last bits from run to run). Default
    /// false: every backward is bit-reproducible.
    stochastic_mode: bool => |r| r != 0, |v| v as i32;
    /// Initial mode: training (dropout, saved state) or inference. Default true.
    training: bool => |r| r != 0, |v| v as i32;
    /// Storage type of parameters and activations. Default [`DType::F32`].
    dtype: DType => |r| DType::from_raw(r).unwrap_or(DType::F32), |v| v.to_raw();
    /// Largest B·S of any call. Default 8192.
    max_batch_tokens: i64 => |r| r, |v| v;
    /// Largest S of any call. Default 512.
    max_seq_len: i32 => |r| r, |v| v;
    /// GELU form. Default [`Gelu::Erf`].
    gelu: Gelu => |r| Gelu::from_raw(r).unwrap_or(Gelu::Erf), |v| v.to_raw();
    /// Causal attention (query i sees keys ≤ i). Default false.
    causal: bool => |r| r != 0, |v| v as i32;
    /// Let FP32 GEMMs use TF32 tensor cores (CUDA). Default false.
    allow_tf32: bool => |r| r != 0, |v| v as i32;
}
// END GENERATED fields

impl LayerConfig {
    /// A builder starting from the library's defaults.
    pub fn builder() -> LayerConfigBuilder {
        LayerConfigBuilder {
            cfg: LayerConfig::default(),
        }
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> LayerConfigBuilder {
        LayerConfigBuilder { cfg: *self }
    }

    pub(crate) fn from_raw(raw: sys::dst_layer_config) -> LayerConfig {
        LayerConfig { raw }
    }

    /// The raw struct, e.g. for `dstransformer-sys` calls.
    pub fn as_raw(&self) -> &sys::dst_layer_config {
        &self.raw
    }

    /// Checks the configuration for a backend without allocating anything
    /// (`dst_layer_config_validate`); [`Backend::Auto`] checks the generic rules only. The error's
    /// message names the offending field.
    pub fn validate(&self, backend: Backend) -> Result<()> {
        // SAFETY: valid pointer; callable from any thread.
        check(unsafe { sys::dst_layer_config_validate(&self.raw, backend.to_raw()) })
    }

    /// Bytes of activations one training forward of B = `batch`, S = `seq` keeps for backward
    /// (`dst_layer_config_saved_bytes`).
    pub fn saved_bytes(&self, batch: usize, seq: usize) -> Result<usize> {
        let (b, s) = sizes(batch, seq)?;
        let mut bytes = 0usize;
        // SAFETY: valid pointers.
        check(unsafe { sys::dst_layer_config_saved_bytes(&self.raw, b, s, &mut bytes) })?;
        Ok(bytes)
    }

    /// Bytes of workspace a call of B = `batch`, S = `seq` needs (`dst_layer_config_workspace_bytes`).
    pub fn workspace_bytes(&self, batch: usize, seq: usize) -> Result<usize> {
        let (b, s) = sizes(batch, seq)?;
        let mut bytes = 0usize;
        // SAFETY: valid pointers.
        check(unsafe { sys::dst_layer_config_workspace_bytes(&self.raw, b, s, &mut bytes) })?;
        Ok(bytes)
    }
}

fn sizes(batch: usize, seq: usize) -> Result<(i64, i64)> {
    match (i64::try_from(batch), i64::try_from(seq)) {
        (Ok(b), Ok(s)) => Ok((b, s)),
        _ => Err(Error::invalid(format!(
            "batch {batch} or seq {seq} is too large"
        ))),
    }
}

/// Builds a [`LayerConfig`]; each setter is named after its field.
#[derive(Clone, Copy, Debug)]
pub struct LayerConfigBuilder {
    cfg: LayerConfig,
}

impl LayerConfigBuilder {
    /// The configuration, checked against the generic rules (`dst_layer_config_validate` with
    /// [`Backend::Auto`]); the error names the offending field.
    pub fn build(self) -> Result<LayerConfig> {
        self.cfg.validate(Backend::Auto)?;
        Ok(self.cfg)
    }
}
