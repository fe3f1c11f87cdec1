//! Embeds the BPF object built by `cargo xtask build-ebpf`, when there is one.
//!
//! The object is looked up at `$DDPROF_EBPF_OBJECT`, else at the path the
//! xtask writes to. Without it the binary is perf-only and says so at run time
//! ("BPF engine not built into this binary").
use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ddprof_bpf)");
    println!("cargo::rerun-if-env-changed=DDPROF_EBPF_OBJECT");
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let default = manifest_dir
        .join("../target/ebpf/bpfel-unknown-none/release/ddprof-ebpf")
        .canonicalize()
        .unwrap_or_else(|_| {
            manifest_dir.join("../target/ebpf/bpfel-unknown-none/release/ddprof-ebpf")
        });
    let object = std::env::var_os("DDPROF_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or(default);
    // Rebuild (re-embed) whenever the object changes or appears.
    println!("cargo::rerun-if-changed={}", object.display());
    if object.is_file() {
        println!("cargo::rustc-cfg=ddprof_bpf");
        println!(
            "cargo::rustc-env=DDPROF_EBPF_OBJECT_PATH={}",
            object.display()
        );
    } else {
        println!(
            "cargo::warning=BPF object not found at {}: building a perf-only ddprof (run `cargo xtask build-ebpf`)",
            object.display()
        );
    }
}
