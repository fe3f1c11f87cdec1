//! `cargo xtask dist`: one statically linked ddprof (musl) with the BPF
//! object embedded, for any x86-64 Linux ≥ 4.15 whatever its libc.
//!
//! Generic on purpose: the musl target comes from rustup, and crates that
//! compile C (the `cc` crate: ring, zstd-sys, …) get `musl-gcc` (Debian
//! `musl-tools`) as their C compiler for that target through
//! `CC_x86_64_unknown_linux_musl`, so no crate needs a setting of its own.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{build_ebpf, have, run_checked, say, target_dir, workspace_root};

pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// Where `dist` leaves the static binary.
pub fn dist_binary() -> PathBuf {
    target_dir().join(MUSL_TARGET).join("release/ddprof")
}

fn ensure_musl_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("cannot run rustup")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == MUSL_TARGET)
    {
        return Ok(());
    }
    say(&format!("adding the {MUSL_TARGET} target with rustup"));
    run_checked(Command::new("rustup").args(["target", "add", MUSL_TARGET]))
}

/// `musl-gcc`, for crates that compile C code for the musl target.
fn ensure_musl_gcc() -> Result<()> {
    if have("musl-gcc") {
        return Ok(());
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("crates that compile C need musl-gcc for the static build: install it (apt-get install musl-tools)");
    }
    say("installing musl-tools (musl-gcc, for crates that compile C)");
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    run_checked(
        Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "musl-tools",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Builds the static ddprof and checks that it is static and carries the
/// BPF program.
pub fn run() -> Result<PathBuf> {
    ensure_musl_target()?;
    ensure_musl_gcc()?;
    // The static binary must not silently lose the BPF engine.
    let object = build_ebpf().context("the dist binary needs the BPF object")?;
    say(&format!("BPF object: {}", object.display()));
    say(&format!(
        "building a static ddprof ({MUSL_TARGET}, release)"
    ));
    run_checked(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args(["build", "--release", "-p", "ddprof", "--bin", "ddprof"])
            .args(["--target", MUSL_TARGET])
            // ddprof/build.rs embeds the object just built (it is newer
            // than its sources), as in the glibc build; the tests' harness
            // (static_ddprof_bin) builds with the same settings, so neither
            // build invalidates the other.
            .env(format!("CC_{}", MUSL_TARGET.replace('-', "_")), "musl-gcc"),
    )?;
    let binary = dist_binary();
    check_static(&binary)?;
    check_embedded_bpf(&binary)?;
    Ok(binary)
}

/// No program interpreter and no shared library: nothing of the host's libc
/// is needed.
fn check_static(binary: &Path) -> Result<()> {
    let bytes =
        std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let linkage =
        elf_linkage(&bytes).with_context(|| format!("{} is not a 64-bit ELF", binary.display()))?;
    if linkage.interpreter || linkage.needed_libraries > 0 {
        bail!(
            "{} is not static (interpreter: {}, needed libraries: {})",
            binary.display(),
            linkage.interpreter,
            linkage.needed_libraries
        );
    }
    if have("file") {
        let described = Command::new("file").arg(binary).output()?;
        say(String::from_utf8_lossy(&described.stdout).trim());
    }
    Ok(())
}

fn check_embedded_bpf(binary: &Path) -> Result<()> {
    let output = Command::new(binary)
        .arg("--check")
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !text.lines().any(|line| line.starts_with("BPF program ")) {
        bail!(
            "`{} --check` does not report on the BPF program: {}{}",
            binary.display(),
            text.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    if text.contains("not built into this binary") {
        bail!("{} was built without the BPF program", binary.display());
    }
    for line in text.lines() {
        say(line);
    }
    Ok(())
}

struct Linkage {
    interpreter: bool,
    needed_libraries: usize,
}

/// Reads the program headers (PT_INTERP) and the dynamic section
/// (DT_NEEDED) of a little-endian ELF64 file.
fn elf_linkage(bytes: &[u8]) -> Option<Linkage> {
    const PT_INTERP: u32 = 3;
    const PT_DYNAMIC: u32 = 2;
    const DT_NEEDED: u64 = 1;
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?));
    if bytes.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    let mut linkage = Linkage {
        interpreter: false,
        needed_libraries: 0,
    };
    for index in 0..phnum {
        let header = phoff + index * phentsize;
        match u32_at(header)? {
            PT_INTERP => linkage.interpreter = true,
            PT_DYNAMIC => {
                let offset = u64_at(header + 8)? as usize;
                let size = u64_at(header + 32)? as usize;
                for entry in (offset..offset + size).step_by(16) {
                    match u64_at(entry)? {
                        0 => break,
                        DT_NEEDED => linkage.needed_libraries += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(linkage)
}

#[cfg(test)]
mod tests {
    use super::elf_linkage;

    #[test]
    fn a_dynamic_executable_is_not_static() {
        // The test binary itself links glibc dynamically.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let linkage = elf_linkage(&me).unwrap();
        assert!(linkage.interpreter && linkage.needed_libraries > 0);
        assert!(elf_linkage(b"not an elf").is_none());
    }
}
