//! GPU tests of the hand-written wrappers of toolkit.rs (convolution, pooling, RoPE, LoRA, grad
//! scaler, optimizer state files, gradient statistics, checkpoint closures, CUDA graphs, fused
//! expressions): skipped unless a context can be created; mandatory with FLAME_REQUIRE_GPU=1.
mod common;

use flame::{
    ConvOptions, DType, Fused, GradScaler, GradScalerOptions, Lora, Optimizer, OptimizerKind, OptimizerOptions,
    Pool2dOptions, RopeOptions, Status, Tensor, STAT_COLUMNS,
};

macro_rules! ctx_or_skip {
    () => {
        match common::gpu() {
            Some(c) => c,
            None => return,
        }
    };
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 + 1e-5 * y.abs())
}

fn leaf(ctx: &flame::Context, data: &[f32], shape: &[i64]) -> Tensor {
    let t = ctx.from_slice(data, shape).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

#[test]
fn convolutions() {
    let ctx = ctx_or_skip!();
    let x = ctx.ones(&[1, 1, 3, 3], DType::F32).unwrap();
    let w = ctx.ones(&[1, 1, 2, 2], DType::F32).unwrap();
    let bias = ctx.from_slice(&[0.5f32], &[1]).unwrap();
    let y = x.conv2d(&w, Some(&bias), &ConvOptions::default()).unwrap();
    assert_eq!(y.shape().unwrap(), vec![1, 1, 2, 2]);
    assert!(close(&y.to_vec().unwrap(), &[4.5; 4]));
    // padding 'same' with a 3x3 kernel of ones: the number of in-image neighbours
    let w3 = ctx.ones(&[1, 1, 3, 3], DType::F32).unwrap();
    let same = ConvOptions { padding_same: true, ..ConvOptions::default() };
    let y = x.conv2d(&w3, None, &same).unwrap();
    assert!(close(&y.to_vec().unwrap(), &[4., 6., 4., 6., 9., 6., 4., 6., 4.]));
    // conv1d and the transposed convolution
    let x1 = ctx.from_slice(&[1.0f32, 2., 3., 4.], &[1, 1, 4]).unwrap();
    let w1 = ctx.ones(&[1, 1, 2], DType::F32).unwrap();
    assert!(close(&x1.conv1d(&w1, None, &ConvOptions::default()).unwrap().to_vec().unwrap(), &[3., 5., 7.]));
    let xt = ctx.from_slice(&[2.0f32], &[1, 1, 1, 1]).unwrap();
    assert!(close(&xt.conv_transpose2d(&w, None, &ConvOptions::default()).unwrap().to_vec().unwrap(), &[2.; 4]));
    // bad options are an error, not a crash
    let bad = ConvOptions { groups: 0, ..ConvOptions::default() };
    assert_eq!(x.conv2d(&w, None, &bad).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn pooling_and_rope() {
    let ctx = ctx_or_skip!();
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let x = ctx.from_slice(&data, &[1, 1, 4, 4]).unwrap();
    let p = Pool2dOptions::new(2, 2);
    assert_eq!(p.stride, [2, 2]);
    assert!(close(&x.max_pool2d(&p).unwrap().to_vec().unwrap(), &[5., 7., 13., 15.]));
    assert!(close(&x.avg_pool2d(&p).unwrap().to_vec().unwrap(), &[2.5, 4.5, 10.5, 12.5]));
    let bad = Pool2dOptions { dilation: [2, 2], ..p };
    assert_eq!(x.avg_pool2d(&bad).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    // RoPE at position 1 (no position tensor: position_offset + t) rotates (1, 0) by 1 radian
    let q = ctx.from_slice(&[1.0f32, 0.0], &[1, 1, 1, 2]).unwrap();
    let o = RopeOptions { position_offset: 1, ..RopeOptions::default() };
    assert_eq!(RopeOptions::default().theta, 10000.0);
    assert!(close(&q.rope(None, &o).unwrap().to_vec().unwrap(), &[1f32.cos(), 1f32.sin()]));
    let pos = ctx.from_slice(&[0i64], &[1]).unwrap();
    assert!(close(&q.rope(Some(&pos), &o).unwrap().to_vec().unwrap(), &[1.0, 0.0]));
}

#[test]
fn lora_forward_merge_unmerge() {
    let ctx = ctx_or_skip!();
    let w = ctx.from_slice(&[1.0f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let b = ctx.from_slice(&[0.5f32, -0.5], &[2]).unwrap();
    let x = ctx.from_slice(&[1.0f32, 0., -1.], &[1, 3]).unwrap();
    let lora = Lora::new(&w, Some(&b), 2, 4.0).unwrap();
    let (a, bb) = lora.adapters().unwrap();
    assert_eq!((a.shape().unwrap(), bb.shape().unwrap()), (vec![2, 3], vec![2, 2]));
    assert!(a.requires_grad().unwrap() && bb.requires_grad().unwrap());
    // B is zero: the adapter changes nothing yet
    assert!(close(&lora.forward(&x).unwrap().to_vec().unwrap(), &[-1.5, -2.5]));
    // train B one step so that merging changes the weight
    let loss = lora.forward(&x).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let mut oo = OptimizerOptions::new(OptimizerKind::Sgd).unwrap();
    oo.lr = 0.1;
    let opt = Optimizer::new(&ctx, &oo, &[&a, &bb]).unwrap();
    opt.step().unwrap();
    let adapted = lora.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let before = w.to_vec::<f32>().unwrap();
    assert!(!lora.is_merged().unwrap());
    lora.merge().unwrap();
    assert!(lora.is_merged().unwrap());
    assert_eq!(lora.merge().unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_ne!(w.to_vec::<f32>().unwrap(), before);
    let merged = x.linear(&w, Some(&b), flame::Activation::None).unwrap().to_vec::<f32>().unwrap();
    assert!(close(&merged, &adapted), "{merged:?} vs {adapted:?}");
    lora.unmerge().unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), before, "unmerge restores the weight bit for bit");
    // a weight that requires grad is refused
    let wg = leaf(&ctx, &[1.0, 2.0], &[1, 2]);
    assert_eq!(Lora::new(&wg, None, 1, 1.0).err().unwrap().status, Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn grad_scaler_steps_and_skips() {
    let ctx = ctx_or_skip!();
    let d = GradScalerOptions::default();
    assert_eq!((d.init_scale, d.growth_factor, d.backoff_factor, d.growth_interval, d.enabled), (65536.0, 2.0, 0.5, 2000, true));
    let scaler = GradScaler::new(&ctx, &GradScalerOptions { init_scale: 8.0, ..d }).unwrap();
    assert_eq!(scaler.get_scale().unwrap(), 8.0);
    let p = leaf(&ctx, &[1.0], &[1]);
    let mut oo = OptimizerOptions::new(OptimizerKind::Sgd).unwrap();
    oo.lr = 0.25;
    let opt = Optimizer::new(&ctx, &oo, &[&p]).unwrap();
    // a clean step: the gradient (2) is unscaled before the update
    let loss = (&p * 2.0).unwrap().sum_all().unwrap();
    let scaled = scaler.scale(&loss).unwrap();
    assert_eq!(scaled.item().unwrap(), 16.0);
    scaled.backward().unwrap();
    assert!(scaler.step(&opt).unwrap());
    scaler.update().unwrap();
    assert!(close(&p.to_vec().unwrap(), &[0.5]));
    assert_eq!(scaler.found_inf().unwrap().item().unwrap(), 0.0);
    opt.zero_grad(true).unwrap();
    // an Inf gradient: the step is skipped and the scale backs off
    let loss = (&p * f64::INFINITY).unwrap().sum_all().unwrap();
    scaler.scale(&loss).unwrap().backward().unwrap();
    assert!(!scaler.step(&opt).unwrap());
    assert_eq!(scaler.found_inf().unwrap().item().unwrap(), 1.0);
    scaler.update().unwrap();
    assert!(close(&p.to_vec().unwrap(), &[0.5]), "the skipped step left the parameter");
    assert_eq!(scaler.state().unwrap(), (4.0, 0));
    scaler.set_state(32.0, 1).unwrap();
    assert_eq!(scaler.state().unwrap(), (32.0, 1));
    assert_eq!(scaler.set_state(-1.0, 0).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn optimizer_state_file_round_trip() {
    let ctx = ctx_or_skip!();
    let path = std::env::temp_dir().join(format!("flame-rs-optim-{}.state", std::process::id()));
    let oo = OptimizerOptions::new(OptimizerKind::AdamW).unwrap();
    let p1 = leaf(&ctx, &[1.0, -2.0, 3.0], &[3]);
    let opt1 = Optimizer::new(&ctx, &oo, &[&p1]).unwrap();
    let step = |p: &Tensor, opt: &Optimizer| {
        (p * p).unwrap().sum_all().unwrap().backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad(true).unwrap();
    };
    step(&p1, &opt1);
    step(&p1, &opt1);
    opt1.save_state(&path).unwrap();
    // a fresh optimizer over a parameter with the same values continues exactly where opt1 is
    let p2 = leaf(&ctx, &p1.to_vec::<f32>().unwrap(), &[3]);
    let opt2 = Optimizer::new(&ctx, &oo, &[&p2]).unwrap();
    opt2.load_state(&path).unwrap();
    assert_eq!(opt2.step_count().unwrap(), opt1.step_count().unwrap());
    step(&p1, &opt1);
    step(&p2, &opt2);
    assert_eq!(p1.to_vec::<f32>().unwrap(), p2.to_vec::<f32>().unwrap());
    std::fs::remove_file(&path).unwrap();
    assert!(opt2.load_state(&path).is_err(), "a missing file is an error");
}

#[test]
fn grad_stats_on_the_host() {
    let ctx = ctx_or_skip!();
    let a = ctx.from_slice(&[3.0f32, 4.0], &[2]).unwrap();
    let b = ctx.from_slice(&[f32::NAN], &[1]).unwrap();
    let rows = ctx.grad_stats_host(&[&a, &b]).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].len(), STAT_COLUMNS);
    assert_eq!((rows[0][0], rows[0][1], rows[0][2], rows[0][3]), (5.0, 3.0, 4.0, 3.5));
    assert_eq!(rows[1][4], 1.0, "one NaN in b");
    assert_eq!(rows[2][4], 1.0, "one NaN in all");
}

#[test]
fn copy_from_slice_into_existing_tensor() {
    let ctx = ctx_or_skip!();
    let t = ctx.zeros(&[3], DType::F32).unwrap();
    t.copy_from_slice(&[1.0f32, 2.0, 3.0]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(t.copy_from_slice(&[1.0f32]).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn checkpoint_closure_recomputes_and_panics_become_errors() {
    let ctx = ctx_or_skip!();
    let x = leaf(&ctx, &[1.0, 2.0, 3.0], &[3]);
    let outs = ctx.checkpoint(&[&x], 1, |ins| Ok(vec![(&ins[0] * &ins[0])?])).unwrap();
    assert_eq!(outs.len(), 1);
    assert!(close(&outs[0].to_vec().unwrap(), &[1., 4., 9.]));
    outs[0].sum_all().unwrap().backward().unwrap();
    assert!(close(&x.grad().unwrap().unwrap().to_vec().unwrap(), &[2., 4., 6.]));
    // a panic inside the closure is an error status with the panic's message, not an abort
    let e = ctx.checkpoint(&[&x], 1, |_| -> flame::Result<Vec<Tensor>> { panic!("block exploded") }).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INTERNAL);
    assert!(e.message.contains("block exploded"), "{}", e.message);
    // an Err keeps its status; a wrong number of outputs is an error
    let e = ctx
        .checkpoint(&[&x], 1, |_| Err(flame::Error::new(Status::ERROR_SHAPE_MISMATCH, "mine")))
        .unwrap_err();
    assert_eq!(e.status, Status::ERROR_SHAPE_MISMATCH);
    let e = ctx.checkpoint(&[&x], 2, |ins| Ok(vec![ins[0].clone()])).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    // the library still works afterwards
    assert!(close(&(&x + 1.0).unwrap().to_vec().unwrap(), &[2., 3., 4.]));
}

#[test]
fn graph_capture_and_replay() {
    let ctx = ctx_or_skip!();
    let x = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let _warm = (&x * 2.0).unwrap().to_vec::<f32>().unwrap(); // kernels compiled outside the capture
    let mut y = None;
    let g = ctx
        .capture_graph(|| {
            y = Some((&x * 2.0)?);
            Ok(())
        })
        .unwrap();
    let y = y.unwrap();
    g.replay().unwrap();
    assert!(close(&y.to_vec().unwrap(), &[2., 4., 6.]));
    x.copy_from_slice(&[10.0f32, 20.0, 30.0]).unwrap();
    g.replay().unwrap();
    assert!(close(&y.to_vec().unwrap(), &[20., 40., 60.]));
    // a failing capture body ends the capture and returns its error; the context stays usable
    let e = ctx.capture_graph(|| Err(flame::Error::new(Status::ERROR_UNSUPPORTED, "body failed"))).err().unwrap();
    assert_eq!(e.status, Status::ERROR_UNSUPPORTED);
    assert!(close(&(&x + 1.0).unwrap().to_vec().unwrap(), &[11., 21., 31.]));
}

#[test]
fn fused_expressions() {
    let ctx = ctx_or_skip!();
    let f = Fused::compile(&ctx, "x0 * x1 + 1", 2).unwrap();
    let a = leaf(&ctx, &[1.0, 2.0, 3.0], &[3]);
    let b = ctx.from_slice(&[4.0f32, 5.0, 6.0], &[3]).unwrap();
    let y = f.call(&[&a, &b]).unwrap();
    assert!(close(&y.to_vec().unwrap(), &[5., 11., 19.]));
    y.sum_all().unwrap().backward().unwrap();
    assert!(close(&a.grad().unwrap().unwrap().to_vec().unwrap(), &[4., 5., 6.]));
    assert_eq!(f.call(&[&a]).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    let e = Fused::compile(&ctx, "x0 +* 1", 1).err().unwrap();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("column"), "{}", e.message);
}

#[test]
fn autocast_takes_and_returns_option_dtype() {
    let ctx = ctx_or_skip!();
    assert_eq!(ctx.autocast().unwrap(), None);
    assert_eq!(ctx.set_autocast(Some(DType::BF16)).unwrap(), None);
    assert_eq!(ctx.autocast().unwrap(), Some(DType::BF16));
    assert_eq!(ctx.set_autocast(Some(DType::F32)).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(ctx.set_autocast(None).unwrap(), Some(DType::BF16));
    assert_eq!(ctx.autocast().unwrap(), None);
}

#[test]
fn parameter_list_round_trip() {
    let ctx = ctx_or_skip!();
    let dir = std::env::temp_dir().join(format!("flame_rs_params_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("p.safetensors");
    let a = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = ctx.from_slice(&[4.0f32, 5.0], &[2]).unwrap();
    let mut p = flame::Params::new(&ctx).unwrap();
    p.add("a", &a).unwrap();
    p.add("b.weight", &b).unwrap();
    assert_eq!(p.add("a", &b).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);  // duplicate name
    assert_eq!(p.len().unwrap(), 2);
    assert_eq!(p.name(1).unwrap(), "b.weight");
    assert!(p.find("c").unwrap().is_none());
    p.save_safetensors(&path, &[("format", "pt")]).unwrap();
    // a fresh list of zeros loads the saved values in place
    let a2 = ctx.zeros(&[3], DType::F32).unwrap();
    let b2 = ctx.zeros(&[2], DType::F32).unwrap();
    let mut q = flame::Params::new(&ctx).unwrap();
    q.add("a", &a2).unwrap();
    q.add("b.weight", &b2).unwrap();
    q.load_safetensors(&path, flame::ParamsLoad::STRICT).unwrap();
    assert_eq!(a2.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(q.find("b.weight").unwrap().unwrap().to_vec::<f32>().unwrap(), vec![4.0, 5.0]);
    assert_eq!(q.tensors().unwrap().len(), 2);
    // strict: an extra entry the file lacks is an error and nothing changes
    let c = ctx.zeros(&[1], DType::F32).unwrap();
    q.add("c", &c).unwrap();
    a2.copy_from_slice(&[9.0f32, 9.0, 9.0]).unwrap();
    assert_eq!(q.load_safetensors(&path, flame::ParamsLoad::STRICT).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(a2.to_vec::<f32>().unwrap(), vec![9.0, 9.0, 9.0]);
    q.load_safetensors(&path, flame::ParamsLoad::ALLOW_MISSING).unwrap();
    assert_eq!(a2.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    std::fs::remove_dir_all(&dir).ok();
}
