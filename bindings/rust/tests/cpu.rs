//! Tests that need the library but no GPU: loading, version, status strings, error paths.
mod common;

use flame::{sys, Context, ContextOptions, DType, Status, Tensor};

#[test]
fn loads_and_checks_version() {
    let v = flame::version().expect("library loads");
    let want = format!("{}.{}.{}", sys::FLAME_VERSION_MAJOR, sys::FLAME_VERSION_MINOR, sys::FLAME_VERSION_PATCH);
    assert_eq!(v, want);
    assert_eq!(flame::abi_version().unwrap(), sys::FLAME_ABI_VERSION);
    assert!(!flame::library_path().unwrap().is_empty());
}

#[test]
fn status_strings_match_header_names() {
    for (s, name) in Status::ALL {
        assert_eq!(s.name(), *name, "flame_status_string({})", s.0);
        assert_eq!(format!("{s:?}"), *name);
    }
    assert_eq!(format!("{:?}", Status(9999)), "Status(9999)");
    assert_eq!(Status::LOAD_FAILED.name(), "LOAD_FAILED");
}

#[test]
fn dtype_queries() {
    assert_eq!(DType::F32.size().unwrap(), 4);
    assert_eq!(DType::F32.name().unwrap(), "f32");
    assert_eq!(DType::F8E4M3.size().unwrap(), 1);
    assert_eq!(DType::F8E5M2.name().unwrap(), "f8_e5m2");
    assert_eq!(DType::try_from(sys::FLAME_DTYPE_F8_E4M3).unwrap(), DType::F8E4M3);
    // Raw values convert with a check: an unknown one is an error, not undefined behaviour.
    assert_eq!(DType::try_from(sys::FLAME_DTYPE_BF16).unwrap(), DType::BF16);
    assert_eq!(DType::try_from(1234).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(DType::BF16.raw(), sys::FLAME_DTYPE_BF16);
    assert_eq!(DType::BF16.c_name(), "FLAME_DTYPE_BF16");
    assert_eq!(flame::OptimizerKind::AdamW.raw(), sys::FLAME_OPTIMIZER_ADAMW);
    assert_eq!(flame::Activation::GeluTanh.raw(), sys::FLAME_ACTIVATION_GELU_TANH);
    assert_eq!(flame::ReduceOp::ALL.len(), sys::ReduceOp::ALL.len());
}

#[test]
fn error_message_roundtrip() {
    flame::set_error_message("hello from rust").unwrap();
    assert_eq!(flame::last_error_message().unwrap(), "hello from rust");
    flame::set_error_message("").unwrap();
    assert_eq!(flame::last_error_message().unwrap(), "");
}

#[test]
fn context_without_gpu_is_an_error_with_message() {
    match Context::new() {
        Ok(ctx) => {
            // A GPU is present: the context works.
            assert!(!ctx.device_name().unwrap().is_empty());
        }
        Err(e) => {
            assert!(!common::require_gpu(), "FLAME_REQUIRE_GPU=1 but {e}");
            assert!(matches!(e.status, Status::ERROR_NO_DRIVER | Status::ERROR_NO_DEVICE), "{e:?}");
            assert!(!e.message.is_empty(), "error carries the library's message");
            let shown = e.to_string();
            assert!(shown.starts_with("FLAME_ERROR_NO_"), "{shown}");
        }
    }
    let opts = ContextOptions { device: 4096, kernel_cache_dir: Some(String::new()), ..Default::default() };
    let e = Context::with_options(&opts).err().expect("device 4096 does not exist");
    assert!(matches!(e.status, Status::ERROR_NO_DRIVER | Status::ERROR_NO_DEVICE), "{e:?}");
}

#[test]
fn null_handles_are_errors_not_crashes() {
    let t = unsafe { Tensor::from_raw(std::ptr::null_mut()) };
    let e = t.add(&t).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT, "{e:?}");
    assert!(!e.message.is_empty());
    let e = (&t * 2.0).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(t.numel().unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(t.sum(&[0], false).unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(t.to_vec::<f32>().unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert!(t.backward().is_err());
    assert!(t.register_hook(|_| Ok(None)).is_err(), "failed registration frees the closure");
    let c = t.clone(); // retain(NULL) fails: a null tensor again, no panic
    drop(c);
    drop(t); // release(NULL) is a no-op
    assert!(flame::device_count().is_ok() || flame::device_count().unwrap_err().status == Status::ERROR_NO_DRIVER);
}

#[test]
fn send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Context>();
    assert_send_sync::<Tensor>();
    assert_send_sync::<flame::Hook>();
    assert_send_sync::<flame::Optimizer>();
    assert_send_sync::<flame::Error>();
}

#[test]
fn every_export_has_a_safe_wrapper() {
    // The check itself can fail: a symbol nobody wraps is reported.
    assert_eq!(flame::unwrapped(&["flame_add", "flame_no_such_export"]), vec!["flame_no_such_export".to_string()]);
    let missing = flame::unwrapped(flame::sys::SYMBOLS);
    assert!(missing.is_empty(), "exports without a safe Rust wrapper (add one to toolkit.rs and HAND_WRAPPED): {missing:?}");
    // the by-design list holds only the C handle scope
    for (export, _) in flame::NOT_WRAPPED_BY_DESIGN {
        assert!(flame::sys::SYMBOLS.contains(export) && export.starts_with("flame_scope_"), "NOT_WRAPPED_BY_DESIGN lists {export}");
    }
    // and every table entry names a real export, once
    let mut seen = std::collections::HashSet::new();
    for (export, wrapper) in flame::WRAPPED.iter().chain(flame::HAND_WRAPPED.iter()) {
        assert!(flame::sys::SYMBOLS.contains(export), "{wrapper} wraps unknown {export}");
        assert!(seen.insert(*export), "{export} listed twice");
    }
}

#[test]
fn dlpack_error_paths_without_gpu() {
    let t = unsafe { Tensor::from_raw(std::ptr::null_mut()) };
    assert_eq!(t.to_dlpack().unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    assert_eq!(t.to_dlpack_versioned().unwrap_err().status, Status::ERROR_INVALID_ARGUMENT);
    let api = flame::api().unwrap();
    let mut out = std::ptr::null_mut();
    let st = unsafe { (api.flame_tensor_from_dlpack)(std::ptr::null_mut(), std::ptr::null_mut(), &mut out) };
    assert_eq!(Status(st), Status::ERROR_INVALID_ARGUMENT);
    assert!(out.is_null());
    assert!(flame::last_error_message().unwrap().contains("flame_tensor_from_dlpack"));
    let st = unsafe { (api.flame_tensor_from_dlpack_versioned)(std::ptr::null_mut(), std::ptr::null_mut(), &mut out) };
    assert_eq!(Status(st), Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn optimizer_options_defaults_and_errors() {
    use flame::{OptimizerKind, OptimizerOptions};
    let sgd = OptimizerOptions::new(OptimizerKind::Sgd).unwrap();
    assert_eq!(sgd.kind, OptimizerKind::Sgd);
    assert_eq!((sgd.lr, sgd.weight_decay, sgd.momentum, sgd.dampening), (1e-3, 0.0, 0.0, 0.0));
    assert!(!sgd.nesterov && !sgd.amsgrad && !sgd.maximize && !sgd.master_weights && !sgd.stochastic_rounding);
    let adamw = OptimizerOptions::new(OptimizerKind::AdamW).unwrap();
    assert_eq!((adamw.weight_decay, adamw.beta1, adamw.beta2, adamw.eps), (1e-2, 0.9, 0.999, 1e-8));
    let lion = OptimizerOptions::new(OptimizerKind::Lion).unwrap();
    assert_eq!((lion.beta1, lion.beta2, lion.weight_decay), (0.9, 0.99, 0.0));
    let raw = lion.to_raw();
    assert_eq!(raw.struct_size, std::mem::size_of::<sys::flame_optimizer_options_t>());
    assert_eq!(raw.kind, sys::FLAME_OPTIMIZER_LION);
    let e = OptimizerKind::try_from(42).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("flame_optimizer_kind_t"), "{}", e.message);
}

#[test]
fn attention_options_defaults() {
    use flame::AttentionOptions;
    let d = AttentionOptions::default();
    let raw = d.to_raw().unwrap();
    assert_eq!(raw.struct_size, std::mem::size_of::<sys::flame_attention_options_t>());
    assert_eq!((raw.flags, raw.scale, raw.dropout_p), (0, 0.0, 0.0));
    let c = AttentionOptions { causal: true, scale: 0.5, dropout_p: 0.1 }.to_raw().unwrap();
    assert_eq!((c.flags, c.scale, c.dropout_p), (sys::FLAME_ATTENTION_CAUSAL, 0.5, 0.1));
}

#[test]
fn memory_estimate_without_gpu() {
    let tiny = r#"{"architecture": "FluxTransformer2DModel", "config": {"num_layers": 1, "num_single_layers": 1,
        "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 16,
        "in_channels": 16, "axes_dims_rope": [4, 6, 6]}, "options": {"dtype": "bf16"}, "height": 64, "width": 64}"#;
    let e = flame::estimate_memory(tiny).unwrap();
    assert_eq!(e.weights_bytes, 2 * e.parameter_count);
    assert!(e.trainable_count > 0 && e.activation_bytes > 0);
    let parts = e.weights_bytes + e.adapter_bytes + e.gradient_bytes + e.optimizer_bytes + e.activation_bytes + e.workspace_bytes;
    assert_eq!(e.total_bytes, parts);
    let err = flame::estimate_memory(r#"{"architecture": "CLIPTextModel"}"#).unwrap_err();
    assert_eq!(err.status, Status::ERROR_UNSUPPORTED);
}

#[test]
fn model_architectures_without_gpu() {
    let names = flame::known_architectures().unwrap();
    for want in ["CLIPTextModel", "CLIPTextModelWithProjection"] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert_eq!(flame::parse_json_string_array(&flame::known_architectures_json().unwrap()).unwrap(), names);
    // the reader of the JSON array: escapes decoded, anything else refused
    let p = flame::parse_json_string_array;
    assert_eq!(p(" [ ] ").unwrap(), Vec::<String>::new());
    assert_eq!(p(r#"["a", "b\"c\\", "\u00e9\ud83d\ude00\n"]"#).unwrap(), vec!["a", "b\"c\\", "é😀\n"]);
    for bad in ["", "[", "[\"a\"", "[\"a\",]", "[1]", "{}", "[\"a\"] x", "[\"\\q\"]", "[\"\\ud800\"]"] {
        assert!(p(bad).is_none(), "{bad:?} accepted");
    }
    // NULL handles through the raw table: errors, no crash; release(NULL) is a no-op
    let api = flame::api().unwrap();
    let mut m = std::ptr::null_mut();
    let st = unsafe { (api.flame_model_create)(std::ptr::null_mut(), b"CLIPTextModel\0".as_ptr().cast(), std::ptr::null(), std::ptr::null(), &mut m) };
    assert_eq!(Status(st), Status::ERROR_INVALID_ARGUMENT);
    assert!(m.is_null());
    unsafe { (api.flame_model_release)(std::ptr::null_mut()) };
    let st = unsafe { (api.flame_model_set_checkpointing)(std::ptr::null_mut(), 1) };
    assert_eq!(Status(st), Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn comm_rendezvous_of_one_rank_and_bad_arguments() {
    let mut id = flame::CommId { internal: [0; 128] };
    id.internal[5] = 42;
    // world_size 1: returns rank 0's id at once, without a network peer.
    let got = flame::Comm::rendezvous("127.0.0.1", 1, 0, 1, 1.0, &id).unwrap();
    assert_eq!(got.internal, id.internal);
    let e = flame::Comm::rendezvous("127.0.0.1", 0, 0, 2, 1.0, &id).unwrap_err();
    assert_eq!(e.status, Status::ERROR_INVALID_ARGUMENT);
    assert!(e.message.contains("master_port 0"), "{}", e.message);
    assert!(flame::Comm::rendezvous("a\0b", 1, 0, 1, 1.0, &id).is_err());
}
