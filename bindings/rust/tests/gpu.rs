//! GPU tests: skipped unless a context can be created; mandatory with FLAME_REQUIRE_GPU=1.
mod common;

use flame::{sys, DType, Status, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

#[test]
fn context_queries() {
    let ctx = ctx_or_skip!();
    assert!(!ctx.device_name().unwrap().is_empty());
    let (major, _) = ctx.compute_capability().unwrap();
    assert!(major >= 3);
    ctx.synchronize().unwrap();
    assert!(flame::device_count().unwrap() >= 1);
    let _ = ctx.memory_stats().unwrap();
}

#[test]
fn roundtrip_shape_dtype() {
    let ctx = ctx_or_skip!();
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let t = Tensor::from_slice(&ctx, &data, &[2, 3]).unwrap();
    assert_eq!(t.shape().unwrap(), vec![2, 3]);
    assert_eq!(t.strides().unwrap(), vec![3, 1]);
    assert_eq!(t.dtype().unwrap(), DType::F32);
    assert_eq!(t.numel().unwrap(), 6);
    assert_eq!(t.to_vec::<f32>().unwrap(), data);
    assert_eq!(t.to_vec::<f64>().unwrap_err().status, Status::ERROR_DTYPE_MISMATCH);
    let tt = t.transpose(0, 1).unwrap();
    assert_eq!(tt.shape().unwrap(), vec![3, 2]);
    assert_eq!(tt.to_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
    let c = t.clone();
    drop(t);
    assert_eq!(c.to_vec::<f32>().unwrap(), data);
    let s = ctx.scalar(2.5, DType::F32).unwrap();
    assert_eq!(s.item().unwrap(), 2.5);
}

#[test]
fn arithmetic_and_reductions() {
    let ctx = ctx_or_skip!();
    let a = ctx.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = ctx.from_slice(&[10.0f32, 20.0], &[2]).unwrap();
    assert!(close(&(&a + &b).unwrap().to_vec().unwrap(), &[11., 22., 13., 24.]));
    assert!(close(&(&a - &b).unwrap().to_vec().unwrap(), &[-9., -18., -7., -16.]));
    assert!(close(&(&a * &b).unwrap().to_vec().unwrap(), &[10., 40., 30., 80.]));
    assert!(close(&(&a / &b).unwrap().to_vec().unwrap(), &[0.1, 0.1, 0.3, 0.2]));
    assert!(close(&(&a * 2.0).unwrap().to_vec().unwrap(), &[2., 4., 6., 8.]));
    assert!(close(&(1.0 - &a).unwrap().to_vec().unwrap(), &[0., -1., -2., -3.]));
    assert!(close(&(-&a).unwrap().to_vec().unwrap(), &[-1., -2., -3., -4.]));
    assert!(close(&a.sum(&[0], false).unwrap().to_vec().unwrap(), &[4., 6.]));
    assert!(close(&a.mean(&[1], true).unwrap().to_vec().unwrap(), &[1.5, 3.5]));
    assert_eq!(a.sum_all().unwrap().item().unwrap(), 10.0);
    assert_eq!(a.max(&[], false).unwrap().item().unwrap(), 4.0);
    assert!(close(&a.exp().unwrap().log().unwrap().to_vec().unwrap(), &[1., 2., 3., 4.]));
    assert_eq!(a.argmax(sys::FLAME_DIM_ALL, false).unwrap().to_vec::<i64>().unwrap(), vec![3]);
    let bad = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let e = (&a + &bad).unwrap_err();
    assert_eq!(e.status, Status::ERROR_SHAPE_MISMATCH);
    assert!(!e.message.is_empty());
    let cat = Tensor::cat(&[&a, &a], 0).unwrap();
    assert_eq!(cat.shape().unwrap(), vec![4, 2]);
    let parts = cat.split(3, 0).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[1].shape().unwrap(), vec![1, 2]);
    assert_eq!(cat.chunk(2, 0).unwrap().len(), 2);
}

#[test]
fn autograd_backward_and_grad() {
    let ctx = ctx_or_skip!();
    let x = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    x.set_requires_grad(true).unwrap();
    assert!(x.requires_grad().unwrap() && x.is_leaf().unwrap());
    let y = (&x * &x).unwrap().sum_all().unwrap();
    assert!(!y.is_leaf().unwrap());
    y.backward().unwrap();
    assert!(close(&x.grad().unwrap().unwrap().to_vec().unwrap(), &[2., 4., 6.]));
    assert_eq!(y.backward().unwrap_err().status, Status::ERROR_GRAPH_FREED);
    x.zero_grad().unwrap();
    assert!(close(&x.grad().unwrap().unwrap().to_vec().unwrap(), &[0., 0., 0.]));
    x.set_grad(None).unwrap();
    assert!(x.grad().unwrap().is_none());
    let z = (&x * 3.0).unwrap().sum_all().unwrap();
    let g = ctx.grad(&[&z], None, &[&x], 0).unwrap();
    assert!(close(&g[0].as_ref().unwrap().to_vec().unwrap(), &[3., 3., 3.]));
    let w = ctx.no_grad(|| &x * 2.0).unwrap();
    assert!(!w.requires_grad().unwrap());
    assert!(ctx.is_grad_enabled().unwrap());
}

#[test]
fn closure_hooks() {
    let ctx = ctx_or_skip!();
    let x = ctx.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    x.set_requires_grad(true).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let (c, guard) = (calls.clone(), OnDrop(dropped.clone()));
    let hook = x
        .register_hook(move |g| {
            let _keep = &guard;
            c.fetch_add(1, Ordering::SeqCst);
            Ok(Some((g * 10.0)?))
        })
        .unwrap();
    let post_calls = Arc::new(AtomicUsize::new(0));
    let pc = post_calls.clone();
    let post = x
        .register_post_accumulate_grad_hook(move |leaf| {
            assert!(leaf.grad()?.is_some());
            pc.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    (&x * &x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(post_calls.load(Ordering::SeqCst), 1);
    assert!(close(&x.grad().unwrap().unwrap().to_vec().unwrap(), &[20., 40.]));
    hook.remove();
    post.remove();
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "closure dropped exactly once on remove");

    // An Err from the closure stops backward with its status and message.
    x.set_grad(None).unwrap();
    let h = x.register_hook(|_| Err(flame::Error::new(Status::ERROR_INVALID_ARGUMENT, "nope from rust"))).unwrap();
    let e = (&x * 2.0).unwrap().sum_all().unwrap().backward().unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("nope from rust"), "{}", e.message);
    drop(h);

    // A panic is caught at the FFI boundary.
    let h = x.register_hook(|_| panic!("boom in hook")).unwrap();
    let e = (&x * 2.0).unwrap().sum_all().unwrap().backward().unwrap_err();
    assert_eq!(e.status, Status::ERROR_INTERNAL);
    assert!(e.message.contains("boom in hook"), "{}", e.message);
    drop(h);

    // The closure goes with the tensor when the hook is kept.
    let d2 = Arc::new(AtomicUsize::new(0));
    let g2 = OnDrop(d2.clone());
    let y = ctx.from_slice(&[1.0f32], &[1]).unwrap();
    y.set_requires_grad(true).unwrap();
    y.register_hook(move |_| {
        let _k = &g2;
        Ok(None)
    })
    .unwrap()
    .keep();
    drop(y);
    assert_eq!(d2.load(Ordering::SeqCst), 1);
}

#[test]
fn threads_share_a_context() {
    let ctx = Arc::new(ctx_or_skip!());
    let t = Arc::new(ctx.ones(&[1024], DType::F32).unwrap());
    let hs: Vec<_> = (0..4)
        .map(|i| {
            let (ctx, t) = (ctx.clone(), t.clone());
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let s = (&*t * (i as f64)).unwrap().sum_all().unwrap().item().unwrap();
                    assert_eq!(s, 1024.0 * i as f64);
                }
                ctx.synchronize().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn training_loop_with_closure_hook() {
    let ctx = ctx_or_skip!();
    // y = 3x - 1, fitted by gradient descent; a hook clips each gradient of w.
    let xs: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let ys: Vec<f32> = xs.iter().map(|x| 3.0 * x - 1.0).collect();
    let x = ctx.from_slice(&xs, &[64]).unwrap();
    let y = ctx.from_slice(&ys, &[64]).unwrap();
    let mut w = ctx.zeros(&[1], DType::F32).unwrap();
    let mut b = ctx.zeros(&[1], DType::F32).unwrap();
    let hook_calls = Arc::new(AtomicUsize::new(0));
    let mut loss_v = f64::INFINITY;
    for _ in 0..300 {
        w.set_requires_grad(true).unwrap();
        b.set_requires_grad(true).unwrap();
        let hc = hook_calls.clone();
        w.register_hook(move |g| {
            hc.fetch_add(1, Ordering::SeqCst);
            Ok(Some(g.clamp(-5.0, 5.0)?))
        })
        .unwrap()
        .keep();
        let pred = (&(&x * &w).unwrap() + &b).unwrap();
        let loss = (&pred - &y).unwrap().square().unwrap().mean(&[], false).unwrap();
        loss.backward().unwrap();
        loss_v = loss.item().unwrap();
        let (gw, gb) = (w.grad().unwrap().unwrap(), b.grad().unwrap().unwrap());
        w = ctx.no_grad(|| &w - &(&gw * 0.3)?).unwrap().detach().unwrap();
        b = ctx.no_grad(|| &b - &(&gb * 0.3)?).unwrap().detach().unwrap();
    }
    assert_eq!(hook_calls.load(Ordering::SeqCst), 300);
    assert!(loss_v < 1e-3, "loss {loss_v}");
    assert!((w.item().unwrap() - 3.0).abs() < 0.05);
    assert!((b.item().unwrap() + 1.0).abs() < 0.05);
}

#[test]
fn safetensors_roundtrip() {
    let ctx = ctx_or_skip!();
    let dir = std::env::temp_dir().join(format!("flame-rs-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    let w = Tensor::from_slice(&ctx, &[1.0f32, -2.0, 3.5, 4.0, 5.0, -6.0], &[2, 3]).unwrap();
    let wt = w.transpose(0, 1).unwrap(); // non-contiguous: written row-major
    let ids = Tensor::from_slice(&ctx, &[7i64, -8], &[2]).unwrap();
    flame::save_safetensors(&ctx, &path, &[("w", &w), ("wt", &wt), ("ids", &ids)], &[("format", "pt")]).unwrap();
    let f = flame::SafetensorsFile::open(&ctx, &path).unwrap();
    assert_eq!(f.names().unwrap(), vec!["ids", "w", "wt"]);
    assert_eq!(f.info("wt").unwrap(), (DType::F32, vec![3, 2]));
    assert_eq!(f.get("wt").unwrap().to_vec::<f32>().unwrap(), vec![1.0, 4.0, -2.0, 5.0, 3.5, -6.0]);
    assert_eq!(f.get("ids").unwrap().to_vec::<i64>().unwrap(), vec![7, -8]);
    assert_eq!(f.metadata().unwrap(), vec![("format".to_string(), "pt".to_string())]);
    assert_eq!(f.metadata_value("absent").unwrap(), None);
    assert_eq!(f.get("absent").unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(f.get("a\0b").unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    drop(f);
    let e = flame::SafetensorsFile::open(&ctx, dir.join("missing")).err().unwrap();
    assert_eq!(e.status, Status::ERROR_IO);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn optimizer_sgd_step_and_zero_grad() {
    use flame::{Optimizer, OptimizerKind, OptimizerOptions};
    let ctx = ctx_or_skip!();
    let p0 = [1.0f32, -2.0, 3.0, 0.5];
    let g = [0.5f32, -1.0, 2.0, 4.0];
    let p = ctx.from_slice(&p0, &[4]).unwrap();
    p.set_requires_grad(true).unwrap();
    let q = ctx.from_slice(&[7.0f32], &[1]).unwrap();
    q.set_requires_grad(true).unwrap();
    let mut opts = OptimizerOptions::new(OptimizerKind::Sgd).unwrap();
    opts.lr = 0.1;
    let opt = Optimizer::new(&ctx, &opts, &[&p]).unwrap();
    opts.lr = 0.25;
    assert_eq!(opt.add_param_group(&opts, &[&q]).unwrap(), 1);
    assert_eq!((opt.lr(0).unwrap(), opt.lr(1).unwrap()), (0.1, 0.25));
    assert_eq!(opt.step_count().unwrap(), 0);

    // d/dp sum(p * g) = g; q has no gradient and is skipped.
    let gt = ctx.from_slice(&g, &[4]).unwrap();
    (&p * &gt).unwrap().sum_all().unwrap().backward().unwrap();
    opt.step().unwrap();
    assert_eq!(opt.step_count().unwrap(), 1);
    let want: Vec<f32> = p0.iter().zip(&g).map(|(p, g)| p - 0.1 * g).collect();
    assert!(close(&p.to_vec::<f32>().unwrap(), &want), "{:?} vs {want:?}", p.to_vec::<f32>().unwrap());
    assert_eq!(q.to_vec::<f32>().unwrap(), vec![7.0]);

    opt.zero_grad(false).unwrap();
    assert_eq!(p.grad().unwrap().expect("grad kept").to_vec::<f32>().unwrap(), vec![0.0; 4]);
    opt.zero_grad(true).unwrap();
    assert!(p.grad().unwrap().is_none());

    opt.set_lr(None, 0.5).unwrap();
    assert_eq!((opt.lr(0).unwrap(), opt.lr(1).unwrap()), (0.5, 0.5));
    opt.set_lr(Some(1), 0.05).unwrap();
    assert_eq!(opt.lr(1).unwrap(), 0.05);
    assert_eq!(opt.set_lr(Some(2), 0.1).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(opt.set_lr(None, -1.0).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(opt.lr(2).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    // A parameter may be in the optimizer only once.
    assert_eq!(opt.add_param_group(&opts, &[&p]).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    drop(opt);
    assert!(close(&p.to_vec::<f32>().unwrap(), &want)); // parameters outlive the optimizer
}

#[test]
fn scaled_dot_product_attention_uniform_scores() {
    use flame::AttentionOptions;
    let ctx = ctx_or_skip!();
    // q = k = 0: every score is equal, so each output row is the mean of the visible values.
    let q = ctx.from_slice(&[0.0f32; 8], &[1, 1, 2, 4]).unwrap();
    let k = ctx.from_slice(&[0.0f32; 12], &[1, 1, 3, 4]).unwrap();
    let v = ctx.from_slice(&[1.0f32, 10.0, 2.0, 20.0, 6.0, 60.0], &[1, 1, 3, 2]).unwrap();
    v.set_requires_grad(true).unwrap();
    let out = q.scaled_dot_product_attention(&k, &v, None, &AttentionOptions::default()).unwrap();
    assert_eq!(out.shape().unwrap(), vec![1, 1, 2, 2]);
    assert!(close(&out.to_vec::<f32>().unwrap(), &[3.0, 30.0, 3.0, 30.0]));
    let causal = AttentionOptions { causal: true, ..Default::default() };
    let out = q.scaled_dot_product_attention(&k, &v, None, &causal).unwrap();
    assert!(close(&out.to_vec::<f32>().unwrap(), &[1.0, 10.0, 1.5, 15.0]));
    out.sum_all().unwrap().backward().unwrap();
    // d sum(out) / dv: row 0 sees key 0 (weight 1), row 1 keys 0 and 1 (weights 1/2)
    assert!(close(&v.grad().unwrap().unwrap().to_vec::<f32>().unwrap(), &[1.5, 1.5, 0.5, 0.5, 0.0, 0.0]));
    let mask = ctx.from_slice(&[0.0f32, 0.0, -f32::INFINITY], &[3]).unwrap();
    let masked = q.scaled_dot_product_attention(&k, &v, Some(&mask), &AttentionOptions::default()).unwrap();
    assert!(close(&masked.to_vec::<f32>().unwrap(), &[1.5, 15.0, 1.5, 15.0]));
    let bad = AttentionOptions { dropout_p: 1.0, ..Default::default() };
    assert_eq!(q.scaled_dot_product_attention(&k, &v, None, &bad).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
}
