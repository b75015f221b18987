//! The training engine (`dst_engine_*`) and its optimizer (`dst_optimizer_*`): DeepSpeed's JSON
//! configuration, Adam/AdamW/LAMB in parameter groups, dynamic loss scaling, accumulation, clipping,
//! schedules and checkpoints (docs/engine.md).

use std::ffi::c_void;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::context::CtxInner;
use crate::layer::LayerInner;
use crate::error::check;
use crate::layer::tensor;
use crate::util::{cpath, cstring, text_of};
use crate::{sys, Backend, Context, DType, Error, Layer, Result, Status};

/// Hyperparameters of one parameter group (`dst_param_group`); `Default` gives FusedAdam's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamGroup {
    /// Learning rate (a schedule of the engine overrides it).
    pub lr: f32,
    /// β1 and β2.
    pub betas: (f32, f32),
    /// ε.
    pub eps: f32,
    /// Weight decay.
    pub weight_decay: f32,
}

impl Default for ParamGroup {
    fn default() -> Self {
        let mut raw = unsafe { std::mem::zeroed::<sys::dst_param_group>() };
        // SAFETY: a valid out pointer; the call only fills it.
        unsafe { sys::dst_param_group_default(&mut raw) };
        ParamGroup::from_raw(&raw)
    }
}

impl ParamGroup {
    fn from_raw(raw: &sys::dst_param_group) -> Self {
        ParamGroup { lr: raw.lr, betas: (raw.beta1, raw.beta2), eps: raw.eps, weight_decay: raw.weight_decay }
    }

    fn to_raw(self) -> sys::dst_param_group {
        let mut raw = unsafe { std::mem::zeroed::<sys::dst_param_group>() };
        // SAFETY: as in Default.
        unsafe { sys::dst_param_group_default(&mut raw) };
        raw.lr = self.lr;
        raw.beta1 = self.betas.0;
        raw.beta2 = self.betas.1;
        raw.eps = self.eps;
        raw.weight_decay = self.weight_decay;
        raw
    }
}

/// The resolved configuration and the counters of an engine, with its loss scaler's state
/// (`dst_engine_state`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineState {
    /// Resolved train_batch_size.
    pub train_batch_size: i32,
    /// Resolved train_micro_batch_size_per_gpu.
    pub micro_batch_size: i32,
    /// Resolved gradient_accumulation_steps.
    pub gradient_accumulation_steps: i32,
    /// fp16.enabled.
    pub fp16: bool,
    /// bf16.enabled.
    pub bf16: bool,
    /// fp16 with a dynamic loss scale (loss_scale 0).
    pub dynamic_loss_scale: bool,
    /// The current loss scale (1 without fp16).
    pub loss_scale: f32,
    /// Global-norm clipping threshold (0: off).
    pub gradient_clipping: f32,
    /// [`Engine::step`] calls.
    pub micro_steps: i64,
    /// Boundary steps, skipped ones included.
    pub global_steps: i64,
    /// Samples: global_steps × train_batch_size.
    pub global_samples: i64,
    /// Boundary steps skipped for an overflow.
    pub skipped_steps: i64,
    /// The global norm of the last boundary's true gradients (0 when none was computed).
    pub grad_norm: f32,
    /// The last boundary updated the weights.
    pub last_step_applied: bool,
    /// The last boundary's gradients held inf or NaN.
    pub last_overflow: bool,
}

/// Checks a DeepSpeed-style JSON configuration without creating anything
/// (`dst_engine_config_validate`); the error's message names the bad key's JSON path.
pub fn validate_engine_config(config_json: &str) -> Result<()> {
    let text = cstring(config_json, "config_json")?;
    // SAFETY: a NUL-terminated string; no reason buffer (the message is dst_last_error's).
    check(unsafe { sys::dst_engine_config_validate(text.as_ptr(), 1, ptr::null_mut(), 0) })
}

/// A training engine created from DeepSpeed's JSON configuration, owning its optimizer.
///
/// Register the tensors to train ([`Engine::add_layer`]: the engine keeps the layer's handle alive as
/// long as it needs its arenas), then per micro-batch: forward, the
/// loss gradient scaled by [`Engine::scale_loss_gradient`], backward with
/// [`GradMode::Accumulate`](crate::GradMode::Accumulate), [`Engine::step`]. Dropping the engine
/// destroys it (`dst_engine_destroy`).
pub struct Engine {
    raw: NonNull<sys::dst_engine>,
    opt: *mut sys::dst_optimizer,
    ctx: Arc<CtxInner>,
    layers: Vec<Arc<LayerInner>>, // dropped after the engine (Drop runs first)
}

// SAFETY: every call on the handles is made under the context's lock (as for Layer).
unsafe impl Send for Engine {}

impl Engine {
    /// Creates an engine in `ctx` (`dst_engine_create`, world size 1).
    pub fn new(ctx: &Context, config_json: &str) -> Result<Engine> {
        let text = cstring(config_json, "config_json")?;
        let ctx = Arc::clone(ctx.inner());
        let mut raw: *mut sys::dst_engine = ptr::null_mut();
        let mut opt: *mut sys::dst_optimizer = ptr::null_mut();
        {
            let _guard = ctx.lock();
            // SAFETY: valid context, NUL-terminated text, out pointer; under the context's lock.
            check(unsafe { sys::dst_engine_create(ctx.raw(), text.as_ptr(), 1, &mut raw) })?;
        }
        let raw = NonNull::new(raw).ok_or_else(|| Error {
            status: Status::Internal,
            message: "dst_engine_create returned DST_OK and no engine".to_owned(),
        })?;
        let mut engine = Engine { raw, opt: ptr::null_mut(), ctx, layers: Vec::new() };
        {
            let _guard = engine.ctx.lock();
            // SAFETY: a live engine and an out pointer.
            check(unsafe { sys::dst_engine_get_optimizer(engine.raw.as_ptr(), &mut opt) })?;
        }
        engine.opt = opt;
        Ok(engine)
    }

    /// Adds a parameter group; returns its index.
    pub fn add_group(&mut self, group: ParamGroup) -> Result<usize> {
        let raw = group.to_raw();
        let mut index = 0i32;
        let _guard = self.ctx.lock();
        // SAFETY: the engine's optimizer, a valid group and out pointer.
        check(unsafe { sys::dst_optimizer_add_group(self.opt, &raw, &mut index) })?;
        Ok(index as usize)
    }

    /// The hyperparameters of a group.
    pub fn group(&self, index: usize) -> Result<ParamGroup> {
        let mut raw = ParamGroup::default().to_raw();
        let _guard = self.ctx.lock();
        // SAFETY: the engine's optimizer and a struct whose struct_size default() set.
        check(unsafe { sys::dst_optimizer_get_group(self.opt, index as i32, &mut raw) })?;
        Ok(ParamGroup::from_raw(&raw))
    }

    /// Registers the twelve parameters of a layer: weight matrices in `decay_group`, biases and
    /// LayerNorm parameters in `no_decay_group` (`dst_optimizer_add_layer`).
    pub fn add_layer(&mut self, layer: &Layer, prefix: &str, decay_group: usize, no_decay_group: usize)
                     -> Result<()> {
        let prefix = cstring(prefix, "prefix")?;
        {
            let _guard = self.ctx.lock();
            // SAFETY: live handles; the engine keeps the layer's handle (below) while it exists.
            check(unsafe {
                sys::dst_optimizer_add_layer(self.opt, layer.as_raw(), prefix.as_ptr(), decay_group as i32,
                                             no_decay_group as i32)
            })?;
        }
        self.layers.push(Arc::clone(layer.inner()));
        Ok(())
    }

    /// Sets every registered gradient to zero (before the first micro-batch).
    pub fn zero_grads(&mut self) -> Result<()> {
        let _guard = self.ctx.lock();
        // SAFETY: a live engine.
        check(unsafe { sys::dst_engine_zero_grads(self.raw.as_ptr()) })
    }

    /// Multiplies the gradient of a micro-batch's loss by loss scale / gradient_accumulation_steps
    /// (`dst_engine_scale_loss_gradient`), for an FP32 host slice on the CPU backend.
    pub fn scale_loss_gradient(&mut self, grad: &mut [f32]) -> Result<()> {
        if self.ctx.backend() != Backend::Cpu {
            return Err(Error::invalid(
                "scale_loss_gradient: a host slice needs a CPU context; on CUDA scale device memory with \
                 dstransformer::sys::dst_engine_scale_loss_gradient".to_owned()));
        }
        if grad.is_empty() {
            return Err(Error::invalid("scale_loss_gradient: grad is empty".to_owned()));
        }
        let t = tensor(grad.as_mut_ptr() as *mut c_void, DType::F32, &[grad.len() as i64]);
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and a view of host memory the slice owns, on the CPU backend.
        check(unsafe { sys::dst_engine_scale_loss_gradient(self.raw.as_ptr(), &t) })
    }

    /// Whether the next [`Engine::step`] is an accumulation boundary.
    pub fn is_boundary(&self) -> Result<bool> {
        let mut b = 0i32;
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and an out pointer.
        check(unsafe { sys::dst_engine_is_boundary(self.raw.as_ptr(), &mut b) })?;
        Ok(b != 0)
    }

    /// Chooses whether [`Engine::step`] sets the registered gradients to zero at each accumulation
    /// boundary: `true` (the default, as DeepSpeed) or `false`, which leaves them for the next step's
    /// first backward to overwrite (`dst_engine_set_zero_grads_on_step`). Off saves a write of every
    /// gradient per step and the first micro-batch's reads of the zeros, but then that backward must
    /// write every gradient ([`GradMode::Write`](crate::GradMode::Write) for its first contribution to
    /// each): after a boundary they hold values not to be used. [`Engine::zero_grads`] still zeroes on
    /// request; checkpoints do not hold the setting.
    pub fn set_zero_grads_on_step(&mut self, enabled: bool) -> Result<()> {
        let _guard = self.ctx.lock();
        // SAFETY: a live engine; the value is 0 or 1.
        check(unsafe { sys::dst_engine_set_zero_grads_on_step(self.raw.as_ptr(), enabled as i32) })
    }

    /// Whether [`Engine::step`] sets the registered gradients to zero at each boundary
    /// (`dst_engine_get_zero_grads_on_step`).
    pub fn zero_grads_on_step(&self) -> Result<bool> {
        let mut enabled = 0i32;
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and an out pointer.
        check(unsafe { sys::dst_engine_get_zero_grads_on_step(self.raw.as_ptr(), &mut enabled) })?;
        Ok(enabled != 0)
    }

    /// Ends a micro-batch; at a boundary, runs the optimizer step (`dst_engine_step`).
    pub fn step(&mut self) -> Result<()> {
        let _guard = self.ctx.lock();
        // SAFETY: a live engine; the registered tensors are borrowed for its lifetime.
        check(unsafe { sys::dst_engine_step(self.raw.as_ptr()) })
    }

    /// The resolved configuration, the counters and the loss scaler's state.
    pub fn state(&self) -> Result<EngineState> {
        let mut s = unsafe { std::mem::zeroed::<sys::dst_engine_state>() };
        s.struct_size = std::mem::size_of::<sys::dst_engine_state>();
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and a struct with its size set.
        check(unsafe { sys::dst_engine_get_state(self.raw.as_ptr(), &mut s) })?;
        Ok(EngineState {
            train_batch_size: s.train_batch_size,
            micro_batch_size: s.train_micro_batch_size_per_gpu,
            gradient_accumulation_steps: s.gradient_accumulation_steps,
            fp16: s.fp16_enabled != 0,
            bf16: s.bf16_enabled != 0,
            dynamic_loss_scale: s.dynamic_loss_scale != 0,
            loss_scale: s.loss_scale,
            gradient_clipping: s.gradient_clipping,
            micro_steps: s.micro_steps,
            global_steps: s.global_steps,
            global_samples: s.global_samples,
            skipped_steps: s.skipped_steps,
            grad_norm: s.grad_norm,
            last_step_applied: s.last_step_applied != 0,
            last_overflow: s.last_overflow != 0,
        })
    }

    /// The learning rate the next step of a group uses (the schedule's).
    pub fn lr(&self, group: usize) -> Result<f32> {
        let mut lr = 0f32;
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and an out pointer.
        check(unsafe { sys::dst_engine_get_lr(self.raw.as_ptr(), group as i32, &mut lr) })?;
        Ok(lr)
    }

    /// Saves the training state to `save_dir/<tag>/` (tag `None`: "global_step<N>") and names it in
    /// `save_dir/latest`; `client_state_json` is any JSON value.
    pub fn save_checkpoint(&mut self, save_dir: &Path, tag: Option<&str>, client_state_json: &str) -> Result<()> {
        let dir = cpath(save_dir)?;
        let tag = tag.map(|t| cstring(t, "tag")).transpose()?;
        let client = cstring(client_state_json, "client_state_json")?;
        let _guard = self.ctx.lock();
        // SAFETY: a live engine and NUL-terminated strings (the tag may be NULL).
        check(unsafe {
            sys::dst_engine_save_checkpoint(self.raw.as_ptr(), dir.as_ptr(),
                                            tag.as_ref().map_or(ptr::null(), |t| t.as_ptr()),
                                            client.as_ptr(), 1)
        })
    }

    /// Loads a checkpoint (tag `None`: the one `load_dir/latest` names) with the default options and
    /// returns its client state as JSON text.
    pub fn load_checkpoint(&mut self, load_dir: &Path, tag: Option<&str>) -> Result<String> {
        let dir = cpath(load_dir)?;
        let tag = tag.map(|t| cstring(t, "tag")).transpose()?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let mut len = 0usize;
            {
                let _guard = self.ctx.lock();
                // SAFETY: a live engine, NUL-terminated strings, a buffer of buf.len() bytes.
                check(unsafe {
                    sys::dst_engine_load_checkpoint(self.raw.as_ptr(), dir.as_ptr(),
                                                    tag.as_ref().map_or(ptr::null(), |t| t.as_ptr()),
                                                    ptr::null(), buf.as_mut_ptr().cast(), buf.len(), &mut len)
                })?;
            }
            if len < buf.len() {
                return Ok(text_of(&buf));
            }
            buf = vec![0u8; len + 1]; // truncated: loading again gives the same state, and all the text
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _guard = self.ctx.lock();
        // SAFETY: the handle came from dst_engine_create and this is its only destroy.
        unsafe { sys::dst_engine_destroy(self.raw.as_ptr()) }
    }
}
