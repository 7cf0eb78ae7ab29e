//! LoRA fine-tuning from Rust: the counterpart of examples/lora_finetune.c (and of
//! bindings/csharp/LoraFinetune.cs) with the same claims, on a model small enough to train its own
//! base first (the C example needs a GPT file written by train_gpt; this one needs nothing).
//!
//! - base: an MLP 4 -> 64 -> 64 -> 1 (SiLU) trained with AdamW on task A, y = sin(2 x0) + x1 x2,
//!   then frozen (detached: nothing of the base requires grad)
//! - LoRA: a [`flame::Lora`] (rank --rank, alpha --alpha; A random, B zero, so the adapted model
//!   starts as the base) on each of the three linear layers, trained with AdamW on task B, which
//!   adds 0.5 cos(3 x3) to task A
//! - save: only the adapters, to safetensors (--out): "<layer>.lora_A" [rank, in] and
//!   "<layer>.lora_B" [out, rank], with rank and alpha as metadata
//! - reload: new adapters of the same rank over the same frozen base, A and B set from the file;
//!   then merged into the weights for inference
//!
//! The claims, checked at the end (exit status 1 when one fails):
//! 1. the loss falls: task B's loss after training is at most --target-factor (default 0.9) times
//!    the base model's;
//! 2. the adapter file holds only adapters: 2 tensors per adapted layer, every name ending in
//!    ".lora_A" or ".lora_B";
//! 3. the reloaded model gives the same loss (within 1e-5 relative);
//! 4. the merged model gives that loss within 1e-4 relative, and unmerging restores the weights.
//!
//! Exit status: 0 when they hold, 1 on a FLAME error or a failed claim, 2 without a GPU or driver.
//!
//! Run: FLAME_LIBRARY=/path/to/libflame.so.1 cargo run --release --example lora_finetune -- [--steps N]
//! [--rank R] [--alpha A] [--lr LR] [--seed S] [--out FILE] [--target-factor F]
use flame::{
    save_safetensors, Activation, Context, ContextOptions, DType, Error, Lora, Optimizer, OptimizerKind,
    OptimizerOptions, Reduction, Result, SafetensorsFile, Status, Tensor,
};

const N: usize = 2048;
const IN: usize = 4;
const HIDDEN: i64 = 64;
const LAYER_NAMES: [&str; 3] = ["fc1", "fc2", "head"];

fn inputs(seed: u64) -> Vec<f32> {
    let mut s = 0x9E3779B97F4A7C15u64 ^ seed;
    (0..N * IN)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(2685821657736338717) >> 11) as f64 / 9007199254740992.0 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn targets(xs: &[f32], task_b: bool) -> Vec<f32> {
    (0..N)
        .map(|i| {
            let x = &xs[i * IN..(i + 1) * IN];
            let (x0, x1, x2, x3) = (x[0] as f64, x[1] as f64, x[2] as f64, x[3] as f64);
            ((2.0 * x0).sin() + x1 * x2 + if task_b { 0.5 * (3.0 * x3).cos() } else { 0.0 }) as f32
        })
        .collect()
}

/// The three linear layers; with adapters the forward goes through them.
fn forward(x: &Tensor, w: &[Tensor], b: &[Tensor], lora: Option<&[Lora]>) -> Result<Tensor> {
    let mut h = x.clone();
    for l in 0..3 {
        h = match lora {
            None => h.linear(&w[l], Some(&b[l]), Activation::None)?,
            Some(ad) => ad[l].forward(&h)?,
        };
        if l < 2 {
            h = h.silu()?;
        }
    }
    h.reshape(&[-1])
}

fn loss(ctx: &Context, x: &Tensor, y: &Tensor, w: &[Tensor], b: &[Tensor], lora: Option<&[Lora]>) -> Result<f64> {
    ctx.no_grad(|| forward(x, w, b, lora)?.mse_loss(y, Reduction::Mean)?.item())
}

fn adapters(w: &[Tensor], b: &[Tensor], rank: i64, alpha: f64) -> Result<Vec<Lora>> {
    (0..3).map(|l| Lora::new(&w[l], Some(&b[l]), rank, alpha)).collect()
}

fn fit(ctx: &Context, params: &[&Tensor], mut loss: impl FnMut() -> Result<Tensor>, steps: usize, lr: f64, what: &str) -> Result<()> {
    let mut oo = OptimizerOptions::new(OptimizerKind::AdamW)?;
    oo.lr = lr;
    oo.weight_decay = 0.0;
    let opt = Optimizer::new(ctx, &oo, params)?;
    for step in 0..steps {
        opt.set_lr(None, lr * 0.5 * (1.0 + (std::f64::consts::PI * step as f64 / steps as f64).cos()))?;
        let l = loss()?;
        l.backward()?;
        ctx.clip_grad_norm(params, 1.0, 2.0, false)?;
        opt.step()?;
        opt.zero_grad(true)?;
        if step % 100 == 0 || step + 1 == steps {
            println!("{} step {:4}  loss {:.5}", what, step, l.item()?);
        }
    }
    Ok(())
}

fn claim(ok: bool, what: &str) -> bool {
    println!("{}{}", if ok { "ok      " } else { "FAILED  " }, what);
    ok
}

struct Args {
    steps: usize,
    rank: i64,
    alpha: f64,
    lr: f64,
    seed: u64,
    out: std::path::PathBuf,
    target_factor: f64,
}

fn parse_args() -> Option<Args> {
    let mut a = Args {
        steps: 400,
        rank: 4,
        alpha: 8.0,
        lr: 1e-2,
        seed: 1,
        out: std::env::temp_dir().join("flame-rs-lora-adapters.safetensors"),
        target_factor: 0.9,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    if v.len() % 2 != 0 {
        return None;
    }
    for kv in v.chunks(2) {
        let val = &kv[1];
        match kv[0].as_str() {
            "--steps" => a.steps = val.parse().ok()?,
            "--rank" => a.rank = val.parse().ok()?,
            "--alpha" => a.alpha = val.parse().ok()?,
            "--lr" => a.lr = val.parse().ok()?,
            "--seed" => a.seed = val.parse().ok()?,
            "--out" => a.out = val.into(),
            "--target-factor" => a.target_factor = val.parse().ok()?,
            _ => return None,
        }
    }
    if a.steps == 0 || a.rank <= 0 {
        return None;
    }
    Some(a)
}

fn run(ctx: &Context, a: &Args) -> Result<bool> {
    println!("lora_finetune on {}: MLP 4-64-64-1, rank {}, alpha {}", ctx.device_name()?, a.rank, a.alpha);
    let xs = inputs(a.seed);
    let x = ctx.from_slice(&xs, &[N as i64, IN as i64])?;
    let ya = ctx.from_slice(&targets(&xs, false), &[N as i64])?;
    let yb = ctx.from_slice(&targets(&xs, true), &[N as i64])?;

    // ---- the base model, trained on task A, then frozen ----
    let dims = [IN as i64, HIDDEN, HIDDEN, 1];
    let mut w = Vec::new();
    let mut b = Vec::new();
    for l in 0..3 {
        let wl = (&ctx.randn(&[dims[l + 1], dims[l]], DType::F32)? * (1.0 / (dims[l] as f64).sqrt()))?;
        let bl = ctx.zeros(&[dims[l + 1]], DType::F32)?;
        wl.set_requires_grad(true)?;
        bl.set_requires_grad(true)?;
        w.push(wl);
        b.push(bl);
    }
    {
        let trainable: Vec<&Tensor> = w.iter().chain(b.iter()).collect();
        fit(ctx, &trainable, || forward(&x, &w, &b, None)?.mse_loss(&ya, Reduction::Mean), 2 * a.steps, 1e-2, "base")?;
    }
    let w: Vec<Tensor> = w.iter().map(|t| t.detach()).collect::<Result<_>>()?;
    let b: Vec<Tensor> = b.iter().map(|t| t.detach()).collect::<Result<_>>()?;
    let base_loss = loss(ctx, &x, &yb, &w, &b, None)?;
    println!("base model: task A loss {:.5}, task B loss {:.5}", loss(ctx, &x, &ya, &w, &b, None)?, base_loss);

    // ---- adapters trained on task B ----
    let lora = adapters(&w, &b, a.rank, a.alpha)?;
    let mut adapter_params = Vec::new();
    for ad in &lora {
        let (ta, tb) = ad.adapters()?;
        adapter_params.push(ta);
        adapter_params.push(tb);
    }
    if (loss(ctx, &x, &yb, &w, &b, Some(&lora))? - base_loss).abs() > 1e-5 * base_loss {
        return Err(Error::new(Status::ERROR_INTERNAL, "check failed: new adapters (B = 0) change nothing"));
    }
    {
        let params: Vec<&Tensor> = adapter_params.iter().collect();
        fit(ctx, &params, || forward(&x, &w, &b, Some(&lora))?.mse_loss(&yb, Reduction::Mean), a.steps, a.lr, "lora")?;
    }
    let tuned = loss(ctx, &x, &yb, &w, &b, Some(&lora))?;

    // ---- save the adapters alone ----
    let mut names = Vec::new();
    for n in LAYER_NAMES {
        names.push(format!("{}.lora_A", n));
        names.push(format!("{}.lora_B", n));
    }
    let entries: Vec<(&str, &Tensor)> = names.iter().map(|s| s.as_str()).zip(adapter_params.iter()).collect();
    let (rank_s, alpha_s) = (a.rank.to_string(), a.alpha.to_string());
    save_safetensors(ctx, &a.out, &entries, &[("lora.rank", &rank_s), ("lora.alpha", &alpha_s)])?;

    // ---- reload into new adapters over the same frozen base ----
    let fresh = adapters(&w, &b, a.rank, a.alpha)?;
    let stored = {
        let f = SafetensorsFile::open(ctx, &a.out)?;
        for (l, n) in LAYER_NAMES.iter().enumerate() {
            let (ta, tb) = fresh[l].adapters()?;
            ta.copy_from_slice(&f.get(&format!("{}.lora_A", n))?.to_vec::<f32>()?)?;
            tb.copy_from_slice(&f.get(&format!("{}.lora_B", n))?.to_vec::<f32>()?)?;
        }
        f.names()?
    };
    let reloaded = loss(ctx, &x, &yb, &w, &b, Some(&fresh))?;
    let before = w[1].to_vec::<f32>()?;
    for ad in &fresh {
        ad.merge()?;
    }
    let merged = loss(ctx, &x, &yb, &w, &b, None)?;
    for ad in &fresh {
        ad.unmerge()?;
    }
    let after = w[1].to_vec::<f32>()?;

    println!(
        "task B loss: base {:.5}, tuned {:.5}, reloaded {:.5} ({}), merged {:.5}",
        base_loss,
        tuned,
        reloaded,
        if reloaded == tuned { "bit for bit" } else { "not bit for bit" },
        merged
    );
    let mut ok = claim(
        tuned <= a.target_factor * base_loss,
        &format!("1. the loss falls to {:.3} of the base's (target {})", tuned / base_loss, a.target_factor),
    );
    let only_adapters = stored.len() == 2 * 3 && stored.iter().all(|n| n.ends_with(".lora_A") || n.ends_with(".lora_B"));
    ok &= claim(only_adapters, &format!("2. the adapter file holds only adapters: {}", stored.join(", ")));
    ok &= claim((reloaded - tuned).abs() <= 1e-5 * tuned, "3. the reloaded model gives the same loss");
    ok &= claim(
        (merged - tuned).abs() <= 1e-4 * tuned && before == after,
        "4. the merged model gives that loss, and unmerging restores the weight",
    );
    let _ = std::fs::remove_file(&a.out);
    Ok(ok)
}

fn main() {
    let a = match parse_args() {
        Some(a) => a,
        None => {
            eprintln!("usage: lora_finetune [--steps N] [--rank R] [--alpha A] [--lr LR] [--seed S] [--out FILE] [--target-factor F]");
            std::process::exit(1);
        }
    };
    let ctx = match Context::with_options(&ContextOptions { seed: a.seed, ..Default::default() }) {
        Ok(c) => c,
        Err(e) if e.status == Status::ERROR_NO_DRIVER || e.status == Status::ERROR_NO_DEVICE => {
            eprintln!("lora_finetune: no GPU available: {}", e);
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("lora_finetune: {}", e);
            std::process::exit(1);
        }
    };
    match run(&ctx, &a) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("lora_finetune: {}", e);
            std::process::exit(1);
        }
    }
}
