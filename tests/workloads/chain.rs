//! chain.rs: a Rust release-build call chain (no frame pointers).
//!
//! Expected stacks (innermost first), most samples:
//!   chain::rust_chain_leaf
//!   chain::rust_chain_inner
//!   chain::rust_chain_middle
//!   chain::rust_chain_outer
//!   chain::main
//!   (std runtime: std::rt::lang_start ... main, libc start)
//! (The crate is named after the file, `chain`.) Symbols are mangled; each
//! contains its function's name.
//!
//! Usage: chain_rs SECONDS (default 2), or chain_rs --work N (fixed work, for
//! benchmarks: N units of about a second of CPU on this project's 2-core VM).
//! Built with `rustc -C opt-level=2 -C force-frame-pointers=no -g`.
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn rust_chain_leaf(mut x: u64) -> u64 {
    for _ in 0..60_000 {
        x = black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
    }
    x
}

#[inline(never)]
fn rust_chain_inner(x: u64) -> u64 {
    black_box(rust_chain_leaf(black_box(x ^ 3))).wrapping_add(1)
}

#[inline(never)]
fn rust_chain_middle(x: u64) -> u64 {
    black_box(rust_chain_inner(black_box(x ^ 2))).wrapping_add(1)
}

#[inline(never)]
fn rust_chain_outer(x: u64) -> u64 {
    black_box(rust_chain_middle(black_box(x ^ 1))).wrapping_add(1)
}

/// `--work N`: N units of about a second of CPU on this project's 2-core VM.
const CALLS_PER_WORK_UNIT: u64 = 16_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() > 2 && args[1] == "--work" {
        let calls = args[2].parse::<u64>().unwrap_or(1) * CALLS_PER_WORK_UNIT;
        let mut x = 1u64;
        for _ in 0..calls {
            x = rust_chain_outer(x);
        }
        black_box(x);
        return;
    }
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut x = 1u64;
    while Instant::now() < end {
        x = rust_chain_outer(x);
    }
    black_box(x);
}
