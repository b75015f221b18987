//! Enumerations of the C API and the element types that cross it.

use std::ffi::CStr;

use dstransformer_sys as sys;

/// Element type of a tensor or of a layer's storage (`dst_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (stored in `u16`).
    F16,
    /// bfloat16 (stored in `u16`).
    BF16,
    /// IEEE binary64 (reference computations).
    F64,
    /// 32-bit signed integer (key-length masks).
    I32,
}

impl DType {
    /// The raw `dst_dtype`.
    pub fn to_raw(self) -> sys::dst_dtype {
        match self {
            DType::F32 => sys::dst_dtype::DST_DTYPE_FP32,
            DType::F16 => sys::dst_dtype::DST_DTYPE_FP16,
            DType::BF16 => sys::dst_dtype::DST_DTYPE_BF16,
            DType::F64 => sys::dst_dtype::DST_DTYPE_FP64,
            DType::I32 => sys::dst_dtype::DST_DTYPE_INT32,
        }
    }

    /// The dtype of a raw `dst_dtype`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_dtype) -> Option<DType> {
        match raw {
            sys::dst_dtype::DST_DTYPE_FP32 => Some(DType::F32),
            sys::dst_dtype::DST_DTYPE_FP16 => Some(DType::F16),
            sys::dst_dtype::DST_DTYPE_BF16 => Some(DType::BF16),
            sys::dst_dtype::DST_DTYPE_FP64 => Some(DType::F64),
            sys::dst_dtype::DST_DTYPE_INT32 => Some(DType::I32),
            _ => None,
        }
    }

    /// Size of one element in bytes (`dst_dtype_size`).
    pub fn size(self) -> usize {
        // SAFETY: dst_dtype_size accepts any value.
        unsafe { sys::dst_dtype_size(self.to_raw()) }
    }

    /// The library's name of the dtype, e.g. `"bf16"` (`dst_dtype_string`).
    pub fn name(self) -> &'static str {
        // SAFETY: dst_dtype_string returns a static NUL-terminated string for any value.
        let ptr = unsafe { sys::dst_dtype_string(self.to_raw()) };
        if ptr.is_null() {
            return "unknown";
        }
        // SAFETY: non-null, NUL-terminated and static.
        unsafe { CStr::from_ptr(ptr) }.to_str().unwrap_or("unknown")
    }

    /// Whether this is one of the 16-bit floating types.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
}

/// Compute backend of a context (`dst_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The best available: CUDA when a GPU is usable, else CPU.
    Auto,
    /// The reference backend: host memory, CBLAS GEMMs, OpenMP loops.
    Cpu,
    /// NVIDIA GPUs.
    Cuda,
}

impl Backend {
    /// The raw `dst_backend`.
    pub fn to_raw(self) -> sys::dst_backend {
        match self {
            Backend::Auto => sys::dst_backend::DST_BACKEND_AUTO,
            Backend::Cpu => sys::dst_backend::DST_BACKEND_CPU,
            Backend::Cuda => sys::dst_backend::DST_BACKEND_CUDA,
        }
    }

    /// The backend of a raw `dst_backend`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_backend) -> Option<Backend> {
        match raw {
            sys::dst_backend::DST_BACKEND_AUTO => Some(Backend::Auto),
            sys::dst_backend::DST_BACKEND_CPU => Some(Backend::Cpu),
            sys::dst_backend::DST_BACKEND_CUDA => Some(Backend::Cuda),
            _ => None,
        }
    }
}

/// When a context's model ops check their index values (`dst_index_checks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IndexChecks {
    /// Before the call returns; a CUDA context waits for the device. The default.
    #[default]
    Eager,
    /// On the device, without waiting; a later call on the context reports a failure.
    Deferred,
}

impl IndexChecks {
    /// The raw `dst_index_checks`.
    pub fn to_raw(self) -> sys::dst_index_checks {
        match self {
            IndexChecks::Eager => sys::dst_index_checks::DST_INDEX_CHECKS_EAGER,
            IndexChecks::Deferred => sys::dst_index_checks::DST_INDEX_CHECKS_DEFERRED,
        }
    }

    /// The mode of a raw `dst_index_checks`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_index_checks) -> Option<IndexChecks> {
        match raw {
            sys::dst_index_checks::DST_INDEX_CHECKS_EAGER => Some(IndexChecks::Eager),
            sys::dst_index_checks::DST_INDEX_CHECKS_DEFERRED => Some(IndexChecks::Deferred),
            _ => None,
        }
    }
}

/// Form of the GELU activation (`dst_gelu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gelu {
    /// Exact x·Φ(x) (Hugging Face BERT). The default.
    Erf,
    /// The tanh approximation (DeepSpeed's kernel).
    Tanh,
}

impl Gelu {
    /// The raw `dst_gelu`.
    pub fn to_raw(self) -> sys::dst_gelu {
        match self {
            Gelu::Erf => sys::dst_gelu::DST_GELU_ERF,
            Gelu::Tanh => sys::dst_gelu::DST_GELU_TANH,
        }
    }

    /// The form of a raw `dst_gelu`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_gelu) -> Option<Gelu> {
        match raw {
            sys::dst_gelu::DST_GELU_ERF => Some(Gelu::Erf),
            sys::dst_gelu::DST_GELU_TANH => Some(Gelu::Tanh),
            _ => None,
        }
    }
}

/// How backward stores parameter gradients (`dst_grad_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GradMode {
    /// Overwrite the gradient arena.
    Write,
    /// Add to the gradient arena (gradient accumulation).
    Accumulate,
}

impl GradMode {
    /// The raw `dst_grad_mode`.
    pub fn to_raw(self) -> sys::dst_grad_mode {
        match self {
            GradMode::Write => sys::dst_grad_mode::DST_GRAD_WRITE,
            GradMode::Accumulate => sys::dst_grad_mode::DST_GRAD_ACCUMULATE,
        }
    }
}

/// Tensor naming scheme of a checkpoint (`dst_weight_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// DeepSpeed Transformer Kernel names (`attn_qkvw` … `norm_b`); the native layout.
    DeepSpeed,
    /// Hugging Face `BertLayer` names (`attention.self.query.weight` …); Post-LN only.
    HfBert,
}

impl WeightLayout {
    /// The raw `dst_weight_layout`.
    pub fn to_raw(self) -> sys::dst_weight_layout {
        match self {
            WeightLayout::DeepSpeed => sys::dst_weight_layout::DST_LAYOUT_DEEPSPEED,
            WeightLayout::HfBert => sys::dst_weight_layout::DST_LAYOUT_HF_BERT,
        }
    }

    /// The layout of a raw `dst_weight_layout`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_weight_layout) -> Option<WeightLayout> {
        match raw {
            sys::dst_weight_layout::DST_LAYOUT_DEEPSPEED => Some(WeightLayout::DeepSpeed),
            sys::dst_weight_layout::DST_LAYOUT_HF_BERT => Some(WeightLayout::HfBert),
            _ => None,
        }
    }
}

/// The twelve parameters of a layer, in DeepSpeed's order (`dst_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Param {
    /// `attn_qkvw` `[3H, H]`: rows Q, then K, then V.
    AttnQkvw,
    /// `attn_qkvb` `[3H]`.
    AttnQkvb,
    /// `attn_ow` `[H, H]`, attention output projection.
    AttnOw,
    /// `attn_ob` `[H]`.
    AttnOb,
    /// `attn_nw` `[H]`, γ of the LayerNorm after the attention residual.
    AttnNw,
    /// `attn_nb` `[H]`, β of that LayerNorm.
    AttnNb,
    /// `inter_w` `[I, H]`, FFN up-projection.
    InterW,
    /// `inter_b` `[I]`.
    InterB,
    /// `output_w` `[H, I]`, FFN down-projection.
    OutputW,
    /// `output_b` `[H]`.
    OutputB,
    /// `norm_w` `[H]`: γ of the input LN (Pre-LN) or of the final LN (Post-LN).
    NormW,
    /// `norm_b` `[H]`.
    NormB,
}

impl Param {
    /// All parameters, in DeepSpeed's order.
    pub const ALL: [Param; 12] = [
        Param::AttnQkvw,
        Param::AttnQkvb,
        Param::AttnOw,
        Param::AttnOb,
        Param::AttnNw,
        Param::AttnNb,
        Param::InterW,
        Param::InterB,
        Param::OutputW,
        Param::OutputB,
        Param::NormW,
        Param::NormB,
    ];

    /// DeepSpeed's name, e.g. `"attn_qkvw"`.
    pub fn name(self) -> &'static str {
        match self {
            Param::AttnQkvw => "attn_qkvw",
            Param::AttnQkvb => "attn_qkvb",
            Param::AttnOw => "attn_ow",
            Param::AttnOb => "attn_ob",
            Param::AttnNw => "attn_nw",
            Param::AttnNb => "attn_nb",
            Param::InterW => "inter_w",
            Param::InterB => "inter_b",
            Param::OutputW => "output_w",
            Param::OutputB => "output_b",
            Param::NormW => "norm_w",
            Param::NormB => "norm_b",
        }
    }

    /// The raw `dst_param`.
    pub fn to_raw(self) -> sys::dst_param {
        sys::dst_param(self as u32)
    }

    /// The parameter of a raw `dst_param`, or `None` for a value that is not one.
    pub fn from_raw(raw: sys::dst_param) -> Option<Param> {
        Param::ALL.get(raw.0 as usize).copied()
    }

    /// Looks a parameter up by name (`dst_param_lookup`): DeepSpeed's names, optionally after a
    /// prefix ending in '.', e.g. `"bert.encoder.layer.3.attn_qkvw"`.
    pub fn lookup(name: &str) -> crate::Result<Param> {
        let cname = crate::util::cstring(name, "name")?;
        let mut raw = sys::dst_param(0);
        // SAFETY: both pointers are valid for the call.
        crate::error::check(unsafe { sys::dst_param_lookup(cname.as_ptr(), &mut raw) })?;
        Param::from_raw(raw).ok_or_else(|| {
            crate::Error::invalid(format!(
                "dst_param_lookup: unexpected parameter id {}",
                raw.0
            ))
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for u16 {}
}

/// A Rust element type that can carry tensor data: `f32` (FP32), `f64` (FP64) and `u16` (the bits
/// of FP16 or BF16 values; which one is taken from the layer's dtype).
pub trait Element: Copy + Default + sealed::Sealed + Send + Sync + 'static {
    /// The dtype of data of this type for a layer of dtype `layer`, or `None` when there is none
    /// (`u16` for a layer that is neither FP16 nor BF16).
    fn dtype_for(layer: DType) -> Option<DType>;
}

impl Element for f32 {
    fn dtype_for(_: DType) -> Option<DType> {
        Some(DType::F32)
    }
}

impl Element for f64 {
    fn dtype_for(_: DType) -> Option<DType> {
        Some(DType::F64)
    }
}

impl Element for u16 {
    fn dtype_for(layer: DType) -> Option<DType> {
        if layer.is_half() {
            Some(layer)
        } else {
            None
        }
    }
}
