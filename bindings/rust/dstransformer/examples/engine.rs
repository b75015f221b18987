//! Training a stack of two Transformer layers with the library's engine, on the CPU.
//!
//! The engine is configured with DeepSpeed's JSON (AdamW, gradient accumulation 2, WarmupLR,
//! clipping); the weight matrices go to a group with weight decay, the biases and LayerNorm
//! parameters to one without. The task: map random inputs to fixed random targets (loss ½‖y − t‖²/N).
//! Prints the loss of every boundary step and exits non-zero unless it fell.
//!
//! `DST_LIB_DIR=../../build cargo run --example engine` from `bindings/rust`.

use dstransformer::{Context, Engine, GradMode, Layer, LayerConfig, Mask, ParamGroup, Result};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) & 0xFF_FFFF) as f32 / 8388608.0 - 1.0
    }
}

const CONFIG: &str = r#"{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-3, "warmup_num_steps": 5}}
}"#;

/// Trains for `steps` boundary steps and returns the loss of each (the mean over its micro-batches).
pub fn train(steps: usize) -> Result<Vec<f64>> {
    const B: usize = 2;
    const S: usize = 8;
    const H: usize = 32;
    let mut ctx = Context::cpu()?;
    ctx.set_rng_state(11, 0)?;
    let cfg = LayerConfig::builder()
        .hidden_size(H as i32)
        .heads(4)
        .intermediate_size(64)
        .max_batch_tokens((B * S) as i64)
        .max_seq_len(S as i32)
        .pre_layer_norm(true)
        .build()?;
    let layers = [Layer::new(&ctx, &cfg)?, Layer::new(&ctx, &cfg)?];
    let mut engine = Engine::new(&ctx, CONFIG)?;
    let no_decay = engine.add_group(ParamGroup { weight_decay: 0.0, ..engine.group(0)? })?;
    for (i, layer) in layers.iter().enumerate() {
        engine.add_layer(layer, &format!("encoder.layer.{i}."), 0, no_decay)?;
    }
    engine.zero_grads()?;
    let gas = engine.state()?.gradient_accumulation_steps as usize;

    let mut rng = Lcg(5);
    let n = B * S * H;
    let data: Vec<(Vec<f32>, Vec<f32>)> = (0..4)
        .map(|_| ((0..n).map(|_| rng.next()).collect(), (0..n).map(|_| 0.5 * rng.next()).collect()))
        .collect();
    let mut losses = Vec::new();
    let (mut h, mut y, mut dy, mut dh, mut dx) =
        (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let mut layers = layers;
    let mut sum = 0.0;
    for micro in 0..steps * gas {
        let (x, t) = &data[micro % data.len()];
        layers[0].forward(x, &mut h, B, S, &Mask::None)?;
        layers[1].forward(&h, &mut y, B, S, &Mask::None)?;
        let mut loss = 0.0;
        for i in 0..n {
            let d = (y[i] - t[i]) as f64;
            loss += 0.5 * d * d / n as f64;
            dy[i] = ((y[i] - t[i]) as f64 / n as f64) as f32;
        }
        sum += loss;
        engine.scale_loss_gradient(&mut dy)?; // × loss scale / gradient_accumulation_steps
        layers[1].backward(&dy, &mut dh, B, S, GradMode::Accumulate)?;
        layers[0].backward(&dh, &mut dx, B, S, GradMode::Accumulate)?;
        let boundary = engine.is_boundary()?;
        engine.step()?;
        if boundary {
            losses.push(sum / gas as f64);
            sum = 0.0;
        }
    }
    Ok(losses)
}

fn main() -> Result<()> {
    let losses = train(40)?;
    for (i, l) in losses.iter().enumerate().step_by(5) {
        println!("step {:3}: loss {l:.6}", i + 1);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    println!("loss {first:.6} -> {last:.6}");
    if !(last < 0.7 * first) {
        eprintln!("the loss did not fall");
        std::process::exit(1);
    }
    Ok(())
}
