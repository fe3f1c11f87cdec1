//! Project tasks: `cargo xtask <task>`.
//!
//! - `build-ebpf`: make sure the BPF toolchain is there and build the BPF object.
//! - `build`: the BPF object, then ddprof (release) with the object embedded.
//! - `dist [--target aarch64]`: the same, statically linked (musl):
//!   `target/x86_64-unknown-linux-musl/release/ddprof` (or `aarch64-…`).
//! - `run -- ARGS`: build, then run ddprof with ARGS.
//! - `demo`: build, then profile the bundled demo workload.
//! - `test`: build, install the test prerequisites, run every test (the
//!   arm64 one too).
//! - `test-arm64`: the static arm64 ddprof in an arm64 guest under qemu:
//!   `--check`, and both engines' stacks of arm64 programs.
//! - `docs`: regenerate docs/Commands.md from the CLI definition.
//! - `bench`: ddprof's engines against perf record and samply (docs/Benchmarks.md).
//! - `soak`: ddprof beside a busy, churning program for 30 minutes; its RSS each minute.
mod apt;
mod arm64_test;
mod arm64_vm;
mod bench;
mod bpf_toolchain;
mod dist;
mod docs;
mod pprof;
mod soak;
mod test;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ddprof project tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Make sure the BPF toolchain is there and build the BPF object
    BuildEbpf,
    /// Build the BPF object and ddprof (release) with it embedded
    Build {
        /// Build the debug profile instead of release
        #[arg(long)]
        debug: bool,
    },
    /// Build the static ddprof (musl, BPF object embedded) for any x86-64 (or arm64) Linux >= 4.15
    Dist {
        /// The architecture: x86_64 (amd64) or aarch64 (arm64); this machine's by default
        #[arg(long, value_parser = dist::parse_arch)]
        target: Option<ddprof_build::BpfArch>,
    },
    /// Build everything (release) and run ddprof with the given arguments
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build everything and profile the bundled demo workload (output in ./ddprof-out)
    Demo {
        /// Seconds the demo workload runs
        #[arg(long, default_value_t = 5)]
        seconds: u32,
    },
    /// Build everything and run the whole test suite (unit + integration)
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the static arm64 ddprof and test it in an emulated arm64 guest (qemu): --check, both engines' stacks
    TestArm64,
    /// `cargo xtask test`'s work beside the tests (it runs this in the idle scheduling class)
    #[command(hide = true)]
    Background,
    /// Measure ddprof's engines against perf record and samply on the same workloads
    Bench(bench::BenchArgs),
    /// Profile a busy, churning program for a long time (30 min) and report the profiler's RSS each minute
    Soak(soak::SoakArgs),
    /// Regenerate docs/Commands.md from the CLI definition
    Docs {
        /// Fail if docs/Commands.md is not up to date instead of writing it
        #[arg(long)]
        check: bool,
    },
}

/// When this xtask started: every line it says carries the time since, so
/// that a CI log tells which step took the suite's time.
static STARTED: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// The variable in which an xtask hands the processes it starts its own
/// clock: the seconds it had run when it started them.
pub const CLOCK_ENV: &str = "DDPROF_XTASK_CLOCK_S";

/// The seconds the xtask that started this one had run then (0 for the
/// first): its lines count from the same start.
static CLOCK_OFFSET_S: std::sync::LazyLock<f64> = std::sync::LazyLock::new(|| {
    std::env::var(CLOCK_ENV)
        .ok()
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or(0.0)
});

/// The seconds since the first xtask of this run started.
pub fn clock_s() -> f64 {
    *CLOCK_OFFSET_S + STARTED.elapsed().as_secs_f64()
}

pub fn say(message: &str) {
    eprintln!("xtask: [{:.0} s] {message}", clock_s());
}

/// The workspace root (the parent of xtask/).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Where `build-ebpf` leaves the BPF object (ddprof/build.rs looks there).
pub fn ebpf_object() -> PathBuf {
    ddprof_build::object_path(
        &target_dir(),
        host_arch().unwrap_or(ddprof_build::BpfArch::X86_64),
    )
}

/// This machine's architecture, as ddprof supports it.
pub fn host_arch() -> Result<ddprof_build::BpfArch> {
    ddprof_build::BpfArch::from_target_arch(std::env::consts::ARCH).with_context(|| {
        format!(
            "ddprof does not support {} hosts (x86_64 and aarch64 only)",
            std::env::consts::ARCH
        )
    })
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// How the tests compile their workloads, the same source.
#[path = "../../tests/harness/workload_build.rs"]
mod workload_build;

/// Builds the workload `tests/workloads/SOURCE` into `target/OUT_DIR/NAME`
/// as the tests build it (no frame pointers: only DWARF unwinding reaches
/// the roots).
pub fn build_workload(source: &str, out_dir: &str, name: &str) -> Result<PathBuf> {
    let source = workspace_root().join("tests/workloads").join(source);
    let out_dir = target_dir().join(out_dir);
    std::fs::create_dir_all(&out_dir)?;
    let binary = out_dir.join(name);
    let mut command =
        workload_build::compile_command(&source, &binary).map_err(anyhow::Error::msg)?;
    run_checked(&mut command)
        .with_context(|| format!("cannot build the workload {}", source.display()))?;
    Ok(binary)
}

pub fn run_checked(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("could not run {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

fn build_ebpf(arch: ddprof_build::BpfArch) -> Result<PathBuf> {
    let toolchain = bpf_toolchain::ensure(&target_dir())?;
    say(&format!(
        "building the BPF object (cargo +{}, {}, {} pt_regs)",
        toolchain.nightly,
        ddprof_build::BPF_TARGET,
        arch.name()
    ));
    ddprof_build::build_ebpf(
        &workspace_root(),
        &target_dir(),
        &toolchain.nightly,
        &toolchain.linker_dir,
        arch,
        ddprof_build::Output::Inherit,
    )
    .map_err(anyhow::Error::msg)
}

/// Builds the BPF object when possible, then ddprof. Without a BPF
/// toolchain the result is a perf-only ddprof, and the reason is printed.
fn build_all(release: bool) -> Result<PathBuf> {
    match build_ebpf(host_arch()?) {
        Ok(object) => say(&format!("BPF object: {}", object.display())),
        Err(error) => say(&format!(
            "cannot build the BPF object ({error:#}); building a perf-only ddprof"
        )),
    }
    let mut command = Command::new("cargo");
    command
        .current_dir(workspace_root())
        .args(["build", "-p", "ddprof"]);
    if release {
        command.arg("--release");
    }
    run_checked(&mut command)?;
    Ok(target_dir()
        .join(if release { "release" } else { "debug" })
        .join("ddprof"))
}

fn run_ddprof(binary: &Path, args: &[String]) -> Result<ExitCode> {
    let status = Command::new(binary)
        .args(args)
        .status()
        .with_context(|| format!("could not run {}", binary.display()))?;
    Ok(match status.code() {
        Some(code) => ExitCode::from(code as u8),
        None => ExitCode::FAILURE,
    })
}

fn demo(seconds: u32) -> Result<ExitCode> {
    let binary = build_all(true)?;
    let workload = test::build_demo_workload()?;
    say(&format!(
        "profiling {} for {seconds} s (profiles go to ./ddprof-out unless an agent is configured)",
        workload.display()
    ));
    run_ddprof(
        &binary,
        &[
            "--log-level".into(),
            "notice".into(),
            "--".into(),
            workload.display().to_string(),
            seconds.to_string(),
        ],
    )
}

fn main() -> ExitCode {
    std::sync::LazyLock::force(&STARTED);
    std::sync::LazyLock::force(&CLOCK_OFFSET_S);
    let args = Args::parse();
    let result = match args.task {
        Task::BuildEbpf => host_arch().and_then(build_ebpf).map(|object| {
            say(&format!("BPF object: {}", object.display()));
            ExitCode::SUCCESS
        }),
        Task::Build { debug } => build_all(!debug).map(|binary| {
            say(&format!("ddprof: {}", binary.display()));
            ExitCode::SUCCESS
        }),
        Task::Dist { target } => {
            target
                .map_or_else(host_arch, Ok)
                .and_then(dist::run)
                .map(|binary| {
                    say(&format!("static ddprof: {}", binary.display()));
                    ExitCode::SUCCESS
                })
        }
        Task::Soak(args) => soak::run(&args).map(|()| ExitCode::SUCCESS),
        Task::Run { args } => build_all(true).and_then(|binary| run_ddprof(&binary, &args)),
        Task::Demo { seconds } => demo(seconds),
        Task::Test { args } => test::run(&args),
        Task::TestArm64 => arm64_test::run().map(|()| ExitCode::SUCCESS),
        Task::Background => Ok(test::background()),
        Task::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
        Task::Docs { check } => docs::run(check).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|error| {
        eprintln!("xtask: error: {error:#}");
        ExitCode::FAILURE
    })
}
