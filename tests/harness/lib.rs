//! Test harness: builds workloads, runs ddprof, reads its outputs.
//!
//! The ddprof binary: `env!("CARGO_BIN_EXE_ddprof")` exists only in the
//! ddprof package's own tests, so [`binary::ddprof_bin`] runs `cargo build -p
//! ddprof --bin ddprof` once per test process (a no-op when it is up to
//! date; cargo's build lock is free while tests run) and returns the binary
//! from the same target directory and profile as the running test
//! executable (`target/<profile>/deps/<test>` → `target/<profile>/ddprof`).
//! `DDPROF_BIN=/path/to/ddprof` skips the build and uses that binary.
pub mod binary;
pub mod corpus;
pub mod launcher;
pub mod outputs;
pub mod processes;

pub use binary::ddprof_bin;

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
