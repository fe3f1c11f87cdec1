//! Embeds the BPF object, and keeps it in step with its sources.
//!
//! The object comes from `$DDPROF_EBPF_OBJECT` when set (embedded as is),
//! else from `target/ebpf/bpfel-unknown-none/release/ddprof-ebpf`, which
//! `cargo xtask build-ebpf` writes (`target/ebpf-aarch64/…` for an arm64
//! ddprof: the program reads the architecture's `pt_regs`). When the BPF sources (`ddprof-ebpf/`,
//! `ddprof-common/`) are newer than that object, this script rebuilds it
//! with the toolchain `build-ebpf` cached in `target/bpf-toolchain/`; with
//! no such toolchain it builds a perf-only ddprof rather than embed an object
//! that no longer matches the loader ("BPF engine not built into this
//! binary" at run time).
use std::path::{Path, PathBuf};
use std::time::SystemTime;

fn newest_mtime(path: &Path) -> Option<SystemTime> {
    let metadata = std::fs::metadata(path).ok()?;
    if !metadata.is_dir() {
        return metadata.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_name() != "target")
        .filter_map(|entry| newest_mtime(&entry.path()))
        .max()
}

/// Rebuilds the object with the toolchain `cargo xtask build-ebpf` cached,
/// by the recipe xtask uses (`ddprof_build::build_ebpf`), the nightly
/// pinned in ddprof-ebpf/rust-toolchain.toml.
fn build_object(
    workspace: &Path,
    target_dir: &Path,
    arch: ddprof_build::BpfArch,
) -> Result<PathBuf, String> {
    let linker_dir = target_dir.join("bpf-toolchain/bin");
    if !linker_dir.join("bpf-linker").is_file() {
        return Err(
            "no BPF toolchain cached in target/bpf-toolchain (run `cargo xtask build-ebpf`)".into(),
        );
    }
    let nightly = ddprof_build::pinned_nightly(workspace)?;
    ddprof_build::build_ebpf(
        workspace,
        target_dir,
        &nightly,
        &linker_dir,
        arch,
        ddprof_build::Output::Capture,
    )
}

/// Builds the allocation sampler that ddprof preloads into the command
/// (`ddprof/alloc/ddprof_alloc.c`) with the host's C compiler (`$DDPROF_ALLOC_CC`,
/// else `cc`): it is loaded into the command's programs, which link the
/// host's glibc, whatever libc ddprof itself is built for (a static musl
/// ddprof included). Without a compiler, ddprof is built without `sALLOC`.
fn build_allocation_sampler(manifest_dir: &Path) {
    println!("cargo::rustc-check-cfg=cfg(ddprof_alloc)");
    println!("cargo::rerun-if-env-changed=DDPROF_ALLOC_CC");
    let source = manifest_dir.join("alloc/ddprof_alloc.c");
    println!("cargo::rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("libddprof_alloc.so");
    let compiler = std::env::var("DDPROF_ALLOC_CC").unwrap_or_else(|_| default_c_compiler());
    let status = std::process::Command::new(&compiler)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            "-fvisibility=hidden",
            // Each hook must call the marker, not jump to it: ddprof drops
            // the marker's and the hook's frames.
            "-fno-optimize-sibling-calls",
            "-fasynchronous-unwind-tables",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
        ])
        .arg(&out)
        .arg(&source)
        .args([
            "-Wl,--as-needed",
            "-ldl",
            "-Wl,-z,now",
            "-Wl,--no-undefined",
            "-Wl,--build-id",
        ])
        .status();
    match status {
        Ok(status) if status.success() => {
            println!("cargo::rustc-cfg=ddprof_alloc");
            println!("cargo::rustc-env=DDPROF_ALLOC_LIBRARY_PATH={}", out.display());
        }
        Ok(status) => println!(
            "cargo::warning={compiler} could not build {} ({status}): building ddprof without allocation profiling",
            source.display()
        ),
        Err(error) => println!(
            "cargo::warning=no C compiler ({compiler}: {error}) for {}: building ddprof without allocation profiling (install gcc)",
            source.display()
        ),
    }
}

/// The C compiler for the target's glibc: the host's `cc`, or for a cross
/// build (an arm64 ddprof built on x86-64) Debian's cross compiler of that
/// architecture (`aarch64-linux-gnu-gcc`, package gcc-aarch64-linux-gnu).
fn default_c_compiler() -> String {
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target_arch.is_empty() || host.split('-').next() == Some(target_arch.as_str()) {
        "cc".into()
    } else {
        format!("{target_arch}-linux-gnu-gcc")
    }
}

fn main() {
    build_allocation_sampler(&PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()));
    println!("cargo::rustc-check-cfg=cfg(ddprof_bpf)");
    println!("cargo::rerun-if-env-changed=DDPROF_EBPF_OBJECT");
    if let Some(object) = std::env::var_os("DDPROF_EBPF_OBJECT").map(PathBuf::from) {
        println!("cargo::rerun-if-changed={}", object.display());
        if object.is_file() {
            println!("cargo::rustc-cfg=ddprof_bpf");
            println!(
                "cargo::rustc-env=DDPROF_EBPF_OBJECT_PATH={}",
                object.display()
            );
        } else {
            println!(
                "cargo::warning=DDPROF_EBPF_OBJECT={} does not exist: building a perf-only ddprof",
                object.display()
            );
        }
        return;
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.parent().unwrap().to_path_buf();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let Some(arch) = ddprof_build::BpfArch::from_target_arch(&target_arch) else {
        println!("cargo::warning=no BPF program for {target_arch}: building a perf-only ddprof");
        return;
    };
    let object = ddprof_build::object_path(&target_dir, arch);
    let sources = [
        workspace.join("ddprof-ebpf/src"),
        workspace.join("ddprof-ebpf/Cargo.toml"),
        workspace.join("ddprof-ebpf/Cargo.lock"),
        workspace.join("ddprof-ebpf/.cargo"),
        workspace.join("ddprof-ebpf/rust-toolchain.toml"),
        workspace.join("ddprof-common/src"),
    ];
    println!("cargo::rerun-if-changed={}", object.display());
    for source in &sources {
        println!("cargo::rerun-if-changed={}", source.display());
    }
    let newest_source = sources.iter().filter_map(|s| newest_mtime(s)).max();
    let object_time = std::fs::metadata(&object).and_then(|m| m.modified()).ok();
    let fresh =
        matches!((object_time, newest_source), (Some(object), Some(source)) if object >= source);
    if !fresh {
        if let Err(why) = build_object(&workspace, &target_dir, arch) {
            let state = if object_time.is_some() {
                "older than its sources"
            } else {
                "missing"
            };
            println!("cargo::warning=BPF object {state} and not rebuilt ({why}): building a perf-only ddprof");
            return;
        }
    }
    println!("cargo::rustc-cfg=ddprof_bpf");
    println!(
        "cargo::rustc-env=DDPROF_EBPF_OBJECT_PATH={}",
        object.display()
    );
}
