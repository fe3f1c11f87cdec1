//! Building the BPF program (`ddprof-ebpf`) into the object ddprof embeds:
//! the one recipe that `ddprof/build.rs` (when the object is older than its
//! sources) and `cargo xtask build-ebpf` both run. Finding or building the
//! toolchain (nightly, rust-src, bpf-linker) stays with xtask; this crate
//! only needs to be told where the linker is.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The file that pins the BPF program's nightly, relative to the workspace
/// root: the one place its date is written.
pub const PIN_FILE: &str = "ddprof-ebpf/rust-toolchain.toml";

/// The target the BPF program is built for.
pub const BPF_TARGET: &str = "bpfel-unknown-none";

/// The `channel = "…"` of a rust-toolchain.toml.
pub fn channel_of(toml: &str) -> Option<String> {
    toml.lines().find_map(|line| {
        let value = line.trim().strip_prefix("channel")?.trim_start();
        let value = value.strip_prefix('=')?.trim();
        Some(value.trim_matches('"').to_string()).filter(|v| !v.is_empty())
    })
}

/// The pinned nightly (`nightly-2026-05-20`), from [`PIN_FILE`] under
/// `workspace`.
pub fn pinned_nightly(workspace: &Path) -> Result<String, String> {
    let path = workspace.join(PIN_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    channel_of(&text).ok_or_else(|| format!("{} has no `channel = \"…\"` line", path.display()))
}

/// The CPU architecture a BPF object is built for. The bytecode is the
/// same, but the program reads the interrupted user registers (`pt_regs`)
/// whose layout is the architecture's, so each ddprof binary embeds the
/// object of its own architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BpfArch {
    X86_64,
    Aarch64,
}

impl BpfArch {
    /// The name as Rust's `target_arch` and aya's `bpf_target_arch` spell it.
    pub const fn name(self) -> &'static str {
        match self {
            BpfArch::X86_64 => "x86_64",
            BpfArch::Aarch64 => "aarch64",
        }
    }

    /// The architecture of a `target_arch` value (a build script's
    /// `CARGO_CFG_TARGET_ARCH`), if ddprof supports it.
    pub fn from_target_arch(arch: &str) -> Option<BpfArch> {
        match arch {
            "x86_64" => Some(BpfArch::X86_64),
            "aarch64" => Some(BpfArch::Aarch64),
            _ => None,
        }
    }

    /// The cargo target directory of this architecture's BPF build, under
    /// the workspace's target directory.
    fn build_dir(self, target_dir: &Path) -> PathBuf {
        match self {
            // Where it has always been: the x86-64 build is the common one.
            BpfArch::X86_64 => target_dir.join("ebpf"),
            BpfArch::Aarch64 => target_dir.join("ebpf-aarch64"),
        }
    }
}

/// Where the build leaves the BPF object for `arch` under the workspace's
/// target directory (and where ddprof/build.rs takes it from).
pub fn object_path(target_dir: &Path, arch: BpfArch) -> PathBuf {
    arch.build_dir(target_dir)
        .join(BPF_TARGET)
        .join("release/ddprof-ebpf")
}

/// What the build's output does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Shown as it comes (xtask).
    Inherit,
    /// Captured; a failure's error lines go into the error (a build script,
    /// whose stdout is for cargo).
    Capture,
}

/// Builds the BPF object for `arch` with `nightly` and the `bpf-linker`
/// found in `linker_dir`, into `target_dir/ebpf` (or `ebpf-aarch64`), and
/// returns its path. The outer
/// cargo's settings (host target, flags, wrappers) are removed from the
/// environment: they are for the host build.
pub fn build_ebpf(
    workspace: &Path,
    target_dir: &Path,
    nightly: &str,
    linker_dir: &Path,
    arch: BpfArch,
    output: Output,
) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(linker_dir.to_path_buf()).chain(std::env::split_paths(&path)),
    )
    .map_err(|e| format!("cannot put {} on PATH: {e}", linker_dir.display()))?;
    let mut command = Command::new("cargo");
    command
        .current_dir(workspace.join("ddprof-ebpf"))
        .arg(format!("+{nightly}"))
        .args([
            "build",
            "--release",
            "--target",
            BPF_TARGET,
            "-Z",
            "build-std=core",
        ]);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let host_setting = key.starts_with("CARGO_")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTUP_TOOLCHAIN"
            || key == "RUSTDOC";
        if host_setting && key != "CARGO_HOME" {
            command.env_remove(key.as_ref());
        }
    }
    command
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", arch.build_dir(target_dir))
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", "bpf-linker")
        // aya-ebpf and the program pick the `pt_regs` layout by this cfg
        // (else by the build host's architecture). Cargo adds these flags
        // to ddprof-ebpf/.cargo/config.toml's for the target.
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            format!("--cfg bpf_target_arch=\"{}\"", arch.name()),
        );
    let failed = match output {
        Output::Inherit => {
            let status = command
                .status()
                .map_err(|e| format!("cannot run cargo +{nightly}: {e}"))?;
            (!status.success()).then(|| format!("the BPF build failed ({status})"))
        }
        Output::Capture => {
            let result = command
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run cargo +{nightly}: {e}"))?;
            (!result.status.success()).then(|| {
                let stderr = String::from_utf8_lossy(&result.stderr);
                let errors: Vec<&str> = stderr
                    .lines()
                    .filter(|l| l.contains("error"))
                    .take(3)
                    .collect();
                format!("the BPF build failed: {}", errors.join(" / "))
            })
        }
    };
    if let Some(failure) = failed {
        return Err(failure);
    }
    let object = object_path(target_dir, arch);
    if !object.is_file() {
        return Err(format!(
            "the BPF build did not produce {}",
            object.display()
        ));
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pinned_channel() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let channel = pinned_nightly(workspace).unwrap();
        assert!(channel.starts_with("nightly-20"), "{channel}");
        assert_eq!(
            channel_of("channel=\"nightly-2026-01-02\"").unwrap(),
            "nightly-2026-01-02"
        );
        assert_eq!(channel_of("[toolchain]\n"), None);
        assert!(pinned_nightly(Path::new("/nonexistent")).is_err());
    }
}
