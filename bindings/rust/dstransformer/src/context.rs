//! Contexts: a backend, its memory, its random-number state and its layer counter.

use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard};

use dstransformer_sys as sys;

use crate::error::check;
use crate::{Backend, Error, IndexChecks, Result, Status};

/// The C context and the lock that serialises every call on it and on its layers.
///
/// It is shared (`Arc`) by the [`Context`] value, its [`Layer`](crate::Layer)s, their
/// [`Saved`](crate::Saved) objects and [`DeviceBuffer`]s, and destroys the C context when the last of
/// them goes. (The C library would keep the context alive for its layers by itself; sharing it here
/// also keeps the handle valid for the calls a layer makes on its context, such as staging buffers.)
pub(crate) struct CtxInner {
    raw: NonNull<sys::dst_context>,
    lock: Mutex<()>,
    backend: Backend,
}

// SAFETY: the C API lets a context and its layers be used from any thread, one thread at a time.
// Every call on the raw handle (and on the layers and saved objects of this context) is made while
// holding `lock`, so no two threads ever use them at the same time. The only thread-local state of the
// library, the message of the last error, is read on the calling thread right after the failing call.
unsafe impl Send for CtxInner {}
// SAFETY: as above: shared references only reach the raw handle through `lock`.
unsafe impl Sync for CtxInner {}

impl CtxInner {
    /// Takes the context's lock; a panic of another holder does not make the C state invalid.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn raw(&self) -> *mut sys::dst_context {
        self.raw.as_ptr()
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from dst_context_create and this is its only destroy.
        unsafe { sys::dst_context_destroy(self.raw.as_ptr()) }
    }
}

/// A context: a backend and its memory, the dropout random-number state and the layer counter.
///
/// # Threads
/// `Context` is `Send` but not `Sync`. The C library has no thread affinity: a context and its
/// layers may be used from any thread, but never from two at the same time. Moving a context to
/// another thread is therefore fine, and this crate makes concurrent use impossible rather than
/// undefined: a context and everything created from it (layers, saved activations, device buffers)
/// share one lock, taken by every call, so a layer moved to another thread cannot race with its
/// context or with a sibling layer (they share the context's workspace and random-number state). It is
/// not `Sync` because sharing `&Context` between threads would only make those threads wait for each
/// other on that lock; give each thread its own context to run in parallel.
///
/// # Lifetime
/// Layers do not borrow their context: the C library keeps a context alive for as long as a layer
/// of it exists, and this crate keeps the handle alive for the layer's own calls, so dropping the
/// `Context` before its layers is allowed.
pub struct Context {
    inner: Arc<CtxInner>,
    device: i32,
    _not_sync: PhantomData<Cell<()>>,
}

impl Context {
    /// Creates a context on `backend` (`dst_context_create`); `device` is the GPU ordinal and must be
    /// 0 for the CPU backend.
    pub fn new(backend: Backend, device: i32) -> Result<Context> {
        let mut raw: *mut sys::dst_context = ptr::null_mut();
        // SAFETY: `raw` is a valid out pointer.
        check(unsafe { sys::dst_context_create(backend.to_raw(), device, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error {
            status: Status::Internal,
            message: "dst_context_create returned DST_OK and no context".to_owned(),
        })?;
        let mut resolved = sys::dst_backend::DST_BACKEND_CPU;
        // SAFETY: valid handle and out pointer; on failure the handle is destroyed below.
        let st = unsafe { sys::dst_context_get_backend(raw.as_ptr(), &mut resolved) };
        if let Err(e) = check(st) {
            // SAFETY: the handle is ours and not used afterwards.
            unsafe { sys::dst_context_destroy(raw.as_ptr()) };
            return Err(e);
        }
        let backend = Backend::from_raw(resolved).unwrap_or(Backend::Cpu);
        Ok(Context {
            inner: Arc::new(CtxInner {
                raw,
                lock: Mutex::new(()),
                backend,
            }),
            device,
            _not_sync: PhantomData,
        })
    }

    /// A context on the CPU backend.
    pub fn cpu() -> Result<Context> {
        Context::new(Backend::Cpu, 0)
    }

    pub(crate) fn inner(&self) -> &Arc<CtxInner> {
        &self.inner
    }

    /// The backend the context runs on ([`Backend::Auto`] resolved).
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The device ordinal the context was created with.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Sets the dropout random-number state: a Philox key and the first counter offset the next
    /// training forward uses (`dst_context_set_rng_state`).
    pub fn set_rng_state(&mut self, seed: u64, offset: u64) -> Result<()> {
        let _guard = self.inner.lock();
        // SAFETY: valid handle, used under the context's lock.
        check(unsafe { sys::dst_context_set_rng_state(self.inner.raw(), seed, offset) })
    }

    /// The dropout random-number state as `(seed, next offset)` (`dst_context_get_rng_state`).
    pub fn rng_state(&self) -> Result<(u64, u64)> {
        let (mut seed, mut offset) = (0u64, 0u64);
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointers.
        check(unsafe { sys::dst_context_get_rng_state(self.inner.raw(), &mut seed, &mut offset) })?;
        Ok((seed, offset))
    }

    /// The graph dropout counter: the word the next training forward run from a CUDA graph takes
    /// (`dst_context_get_rng_graph_counter`; waits for the context's stream).
    pub fn rng_graph_counter(&self) -> Result<u32> {
        let mut counter = 0u64;
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_context_get_rng_graph_counter(self.inner.raw(), &mut counter) })?;
        Ok(counter as u32) // the library writes a 32-bit word
    }

    /// Sets the graph dropout counter (`dst_context_set_rng_graph_counter`).
    pub fn set_rng_graph_counter(&mut self, counter: u32) -> Result<()> {
        let _guard = self.inner.lock();
        // SAFETY: valid handle, used under the context's lock.
        check(unsafe { sys::dst_context_set_rng_graph_counter(self.inner.raw(), u64::from(counter)) })
    }

    /// Sets the number of host threads of the CPU backend; 0 restores the default (all cores)
    /// (`dst_context_set_num_threads`).
    pub fn set_num_threads(&mut self, threads: usize) -> Result<()> {
        let threads = i32::try_from(threads).map_err(|_| {
            Error::invalid(format!("set_num_threads: {threads} threads is too many"))
        })?;
        let _guard = self.inner.lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_context_set_num_threads(self.inner.raw(), threads) })
    }

    /// The host thread count in effect (`dst_context_get_num_threads`).
    pub fn num_threads(&self) -> Result<usize> {
        let mut threads = 0;
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_context_get_num_threads(self.inner.raw(), &mut threads) })?;
        Ok(threads.max(0) as usize)
    }

    /// Chooses when the model ops check their index values: eagerly (the default) or deferred to
    /// the device, a later call reporting a failure (`dst_context_set_index_checks`).
    pub fn set_index_checks(&mut self, mode: IndexChecks) -> Result<()> {
        let _guard = self.inner.lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_context_set_index_checks(self.inner.raw(), mode.to_raw()) })
    }

    /// When the model ops check their index values (`dst_context_get_index_checks`).
    pub fn index_checks(&self) -> Result<IndexChecks> {
        let mut raw = sys::dst_index_checks::DST_INDEX_CHECKS_EAGER;
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_context_get_index_checks(self.inner.raw(), &mut raw) })?;
        IndexChecks::from_raw(raw)
            .ok_or_else(|| Error::invalid(format!("index_checks: unknown mode {}", raw.0)))
    }

    /// Waits until all work the context queued has finished (`dst_context_synchronize`).
    pub fn synchronize(&self) -> Result<()> {
        let _guard = self.inner.lock();
        // SAFETY: valid handle.
        check(unsafe { sys::dst_context_synchronize(self.inner.raw()) })
    }

    /// Current size of the context's activation workspace in bytes (`dst_context_workspace_bytes`).
    pub fn workspace_bytes(&self) -> Result<usize> {
        let mut bytes = 0usize;
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_context_workspace_bytes(self.inner.raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Gives the context caller-owned workspace memory; a null `data` returns to an owned workspace
    /// (`dst_context_set_workspace`).
    ///
    /// # Safety
    /// `data` must be null or point to `bytes` bytes of the context's memory space, 256-byte
    /// aligned, that stay valid and unused by anything else while the context (or any of its layers)
    /// uses them, i.e. until another workspace is set or the context and its layers are gone.
    pub unsafe fn set_workspace(&mut self, data: *mut c_void, bytes: usize) -> Result<()> {
        let _guard = self.inner.lock();
        check(sys::dst_context_set_workspace(
            self.inner.raw(),
            data,
            bytes,
        ))
    }

    /// Sets the CUDA stream the context runs on; null restores the context's own stream
    /// (`dst_context_set_stream`). A CPU context accepts only null.
    ///
    /// # Safety
    /// `stream` must be null or a `cudaStream_t` of the context's device that stays alive while the
    /// context uses it.
    pub unsafe fn set_stream(&mut self, stream: *mut c_void) -> Result<()> {
        let _guard = self.inner.lock();
        check(sys::dst_context_set_stream(self.inner.raw(), stream))
    }

    /// The `cudaStream_t` the context runs on (null for a CPU context) (`dst_context_get_stream`).
    pub fn stream(&self) -> Result<*mut c_void> {
        let mut stream: *mut c_void = ptr::null_mut();
        let _guard = self.inner.lock();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::dst_context_get_stream(self.inner.raw(), &mut stream) })?;
        Ok(stream)
    }

    /// Allocates `bytes` bytes in the context's memory space (device memory for CUDA) (`dst_malloc`).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let _guard = self.inner.lock();
        // SAFETY: called under the context's lock.
        let ptr = unsafe { raw_alloc(&self.inner, bytes)? };
        Ok(DeviceBuffer {
            ctx: Arc::clone(&self.inner),
            ptr,
            bytes,
            _not_sync: PhantomData,
        })
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("backend", &self.inner.backend)
            .field("device", &self.device)
            .finish()
    }
}

/// Number of CUDA devices usable by this build; 0 without a CUDA backend or GPU (`dst_cuda_device_count`).
pub fn cuda_device_count() -> Result<usize> {
    let mut count = 0;
    // SAFETY: valid out pointer; callable from any thread.
    check(unsafe { sys::dst_cuda_device_count(&mut count) })?;
    Ok(count.max(0) as usize)
}

/// dst_malloc of `bytes` (null for 0).
///
/// # Safety
/// The caller holds the context's lock.
pub(crate) unsafe fn raw_alloc(ctx: &CtxInner, bytes: usize) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = ptr::null_mut();
    check(sys::dst_malloc(ctx.raw(), bytes, &mut ptr))?;
    Ok(ptr)
}

/// dst_memcpy of `bytes` bytes.
///
/// # Safety
/// The caller holds the context's lock and both pointers are valid for `bytes` bytes in the memory
/// spaces `kind` names.
pub(crate) unsafe fn raw_copy(
    ctx: &CtxInner,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: sys::dst_copy_kind,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    check(sys::dst_memcpy(ctx.raw(), dst, src, bytes, kind))
}

/// Memory in a context's memory space (from [`Context::alloc`]), freed on drop.
///
/// It keeps its context alive. `Send` but not `Sync`, like [`Context`].
pub struct DeviceBuffer {
    ctx: Arc<CtxInner>,
    ptr: *mut c_void,
    bytes: usize,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the pointer is only used through the context, under its lock (see CtxInner).
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The address in the context's memory space (null for an empty buffer), e.g. for
    /// [`Layer::forward_raw`](crate::Layer::forward_raw).
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Copies `src` from host memory to the start of the buffer (`dst_memcpy`, host to context).
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        if src.len() > self.bytes {
            return Err(Error::invalid(format!(
                "DeviceBuffer::copy_from_host: {} bytes do not fit in {} bytes",
                src.len(),
                self.bytes
            )));
        }
        let _guard = self.ctx.lock();
        // SAFETY: under the lock; `ptr` holds `bytes` ≥ src.len() bytes; `src` is host memory.
        unsafe {
            raw_copy(
                &self.ctx,
                self.ptr,
                src.as_ptr().cast(),
                src.len(),
                sys::dst_copy_kind::DST_COPY_HOST_TO_CONTEXT,
            )
        }
    }

    /// Copies the start of the buffer into `dst` in host memory (`dst_memcpy`, context to host).
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() > self.bytes {
            return Err(Error::invalid(format!(
                "DeviceBuffer::copy_to_host: {} bytes requested from {} bytes",
                dst.len(),
                self.bytes
            )));
        }
        let _guard = self.ctx.lock();
        // SAFETY: under the lock; `ptr` holds `bytes` ≥ dst.len() bytes; `dst` is host memory.
        unsafe {
            raw_copy(
                &self.ctx,
                dst.as_mut_ptr().cast(),
                self.ptr,
                dst.len(),
                sys::dst_copy_kind::DST_COPY_CONTEXT_TO_HOST,
            )
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _guard = self.ctx.lock();
        // SAFETY: allocated by dst_malloc on this context; freed once.
        unsafe { sys::dst_free(self.ctx.raw(), self.ptr) }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Host data made visible to the context for the duration of one call: the host memory itself on
/// the CPU backend, a temporary device copy elsewhere.
pub(crate) struct Staged<'c> {
    ctx: &'c CtxInner,
    host: *mut c_void,
    dev: *mut c_void,
    bytes: usize,
}

impl<'c> Staged<'c> {
    /// Stages `bytes` bytes at `host`; `copy_in` copies them to the device copy.
    ///
    /// # Safety
    /// The caller holds the context's lock for the whole life of the result, and `host` is valid for
    /// `bytes` bytes (writable when [`Staged::copy_out`] is used) for that time.
    pub(crate) unsafe fn new(
        ctx: &'c CtxInner,
        host: *const c_void,
        bytes: usize,
        copy_in: bool,
    ) -> Result<Staged<'c>> {
        let mut staged = Staged {
            ctx,
            host: host as *mut c_void,
            dev: ptr::null_mut(),
            bytes,
        };
        if ctx.backend() != Backend::Cpu {
            staged.dev = raw_alloc(ctx, bytes)?;
            if copy_in {
                raw_copy(
                    ctx,
                    staged.dev,
                    host,
                    bytes,
                    sys::dst_copy_kind::DST_COPY_HOST_TO_CONTEXT,
                )?;
            }
        }
        Ok(staged)
    }

    /// The address to give the library.
    pub(crate) fn ptr(&self) -> *mut c_void {
        if self.dev.is_null() {
            self.host
        } else {
            self.dev
        }
    }

    /// Copies the device copy back to host memory (nothing to do on the CPU backend).
    pub(crate) fn copy_out(&self) -> Result<()> {
        if self.dev.is_null() {
            return Ok(());
        }
        // SAFETY: per `new`'s contract (lock held, host writable for `bytes`).
        unsafe {
            raw_copy(
                self.ctx,
                self.host,
                self.dev,
                self.bytes,
                sys::dst_copy_kind::DST_COPY_CONTEXT_TO_HOST,
            )
        }
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if !self.dev.is_null() {
            // SAFETY: allocated by dst_malloc on this context; the lock is still held (see `new`).
            unsafe { sys::dst_free(self.ctx.raw(), self.dev) }
        }
    }
}
