//! Finds or builds what it takes to compile the BPF program: the nightly
//! toolchain pinned in `ddprof-ebpf/rust-toolchain.toml` (installed with
//! rustup when missing), its `rust-src` component, and a `bpf-linker` built
//! against that nightly's own LLVM.
//!
//! No LLVM of the nightly's version is packaged for this Debian, but the
//! nightly ships its own shared libLLVM; bpf-linker is built against it
//! (see docs/Build.md) and cached in `target/bpf-toolchain/`, so the second
//! build costs nothing.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::say;

/// The bpf-linker release that supports the nightly's LLVM (21–23).
const BPF_LINKER_VERSION: &str = "0.13.0";

pub struct BpfToolchain {
    /// Directory holding the `bpf-linker` to put first on PATH.
    pub linker_dir: PathBuf,
    /// The pinned nightly, as rustup names it (`nightly-YYYY-MM-DD`).
    pub nightly: String,
}

pub use ddprof_build::PIN_FILE;

/// The pinned nightly (`nightly-2026-05-20`), from [`PIN_FILE`].
pub fn pinned_nightly() -> Result<String> {
    ddprof_build::pinned_nightly(&crate::workspace_root()).map_err(anyhow::Error::msg)
}

fn output_of(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("could not run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `rustc +NIGHTLY --print sysroot`, installing the pinned nightly
/// (minimal profile, with rust-src) through rustup when it is missing: a
/// fresh machine has only stable.
fn nightly_sysroot(nightly: &str) -> Result<PathBuf> {
    let toolchain = format!("+{nightly}");
    let query = || output_of(Command::new("rustc").args([&toolchain, "--print", "sysroot"]));
    let sysroot = match query() {
        Ok(sysroot) => sysroot,
        Err(_) => {
            say(&format!(
                "no {nightly} toolchain: installing it with rustup (minimal profile, rust-src; pinned in {PIN_FILE})"
            ));
            let status = Command::new("rustup")
                .args(["toolchain", "install", nightly, "--profile", "minimal"])
                .args(["--component", "rust-src"])
                .status()
                .context("cannot run rustup")?;
            if !status.success() {
                bail!("`rustup toolchain install {nightly}` failed");
            }
            query().with_context(|| {
                format!("rustc {toolchain} still does not run after installing it")
            })?
        }
    };
    Ok(PathBuf::from(sysroot.trim()))
}

/// The LLVM major version the nightly rustc uses (`LLVM version: 22.1.2`).
fn nightly_llvm_major(nightly: &str) -> Result<u32> {
    let verbose = output_of(Command::new("rustc").args([&format!("+{nightly}"), "-vV"]))?;
    verbose
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|version| version.split('.').next()?.parse().ok())
        .with_context(|| format!("`rustc +{nightly} -vV` does not say which LLVM it uses"))
}

fn ensure_rust_src(sysroot: &Path, nightly: &str) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    say("adding the nightly's rust-src component (needed for -Z build-std=core)");
    let status = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", nightly])
        .status()
        .context("could not run rustup")?;
    if !status.success() {
        bail!("`rustup component add rust-src --toolchain {nightly}` failed");
    }
    Ok(())
}

/// The nightly's own shared libLLVM (`lib/libLLVM.so.22.1-rust-1.97.0-nightly`).
/// Its other name, `libLLVM-22-rust-….so`, is a linker script, not a library:
/// only a real ELF file will do as the link target.
fn nightly_libllvm(sysroot: &Path, major: u32) -> Result<PathBuf> {
    let lib = sysroot.join("lib");
    let prefix = format!("libLLVM.so.{major}");
    std::fs::read_dir(&lib)
        .with_context(|| format!("cannot list {}", lib.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(&prefix))
        })
        .find(|path| is_elf(path))
        .with_context(|| {
            format!(
                "the nightly at {} ships no libLLVM {major}",
                sysroot.display()
            )
        })
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// Does this bpf-linker link against the given LLVM major version?
fn linker_matches(linker: &Path, major: u32) -> bool {
    // A dynamically linked bpf-linker names its libLLVM; one linked
    // statically cannot be checked this way and is not trusted.
    let Ok(libraries) = output_of(Command::new("ldd").arg(linker)) else {
        return false;
    };
    libraries.lines().any(|line| {
        line.contains(&format!("libLLVM.so.{major}")) || line.contains(&format!("libLLVM-{major}"))
    })
}

fn linker_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
}

/// Builds bpf-linker against the nightly's libLLVM into `root/bin`.
fn build_linker(root: &Path, libllvm: &Path, major: u32) -> Result<()> {
    say(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {major} (once; cached in {})",
        root.display()
    ));
    // bpf-linker's build script only checks that llvm-config exists and
    // links `-lLLVM` from $LLVM_PREFIX/lib, with an rpath to it.
    let prefix = root.join("llvm-prefix");
    let bin = prefix.join("bin");
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(&lib)?;
    let llvm_config = bin.join("llvm-config");
    std::fs::write(
        &llvm_config,
        format!("#!/bin/sh\n# Stand-in: bpf-linker's build only needs this file to exist.\necho {major}.0.0\n"),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&llvm_config, std::fs::Permissions::from_mode(0o755))?;
    let file_name = libllvm.file_name().context("libLLVM has no file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(file_name)] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(libllvm, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            // Rebuild even when a bpf-linker of this version is in `root`:
            // it was built against another libLLVM.
            "--force",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
            "--root",
        ])
        .arg(root)
        .env("LLVM_PREFIX", &prefix)
        .env("CARGO_TARGET_DIR", root.join("build"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .context("could not run cargo install")?;
    if !status.success() {
        bail!("building bpf-linker failed (see the cargo output above)");
    }
    Ok(())
}

/// Whether the cached bpf-linker was built against this sysroot's libLLVM
/// (its prefix links there): one built for another nightly of the same
/// LLVM major would work, but the BPF object would not be reproducible.
fn built_for_sysroot(root: &Path, sysroot: &Path) -> bool {
    let linked = std::fs::canonicalize(root.join("llvm-prefix/lib/libLLVM.so"));
    let sysroot = std::fs::canonicalize(sysroot);
    matches!((linked, sysroot), (Ok(linked), Ok(sysroot)) if linked.starts_with(&sysroot))
}

/// Makes sure the pinned nightly, rust-src and a matching bpf-linker are there.
pub fn ensure(target_dir: &Path) -> Result<BpfToolchain> {
    let nightly = pinned_nightly()?;
    let sysroot = nightly_sysroot(&nightly)?;
    ensure_rust_src(&sysroot, &nightly)?;
    let major = nightly_llvm_major(&nightly)?;
    let root = target_dir.join("bpf-toolchain");
    let cached = root.join("bin/bpf-linker");
    if cached.is_file() && linker_matches(&cached, major) && built_for_sysroot(&root, &sysroot) {
        return Ok(BpfToolchain {
            linker_dir: root.join("bin"),
            nightly,
        });
    }
    if let Some(linker) = linker_on_path() {
        if linker_matches(&linker, major) {
            say(&format!("using {} (LLVM {major})", linker.display()));
            return Ok(BpfToolchain {
                linker_dir: linker.parent().unwrap().to_path_buf(),
                nightly,
            });
        }
        say(&format!(
            "{} does not use the nightly's LLVM {major}: building a matching one",
            linker.display()
        ));
    }
    let libllvm = nightly_libllvm(&sysroot, major)?;
    build_linker(&root, &libllvm, major)?;
    if !linker_matches(&cached, major) {
        bail!(
            "the bpf-linker just built at {} does not load the nightly's libLLVM",
            cached.display()
        );
    }
    Ok(BpfToolchain {
        linker_dir: root.join("bin"),
        nightly,
    })
}
