//! `cargo xtask dist [--target aarch64]`: one statically linked ddprof
//! (musl) with the BPF object of its architecture embedded, for any x86-64
//! (or arm64) Linux ≥ 4.15 whatever its libc. Built on this machine for
//! either architecture.
//!
//! Generic on purpose: the musl target comes from rustup, and crates that
//! compile C (the `cc` crate: ring, mimalloc, …) get their C compiler for
//! that target through `CC_<target>`, so no crate needs a setting of its
//! own: `musl-gcc` (Debian `musl-tools`) for the host's architecture; for
//! arm64 on an x86-64 host, clang with the arm64 musl headers (Debian
//! `musl-dev:arm64`), linked by rust-lld against the target's own musl.
//! The allocation sampler preloaded into commands links the target's
//! glibc: Debian's `aarch64-linux-gnu-gcc` builds it (ddprof/build.rs).
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use ddprof_build::BpfArch;

use crate::apt::{ensure_arm64_packages_known, install, installed};
use crate::{build_ebpf, have, host_arch, run_checked, say, target_dir, workspace_root};

/// The Rust target of the static build for `arch`.
pub const fn musl_target(arch: BpfArch) -> &'static str {
    match arch {
        BpfArch::X86_64 => "x86_64-unknown-linux-musl",
        BpfArch::Aarch64 => "aarch64-unknown-linux-musl",
    }
}

/// `--target`'s spellings: Rust's and Debian's names of the architecture.
pub fn parse_arch(name: &str) -> Result<BpfArch, String> {
    match name {
        "x86_64" | "x86-64" | "amd64" => Ok(BpfArch::X86_64),
        "aarch64" | "arm64" => Ok(BpfArch::Aarch64),
        other => Err(format!(
            "no static build for `{other}`: use x86_64 (amd64) or aarch64 (arm64)"
        )),
    }
}

/// Where `dist` leaves the static binary for `arch`.
fn dist_binary(arch: BpfArch, build_dir: &Path) -> PathBuf {
    build_dir.join(musl_target(arch)).join("release/ddprof")
}

fn ensure_musl_target(target: &str) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("cannot run rustup")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == target)
    {
        return Ok(());
    }
    say(&format!("adding the {target} target with rustup"));
    run_checked(Command::new("rustup").args(["target", "add", target]))
}

/// The C compiler settings of the static build for `arch`: `(variable,
/// value)` pairs for the `cc` crate, after installing what they name.
fn c_toolchain(arch: BpfArch) -> Result<Vec<(String, String)>> {
    let target = musl_target(arch).replace('-', "_");
    if arch == host_arch()? {
        if !have("musl-gcc") {
            install(
                &["musl-tools"],
                "crates that compile C, for the static build",
            )?;
        }
        return Ok(vec![(format!("CC_{target}"), "musl-gcc".into())]);
    }
    match arch {
        BpfArch::Aarch64 => {
            ensure_arm64_packages_known()?;
            let mut missing = Vec::new();
            if !installed("musl-dev:arm64") {
                missing.push("musl-dev:arm64");
            }
            if !have("clang") {
                missing.push("clang");
            }
            if !have("aarch64-linux-gnu-gcc") {
                missing.push("gcc-aarch64-linux-gnu");
            }
            if !missing.is_empty() {
                install(&missing, "the arm64 static build")?;
            }
            let resource_dir = Command::new("clang")
                .arg("-print-resource-dir")
                .output()
                .context("cannot run clang")?;
            let resource_dir = String::from_utf8_lossy(&resource_dir.stdout)
                .trim()
                .to_string();
            Ok(vec![
                (format!("CC_{target}"), "clang".into()),
                (
                    format!("CFLAGS_{target}"),
                    // Only musl's headers (and the compiler's own): the
                    // host's glibc headers describe another libc.
                    format!(
                        "--target=aarch64-linux-musl -nostdinc -isystem /usr/include/aarch64-linux-musl -isystem {resource_dir}/include"
                    ),
                ),
                (format!("AR_{target}"), "aarch64-linux-gnu-ar".into()),
                (
                    format!("CARGO_TARGET_{}_LINKER", target.to_uppercase()),
                    "rust-lld".into(),
                ),
            ])
        }
        BpfArch::X86_64 => {
            bail!("a static x86-64 build on an arm64 host is not supported: build it on x86-64")
        }
    }
}

/// Builds the static ddprof for `arch` and checks that it is static and
/// carries the BPF program.
pub fn run(arch: BpfArch) -> Result<PathBuf> {
    run_into(arch, &target_dir(), false)
}

/// [`run`], cargo's artifacts in `build_dir` (its own lock: a build there
/// does not wait for, nor hold up, one in the workspace's target
/// directory), its progress lines left out when `quiet`. The BPF object and
/// its tool chain stay in the workspace's target directory, where
/// `ddprof/build.rs` looks for them.
pub fn run_into(arch: BpfArch, build_dir: &Path, quiet: bool) -> Result<PathBuf> {
    let target = musl_target(arch);
    ensure_musl_target(target)?;
    let c_settings = c_toolchain(arch)?;
    // The static binary must not silently lose the BPF engine.
    let object = build_ebpf(arch).context("the dist binary needs the BPF object")?;
    say(&format!("BPF object: {}", object.display()));
    say(&format!("building a static ddprof ({target}, release)"));
    run_checked(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args(["build", "--release", "-p", "ddprof", "--bin", "ddprof"])
            .args(["--target", target])
            .arg("--target-dir")
            .arg(build_dir)
            .args(quiet.then_some("--quiet"))
            // ddprof/build.rs embeds the object just built (it is newer
            // than its sources), as in the glibc build; the tests' harness
            // (static_ddprof_bin) builds with the same settings, so neither
            // build invalidates the other.
            .envs(c_settings),
    )?;
    let binary = dist_binary(arch, build_dir);
    check_static(&binary, arch)?;
    if arch == host_arch()? {
        check_embedded_bpf(&binary)?;
    } else {
        check_carries_bpf_object(&binary, &object)?;
    }
    Ok(binary)
}

/// For a binary this machine cannot run: the BPF object's bytes are in it.
fn check_carries_bpf_object(binary: &Path, object: &Path) -> Result<()> {
    let bytes =
        std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let program =
        std::fs::read(object).with_context(|| format!("cannot read {}", object.display()))?;
    if program.is_empty() || !bytes.windows(program.len()).any(|window| window == program) {
        bail!(
            "{} does not carry the BPF object {}",
            binary.display(),
            object.display()
        );
    }
    say(&format!(
        "{} carries the BPF object {} ({} bytes)",
        binary.display(),
        object.display(),
        program.len()
    ));
    Ok(())
}

/// No program interpreter and no shared library: nothing of the host's libc
/// is needed.
fn check_static(binary: &Path, arch: BpfArch) -> Result<()> {
    let bytes =
        std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    // e_machine: EM_X86_64 (62), EM_AARCH64 (183).
    let machine = bytes
        .get(0x12..0x14)
        .map(|b| u16::from_le_bytes([b[0], b[1]]));
    let expected = match arch {
        BpfArch::X86_64 => 62,
        BpfArch::Aarch64 => 183,
    };
    if machine != Some(expected) {
        bail!(
            "{} is not an {} ELF (e_machine {machine:?})",
            binary.display(),
            arch.name()
        );
    }
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
