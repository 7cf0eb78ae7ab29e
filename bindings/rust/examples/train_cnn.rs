//! Trains a small convolutional classifier on procedurally drawn shapes: the Rust twin of
//! examples/train_cnn.c (same data generator, model, optimizer, schedule and claim).
//!
//! - data: 32x32 RGB images of a filled circle, square or triangle at a random position, size and
//!   colour on a noisy background (examples/shapes_data.h, ported below); a fresh batch every step
//!   and a fixed held-out set from another part of the random stream
//! - model: three blocks of conv 3x3 (padding 'same') -> group norm -> SiLU, the first two followed
//!   by 2x2 max pooling, then adaptive average pooling to 1x1 and a linear head (3 classes)
//! - train: cross-entropy, AdamW (no weight decay on biases and norm parameters), warm-up + cosine,
//!   global gradient-norm clipping at 1.0; each step's intermediates are dropped with the step
//!
//! Exit status: 0 when the held-out accuracy reaches --target (default 0.95), 1 on a FLAME error or
//! a missed target, 2 without a GPU or driver.
//!
//! Run: FLAME_LIBRARY=/path/to/libflame.so.1 cargo run --release --example train_cnn -- [--steps N]
//! [--batch B] [--width C] [--lr LR] [--seed S] [--log K] [--target A]
use flame::{
    Activation, Context, ContextOptions, ConvOptions, DType, Optimizer, OptimizerKind, OptimizerOptions, Pool2dOptions,
    Reduction, Result, Status, Tensor,
};
use std::time::Instant;

const IMG: usize = 32;
const CLASSES: u64 = 3;
const BLOCKS: usize = 3;

// ---- the data set of examples/shapes_data.h ----

fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(2685821657736338717)
}

fn uniform(s: &mut u64) -> f64 {
    (next(s) >> 11) as f64 / 9007199254740992.0
}

fn draw_shape(s: &mut u64, c: u64, img: &mut [f32]) {
    let (cx, cy, r) = (8.0 + 16.0 * uniform(s), 8.0 + 16.0 * uniform(s), 4.0 + 4.0 * uniform(s));
    let col = [0.3 + 0.7 * uniform(s), 0.3 + 0.7 * uniform(s), 0.3 + 0.7 * uniform(s)];
    let ang = 2.0 * std::f64::consts::PI * uniform(s);
    for y in 0..IMG {
        for x in 0..IMG {
            let (dx, dy) = (x as f64 + 0.5 - cx, y as f64 + 0.5 - cy);
            let inside = match c {
                0 => dx * dx + dy * dy <= r * r,
                1 => dx.abs() <= r * 0.85 && dy.abs() <= r * 0.85,
                _ => (0..3).all(|e| {
                    let a = ang + e as f64 * 2.0 * std::f64::consts::PI / 3.0;
                    dx * a.cos() + dy * a.sin() <= r * 0.5
                }),
            };
            for (k, ck) in col.iter().enumerate() {
                let bg = 0.15 * uniform(s);
                img[(k * IMG + y) * IMG + x] = ((if inside { *ck } else { bg }) * 2.0 - 1.0) as f32;
            }
        }
    }
}

/// n images [n, 3, 32, 32] and their labels [n] (i64), uploaded.
fn batch(ctx: &Context, s: &mut u64, n: usize) -> Result<(Tensor, Tensor)> {
    let per = 3 * IMG * IMG;
    let mut imgs = vec![0f32; n * per];
    let mut labels = vec![0i64; n];
    for i in 0..n {
        let c = next(s) % CLASSES;
        labels[i] = c as i64;
        draw_shape(s, c, &mut imgs[i * per..(i + 1) * per]);
    }
    Ok((
        ctx.from_slice(&imgs, &[n as i64, 3, IMG as i64, IMG as i64])?,
        ctx.from_slice(&labels, &[n as i64])?,
    ))
}

// ---- the model ----

struct Model {
    conv_w: Vec<Tensor>,
    conv_b: Vec<Tensor>,
    gn_w: Vec<Tensor>,
    gn_b: Vec<Tensor>,
    head_w: Tensor,
    head_b: Tensor,
    channels: i64,
    same: ConvOptions,
    pool: Pool2dOptions,
}

fn leaf(ctx: &Context, shape: &[i64], scale: f64, fill: f64) -> Result<Tensor> {
    let t = if scale > 0.0 { (&ctx.randn(shape, DType::F32)? * scale)? } else { ctx.full(shape, DType::F32, fill)? };
    t.set_requires_grad(true)?;
    Ok(t)
}

impl Model {
    fn new(ctx: &Context, width: i64) -> Result<Model> {
        let ch = [3, width, 2 * width, 2 * width];
        let mut m = Model {
            conv_w: vec![],
            conv_b: vec![],
            gn_w: vec![],
            gn_b: vec![],
            head_w: leaf(ctx, &[CLASSES as i64, ch[BLOCKS]], 1.0 / (ch[BLOCKS] as f64).sqrt(), 0.0)?,
            head_b: leaf(ctx, &[CLASSES as i64], 0.0, 0.0)?,
            channels: ch[BLOCKS],
            same: ConvOptions { padding_same: true, ..ConvOptions::default() },
            pool: Pool2dOptions::new(2, 2),
        };
        for b in 0..BLOCKS {
            m.conv_w.push(leaf(ctx, &[ch[b + 1], ch[b], 3, 3], (2.0 / (ch[b] as f64 * 9.0)).sqrt(), 0.0)?);
            m.conv_b.push(leaf(ctx, &[ch[b + 1]], 0.0, 0.0)?);
            m.gn_w.push(leaf(ctx, &[ch[b + 1]], 0.0, 1.0)?);
            m.gn_b.push(leaf(ctx, &[ch[b + 1]], 0.0, 0.0)?);
        }
        Ok(m)
    }

    /// logits [N, 3].
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut cur = x.clone();
        for b in 0..BLOCKS {
            cur = cur
                .conv2d(&self.conv_w[b], Some(&self.conv_b[b]), &self.same)?
                .group_norm(8, Some(&self.gn_w[b]), Some(&self.gn_b[b]), 1e-5, false)?
                .silu()?;
            if b + 1 < BLOCKS {
                cur = cur.max_pool2d(&self.pool)?;
            }
        }
        cur.adaptive_avg_pool2d(1, 1)?.reshape(&[-1, self.channels])?.linear(&self.head_w, Some(&self.head_b), Activation::None)
    }
}

fn accuracy(ctx: &Context, m: &Model, x: &Tensor, y: &Tensor, n: usize) -> Result<f64> {
    ctx.no_grad(|| Ok(m.forward(x)?.argmax(1, false)?.eq(y)?.to_dtype(DType::F32)?.sum_all()?.item()? / n as f64))
}

struct Args {
    steps: usize,
    batch: usize,
    width: i64,
    lr: f64,
    seed: u64,
    log: usize,
    target: f64,
}

const USAGE: &str = "usage: train_cnn [--steps N] [--batch B] [--width C (a multiple of 8)] [--lr LR] [--seed S] [--log K] [--target A]";

fn parse_args() -> Option<Args> {
    let mut a = Args { steps: 600, batch: 128, width: 32, lr: 3e-3, seed: 1, log: 50, target: 0.95 };
    let v: Vec<String> = std::env::args().skip(1).collect();
    if v.len() % 2 != 0 {
        return None;
    }
    for kv in v.chunks(2) {
        let val = &kv[1];
        match kv[0].as_str() {
            "--steps" => a.steps = val.parse().ok()?,
            "--batch" => a.batch = val.parse().ok()?,
            "--width" => a.width = val.parse().ok()?,
            "--lr" => a.lr = val.parse().ok()?,
            "--seed" => a.seed = val.parse().ok()?,
            "--log" => a.log = val.parse().ok()?,
            "--target" => a.target = val.parse().ok()?,
            _ => return None,
        }
    }
    if a.steps == 0 || a.batch == 0 || a.width < 8 || a.width % 8 != 0 || a.log == 0 || a.lr <= 0.0 {
        return None;
    }
    Some(a)
}

fn train(ctx: &Context, a: &Args) -> Result<bool> {
    const HELD_OUT: usize = 1024;
    println!(
        "train_cnn on {}: shapes 32x32, batch {}, width {}, {} steps, AdamW lr {}",
        ctx.device_name()?,
        a.batch,
        a.width,
        a.steps,
        a.lr
    );
    let (mut test_rng, mut train_rng) = (0xD1B54A32D192ED03u64 ^ a.seed, 0x8CB92BA72F3D8DD7u64 ^ a.seed);
    let (xte, yte) = batch(ctx, &mut test_rng, HELD_OUT)?;
    let m = Model::new(ctx, a.width)?;
    let mut decayed: Vec<&Tensor> = m.conv_w.iter().collect();
    decayed.push(&m.head_w);
    let mut plain: Vec<&Tensor> = vec![];
    for b in 0..BLOCKS {
        plain.extend([&m.conv_b[b], &m.gn_w[b], &m.gn_b[b]]);
    }
    plain.push(&m.head_b);
    let all: Vec<&Tensor> = decayed.iter().chain(plain.iter()).copied().collect();
    let mut oo = OptimizerOptions::new(OptimizerKind::AdamW)?;
    oo.lr = a.lr;
    oo.weight_decay = 1e-4;
    let opt = Optimizer::new(ctx, &oo, &decayed)?;
    oo.weight_decay = 0.0;
    opt.add_param_group(&oo, &plain)?;
    let mut clock = Instant::now();
    let mut since = 0usize;
    for step in 0..a.steps {
        let warm = a.steps / 20 + 1;
        let p = (step as f64 - warm as f64) / (a.steps.saturating_sub(warm)).max(1) as f64;
        let lr = if step < warm {
            a.lr * (step + 1) as f64 / warm as f64
        } else {
            a.lr * (0.01 + 0.99 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
        };
        let (x, y) = batch(ctx, &mut train_rng, a.batch)?;
        opt.set_lr(None, lr)?;
        let loss = m.forward(&x)?.cross_entropy(&y, None, -100, 0.0, Reduction::Mean)?;
        loss.backward()?;
        ctx.clip_grad_norm(&all, 1.0, 2.0, false)?;
        opt.step()?;
        opt.zero_grad(true)?;
        since += 1;
        if step % a.log == 0 || step + 1 == a.steps {
            let lv = loss.item()?;
            let sec = clock.elapsed().as_secs_f64();
            let ms = ctx.memory_stats()?;
            println!(
                "step {:4}  loss {:.4}  lr {:.2e}  {:7.0} images/s  {:.2} ms/step  memory {:.1} MiB (peak {:.1})",
                step,
                lv,
                lr,
                since as f64 * a.batch as f64 / sec,
                1e3 * sec / since as f64,
                ms.bytes_in_use as f64 / 1048576.0,
                ms.peak_bytes_in_use as f64 / 1048576.0
            );
            clock = Instant::now();
            since = 0;
        }
    }
    let acc = accuracy(ctx, &m, &xte, &yte, HELD_OUT)?;
    println!("held-out accuracy: {:.2}% over {} images (target {:.0}%)", 100.0 * acc, HELD_OUT, 100.0 * a.target);
    if acc < a.target {
        eprintln!("train_cnn: held-out accuracy {:.4} is below the target {:.4}", acc, a.target);
    }
    Ok(acc >= a.target)
}

fn main() {
    let a = match parse_args() {
        Some(a) => a,
        None => {
            eprintln!("{}", USAGE);
            std::process::exit(1);
        }
    };
    let ctx = match Context::with_options(&ContextOptions { seed: a.seed, ..Default::default() }) {
        Ok(c) => c,
        Err(e) if e.status == Status::ERROR_NO_DRIVER || e.status == Status::ERROR_NO_DEVICE => {
            eprintln!("train_cnn: no GPU available: {}", e);
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("train_cnn: {}", e);
            std::process::exit(1);
        }
    };
    match train(&ctx, &a) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("train_cnn: {}", e);
            std::process::exit(1);
        }
    }
}
