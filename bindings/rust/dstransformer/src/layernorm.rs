//! The standalone LayerNorm of the C API (`dst_layernorm_forward` / `dst_layernorm_backward`): the
//! final LayerNorm a Pre-LN stack needs after its last layer.

use std::ptr;

use dstransformer_sys as sys;

use crate::context::Staged;
use crate::error::check;
use crate::layer::{bytes_of, check_len, tensor};
use crate::{Context, DType, Element, Error, GradMode, Result};

fn float_dtype<T: Element>() -> Result<DType> {
    T::dtype_for(DType::F32).ok_or_else(|| {
        Error::invalid(
            "layernorm: data must be f32 or f64 (16-bit data goes through the C API)".into(),
        )
    })
}

fn dims(rows: usize, hidden: usize) -> Result<usize> {
    if rows == 0 || hidden == 0 {
        return Err(Error::invalid(format!(
            "layernorm: rows {rows} and hidden {hidden} must be at least 1"
        )));
    }
    rows.checked_mul(hidden)
        .ok_or_else(|| Error::invalid("layernorm: rows x hidden overflows".into()))
}

/// `y = gamma * (x - mean) / sqrt(var + eps) + beta` per row of the row-major `rows x hidden` data
/// `x` (`f32` or `f64`; `gamma` and `beta` have `hidden` elements). `stats` (`2 * rows`: the row
/// means, then the inverse deviations, in the same type) receives what [`layernorm_backward`] needs;
/// pass `None` when not training. On a non-CPU context the data is staged through device memory.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward<T: Element>(
    ctx: &Context,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    eps: f32,
    y: &mut [T],
    stats: Option<&mut [T]>,
    rows: usize,
    hidden: usize,
) -> Result<()> {
    let dt = float_dtype::<T>()?;
    let n = dims(rows, hidden)?;
    check_len("layernorm: x", x.len(), n)?;
    check_len("layernorm: gamma", gamma.len(), hidden)?;
    check_len("layernorm: beta", beta.len(), hidden)?;
    check_len("layernorm: y", y.len(), n)?;
    if let Some(s) = stats.as_ref() {
        check_len("layernorm: stats", s.len(), 2 * rows)?;
    }
    let inner = ctx.inner();
    let _guard = inner.lock();
    let (r, h) = (rows as i64, hidden as i64);
    // SAFETY (all): the lock is held until the staged buffers are dropped; the slices outlive them
    // and have the lengths checked above.
    let sx = unsafe { Staged::new(inner, bytes_of(x).0, bytes_of(x).1, true)? };
    let sg = unsafe { Staged::new(inner, bytes_of(gamma).0, bytes_of(gamma).1, true)? };
    let sb = unsafe { Staged::new(inner, bytes_of(beta).0, bytes_of(beta).1, true)? };
    let bytes_y = bytes_of(y).1;
    let sy = unsafe { Staged::new(inner, y.as_mut_ptr().cast(), bytes_y, false)? };
    let ss = match stats {
        Some(s) => {
            let bytes = bytes_of(s).1;
            Some(unsafe { Staged::new(inner, s.as_mut_ptr().cast(), bytes, false)? })
        }
        None => None,
    };
    let tx = tensor(sx.ptr(), dt, &[r, h]);
    let tg = tensor(sg.ptr(), dt, &[h]);
    let tb = tensor(sb.ptr(), dt, &[h]);
    let mut ty = tensor(sy.ptr(), dt, &[r, h]);
    let mut ts = ss.as_ref().map(|s| tensor(s.ptr(), dt, &[2, r]));
    let ts_ptr = ts
        .as_mut()
        .map_or(ptr::null_mut(), |t| t as *mut sys::dst_tensor);
    // SAFETY: a valid context handle under its lock; the tensors describe live memory.
    check(unsafe { sys::dst_layernorm_forward(inner.raw(), &tx, &tg, &tb, eps, &mut ty, ts_ptr) })?;
    sy.copy_out()?;
    if let Some(s) = ss.as_ref() {
        s.copy_out()?;
    }
    Ok(())
}

/// Gradients of [`layernorm_forward`] from its `stats`: writes `dx`; overwrites `dgamma` and `dbeta`,
/// or adds to them with [`GradMode::Accumulate`].
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward<T: Element>(
    ctx: &Context,
    dy: &[T],
    x: &[T],
    gamma: &[T],
    beta: &[T],
    stats: &[T],
    dx: &mut [T],
    dgamma: &mut [T],
    dbeta: &mut [T],
    rows: usize,
    hidden: usize,
    mode: GradMode,
) -> Result<()> {
    let dt = float_dtype::<T>()?;
    let n = dims(rows, hidden)?;
    check_len("layernorm: dy", dy.len(), n)?;
    check_len("layernorm: x", x.len(), n)?;
    check_len("layernorm: gamma", gamma.len(), hidden)?;
    check_len("layernorm: beta", beta.len(), hidden)?;
    check_len("layernorm: stats", stats.len(), 2 * rows)?;
    check_len("layernorm: dx", dx.len(), n)?;
    check_len("layernorm: dgamma", dgamma.len(), hidden)?;
    check_len("layernorm: dbeta", dbeta.len(), hidden)?;
    let accumulate = mode == GradMode::Accumulate;
    let inner = ctx.inner();
    let _guard = inner.lock();
    let (r, h) = (rows as i64, hidden as i64);
    let stage_in = |d: &[T]| {
        let (p, bytes) = bytes_of(d);
        // SAFETY: as in layernorm_forward.
        unsafe { Staged::new(inner, p, bytes, true) }
    };
    let (sdy, sx, sg, sb, ss) = (
        stage_in(dy)?,
        stage_in(x)?,
        stage_in(gamma)?,
        stage_in(beta)?,
        stage_in(stats)?,
    );
    let (bdx, bdg, bdb) = (bytes_of(dx).1, bytes_of(dgamma).1, bytes_of(dbeta).1);
    // SAFETY: as in layernorm_forward; dgamma/dbeta are copied in when accumulating.
    let sdx = unsafe { Staged::new(inner, dx.as_mut_ptr().cast(), bdx, false)? };
    let sdg = unsafe { Staged::new(inner, dgamma.as_mut_ptr().cast(), bdg, accumulate)? };
    let sdb = unsafe { Staged::new(inner, dbeta.as_mut_ptr().cast(), bdb, accumulate)? };
    let (tdy, tx) = (
        tensor(sdy.ptr(), dt, &[r, h]),
        tensor(sx.ptr(), dt, &[r, h]),
    );
    let (tg, tb) = (tensor(sg.ptr(), dt, &[h]), tensor(sb.ptr(), dt, &[h]));
    let ts = tensor(ss.ptr(), dt, &[2, r]);
    let mut tdx = tensor(sdx.ptr(), dt, &[r, h]);
    let (mut tdg, mut tdb) = (tensor(sdg.ptr(), dt, &[h]), tensor(sdb.ptr(), dt, &[h]));
    // SAFETY: a valid context handle under its lock; the tensors describe live memory.
    check(unsafe {
        sys::dst_layernorm_backward(
            inner.raw(),
            &tdy,
            &tx,
            &tg,
            &tb,
            &ts,
            &mut tdx,
            &mut tdg,
            &mut tdb,
            mode.to_raw(),
        )
    })?;
    sdx.copy_out()?;
    sdg.copy_out()?;
    sdb.copy_out()
}
