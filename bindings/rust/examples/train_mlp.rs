//! Trains a small MLP (2 -> 16 -> 1, ReLU, logistic loss) on a synthetic XOR-quadrant data set.
//!
//! The hidden layer is `x @ w1 + b1` (flame_matmul on cuBLASLt), the output a dot product with w2;
//! the update is plain SGD written with tensor ops, and a closure hook clips the first layer's
//! gradient. (examples/train_mlp.c shows the fused flame_linear with AdamW from C.)
//!
//! Run: FLAME_LIBRARY=/path/to/libflame.so.1 cargo run --release --example train_mlp
use flame::{Context, DType, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const N: usize = 512;
const H: i64 = 16;

/// x: [N, D], w: [D, H] -> [N, H].
fn dense(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    &x.matmul(w)? + b
}

fn data() -> (Vec<f32>, Vec<f32>) {
    let mut s: u64 = 0x2545F4914F6CDD1D;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
    };
    let mut xs = Vec::with_capacity(2 * N);
    let mut ys = Vec::with_capacity(N);
    for _ in 0..N {
        let (a, b) = (rnd(), rnd());
        xs.push(a);
        xs.push(b);
        ys.push(if a * b > 0.0 { 1.0 } else { 0.0 });
    }
    (xs, ys)
}

fn run() -> Result<()> {
    println!("FLAME {} (ABI {})", flame::version()?, flame::abi_version()?);
    let ctx = Context::new()?;
    println!("device: {}", ctx.device_name()?);
    ctx.manual_seed(0)?;
    let (xs, ys) = data();
    let x = ctx.from_slice(&xs, &[N as i64, 2])?;
    let y = ctx.from_slice(&ys, &[N as i64])?;

    let mut w1 = (&ctx.randn(&[2, H], DType::F32)? * 1.0)?;
    let mut b1 = ctx.zeros(&[H], DType::F32)?;
    let mut w2 = (&ctx.randn(&[H], DType::F32)? * (1.0 / (H as f64).sqrt()))?;
    let mut b2 = ctx.zeros(&[1], DType::F32)?;
    let clipped = Arc::new(AtomicUsize::new(0));
    let lr = 0.5;

    for step in 0..=600 {
        for p in [&w1, &b1, &w2, &b2] {
            p.set_requires_grad(true)?;
        }
        // A closure hook: clip the first layer's gradient and count how often it bites.
        let c = clipped.clone();
        w1.register_hook(move |g| {
            let m = g.abs()?.max_all()?.item()?;
            if m > 1.0 {
                c.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(g.clamp(-1.0, 1.0)?));
            }
            Ok(None)
        })?
        .keep();

        let h = dense(&x, &w1, &b1)?.relu()?; // [N, H]
        let logits = (&(&h * &w2)?.sum(&[1], false)? + &b2)?; // [N]
        // binary cross-entropy with logits: softplus(z) - y z
        let loss = (&logits.softplus(1.0, 20.0)? - &(&y * &logits)?)?.mean(&[], false)?;
        loss.backward()?;

        if step % 100 == 0 {
            let acc = ctx.no_grad(|| {
                let pred = logits.gt(&ctx.scalar(0.0, DType::F32)?)?.to_dtype(DType::F32)?;
                pred.eq(&y)?.to_dtype(DType::F32)?.mean(&[], false)?.item()
            })?;
            println!("step {step:4}  loss {:.4}  accuracy {:.3}", loss.item()?, acc);
        }
        let sgd = |p: &Tensor| -> Result<Tensor> {
            let g = p.grad()?.expect("parameter has a gradient");
            ctx.no_grad(|| (p - &(&g * lr)?)?.detach())
        };
        w1 = sgd(&w1)?;
        b1 = sgd(&b1)?;
        w2 = sgd(&w2)?;
        b2 = sgd(&b2)?;
    }
    println!("first-layer gradient clipped in {} steps", clipped.load(Ordering::Relaxed));
    Ok(())
}

/// Exit status: 0 on success, 2 without a GPU or driver, 1 on any other error.
fn main() {
    if let Err(e) = run() {
        eprintln!("train_mlp: {}", e);
        let no_gpu = e.status == flame::Status::ERROR_NO_DRIVER || e.status == flame::Status::ERROR_NO_DEVICE;
        std::process::exit(if no_gpu { 2 } else { 1 });
    }
}
