//! GPU tests of [`flame::Model`]: a tiny CLIPTextModel made, run forward and backward, saved and
//! loaded back, and its error paths. Skipped unless a context can be created; mandatory with
//! FLAME_REQUIRE_GPU=1.
mod common;

use flame::{DType, Model, Status};

const CONFIG: &str = r#"{"vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"max_position_embeddings":16}"#;

macro_rules! ctx_or_skip {
    () => {
        match common::gpu() {
            Some(c) => c,
            None => return,
        }
    };
}

#[test]
fn clip_forward_backward_and_params() {
    let ctx = ctx_or_skip!();
    let model = Model::create(&ctx, "CLIPTextModel", Some(CONFIG), None).unwrap();
    assert_eq!(model.architecture().unwrap(), "CLIPTextModel");
    let config = model.config_json().unwrap();
    assert!(config.contains("\"hidden_size\":32") || config.contains("\"hidden_size\": 32"), "{config}");
    let params = model.params().unwrap();
    let entries = params.entries().unwrap();
    assert!(!entries.is_empty());
    let embedding = params.find("text_model.embeddings.token_embedding.weight").unwrap().expect("the transformers name");
    assert_eq!(embedding.shape().unwrap(), vec![100, 32]);
    for (name, p) in &entries {
        assert!(p.requires_grad().unwrap(), "{name} requires grad");
    }

    model.set_training(true).unwrap();
    model.set_checkpointing(1).unwrap();
    let ids = ctx.from_slice(&[1i64, 5, 7, 99, 3, 2, 8, 4], &[2, 4]).unwrap();
    let out = model.forward(&[("input_ids", &ids)]).unwrap();
    let hidden = out.find("last_hidden_state").unwrap().expect("last_hidden_state");
    assert_eq!(hidden.shape().unwrap(), vec![2, 4, 32]);
    assert_eq!(hidden.dtype().unwrap(), DType::F32);
    let pooled = out.find("pooler_output").unwrap().expect("pooler_output");
    assert_eq!(pooled.shape().unwrap(), vec![2, 32]);
    assert!(hidden.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    hidden.sum_all().unwrap().backward().unwrap();
    for (name, p) in &entries {
        // position embeddings past T=4 and unused token rows get zero gradient, but every parameter has one
        let g = p.grad().unwrap().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_eq!(g.shape().unwrap(), p.shape().unwrap(), "{name}");
        assert!(g.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()), "{name}");
    }
    let g = embedding.grad().unwrap().unwrap().to_vec::<f32>().unwrap();
    assert!(g[5 * 32..6 * 32].iter().any(|v| *v != 0.0), "token 5 was used");
    assert!(g[6 * 32..7 * 32].iter().all(|v| *v == 0.0), "token 6 was not");
}

#[test]
fn clip_save_and_load_round_trip() {
    let ctx = ctx_or_skip!();
    let model = Model::create(&ctx, "CLIPTextModel", Some(CONFIG), None).unwrap();
    let dir = std::env::temp_dir().join(format!("flame-rs-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clip.safetensors");
    model.save(&file).unwrap();
    let options = format!(r#"{{"architecture":"CLIPTextModel","config":{CONFIG}}}"#);
    let loaded = Model::load(&ctx, &file, Some(&options)).unwrap();
    assert_eq!(loaded.architecture().unwrap(), "CLIPTextModel");
    let (a, b) = (model.params().unwrap().entries().unwrap(), loaded.params().unwrap().entries().unwrap());
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec::<f32>().unwrap(), tb.to_vec::<f32>().unwrap(), "{na}");
    }
    // same weights, same outputs (up to the order of reductions)
    let ids = ctx.from_slice(&[4i64, 9, 2], &[1, 3]).unwrap();
    let ya = model.forward(&[("input_ids", &ids)]).unwrap().find("last_hidden_state").unwrap().unwrap();
    let yb = loaded.forward(&[("input_ids", &ids)]).unwrap().find("last_hidden_state").unwrap().unwrap();
    let (ya, yb) = (ya.to_vec::<f32>().unwrap(), yb.to_vec::<f32>().unwrap());
    assert!(ya.iter().zip(&yb).all(|(a, b)| (a - b).abs() <= 1e-6 + 1e-6 * b.abs()), "{ya:?} vs {yb:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_errors() {
    let ctx = ctx_or_skip!();
    let e = Model::create(&ctx, "NoSuchModel", None, None).err().expect("unknown architecture");
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("NoSuchModel") && e.message.contains("CLIPTextModel"), "{}", e.message);
    let e = Model::create(&ctx, "CLIPTextModel", Some("{not json"), None).err().expect("bad JSON");
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    let model = Model::create(&ctx, "CLIPTextModel", Some(CONFIG), None).unwrap();
    // missing input: the message names it
    let mask = ctx.ones(&[1, 3], DType::F32).unwrap();
    let e = model.forward(&[("attention_mask", &mask)]).err().expect("input_ids missing");
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("input_ids"), "{}", e.message);
    assert!(model.forward(&[]).is_err());
    assert_eq!(model.set_checkpointing(-1).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    let e = Model::load(&ctx, "/nonexistent/flame-model", None).err().expect("no such path");
    assert!(e.message.contains("/nonexistent/flame-model"), "{}", e.message);
}

#[test]
fn clip_original_layout_round_trip() {
    let ctx = ctx_or_skip!();
    // 64-wide heads, as the loader's CLIP detection reads them back.
    let config = r#"{"vocab_size":100,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":1,"max_position_embeddings":16}"#;
    let model = Model::create(&ctx, "CLIPTextModel", Some(config), None).unwrap();
    let dir = std::env::temp_dir().join(format!("flame-rs-model-orig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("clip_sgm.safetensors");
    model.save_layout(&file, "original").unwrap();
    let loaded = Model::load(&ctx, &file, None).unwrap();  // detected from the SGM names
    assert_eq!(loaded.architecture().unwrap(), "CLIPTextModel");
    let (a, b) = (model.params().unwrap().entries().unwrap(), loaded.params().unwrap().entries().unwrap());
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec::<f32>().unwrap(), tb.to_vec::<f32>().unwrap(), "{na}");
    }
    // A layout CLIPTextModel does not have, and a width the layout cannot hold: errors, no file.
    let bad = dir.join("bad.safetensors");
    assert!(model.save_layout(&bad, "bfl").is_err());
    let narrow = Model::create(&ctx, "CLIPTextModel", Some(CONFIG), None).unwrap();
    assert!(narrow.save_layout(&bad, "original").is_err());
    assert!(!bad.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn clip_lora_train_save_and_load() {
    // CLIP widths in kohya's key tables are multiples of 64 (64-wide heads)
    const LORA_CONFIG: &str = r#"{"vocab_size":100,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":1,"max_position_embeddings":16}"#;
    let ctx = ctx_or_skip!();
    let model = Model::create(&ctx, "CLIPTextModel", Some(LORA_CONFIG), None).unwrap();
    let ids = ctx.from_slice(&[4i64, 9, 2, 17], &[1, 4]).unwrap();
    let run = |m: &Model| -> Vec<f32> {
        m.forward(&[("input_ids", &ids)]).unwrap().find("last_hidden_state").unwrap().unwrap().to_vec::<f32>().unwrap()
    };
    let base = run(&model);
    let lora = model.add_lora(Some(r#"{"rank": 4, "alpha": 8}"#)).unwrap();
    let entries = lora.entries().unwrap();
    assert_eq!(entries.len(), 2 * 4 * 2, "q, k, v, out_proj of 2 layers, A and B each");
    assert!(entries[0].0.ends_with(".lora_A.weight"), "{}", entries[0].0);
    assert_eq!(run(&model), base, "a new adapter (B = 0) changes nothing");
    for (name, p) in model.params().unwrap().entries().unwrap() {
        assert!(!p.requires_grad().unwrap(), "{name} is frozen");
    }
    // give B values, then the adapter changes the output, and files carry it
    for (name, t) in &entries {
        if name.ends_with(".lora_B.weight") {
            let n: usize = t.shape().unwrap().iter().product::<i64>() as usize;
            let v: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 0.2).collect();
            t.copy_from_slice(&v).unwrap();
        }
    }
    let adapted = run(&model);
    assert!(adapted.iter().zip(&base).any(|(a, b)| (a - b).abs() > 1e-4));
    let dir = std::env::temp_dir().join(format!("flame-rs-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for format in ["kohya", "peft"] {
        let file = dir.join(format!("{format}.safetensors"));
        model.save_lora(None, &file, Some(&format!(r#"{{"format": "{format}"}}"#))).unwrap();
        let fresh = Model::create(&ctx, "CLIPTextModel", Some(LORA_CONFIG), None).unwrap();
        for ((_, dst), (_, src)) in fresh.params().unwrap().entries().unwrap().iter().zip(&model.params().unwrap().entries().unwrap()) {
            dst.copy_from_slice(&src.to_vec::<f32>().unwrap()).unwrap();
        }
        fresh.load_lora(&file, None).unwrap();
        let y = run(&fresh);
        assert!(y.iter().zip(&adapted).all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-5 * b.abs()), "{format}");
    }
    let err = model.add_lora(None).err().expect("\"default\" is in use");
    assert_eq!(err.status, Status::ERROR_INVALID_ARGUMENT);
    model.remove_lora(None).unwrap();
    assert_eq!(run(&model), base);
    // a DoRA adapter folded into the weights: the same output without it
    let dora = model.add_lora(Some(r#"{"name": "d", "rank": 4, "dora": true}"#)).unwrap();
    for (name, t) in &dora.entries().unwrap() {
        if name.ends_with(".lora_B.weight") {
            let n: usize = t.shape().unwrap().iter().product::<i64>() as usize;
            let v: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.53).cos() * 0.2).collect();
            t.copy_from_slice(&v).unwrap();
        }
    }
    let with_dora = run(&model);
    assert!(with_dora.iter().zip(&base).any(|(a, b)| (a - b).abs() > 1e-4));
    model.merge_lora(Some("d")).unwrap();
    assert!(model.lora_params(Some("d")).is_err(), "a merged adapter is gone");
    let merged = run(&model);
    assert!(merged.iter().zip(&with_dora).all(|(a, b)| (a - b).abs() <= 1e-4 + 1e-4 * b.abs()));
    assert_eq!(model.merge_lora(Some("d")).err().expect("no adapter d").status, Status::ERROR_INVALID_ARGUMENT);
    std::fs::remove_dir_all(&dir).unwrap();
}
