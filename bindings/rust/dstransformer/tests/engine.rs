//! The safe engine wrapper: the loss falls over a few steps of a two-layer stack (the example's
//! `train`), configuration errors carry the library's message with the key's path, the
//! zero_grads_on_step setting, the loss scaler state of an fp16 engine, and a checkpoint round trip
//! with its client state.

#[path = "../examples/engine.rs"]
#[allow(dead_code)]
mod example;

use dstransformer::{validate_engine_config, Context, Engine, Layer, LayerConfig, ParamGroup, Status};

#[test]
fn loss_falls() {
    let losses = example::train(20).expect("training");
    assert_eq!(losses.len(), 20);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(losses[19] < 0.8 * losses[0], "{losses:?}");
}

#[test]
fn bad_config_names_the_key() {
    let err = validate_engine_config(r#"{"train_batch_size": 4, "optimizer": {"type": "adam", "params": {"weight_decy": 0}}}"#)
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("optimizer.params.weight_decy"), "{}", err.message());
    let ctx = Context::cpu().unwrap();
    let err = Engine::new(&ctx, r#"{"train_batch_size": 4, "optimizer": {"type": "lion"}}"#).err().unwrap();
    assert_eq!(err.status(), Status::Unsupported);
    assert!(Engine::new(&ctx, "{not json").is_err());
}

#[test]
fn zero_grads_on_step_setting() {
    let ctx = Context::cpu().unwrap();
    let mut engine = Engine::new(&ctx, r#"{"train_batch_size": 2, "optimizer": {"type": "adam"}}"#).unwrap();
    assert!(engine.zero_grads_on_step().unwrap()); // the default: zeroed at each boundary, as DeepSpeed
    engine.set_zero_grads_on_step(false).unwrap();
    assert!(!engine.zero_grads_on_step().unwrap());
    engine.set_zero_grads_on_step(true).unwrap();
    assert!(engine.zero_grads_on_step().unwrap());
    engine.set_zero_grads_on_step(false).unwrap();
    assert!(!engine.zero_grads_on_step().unwrap());
}

#[test]
fn loss_scaler_state_groups_and_checkpoint() {
    let ctx = Context::cpu().unwrap();
    let cfg = LayerConfig::builder().hidden_size(16).heads(2).max_batch_tokens(8).max_seq_len(4)
        .dtype(dstransformer::DType::F16).build().unwrap();
    let layer = Layer::new(&ctx, &cfg).unwrap();
    let mut engine = Engine::new(&ctx, r#"{"train_batch_size": 2, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "adamw", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 10}}"#).unwrap();
    let g = engine.add_group(ParamGroup { weight_decay: 0.0, ..engine.group(0).unwrap() }).unwrap();
    assert_eq!(g, 1);
    assert_eq!(engine.group(1).unwrap().weight_decay, 0.0);
    assert!((engine.group(0).unwrap().weight_decay - 0.1).abs() < 1e-7);
    engine.add_layer(&layer, "l.", 0, g).unwrap();
    drop(layer); // the engine keeps the layer's handle alive
    engine.zero_grads().unwrap();
    let st = engine.state().unwrap();
    assert!(st.fp16 && st.dynamic_loss_scale && st.loss_scale == 1024.0);
    assert_eq!((st.train_batch_size, st.micro_batch_size, st.gradient_accumulation_steps), (2, 1, 2));
    let mut dy = vec![1.0f32; 4];
    engine.scale_loss_gradient(&mut dy).unwrap();
    assert_eq!(dy, vec![512.0; 4]); // × 1024 / 2
    assert!(!engine.is_boundary().unwrap());
    engine.step().unwrap();
    assert!(engine.is_boundary().unwrap());
    engine.step().unwrap(); // zero gradients: an applied step
    let st = engine.state().unwrap();
    assert_eq!((st.micro_steps, st.global_steps, st.skipped_steps), (2, 1, 0));
    assert!(st.last_step_applied && !st.last_overflow);
    assert_eq!(engine.lr(0).unwrap(), 1e-3);

    let dir = std::env::temp_dir().join(format!("dst-rust-engine-{}", std::process::id()));
    engine.save_checkpoint(&dir, Some("t1"), r#"{"epoch": 2, "list": [1, [2]]}"#).unwrap();
    assert!(engine.save_checkpoint(&dir, Some("bad"), "{oops").is_err());
    let client = engine.load_checkpoint(&dir, None).unwrap();
    assert_eq!(client, r#"{"epoch":2,"list":[1,[2]]}"#);
    let err = engine.load_checkpoint(&dir, Some("missing")).unwrap_err();
    assert_eq!(err.status(), Status::Io);
    std::fs::remove_dir_all(&dir).ok();
}
