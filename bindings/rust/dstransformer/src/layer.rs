//! Layers, masks and saved activations.

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use dstransformer_sys as sys;

use crate::context::{CtxInner, Staged};
use crate::error::check;
use crate::util::cstring;
use crate::{
    Backend, Context, DType, Element, Error, GradMode, LayerConfig, Param, Result, Status,
};

/// The C layer; destroyed when the [`Layer`] and all its [`Saved`] objects are gone.
pub(crate) struct LayerInner {
    raw: NonNull<sys::dst_layer>,
    ctx: Arc<CtxInner>,
}

// SAFETY: every use of the raw handle happens under the context's lock (see CtxInner).
unsafe impl Send for LayerInner {}
// SAFETY: as above.
unsafe impl Sync for LayerInner {}

impl LayerInner {
    pub(crate) fn raw(&self) -> *mut sys::dst_layer {
        self.raw.as_ptr()
    }

    pub(crate) fn ctx(&self) -> &Arc<CtxInner> {
        &self.ctx
    }
}

impl Drop for LayerInner {
    fn drop(&mut self) {
        let _guard = self.ctx.lock();
        // SAFETY: the handle came from dst_layer_create; every dst_saved of it is gone (each holds
        // an Arc to this object), and this is the only destroy.
        unsafe { sys::dst_layer_destroy(self.raw.as_ptr()) }
    }
}

/// An attention mask for [`Layer::forward`]. Slices are in host memory; shapes follow the call's
/// batch B and sequence length S.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// Every key is visible.
    None,
    /// Added to the attention scores: `[B, S]` in FP32 (0 to keep a key, a large negative value
    /// such as -10000 to mask it). DeepSpeed's `[B, 1, 1, S]` mask is the same memory.
    Additive(&'a [f32]),
    /// As [`Mask::Additive`], in FP64 (for FP64 layers).
    AdditiveF64(&'a [f64]),
    /// As [`Mask::Additive`], in the layer's 16-bit dtype (for FP16 and BF16 layers).
    AdditiveHalf(&'a [u16]),
    /// Key lengths `[B]`: keys j ≥ len\[b\] are masked; values in 1..=S. The fast form.
    KeyLengths(&'a [i32]),
}

/// Shape and arena position of one parameter (and of its gradient) (`dst_param_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Which parameter.
    pub param: Param,
    /// DeepSpeed's name, e.g. `"attn_qkvw"`.
    pub name: &'static str,
    /// Row-major shape (`[out, in]` for weights).
    pub shape: Vec<usize>,
    /// Number of elements.
    pub numel: usize,
    /// Byte offset from the start of the arena (a multiple of 256).
    pub offset_bytes: usize,
    /// numel × the layer dtype's size.
    pub size_bytes: usize,
}

/// One Transformer encoder layer: its parameters, gradients and default saved activations.
///
/// Create it with [`Layer::new`]; it is destroyed on drop (after the [`Saved`] objects made for it).
///
/// # Threads and lifetime
/// `Send` but not `Sync`, for the reasons given on [`Context`]: a layer may move to another thread,
/// and its calls are serialised with those of its context and sibling layers by the context's lock.
/// A layer does not borrow its context (the C library keeps the context alive for its layers), so
/// the [`Context`] value may be dropped first.
pub struct Layer {
    inner: Arc<LayerInner>,
    hidden: usize,
    dtype: DType,
    _not_sync: PhantomData<Cell<()>>,
}

pub(crate) fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} has {got} elements, expected {want}"
        )))
    }
}

pub(crate) fn tensor(data: *mut c_void, dtype: DType, shape: &[i64]) -> sys::dst_tensor {
    let mut dims = [0i64; 4];
    dims[..shape.len()].copy_from_slice(shape);
    sys::dst_tensor {
        data,
        dtype: dtype.to_raw(),
        ndim: shape.len() as i32,
        shape: dims,
    }
}

/// The bytes of a slice, as a raw pointer and a length.
pub(crate) fn bytes_of<T>(data: &[T]) -> (*const c_void, usize) {
    (data.as_ptr().cast(), std::mem::size_of_val(data))
}

impl Layer {
    /// Creates a layer in `ctx` and initialises its parameters (`dst_layer_create`).
    pub fn new(ctx: &Context, config: &LayerConfig) -> Result<Layer> {
        let ctx = Arc::clone(ctx.inner());
        let mut raw: *mut sys::dst_layer = ptr::null_mut();
        {
            let _guard = ctx.lock();
            // SAFETY: valid handle, config and out pointer, under the context's lock.
            check(unsafe { sys::dst_layer_create(ctx.raw(), config.as_raw(), &mut raw) })?;
        }
        let raw = NonNull::new(raw).ok_or_else(|| Error {
            status: Status::Internal,
            message: "dst_layer_create returned DST_OK and no layer".to_owned(),
        })?;
        let inner = Arc::new(LayerInner { raw, ctx });
        let mut layer = Layer {
            inner,
            hidden: 0,
            dtype: DType::F32,
            _not_sync: PhantomData,
        };
        let cfg = layer.config()?;
        layer.hidden = cfg.hidden_size().max(0) as usize;
        layer.dtype = cfg.dtype();
        Ok(layer)
    }

    pub(crate) fn inner(&self) -> &Arc<LayerInner> {
        &self.inner
    }

    /// The raw handle, e.g. for `dstransformer-sys` calls. It stays owned by this value.
    pub fn as_raw(&self) -> *mut sys::dst_layer {
        self.inner.raw()
    }

    /// The layer's configuration, with `intermediate_size` resolved and the current training mode
    /// (`dst_layer_get_config`).
    pub fn config(&self) -> Result<LayerConfig> {
        let mut raw = MaybeUninit::<sys::dst_layer_config>::zeroed();
        // SAFETY: valid pointer to one struct; zeroed memory is a valid value.
        let mut raw = unsafe {
            sys::dst_layer_config_default(raw.as_mut_ptr());
            raw.assume_init()
        };
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle and out struct whose struct_size was set by the default call.
        check(unsafe { sys::dst_layer_get_config(self.inner.raw(), &mut raw) })?;
        Ok(LayerConfig::from_raw(raw))
    }

    /// H, the model width.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// Storage dtype of parameters and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The backend of the layer's context.
    pub fn backend(&self) -> Backend {
        self.inner.ctx.backend()
    }

    /// The layer's id within its context, in creation order from 0 (`dst_layer_get_id`).
    pub fn id(&self) -> Result<i32> {
        let mut id = 0;
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_layer_get_id(self.inner.raw(), &mut id) })?;
        Ok(id)
    }

    /// Switches between training (dropout on, activations saved) and inference (`dst_layer_set_training`).
    pub fn set_training(&mut self, training: bool) -> Result<()> {
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_layer_set_training(self.inner.raw(), training as i32) })
    }

    /// Training mode, as `set_training(true)`.
    pub fn train(&mut self) -> Result<()> {
        self.set_training(true)
    }

    /// Inference mode, as `set_training(false)`.
    pub fn eval(&mut self) -> Result<()> {
        self.set_training(false)
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> Result<bool> {
        Ok(self.config()?.training())
    }

    /// An empty saved-activations object for this layer (`dst_saved_create`), to keep several
    /// forwards in flight (one per micro-batch).
    pub fn new_saved(&self) -> Result<Saved> {
        let mut raw: *mut sys::dst_saved = ptr::null_mut();
        {
            let _guard = self.inner.ctx.lock();
            // SAFETY: valid handle and out pointer.
            check(unsafe { sys::dst_saved_create(self.inner.raw(), &mut raw) })?;
        }
        let raw = NonNull::new(raw).ok_or_else(|| Error {
            status: Status::Internal,
            message: "dst_saved_create returned DST_OK and no object".to_owned(),
        })?;
        Ok(Saved {
            raw,
            layer: Arc::clone(&self.inner),
        })
    }

    fn data_dtype<T: Element>(&self, what: &str) -> Result<DType> {
        T::dtype_for(self.dtype).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: u16 data needs an fp16 or bf16 layer, this layer is {}",
                self.dtype.name()
            ))
        })
    }

    fn tokens(&self, batch: usize, seq: usize, what: &str) -> Result<(i64, i64, usize)> {
        let n = batch
            .checked_mul(seq)
            .and_then(|t| t.checked_mul(self.hidden))
            .filter(|&n| n <= isize::MAX as usize);
        match (n, i64::try_from(batch), i64::try_from(seq)) {
            (Some(n), Ok(b), Ok(s)) => Ok((b, s, n)),
            _ => Err(Error::invalid(format!(
                "{what}: batch {batch} × seq {seq} is too large"
            ))),
        }
    }

    fn saved_ptr(&self, saved: Option<&mut Saved>, what: &str) -> Result<*mut sys::dst_saved> {
        match saved {
            None => Ok(ptr::null_mut()),
            Some(s) if Arc::ptr_eq(&s.layer, &self.inner) => Ok(s.raw.as_ptr()),
            Some(_) => Err(Error::invalid(format!(
                "{what}: the saved object belongs to another layer"
            ))),
        }
    }

    /// Runs the layer forward on a batch of B = `batch` sequences of S = `seq` tokens
    /// (`dst_layer_forward`), keeping the activations in the layer's default saved object.
    ///
    /// `input` and `output` are `[B, S, H]` in host memory, of the layer's dtype (`f32` for FP32,
    /// `f64` for FP64, `u16` for FP16/BF16). On a non-CPU context the data is copied to and from
    /// device memory around the call.
    pub fn forward<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        batch: usize,
        seq: usize,
        mask: &Mask<'_>,
    ) -> Result<()> {
        self.forward_impl(None, input, output, batch, seq, mask)
    }

    /// As [`Layer::forward`], keeping the activations in `saved` (which must belong to this layer).
    pub fn forward_saved<T: Element>(
        &mut self,
        saved: &mut Saved,
        input: &[T],
        output: &mut [T],
        batch: usize,
        seq: usize,
        mask: &Mask<'_>,
    ) -> Result<()> {
        self.forward_impl(Some(saved), input, output, batch, seq, mask)
    }

    fn forward_impl<T: Element>(
        &mut self,
        saved: Option<&mut Saved>,
        input: &[T],
        output: &mut [T],
        batch: usize,
        seq: usize,
        mask: &Mask<'_>,
    ) -> Result<()> {
        let dtype = self.data_dtype::<T>("forward")?;
        let (b, s, n) = self.tokens(batch, seq, "forward")?;
        check_len("forward: input", input.len(), n)?;
        check_len("forward: output", output.len(), n)?;
        let saved = self.saved_ptr(saved, "forward")?;
        // The masks' shapes live here: temporaries in the match arms would not outlive it on older
        // compilers (Debian 12's rustc 1.63 refuses them).
        let (shape_bs, shape_b) = ([b, s], [b]);
        let (mask_kind, mask_data, mask_dtype, mask_shape): (_, _, _, &[i64]) = match *mask {
            Mask::None => (sys::dst_mask_kind::DST_MASK_NONE, None, DType::F32, &[]),
            Mask::Additive(m) => {
                check_len("forward: additive mask", m.len(), batch * seq)?;
                (
                    sys::dst_mask_kind::DST_MASK_ADDITIVE,
                    Some(bytes_of(m)),
                    DType::F32,
                    &shape_bs,
                )
            }
            Mask::AdditiveF64(m) => {
                check_len("forward: additive mask", m.len(), batch * seq)?;
                (
                    sys::dst_mask_kind::DST_MASK_ADDITIVE,
                    Some(bytes_of(m)),
                    DType::F64,
                    &shape_bs,
                )
            }
            Mask::AdditiveHalf(m) => {
                check_len("forward: additive mask", m.len(), batch * seq)?;
                let dt = self.data_dtype::<u16>("forward: additive mask")?;
                (
                    sys::dst_mask_kind::DST_MASK_ADDITIVE,
                    Some(bytes_of(m)),
                    dt,
                    &shape_bs,
                )
            }
            Mask::KeyLengths(m) => {
                check_len("forward: key lengths", m.len(), batch)?;
                (
                    sys::dst_mask_kind::DST_MASK_KEY_LENGTHS,
                    Some(bytes_of(m)),
                    DType::I32,
                    &shape_b,
                )
            }
        };
        let ctx = &self.inner.ctx;
        let _guard = ctx.lock();
        let (in_ptr, in_bytes) = bytes_of(input);
        // SAFETY (all three): the lock is held until the end of the function, after the staged
        // buffers are dropped; the slices outlive them and have the sizes given.
        let x = unsafe { Staged::new(ctx, in_ptr, in_bytes, true)? };
        let y = unsafe { Staged::new(ctx, output.as_mut_ptr().cast(), in_bytes, false)? };
        let m = match mask_data {
            Some((p, bytes)) => Some(unsafe { Staged::new(ctx, p, bytes, true)? }),
            None => None,
        };
        let shape = [b, s, self.hidden as i64];
        let tin = tensor(x.ptr(), dtype, &shape);
        let mut tout = tensor(y.ptr(), dtype, &shape);
        let raw_mask = sys::dst_mask {
            kind: mask_kind,
            tensor: tensor(
                m.as_ref().map_or(ptr::null_mut(), |m| m.ptr()),
                mask_dtype,
                mask_shape,
            ),
        };
        let mask_ptr = if m.is_some() {
            &raw_mask as *const sys::dst_mask
        } else {
            ptr::null()
        };
        // SAFETY: valid handles; tensors describe live memory of the sizes checked above.
        check(unsafe {
            sys::dst_layer_forward(self.inner.raw(), saved, &tin, mask_ptr, &mut tout)
        })?;
        y.copy_out()
    }

    /// Runs the layer backward for the forward recorded in the default saved object
    /// (`dst_layer_backward`): writes dL/dX into `grad_input` and the twelve parameter gradients into
    /// the gradient arena (overwriting or adding, per `mode`).
    ///
    /// `grad_output` and `grad_input` are `[B, S, H]` with the B = `batch` and S = `seq` of that
    /// forward, of the layer's dtype.
    pub fn backward<T: Element>(
        &mut self,
        grad_output: &[T],
        grad_input: &mut [T],
        batch: usize,
        seq: usize,
        mode: GradMode,
    ) -> Result<()> {
        self.backward_impl(None, grad_output, grad_input, batch, seq, mode)
    }

    /// As [`Layer::backward`], for the forward recorded in `saved`.
    pub fn backward_saved<T: Element>(
        &mut self,
        saved: &mut Saved,
        grad_output: &[T],
        grad_input: &mut [T],
        batch: usize,
        seq: usize,
        mode: GradMode,
    ) -> Result<()> {
        self.backward_impl(Some(saved), grad_output, grad_input, batch, seq, mode)
    }

    fn backward_impl<T: Element>(
        &mut self,
        saved: Option<&mut Saved>,
        grad_output: &[T],
        grad_input: &mut [T],
        batch: usize,
        seq: usize,
        mode: GradMode,
    ) -> Result<()> {
        let dtype = self.data_dtype::<T>("backward")?;
        let (b, s, n) = self.tokens(batch, seq, "backward")?;
        check_len("backward: grad_output", grad_output.len(), n)?;
        check_len("backward: grad_input", grad_input.len(), n)?;
        let saved = self.saved_ptr(saved, "backward")?;
        let shape = [b, s, self.hidden as i64];
        self.run_backward(saved, grad_output, grad_input, dtype, &shape, false, mode)
    }

    /// N, the rows of packed tokens `[N, H]` held by `len` elements.
    fn packed_rows(&self, what: &str, len: usize) -> Result<i64> {
        if self.hidden == 0 || len < self.hidden || len % self.hidden != 0 {
            return Err(Error::invalid(format!(
                "{what} has {len} elements, expected [N, {}] (N ≥ 1 packed tokens)",
                self.hidden
            )));
        }
        // A slice holds at most isize::MAX elements, so N fits an i64.
        Ok((len / self.hidden) as i64)
    }

    /// Runs the layer forward on packed sequences (`dst_layer_forward_packed`): B sequences laid end
    /// to end, no padding, sequence b in rows `cu_seqlens[b]` .. `cu_seqlens[b+1] - 1` of `input`.
    ///
    /// `input` and `output` are `[N, H]` in host memory, of the layer's dtype; `cu_seqlens` holds the
    /// B + 1 offsets, 0 = `cu_seqlens[0]` < … < `cu_seqlens[B]` = N, and `max_seqlen` is at least every
    /// sequence's length (1..=`max_seq_len`). The layer runs on the N rows; each output row gets what
    /// [`Layer::forward`] gives it in a padded `[B, max_seqlen, H]` batch with [`Mask::KeyLengths`] (up
    /// to the rounding of GEMMs over another row count, with the same dropout masks for the same RNG
    /// state). B·`max_seqlen` must fit `max_batch_tokens` ([`Status::Capacity`] otherwise).
    /// Bad offsets give [`Status::InvalidArgument`] naming `cu_seqlens` (on the CPU backend before
    /// anything is written). The activations go to the default saved object; the backward is
    /// [`Layer::backward_packed`].
    pub fn forward_packed<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        cu_seqlens: &[i32],
        max_seqlen: usize,
    ) -> Result<()> {
        self.forward_packed_impl(None, input, output, cu_seqlens, max_seqlen)
    }

    /// As [`Layer::forward_packed`], keeping the activations in `saved` (which must belong to this layer).
    pub fn forward_packed_saved<T: Element>(
        &mut self,
        saved: &mut Saved,
        input: &[T],
        output: &mut [T],
        cu_seqlens: &[i32],
        max_seqlen: usize,
    ) -> Result<()> {
        self.forward_packed_impl(Some(saved), input, output, cu_seqlens, max_seqlen)
    }

    fn forward_packed_impl<T: Element>(
        &mut self,
        saved: Option<&mut Saved>,
        input: &[T],
        output: &mut [T],
        cu_seqlens: &[i32],
        max_seqlen: usize,
    ) -> Result<()> {
        let dtype = self.data_dtype::<T>("forward_packed")?;
        let n = self.packed_rows("forward_packed: input", input.len())?;
        check_len("forward_packed: output", output.len(), input.len())?;
        if cu_seqlens.len() < 2 {
            return Err(Error::invalid(format!(
                "forward_packed: cu_seqlens has {} elements, expected B + 1 ≥ 2 offsets",
                cu_seqlens.len()
            )));
        }
        let max_seqlen = i64::try_from(max_seqlen).map_err(|_| {
            Error::invalid(format!(
                "forward_packed: max_seqlen {max_seqlen} is too large"
            ))
        })?;
        let saved = self.saved_ptr(saved, "forward_packed")?;
        let ctx = &self.inner.ctx;
        let _guard = ctx.lock();
        let (in_ptr, in_bytes) = bytes_of(input);
        let (cu_ptr, cu_bytes) = bytes_of(cu_seqlens);
        // SAFETY (all three): as in forward_impl.
        let x = unsafe { Staged::new(ctx, in_ptr, in_bytes, true)? };
        let y = unsafe { Staged::new(ctx, output.as_mut_ptr().cast(), in_bytes, false)? };
        let cu = unsafe { Staged::new(ctx, cu_ptr, cu_bytes, true)? };
        let shape = [n, self.hidden as i64];
        let tin = tensor(x.ptr(), dtype, &shape);
        let mut tout = tensor(y.ptr(), dtype, &shape);
        let tcu = tensor(cu.ptr(), DType::I32, &[cu_seqlens.len() as i64]);
        // SAFETY: valid handles; tensors describe live memory of the sizes checked above.
        check(unsafe {
            sys::dst_layer_forward_packed(
                self.inner.raw(),
                saved,
                &tin,
                &tcu,
                max_seqlen,
                &mut tout,
            )
        })?;
        y.copy_out()
    }

    /// Runs the layer backward for the packed forward recorded in the default saved object
    /// (`dst_layer_backward_packed`): writes dL/dX into `grad_input` and the twelve parameter
    /// gradients into the gradient arena (overwriting or adding, per `mode`).
    ///
    /// `grad_output` and `grad_input` are `[N, H]` with the N of that forward. A saved object that
    /// holds no packed training forward (none, or a padded one) gives [`Status::State`].
    pub fn backward_packed<T: Element>(
        &mut self,
        grad_output: &[T],
        grad_input: &mut [T],
        mode: GradMode,
    ) -> Result<()> {
        self.backward_packed_impl(None, grad_output, grad_input, mode)
    }

    /// As [`Layer::backward_packed`], for the packed forward recorded in `saved`.
    pub fn backward_packed_saved<T: Element>(
        &mut self,
        saved: &mut Saved,
        grad_output: &[T],
        grad_input: &mut [T],
        mode: GradMode,
    ) -> Result<()> {
        self.backward_packed_impl(Some(saved), grad_output, grad_input, mode)
    }

    fn backward_packed_impl<T: Element>(
        &mut self,
        saved: Option<&mut Saved>,
        grad_output: &[T],
        grad_input: &mut [T],
        mode: GradMode,
    ) -> Result<()> {
        let dtype = self.data_dtype::<T>("backward_packed")?;
        let n = self.packed_rows("backward_packed: grad_output", grad_output.len())?;
        check_len(
            "backward_packed: grad_input",
            grad_input.len(),
            grad_output.len(),
        )?;
        let saved = self.saved_ptr(saved, "backward_packed")?;
        let shape = [n, self.hidden as i64];
        self.run_backward(saved, grad_output, grad_input, dtype, &shape, true, mode)
    }

    /// `dst_layer_backward` (or `_packed`) on slices of `shape`, whose lengths the caller checked.
    #[allow(clippy::too_many_arguments)]
    fn run_backward<T: Element>(
        &self,
        saved: *mut sys::dst_saved,
        grad_output: &[T],
        grad_input: &mut [T],
        dtype: DType,
        shape: &[i64],
        packed: bool,
        mode: GradMode,
    ) -> Result<()> {
        let ctx = &self.inner.ctx;
        let _guard = ctx.lock();
        let (dy_ptr, bytes) = bytes_of(grad_output);
        // SAFETY: as in forward_impl.
        let dy = unsafe { Staged::new(ctx, dy_ptr, bytes, true)? };
        let dx = unsafe { Staged::new(ctx, grad_input.as_mut_ptr().cast(), bytes, false)? };
        let tdy = tensor(dy.ptr(), dtype, shape);
        let mut tdx = tensor(dx.ptr(), dtype, shape);
        let raw = self.inner.raw();
        // SAFETY: valid handles; tensors describe live memory of the sizes checked by the caller.
        check(unsafe {
            if packed {
                sys::dst_layer_backward_packed(raw, saved, &tdy, &mut tdx, mode.to_raw())
            } else {
                sys::dst_layer_backward(raw, saved, &tdy, &mut tdx, mode.to_raw())
            }
        })?;
        dx.copy_out()
    }

    /// Runs forward on tensors that already live in the context's memory space (`dst_layer_forward`).
    ///
    /// # Safety
    /// Each tensor's `data` must point to memory of the context's memory space holding the elements
    /// its dtype and shape describe (the output writable), valid for the call; `saved`, when given,
    /// must belong to this layer.
    pub unsafe fn forward_raw(
        &mut self,
        saved: Option<&mut Saved>,
        input: &sys::dst_tensor,
        mask: Option<&sys::dst_mask>,
        output: &mut sys::dst_tensor,
    ) -> Result<()> {
        let saved = self.saved_ptr(saved, "forward_raw")?;
        let mask = mask.map_or(ptr::null(), |m| m as *const sys::dst_mask);
        let _guard = self.inner.ctx.lock();
        check(sys::dst_layer_forward(
            self.inner.raw(),
            saved,
            input,
            mask,
            output,
        ))
    }

    /// Runs backward on tensors that already live in the context's memory space (`dst_layer_backward`).
    ///
    /// # Safety
    /// As for [`Layer::forward_raw`].
    pub unsafe fn backward_raw(
        &mut self,
        saved: Option<&mut Saved>,
        grad_output: &sys::dst_tensor,
        grad_input: &mut sys::dst_tensor,
        mode: GradMode,
    ) -> Result<()> {
        let saved = self.saved_ptr(saved, "backward_raw")?;
        let _guard = self.inner.ctx.lock();
        check(sys::dst_layer_backward(
            self.inner.raw(),
            saved,
            grad_output,
            grad_input,
            mode.to_raw(),
        ))
    }

    /// Shape and arena position of a parameter (`dst_layer_param_info`).
    pub fn param_info(&self, param: Param) -> Result<ParamInfo> {
        let mut info = MaybeUninit::<sys::dst_param_info>::zeroed();
        {
            let _guard = self.inner.ctx.lock();
            // SAFETY: valid handle and out struct.
            check(unsafe {
                sys::dst_layer_param_info(self.inner.raw(), param.to_raw(), info.as_mut_ptr())
            })?;
        }
        // SAFETY: zero-initialised plain data filled by the library.
        let info = unsafe { info.assume_init() };
        let name = if info.name.is_null() {
            param.name()
        } else {
            // SAFETY: the library documents `name` as a static NUL-terminated string.
            unsafe { CStr::from_ptr(info.name) }
                .to_str()
                .unwrap_or(param.name())
        };
        let ndim = info.ndim.clamp(0, 2) as usize;
        Ok(ParamInfo {
            param,
            name,
            shape: info.shape[..ndim]
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect(),
            numel: info.numel.max(0) as usize,
            offset_bytes: info.offset_bytes,
            size_bytes: info.size_bytes,
        })
    }

    /// [`Layer::param_info`] of a parameter given by name (see [`Param::lookup`]).
    pub fn param_info_by_name(&self, name: &str) -> Result<ParamInfo> {
        self.param_info(Param::lookup(name)?)
    }

    /// [`ParamInfo`] of all twelve parameters, in DeepSpeed's order.
    pub fn params(&self) -> Result<Vec<ParamInfo>> {
        Param::ALL.iter().map(|&p| self.param_info(p)).collect()
    }

    /// Copies `data` into the parameter `name`, converting to the layer's dtype (`dst_layer_set_param`).
    /// `data` must have exactly the parameter's element count.
    pub fn set_param<T: Element>(&mut self, name: &str, data: &[T]) -> Result<()> {
        let dtype = self.data_dtype::<T>("set_param")?;
        let cname = cstring(name, "set_param: name")?;
        let _guard = self.inner.ctx.lock();
        // SAFETY: `data` holds `data.len()` elements of `dtype`; the library checks that this is the
        // parameter's count before reading.
        check(unsafe {
            sys::dst_layer_set_param(
                self.inner.raw(),
                cname.as_ptr(),
                data.as_ptr().cast(),
                dtype.to_raw(),
                data.len(),
            )
        })
    }

    /// Copies the parameter `name` into `out`, converting to `T` (`dst_layer_get_param`).
    pub fn get_param_into<T: Element>(&self, name: &str, out: &mut [T]) -> Result<()> {
        self.copy_out(name, out, false)
    }

    /// The parameter `name`, converted to `T` (`dst_layer_get_param`).
    pub fn get_param<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.param_info_by_name(name)?.numel];
        self.copy_out(name, &mut out, false)?;
        Ok(out)
    }

    /// Copies the gradient of the parameter `name` into `out`, converting to `T` (`dst_layer_get_grad`).
    pub fn get_grad_into<T: Element>(&self, name: &str, out: &mut [T]) -> Result<()> {
        self.copy_out(name, out, true)
    }

    /// The gradient of the parameter `name`, converted to `T` (`dst_layer_get_grad`).
    pub fn get_grad<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.param_info_by_name(name)?.numel];
        self.copy_out(name, &mut out, true)?;
        Ok(out)
    }

    fn copy_out<T: Element>(&self, name: &str, out: &mut [T], grad: bool) -> Result<()> {
        let what = if grad { "get_grad" } else { "get_param" };
        let dtype = self.data_dtype::<T>(what)?;
        let cname = cstring(name, what)?;
        let f = if grad {
            sys::dst_layer_get_grad
        } else {
            sys::dst_layer_get_param
        };
        let _guard = self.inner.ctx.lock();
        // SAFETY: `out` has room for `out.len()` elements of `dtype`; the library checks that this is
        // the parameter's count before writing.
        check(unsafe {
            f(
                self.inner.raw(),
                cname.as_ptr(),
                out.as_mut_ptr().cast(),
                dtype.to_raw(),
                out.len(),
            )
        })
    }

    /// Sets every gradient to zero (`dst_layer_zero_grads`).
    pub fn zero_grads(&mut self) -> Result<()> {
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_layer_zero_grads(self.inner.raw()) })
    }

    /// Size of the parameter arena (and of the gradient arena) in bytes (`dst_layer_arena_bytes`).
    pub fn arena_bytes(&self) -> Result<usize> {
        let mut bytes = 0usize;
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_layer_arena_bytes(self.inner.raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Address of the parameter arena in the context's memory space (`dst_layer_param_arena`); valid
    /// until the layer is dropped or another arena is bound.
    pub fn param_arena_ptr(&mut self) -> Result<*mut c_void> {
        self.arena_ptr(false)
    }

    /// Address of the gradient arena in the context's memory space (`dst_layer_grad_arena`).
    pub fn grad_arena_ptr(&mut self) -> Result<*mut c_void> {
        self.arena_ptr(true)
    }

    fn arena_ptr(&mut self, grad: bool) -> Result<*mut c_void> {
        let mut data: *mut c_void = ptr::null_mut();
        let f = if grad {
            sys::dst_layer_grad_arena
        } else {
            sys::dst_layer_param_arena
        };
        let _guard = self.inner.ctx.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { f(self.inner.raw(), &mut data) })?;
        Ok(data)
    }

    /// The parameter arena of a CPU layer as bytes, for an optimizer step between calls; see
    /// [`Layer::param_info`] for where each parameter lies. Other backends: [`Status::Unsupported`]
    /// (use [`Layer::param_arena_ptr`]).
    pub fn param_arena(&mut self) -> Result<&mut [u8]> {
        self.arena_slice(false)
    }

    /// The gradient arena of a CPU layer as bytes (same layout as the parameter arena).
    pub fn grad_arena(&mut self) -> Result<&mut [u8]> {
        self.arena_slice(true)
    }

    fn arena_slice(&mut self, grad: bool) -> Result<&mut [u8]> {
        if self.backend() != Backend::Cpu {
            return Err(Error {
                status: Status::Unsupported,
                message: "the arena of a non-CPU layer is device memory; use param_arena_ptr/grad_arena_ptr"
                    .to_owned(),
            });
        }
        let bytes = self.arena_bytes()?;
        let data = self.arena_ptr(grad)?;
        if data.is_null() || bytes == 0 {
            return Ok(&mut []);
        }
        // SAFETY: a CPU arena is host memory of `bytes` bytes, owned by the layer (or bound by the
        // caller) and valid until the layer is dropped or rebound, both of which need `&mut self`,
        // which the returned borrow holds; no library call touches it meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), bytes) })
    }

    /// Makes the layer use caller memory for its parameters (`dst_layer_bind_param_arena`); with
    /// `copy_current` the current values are copied there first.
    ///
    /// # Safety
    /// `data` must point to `bytes` ≥ [`Layer::arena_bytes`] bytes of the context's memory space,
    /// 256-byte aligned, valid and used by nothing else until the layer is dropped or another arena
    /// is bound; without `copy_current` it must hold valid parameters.
    pub unsafe fn bind_param_arena(
        &mut self,
        data: *mut c_void,
        bytes: usize,
        copy_current: bool,
    ) -> Result<()> {
        let _guard = self.inner.ctx.lock();
        check(sys::dst_layer_bind_param_arena(
            self.inner.raw(),
            data,
            bytes,
            copy_current as i32,
        ))
    }

    /// Makes the layer use caller memory for its gradients (`dst_layer_bind_grad_arena`).
    ///
    /// # Safety
    /// As for [`Layer::bind_param_arena`].
    pub unsafe fn bind_grad_arena(&mut self, data: *mut c_void, bytes: usize) -> Result<()> {
        let _guard = self.inner.ctx.lock();
        check(sys::dst_layer_bind_grad_arena(
            self.inner.raw(),
            data,
            bytes,
        ))
    }
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer")
            .field("hidden_size", &self.hidden)
            .field("dtype", &self.dtype)
            .field("backend", &self.backend())
            .finish()
    }
}

/// The activations one training forward keeps for its backward (`dst_saved`), for keeping several
/// forwards in flight. Made by [`Layer::new_saved`]; it keeps its layer alive and is destroyed on drop.
/// `Send` but not `Sync`, like [`Layer`].
pub struct Saved {
    raw: NonNull<sys::dst_saved>,
    layer: Arc<LayerInner>,
}

// SAFETY: the raw handle is only used under its context's lock (see CtxInner).
unsafe impl Send for Saved {}

impl Saved {
    /// Frees the activations held; a forward must fill it again before a backward (`dst_saved_release`).
    pub fn release(&mut self) -> Result<()> {
        let _guard = self.layer.ctx().lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_saved_release(self.raw.as_ptr()) })
    }

    /// Bytes of activations currently held (0 when empty) (`dst_saved_bytes`).
    pub fn bytes(&self) -> Result<usize> {
        let mut bytes = 0usize;
        let _guard = self.layer.ctx().lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_saved_bytes(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }
}

impl Drop for Saved {
    fn drop(&mut self) {
        let _guard = self.layer.ctx().lock();
        // SAFETY: created by dst_saved_create; its layer is still alive (held by `self.layer`).
        unsafe { sys::dst_saved_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved").field("raw", &self.raw).finish()
    }
}
