//! Shared helpers: the GPU gate.
#![allow(dead_code)]
use flame::{Context, Status};

/// True when FLAME_REQUIRE_GPU=1: GPU tests must run and a failing context is a test failure.
pub fn require_gpu() -> bool {
    std::env::var("FLAME_REQUIRE_GPU").map(|v| v == "1").unwrap_or(false)
}

/// A context for GPU tests, or None (test skipped) when no GPU is usable and none is required.
pub fn gpu() -> Option<Context> {
    match Context::new() {
        Ok(c) => Some(c),
        Err(e) if !require_gpu() => {
            assert!(
                e.status == Status::ERROR_NO_DRIVER || e.status == Status::ERROR_NO_DEVICE || e.status == Status::ERROR_CUDA,
                "unexpected context error without GPU: {e}"
            );
            eprintln!("skipping GPU test: {e}");
            None
        }
        Err(e) => panic!("FLAME_REQUIRE_GPU=1 but no context: {e}"),
    }
}
