//! Test harness: builds workloads, runs ddprof, reads its outputs.
//!
//! The ddprof binary: `env!("CARGO_BIN_EXE_ddprof")` exists only in the
//! ddprof package's own tests, so [`binary::ddprof_bin`] runs `cargo build -p
//! ddprof --bin ddprof` once per test process (a no-op when it is up to
//! date; cargo's build lock is free while tests run) and returns the binary
//! from the same target directory and profile as the running test
//! executable (`target/<profile>/deps/<test>` → `target/<profile>/ddprof`).
//! `DDPROF_BIN=/path/to/ddprof` skips the build and uses that binary.
//! [`binary::static_ddprof_bin`] is the static (musl) ddprof of `cargo
//! xtask dist` (`DDPROF_STATIC_BIN` overrides it).
pub mod big_program;
pub mod binary;
pub mod corpus;
pub mod e2e;
pub mod guards;
pub mod intake;
pub mod launcher;
pub mod old_kernel;
pub mod outputs;
pub mod perf_script;
pub mod pprof;
pub mod processes;
pub mod workload_build;

pub use binary::{ddprof_bin, static_ddprof_bin};

/// A command running the ddprof under test, independent of the developer's
/// `DD_*` environment.
pub fn ddprof_command() -> std::process::Command {
    let mut command = std::process::Command::new(ddprof_bin());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DD_") {
            command.env_remove(key);
        }
    }
    command
}

/// [`ddprof_command`] writing its profiles into a scratch directory named
/// after `tests` and this test process (shared by its tests, never emptied
/// while they run, never the source tree).
pub fn ddprof_command_with_scratch_output(tests: &str) -> std::process::Command {
    let mut command = ddprof_command();
    let profiles =
        std::env::temp_dir().join(format!("ddprof-{tests}-{}-profiles", std::process::id()));
    command.env("DD_PROFILING_OUTPUT_DIR", profiles);
    command
}

/// Runs `command` to its end with no standard input.
pub fn run_without_input(command: &mut std::process::Command) -> std::process::Output {
    command
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running ddprof")
}

/// Bytes a process wrote, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub mod symbols;
pub mod workloads;

/// A command that runs `program` as `nobody` (uid and gid 65534) with no
/// supplementary groups and no inheritable capabilities: an unprivileged
/// user, as far as perf and BPF are concerned.
pub fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut command = std::process::Command::new("setpriv");
    command
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(program);
    command
}
