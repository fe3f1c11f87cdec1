//! The bench's `rustc` workload: a generated Rust library for the stable
//! toolchain's `rustc -O` to compile, 250 functions per unit of work (about
//! 0.8 s of the compiler's CPU here).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Functions per unit of `--work`.
const FUNCTIONS_PER_UNIT: u32 = 250;

/// The compiler's arguments for `work` units, the source and its object in
/// `dir`: an optimised library, object only (no linker run).
pub fn args(work: u32, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "-O",
        "--edition",
        "2021",
        "--crate-type",
        "lib",
        "--crate-name",
        "rust_library",
        "--emit",
        "obj",
        "-o",
    ]
    .map(String::from)
    .into();
    args.push(dir.join("rust_library.o").display().to_string());
    args.push(dir.join(file_name(work)).display().to_string());
    args
}

/// The source's name for `work` units.
fn file_name(work: u32) -> String {
    format!("rust_library_{work}.rs")
}

/// Writes the source for `work` units into `dir` and returns the
/// toolchain's `rustc` (the binary itself: rustup's `rustc` is a proxy
/// that would run, and be profiled, as a process of its own).
pub fn prepare(dir: &Path, work: u32) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(file_name(work)), source(work * FUNCTIONS_PER_UNIT))?;
    let output = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("cannot run rustc --print sysroot")?;
    if !output.status.success() {
        bail!("rustc --print sysroot failed ({})", output.status);
    }
    let sysroot = String::from_utf8(output.stdout).context("rustc's sysroot is not UTF-8")?;
    let rustc = Path::new(sysroot.trim()).join("bin/rustc");
    if !rustc.is_file() {
        bail!("no rustc at {}", rustc.display());
    }
    Ok(rustc)
}

/// A library of `functions` functions, each a loop with a branch: work for
/// rustc's front end and for LLVM's optimiser, ~3.3 ms of the compiler's
/// CPU each here. (Bodies with a hash map or a sort cost 13-23 ms each:
/// a 1,000-function file would take 15-25 s a run.)
fn source(functions: u32) -> String {
    let mut source = String::new();
    for i in 0..functions {
        let (m, r) = (i % 11 + 1, i % 63 + 1);
        let _ = write!(
            source,
            r#"
pub fn func{i}(values: &[u64]) -> u64 {{
    let mut acc = {i}u64;
    for (k, v) in values.iter().enumerate() {{
        if k % {m} != 1 {{
            acc = acc.wrapping_mul(31).wrapping_add(v.rotate_left({r}));
        }}
    }}
    acc
}}
"#
        );
    }
    source
}
