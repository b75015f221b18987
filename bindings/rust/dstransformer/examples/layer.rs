//! One training step of a Transformer layer through the safe Rust crate, on the CPU.
//!
//! Builds a Pre-LN layer (H = 64, 4 heads), runs a training forward on random data with a padded
//! batch described by key lengths, takes the gradient of the loss L = ½‖y‖² (so dL/dy = y), runs
//! backward and reads two parameter gradients by name.
//!
//! Run it from `bindings/rust` with the library's directory in `DST_LIB_DIR` (or installed, found by
//! pkg-config): `DST_LIB_DIR=../../build cargo run --example layer`.

use dstransformer::{Context, GradMode, Layer, LayerConfig, Mask, Result};

/// A small deterministic generator for the example's data (uniform in [-1, 1)).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) & 0xFF_FFFF) as f32 / 8388608.0 - 1.0
    }
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn main() -> Result<()> {
    const B: usize = 2;
    const S: usize = 16;
    const H: usize = 64;

    // 1. A CPU context with a fixed dropout stream.
    let mut ctx = Context::cpu()?;
    ctx.set_rng_state(2024, 0)?;

    // 2. A Pre-LN layer; every other field keeps the library's default.
    let cfg = LayerConfig::builder()
        .hidden_size(H as i32)
        .heads(4)
        .max_batch_tokens((B * S) as i64)
        .max_seq_len(S as i32)
        .pre_layer_norm(true)
        .build()?;
    let mut layer = Layer::new(&ctx, &cfg)?;
    println!(
        "dstransformer {} — layer {} of H = {H}, dtype {}",
        dstransformer::version_string(),
        layer.id()?,
        layer.dtype().name()
    );

    // 3. Random input; the second sequence has 5 padded positions.
    let mut rng = Lcg(7);
    let x: Vec<f32> = (0..B * S * H).map(|_| rng.next()).collect();
    let lengths = [16, 11];
    let mut y = vec![0f32; B * S * H];
    layer.forward(&x, &mut y, B, S, &Mask::KeyLengths(&lengths))?;
    let loss = 0.5 * norm(&y).powi(2);
    println!("forward: loss ½‖y‖² = {loss:.4}");

    // 4. Backward with dL/dy = y.
    let mut dx = vec![0f32; B * S * H];
    layer.backward(&y, &mut dx, B, S, GradMode::Write)?;
    println!("backward: ‖dL/dx‖ = {:.4}", norm(&dx));

    // 5. Gradients by name.
    for name in ["attn_qkvw", "norm_w"] {
        let info = layer.param_info_by_name(name)?;
        let grad: Vec<f32> = layer.get_grad(name)?;
        println!("‖dL/d{name}‖ = {:.4} (shape {:?})", norm(&grad), info.shape);
        if !grad.iter().all(|g| g.is_finite()) {
            eprintln!("non-finite gradient in {name}");
            std::process::exit(1);
        }
    }
    Ok(())
}
