//! API tests of the safe crate on the CPU backend: the same ground as the Python and Java tests.

use dstransformer::{
    load_checkpoint, save_checkpoint, version, version_string, CheckpointOptions, Context, DType,
    Error, GradMode, IndexChecks, Layer, LayerConfig, Mask, Param, Status, VERSION_NUMBER,
};

/// xorshift64*: deterministic test data, uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        bits as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn f64s(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next() as f32).collect()
    }
}

const H: usize = 8;

fn tiny(dtype: DType, dropout: f32) -> LayerConfig {
    LayerConfig::builder()
        .hidden_size(H as i32)
        .heads(2)
        .intermediate_size(16)
        .max_batch_tokens(64)
        .max_seq_len(16)
        .attn_dropout_ratio(dropout)
        .hidden_dropout_ratio(dropout)
        .initializer_range(0.3)
        .layer_norm_eps(1e-5)
        .dtype(dtype)
        .build()
        .expect("valid tiny config")
}

fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    let den: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    num / den.max(1e-300)
}

#[test]
fn version_matches_header() {
    assert_eq!(version(), VERSION_NUMBER);
    let parts: Vec<u32> = version_string()
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[0] * 10000 + parts[1] * 100 + parts[2], VERSION_NUMBER);
}

#[test]
fn bad_config_field_gives_invalid_argument_with_message() {
    let err: Error = LayerConfig::builder()
        .hidden_size(30)
        .heads(4)
        .build()
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("heads"), "message: {}", err.message);
    let shown = err.to_string();
    assert!(shown.starts_with("DST_ERR_INVALID_ARGUMENT: "), "{shown}");
    // The error type works with `?` into Box<dyn Error>.
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.to_string().contains("heads"));

    let err = LayerConfig::builder()
        .layer_norm_eps(0.0)
        .build()
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message().contains("layer_norm_eps"),
        "message: {}",
        err.message()
    );
}

#[test]
fn status_codes_and_names() {
    assert_eq!(Status::Capacity.code(), 3);
    assert_eq!(Status::Capacity.name(), "DST_ERR_CAPACITY");
    assert_eq!(Status::Internal.code(), 99);
    assert_eq!(DType::BF16.size(), 2);
    assert_eq!(DType::BF16.name(), "bf16");
    assert_eq!(
        Param::lookup("bert.encoder.layer.3.attn_qkvw").unwrap(),
        Param::AttnQkvw
    );
    assert_eq!(
        Param::lookup("nope").unwrap_err().status,
        Status::InvalidArgument
    );
}

#[test]
fn context_state() {
    let mut ctx = Context::cpu().unwrap();
    assert_eq!(ctx.backend(), dstransformer::Backend::Cpu);
    ctx.set_rng_state(1234, 77).unwrap();
    assert_eq!(ctx.rng_state().unwrap(), (1234, 77));
    assert_eq!(ctx.rng_graph_counter().unwrap(), 0);
    ctx.set_rng_graph_counter(u32::MAX).unwrap();
    assert_eq!(ctx.rng_graph_counter().unwrap(), u32::MAX);
    ctx.set_rng_state(1234, 77).unwrap();
    assert_eq!(ctx.rng_graph_counter().unwrap(), 0);
    ctx.set_num_threads(1).unwrap();
    assert_eq!(ctx.num_threads().unwrap(), 1);
    assert_eq!(ctx.index_checks().unwrap(), IndexChecks::Eager);
    ctx.set_index_checks(IndexChecks::Deferred).unwrap();
    assert_eq!(ctx.index_checks().unwrap(), IndexChecks::Deferred);
    ctx.set_index_checks(IndexChecks::Eager).unwrap();
    assert_eq!(ctx.index_checks().unwrap(), IndexChecks::Eager);
    ctx.synchronize().unwrap();
    assert!(ctx.stream().unwrap().is_null());
    let err = Context::new(dstransformer::Backend::Cpu, 3).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    let mut buf = ctx.alloc(16).unwrap();
    buf.copy_from_host(&[7u8; 16]).unwrap();
    let mut back = [0u8; 16];
    buf.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [7u8; 16]);
    assert_eq!(
        buf.copy_from_host(&[0u8; 17]).unwrap_err().status,
        Status::InvalidArgument
    );
}

#[test]
fn capacity_error() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let (b, s) = (5, 16); // 80 tokens > max_batch_tokens 64
    let x = vec![0.1f32; b * s * H];
    let mut y = vec![0f32; b * s * H];
    let err = layer.forward(&x, &mut y, b, s, &Mask::None).unwrap_err();
    assert_eq!(err.status, Status::Capacity);
    assert!(
        err.message.contains("max_batch_tokens"),
        "message: {}",
        err.message
    );
}

#[test]
fn backward_without_forward_is_a_state_error() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let dy = vec![1f32; 2 * 4 * H];
    let mut dx = vec![0f32; 2 * 4 * H];
    let err = layer
        .backward(&dy, &mut dx, 2, 4, GradMode::Write)
        .unwrap_err();
    assert_eq!(err.status, Status::State);
    assert!(!err.message.is_empty());
}

#[test]
fn slice_lengths_are_checked_before_the_call() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let x = vec![0f32; 10];
    let mut y = vec![0f32; 2 * 4 * H];
    let err = layer.forward(&x, &mut y, 2, 4, &Mask::None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("input"), "{}", err.message);
    let x = vec![0f32; 2 * 4 * H];
    let err = layer
        .forward(&x, &mut y, 2, 4, &Mask::KeyLengths(&[4]))
        .unwrap_err();
    assert!(err.message.contains("key lengths"), "{}", err.message);
    // f64 data on an FP32 layer: the library refuses the dtype.
    let xd = vec![0f64; 2 * 4 * H];
    let mut yd = vec![0f64; 2 * 4 * H];
    assert_eq!(
        layer
            .forward(&xd, &mut yd, 2, 4, &Mask::None)
            .unwrap_err()
            .status,
        Status::InvalidArgument
    );
    // u16 data needs a 16-bit layer.
    let xh = vec![0u16; 2 * 4 * H];
    let mut yh = vec![0u16; 2 * 4 * H];
    assert_eq!(
        layer
            .forward(&xh, &mut yh, 2, 4, &Mask::None)
            .unwrap_err()
            .status,
        Status::InvalidArgument
    );
}

#[test]
fn forward_backward_with_both_mask_kinds() {
    let mut ctx = Context::cpu().unwrap();
    ctx.set_rng_state(7, 0).unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let (b, s) = (2, 5);
    let mut rng = Rng(99);
    let x = rng.f32s(b * s * H);
    let dy = rng.f32s(b * s * H);
    let mut additive = vec![0f32; b * s];
    additive[s + 3] = -10000.0;
    additive[s + 4] = -10000.0;
    let lengths = [5, 3];
    for mask in [
        Mask::None,
        Mask::Additive(&additive),
        Mask::KeyLengths(&lengths),
    ] {
        let mut y = vec![f32::NAN; b * s * H];
        let mut dx = vec![f32::NAN; b * s * H];
        layer.forward(&x, &mut y, b, s, &mask).unwrap();
        layer.backward(&dy, &mut dx, b, s, GradMode::Write).unwrap();
        assert!(y.iter().chain(&dx).all(|v| v.is_finite()), "{mask:?}");
        let g: Vec<f32> = layer.get_grad("attn_qkvw").unwrap();
        assert_eq!(g.len(), 3 * H * H);
        assert!(g.iter().all(|v| v.is_finite()) && g.iter().any(|&v| v != 0.0));
    }
    // Masking the last two keys of sequence 1 either way gives the same output in inference.
    layer.eval().unwrap();
    assert!(!layer.is_training().unwrap());
    let mut y1 = vec![0f32; b * s * H];
    let mut y2 = vec![0f32; b * s * H];
    layer
        .forward(&x, &mut y1, b, s, &Mask::Additive(&additive))
        .unwrap();
    layer
        .forward(&x, &mut y2, b, s, &Mask::KeyLengths(&[5, 3]))
        .unwrap();
    for (a, c) in y1.iter().zip(&y2) {
        assert!((a - c).abs() < 1e-5, "{a} vs {c}");
    }
    // Inference keeps nothing, so backward now has no forward to use.
    layer.train().unwrap();
    let mut saved = layer.new_saved().unwrap();
    let mut dx = vec![0f32; b * s * H];
    assert_eq!(
        layer
            .backward_saved(&mut saved, &dy, &mut dx, b, s, GradMode::Write)
            .unwrap_err()
            .status,
        Status::State
    );
    layer
        .forward_saved(&mut saved, &x, &mut y1, b, s, &Mask::None)
        .unwrap();
    assert!(saved.bytes().unwrap() > 0);
    layer
        .backward_saved(&mut saved, &dy, &mut dx, b, s, GradMode::Write)
        .unwrap();
    saved.release().unwrap();
    assert_eq!(saved.bytes().unwrap(), 0);
}

/// Offsets `[B + 1]` of sequences of `lengths`.
fn offsets(lengths: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &n in lengths {
        cu.push(cu.last().unwrap() + n as i32);
    }
    cu
}

/// ‖a − b‖ / ‖b‖ (0 when both are zero).
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den > 0.0 { (num / den).sqrt() } else { num.sqrt() }
}

// Packed rows agree with the padded layer up to GEMM rounding (the BLAS kernel may round the rows at
// the edge of a block differently), with the same dropout masks: fp32 within 2e-5 per sequence, where a
// different mask would be off by O(1).
const PACKED_BOUND: f64 = 2e-5;

#[test]
fn packed_rows_match_the_padded_layer() {
    let lengths = [3usize, 8, 1, 5];
    let (b, s) = (lengths.len(), 8);
    let cu = offsets(&lengths);
    let n = *cu.last().unwrap() as usize;
    let mut rng = Rng(21);
    let x = rng.f32s(n * H);
    let dy = rng.f32s(n * H);
    let mut xp = vec![0f32; b * s * H];
    let mut dyp = vec![0f32; b * s * H];
    for (i, &len) in lengths.iter().enumerate() {
        let (src, dst) = (cu[i] as usize * H, i * s * H);
        xp[dst..dst + len * H].copy_from_slice(&x[src..src + len * H]);
        dyp[dst..dst + len * H].copy_from_slice(&dy[src..src + len * H]);
    }
    let mut ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();

    // The padded reference: [B, S, H] with key lengths, dropout on.
    ctx.set_rng_state(11, 0).unwrap();
    let key_lengths: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
    let mut yp = vec![0f32; b * s * H];
    let mut dxp = vec![0f32; b * s * H];
    layer
        .forward(&xp, &mut yp, b, s, &Mask::KeyLengths(&key_lengths))
        .unwrap();
    layer
        .backward(&dyp, &mut dxp, b, s, GradMode::Write)
        .unwrap();
    let gp: Vec<Vec<f32>> = Param::ALL
        .iter()
        .map(|p| layer.get_grad(p.name()).unwrap())
        .collect();

    // The same RNG state, packed, through a saved object of its own.
    ctx.set_rng_state(11, 0).unwrap();
    let mut y = vec![f32::NAN; n * H];
    let mut dx = vec![f32::NAN; n * H];
    let mut saved = layer.new_saved().unwrap();
    layer
        .forward_packed_saved(&mut saved, &x, &mut y, &cu, s)
        .unwrap();
    layer
        .backward_packed_saved(&mut saved, &dy, &mut dx, GradMode::Write)
        .unwrap();
    drop(saved);
    // Every row written (a NaN left in an unwritten row fails here and in the bounds below).
    assert!(y.iter().chain(&dx).all(|v| v.is_finite()));
    for (i, &len) in lengths.iter().enumerate() {
        let (row, pad) = (cu[i] as usize * H, i * s * H);
        let e = rel_l2(&y[row..row + len * H], &yp[pad..pad + len * H]);
        assert!(e <= PACKED_BOUND, "output of sequence {i}: {e:e}");
        let e = rel_l2(&dx[row..row + len * H], &dxp[pad..pad + len * H]);
        assert!(e <= PACKED_BOUND, "dX of sequence {i}: {e:e}");
    }
    for (p, want) in Param::ALL.iter().zip(&gp) {
        let got: Vec<f32> = layer.get_grad(p.name()).unwrap();
        let e = rel_l2(&got, want);
        assert!(e <= PACKED_BOUND, "gradient of {}: {e:e}", p.name());
    }

    // Dropout is on: another RNG state gives other masks, far outside the bound (so it is not vacuous).
    ctx.set_rng_state(12, 0).unwrap();
    let mut other = vec![0f32; n * H];
    layer.forward_packed(&x, &mut other, &cu, s).unwrap();
    assert!(rel_l2(&other, &y) > 100.0 * PACKED_BOUND);
    // The default saved object now holds a packed forward: the padded backward refuses it.
    let err = layer
        .backward(&dyp, &mut dxp, b, s, GradMode::Write)
        .unwrap_err();
    assert_eq!(err.status, Status::State);
    assert!(err.message.contains("packed"), "{}", err.message);
    layer
        .backward_packed(&dy, &mut dx, GradMode::Write)
        .unwrap();
}

#[test]
fn packed_offsets_and_lengths_are_checked() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let n = 6;
    let x = Rng(3).f32s(n * H);
    let mut y = vec![7f32; n * H];
    let invalid = |err: Error, what: &str| {
        assert_eq!(err.status, Status::InvalidArgument, "{}", err.message);
        assert!(err.message.contains(what), "{what}: {}", err.message);
    };
    // Offsets ending at 5, not N = 6: refused before anything is written.
    invalid(
        layer.forward_packed(&x, &mut y, &[0, 2, 5], 8).unwrap_err(),
        "cu_seqlens",
    );
    assert!(y.iter().all(|&v| v == 7.0));
    // Offsets that go backwards (a negative length).
    invalid(
        layer
            .forward_packed(&x, &mut y, &[0, 4, 2, 6], 8)
            .unwrap_err(),
        "cu_seqlens",
    );
    // A sequence longer than max_seqlen (lengths 1 and 5, max_seqlen 4).
    invalid(
        layer.forward_packed(&x, &mut y, &[0, 1, 6], 4).unwrap_err(),
        "max_seqlen",
    );
    // Checked by the binding: too few offsets, rows that are not [N, H], mismatched output.
    invalid(
        layer.forward_packed(&x, &mut y, &[0], 8).unwrap_err(),
        "cu_seqlens",
    );
    invalid(
        layer
            .forward_packed(&x[1..], &mut y, &[0, 6], 8)
            .unwrap_err(),
        "[N, 8]",
    );
    invalid(
        layer
            .forward_packed(&x, &mut y[..H], &[0, 6], 8)
            .unwrap_err(),
        "output",
    );
    // max_seqlen above the layer's max_seq_len (16) is a capacity error.
    assert_eq!(
        layer
            .forward_packed(&x, &mut y, &[0, 6], 17)
            .unwrap_err()
            .status,
        Status::Capacity
    );
    // Backward: no packed forward yet, then a gradient of the wrong N.
    let mut dx = vec![0f32; n * H];
    assert_eq!(
        layer
            .backward_packed(&x, &mut dx, GradMode::Write)
            .unwrap_err()
            .status,
        Status::State
    );
    layer.forward_packed(&x, &mut y, &[0, 2, 6], 4).unwrap();
    invalid(
        layer
            .backward_packed(&x, &mut dx[..2 * H], GradMode::Write)
            .unwrap_err(),
        "grad_input",
    );
    invalid(
        layer
            .backward_packed(&x[..2 * H], &mut dx[..2 * H], GradMode::Write)
            .unwrap_err(),
        "grad_output",
    );
    layer.backward_packed(&x, &mut dx, GradMode::Write).unwrap();
}

#[test]
fn param_round_trip_and_info() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let info = layer.param_info_by_name("inter_w").unwrap();
    assert_eq!(info.name, "inter_w");
    assert_eq!(info.shape, vec![16, H]);
    assert_eq!(info.numel, 16 * H);
    assert_eq!(info.offset_bytes % 256, 0);
    let all = layer.params().unwrap();
    assert_eq!(all.len(), 12);
    assert_eq!(all[0].shape, vec![3 * H, H]);
    let values: Vec<f32> = (0..16 * H).map(|i| i as f32 * 0.25 - 3.0).collect();
    layer.set_param("inter_w", &values).unwrap();
    assert_eq!(layer.get_param::<f32>("inter_w").unwrap(), values);
    let as_f64: Vec<f64> = layer.get_param("inter_w").unwrap();
    assert_eq!(as_f64[5], values[5] as f64);
    // The arena view sees the same values.
    let arena = layer.param_arena().unwrap();
    let at = info.offset_bytes + 4 * 5;
    assert_eq!(
        f32::from_ne_bytes(arena[at..at + 4].try_into().unwrap()),
        values[5]
    );
    let err = layer.set_param("inter_w", &values[1..]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(
        layer.set_param("no_such", &values).unwrap_err().status,
        Status::InvalidArgument
    );
    assert_eq!(layer.id().unwrap(), 0);
    assert_eq!(
        Layer::new(&ctx, &tiny(DType::F32, 0.1))
            .unwrap()
            .id()
            .unwrap(),
        1
    );
}

#[test]
fn half_layer_takes_u16() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::BF16, 0.0)).unwrap();
    let ones = vec![0x3F80u16; H]; // 1.0 in bf16
    layer.set_param("norm_w", &ones).unwrap();
    assert_eq!(layer.get_param::<f32>("norm_w").unwrap(), vec![1.0f32; H]);
    let x: Vec<u16> = Rng(3)
        .f32s(4 * H)
        .iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    let mut y = vec![0u16; 4 * H];
    layer.forward(&x, &mut y, 1, 4, &Mask::None).unwrap();
    assert!(y
        .iter()
        .all(|&v| f32::from_bits((v as u32) << 16).is_finite()));
}

/// Loss L = Σ w·y for fixed random w, so dL/dy = w.
fn loss(layer: &mut Layer, x: &[f64], w: &[f64], b: usize, s: usize, mask: &Mask<'_>) -> f64 {
    let mut y = vec![0f64; x.len()];
    layer.forward(x, &mut y, b, s, mask).unwrap();
    y.iter().zip(w).map(|(a, c)| a * c).sum()
}

#[test]
fn gradients_match_finite_differences_in_fp64() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F64, 0.0)).unwrap();
    let (b, s) = (2, 3);
    let mut rng = Rng(2024);
    // Non-trivial biases and LayerNorm parameters, so that every gradient is exercised.
    for p in dstransformer::Param::ALL {
        let info = layer.param_info(p).unwrap();
        if info.shape.len() == 1 {
            let v: Vec<f64> = rng
                .f64s(info.numel)
                .iter()
                .map(|v| {
                    if p.name().ends_with("nw") || p == Param::NormW {
                        1.0 + 0.3 * v
                    } else {
                        0.3 * v
                    }
                })
                .collect();
            layer.set_param(p.name(), &v).unwrap();
        }
    }
    let x = rng.f64s(b * s * H);
    let w = rng.f64s(b * s * H);
    let lengths = [3, 2];
    let mask = Mask::KeyLengths(&lengths);
    let mut y = vec![0f64; x.len()];
    let mut dx = vec![0f64; x.len()];
    layer.forward(&x, &mut y, b, s, &mask).unwrap();
    layer.backward(&w, &mut dx, b, s, GradMode::Write).unwrap();

    let eps = 1e-6;
    // dX.
    let mut fd = Vec::new();
    let mut an = Vec::new();
    for i in (0..x.len()).step_by(5) {
        let mut xp = x.clone();
        xp[i] += eps;
        let lp = loss(&mut layer, &xp, &w, b, s, &mask);
        xp[i] -= 2.0 * eps;
        let lm = loss(&mut layer, &xp, &w, b, s, &mask);
        fd.push((lp - lm) / (2.0 * eps));
        an.push(dx[i]);
    }
    let e = rel_err(&an, &fd);
    assert!(e < 1e-6, "dX relative error {e}");

    // A few entries of every parameter gradient.
    for p in Param::ALL {
        let grad: Vec<f64> = layer.get_grad(p.name()).unwrap();
        let base: Vec<f64> = layer.get_param(p.name()).unwrap();
        let mut fd = Vec::new();
        let mut an = Vec::new();
        for j in (0..base.len()).step_by(base.len() / 5 + 1) {
            let mut v = base.clone();
            v[j] += eps;
            layer.set_param(p.name(), &v).unwrap();
            let lp = loss(&mut layer, &x, &w, b, s, &mask);
            v[j] -= 2.0 * eps;
            layer.set_param(p.name(), &v).unwrap();
            let lm = loss(&mut layer, &x, &w, b, s, &mask);
            fd.push((lp - lm) / (2.0 * eps));
            an.push(grad[j]);
        }
        layer.set_param(p.name(), &base).unwrap();
        let e = rel_err(&an, &fd);
        assert!(
            e < 1e-6,
            "{}: relative error {e} ({an:?} vs {fd:?})",
            p.name()
        );
    }
}

#[test]
fn accumulate_adds_to_the_gradients() {
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F64, 0.0)).unwrap();
    let (b, s) = (1, 4);
    let mut rng = Rng(5);
    let x = rng.f64s(b * s * H);
    let dy = rng.f64s(b * s * H);
    let mut y = vec![0f64; x.len()];
    let mut dx = vec![0f64; x.len()];
    layer.forward(&x, &mut y, b, s, &Mask::None).unwrap();
    layer.backward(&dy, &mut dx, b, s, GradMode::Write).unwrap();
    let once: Vec<f64> = layer.get_grad("output_w").unwrap();
    layer
        .backward(&dy, &mut dx, b, s, GradMode::Accumulate)
        .unwrap();
    let twice: Vec<f64> = layer.get_grad("output_w").unwrap();
    for (a, c) in once.iter().zip(&twice) {
        assert!((2.0 * a - c).abs() <= 1e-12 * (1.0 + a.abs()), "{a} {c}");
    }
    layer.zero_grads().unwrap();
    assert!(layer
        .get_grad::<f64>("output_w")
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
}

#[test]
fn checkpoint_round_trip() {
    let ctx = Context::cpu().unwrap();
    let mut a = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let mut b = Layer::new(
        &ctx,
        &tiny(DType::F32, 0.1).to_builder().seed(7).build().unwrap(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("dst_rust_ckpt_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("layer.safetensors");
    let opts = CheckpointOptions {
        client_state: Some(b"step=12".to_vec()),
        ..CheckpointOptions::default()
    };
    save_checkpoint(&[&a], &path, &opts).unwrap();
    assert_ne!(
        a.get_param::<f32>("attn_qkvw").unwrap(),
        b.get_param::<f32>("attn_qkvw").unwrap()
    );
    let state = load_checkpoint(&mut [&mut b], &path, &CheckpointOptions::default()).unwrap();
    assert_eq!(state.as_deref(), Some(&b"step=12"[..]));
    // Any bytes round-trip exactly (stored base64-encoded when they are not UTF-8 text).
    let binary = vec![0xffu8, 0, b'x', 0x80, 0];
    let opts_bin = CheckpointOptions {
        client_state: Some(binary.clone()),
        ..CheckpointOptions::default()
    };
    save_checkpoint(&[&a], &path, &opts_bin).unwrap();
    let state = load_checkpoint(&mut [&mut b], &path, &CheckpointOptions::default()).unwrap();
    assert_eq!(state, Some(binary));
    assert_eq!(
        a.get_param::<f32>("attn_qkvw").unwrap(),
        b.get_param::<f32>("attn_qkvw").unwrap()
    );
    let err = load_checkpoint(&mut [&mut a], dir.join("missing.safetensors"), &opts).unwrap_err();
    assert_eq!(err.status, Status::Io);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoint_convert_to_hugging_face_and_back() {
    let ctx = Context::cpu().unwrap();
    let post_ln = tiny(DType::F32, 0.1)
        .to_builder()
        .pre_layer_norm(false)
        .build()
        .unwrap();
    let a = Layer::new(&ctx, &post_ln).unwrap();
    let mut b = Layer::new(&ctx, &post_ln.to_builder().seed(9).build().unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("dst_rust_convert_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ds = dir.join("ds.safetensors");
    let hf = dir.join("hf.safetensors");
    save_checkpoint(&[&a], &ds, &CheckpointOptions::default()).unwrap();
    let summary = dstransformer::convert_checkpoint(
        &ds,
        dstransformer::WeightLayout::DeepSpeed,
        None,
        &hf,
        dstransformer::WeightLayout::HfBert,
        Some("bert.encoder."),
    )
    .unwrap();
    assert!(!summary.is_empty());
    let info = dstransformer::describe_checkpoint(&hf).unwrap();
    assert!(
        info.contains("layers: 1 (layout hf_bert, prefix \"bert.encoder.\", 16 tensors)"),
        "{info}"
    );
    let state = "s".repeat(40000); // longer than describe's first buffer
    let long = CheckpointOptions {
        client_state: Some(state.clone().into_bytes()),
        ..CheckpointOptions::default()
    };
    save_checkpoint(&[&a], &ds, &long).unwrap();
    assert!(dstransformer::describe_checkpoint(&ds)
        .unwrap()
        .contains(&format!("\n  client_state: {state}\n")));
    let err = dstransformer::describe_checkpoint(dir.join("missing.safetensors")).unwrap_err();
    assert_eq!(err.status, Status::Io);
    let opts = CheckpointOptions {
        layout: dstransformer::WeightLayout::HfBert,
        ..CheckpointOptions::default()
    };
    load_checkpoint(&mut [&mut b], &hf, &opts).unwrap();
    for p in Param::ALL {
        assert_eq!(
            a.get_param::<f32>(p.name()).unwrap(),
            b.get_param::<f32>(p.name()).unwrap(),
            "{}",
            p.name()
        );
    }
    let err = dstransformer::convert_checkpoint(
        dir.join("missing.safetensors"),
        dstransformer::WeightLayout::DeepSpeed,
        None,
        &hf,
        dstransformer::WeightLayout::HfBert,
        None,
    )
    .unwrap_err();
    assert_eq!(err.status, Status::Io);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn drop_order_and_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Context>();
    assert_send::<Layer>();
    assert_send::<dstransformer::Saved>();
    let ctx = Context::cpu().unwrap();
    let mut layer = Layer::new(&ctx, &tiny(DType::F32, 0.1)).unwrap();
    let saved = layer.new_saved().unwrap();
    drop(ctx); // the layer keeps its context alive
    let handle = std::thread::spawn(move || {
        let x = vec![0.25f32; 3 * H];
        let mut y = vec![0f32; 3 * H];
        layer.forward(&x, &mut y, 1, 3, &Mask::None).unwrap();
        drop(layer); // the saved object keeps the layer alive until it goes
        drop(saved);
        y
    });
    assert!(handle.join().unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn standalone_layernorm_matches_the_formula() {
    let ctx = Context::cpu().unwrap();
    let (rows, hidden, eps) = (5usize, 9usize, 1e-5f32);
    let x: Vec<f64> = (0..rows * hidden)
        .map(|i| ((i * 37 % 17) as f64) * 0.3 - 2.0)
        .collect();
    let dy: Vec<f64> = (0..rows * hidden)
        .map(|i| ((i * 11 % 13) as f64) * 0.2 - 1.1)
        .collect();
    let g: Vec<f64> = (0..hidden).map(|j| 1.0 + 0.1 * j as f64).collect();
    let b: Vec<f64> = (0..hidden).map(|j| 0.05 * j as f64 - 0.2).collect();
    let mut y = vec![0f64; rows * hidden];
    let mut stats = vec![0f64; 2 * rows];
    dstransformer::layernorm_forward(
        &ctx,
        &x,
        &g,
        &b,
        eps,
        &mut y,
        Some(&mut stats),
        rows,
        hidden,
    )
    .unwrap();
    let (mut dx, mut dg, mut db) = (
        vec![0f64; rows * hidden],
        vec![0f64; hidden],
        vec![0f64; hidden],
    );
    dstransformer::layernorm_backward(
        &ctx,
        &dy,
        &x,
        &g,
        &b,
        &stats,
        &mut dx,
        &mut dg,
        &mut db,
        rows,
        hidden,
        GradMode::Write,
    )
    .unwrap();
    let hf = hidden as f64;
    let mut rdg = vec![0f64; hidden];
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let mu = row.iter().sum::<f64>() / hf;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / hf;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        assert!((stats[r] - mu).abs() < 1e-12 && (stats[rows + r] - rstd).abs() < 1e-9 * rstd);
        let (mut a, mut c) = (0.0, 0.0);
        for j in 0..hidden {
            let i = r * hidden + j;
            let xhat = (x[i] - mu) * rstd;
            assert!((y[i] - (g[j] * xhat + b[j])).abs() < 1e-12, "y[{i}]");
            rdg[j] += dy[i] * xhat;
            a += g[j] * dy[i] / hf;
            c += g[j] * dy[i] * xhat / hf;
        }
        for j in 0..hidden {
            let i = r * hidden + j;
            let want = rstd * (g[j] * dy[i] - a - (x[i] - mu) * rstd * c);
            assert!((dx[i] - want).abs() < 1e-10, "dx[{i}]");
        }
    }
    for j in 0..hidden {
        assert!((dg[j] - rdg[j]).abs() < 1e-10, "dgamma[{j}]");
    }
    // f32, inference (no statistics); errors name the argument and leave the output alone.
    let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let gf: Vec<f32> = g.iter().map(|&v| v as f32).collect();
    let bf: Vec<f32> = b.iter().map(|&v| v as f32).collect();
    let mut yf = vec![7f32; rows * hidden];
    let err =
        dstransformer::layernorm_forward(&ctx, &xf, &gf, &bf, 0.0, &mut yf, None, rows, hidden)
            .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("eps"), "{}", err.message);
    assert!(yf.iter().all(|&v| v == 7.0));
    let err = dstransformer::layernorm_forward(
        &ctx,
        &xf,
        &gf[..3],
        &bf,
        eps,
        &mut yf,
        None,
        rows,
        hidden,
    )
    .unwrap_err();
    assert!(err.message.contains("gamma"), "{}", err.message);
    dstransformer::layernorm_forward(&ctx, &xf, &gf, &bf, eps, &mut yf, None, rows, hidden)
        .unwrap();
    for i in 0..rows * hidden {
        assert!(
            ((yf[i] as f64) - y[i]).abs() < 1e-5 * (1.0 + y[i].abs()),
            "yf[{i}]"
        );
    }
}
