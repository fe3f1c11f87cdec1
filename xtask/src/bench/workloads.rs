//! The bench's workloads: what each runs, and how its source is built.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{big_program, rust_library};
use crate::target_dir;

/// How a workload's source is built.
#[derive(Clone, Copy)]
pub(super) enum Language {
    /// A C, C++ or Rust source built as the tests build it
    /// (`tests/harness/workload_build.rs`, shared as source).
    Source,
    /// The corpus's generated big program (`tests/harness/big_program.rs`,
    /// shared as source), statically linked.
    BigProgram,
    /// Not built: the stable toolchain's own `rustc` (not rustup's proxy,
    /// which would be a process of its own), compiling a generated library
    /// ([`rust_library`]).
    Rustc,
}

/// A workload of tests/workloads.
pub(super) struct Workload {
    pub(super) name: &'static str,
    pub(super) source: &'static str,
    pub(super) language: Language,
    /// Other programs of tests/workloads it runs (built beside it).
    pub(super) helpers: &'static [&'static str],
    /// Arguments that make it do `work` units of work, given the directory
    /// the workloads are built in.
    pub(super) args: fn(u32, &Path) -> Vec<String>,
    /// Functions its threads start in (they count as roots, see [`ROOT_FRAMES`]).
    pub(super) thread_entries: &'static [&'static str],
    /// One process of small unwind tables, for issue 10's RSS target ("one
    /// profiled process"): the big programs' tables alone are tens of MiB.
    pub(super) one_small_process: bool,
    /// The most CPU the whole profiler may spend at the lowest frequency,
    /// in % of the workload's (start-up included).
    pub(super) cpu_share_target: f64,
}

pub(super) fn work_args(work: u32, _: &Path) -> Vec<String> {
    vec!["--work".into(), work.to_string()]
}

pub(super) const WORKLOADS: &[Workload] = &[
    Workload {
        name: "chain",
        source: "chain.c",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "recursion",
        source: "recursion.c",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "threads",
        source: "threads.c",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &["thread_a_work", "thread_b_work"],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "qsort",
        source: "qsort.c",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "chain_rs",
        source: "chain.rs",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "forker",
        source: "forker.c",
        language: Language::Source,
        helpers: &["forker_child.c"],
        args: |work, dir| {
            vec![
                "--work".into(),
                work.to_string(),
                dir.join("forker_child").display().to_string(),
            ]
        },
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 1.0,
    },
    // Issue 36: two threads on one CPU that block on each other through
    // pipes, ~10^6 context switches a second: what a hook at every switch
    // costs shows here (the wall-time event's bar is measured against this
    // CPU-only run).
    Workload {
        name: "switcher",
        source: "switcher.c",
        language: Language::Source,
        helpers: &[],
        args: work_args,
        thread_entries: &["switcher_thread"],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    // Issue 36's bar: the same at ~10^5 switches a second (each thread
    // computes 8 µs with the token), where wall time may cost at most 2 %.
    Workload {
        name: "switcher_100k",
        source: "switcher.c",
        language: Language::Source,
        helpers: &[],
        args: |work, _| {
            vec![
                "--work".into(),
                work.to_string(),
                "--spin".into(),
                "8000".into(),
            ]
        },
        thread_entries: &["switcher_thread"],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    // Issue 32: a 205 MB static binary (2.4 M unwind rows) with 48 KiB
    // stacks, what the eBPF engine must unwind in the kernel.
    Workload {
        name: "big_static",
        source: "(generated: tests/harness/big_program.rs)",
        language: Language::BigProgram,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 1.0,
    },
    // Issue 32: a compiler whose libraries (librustc_driver, libLLVM) have
    // ~2.3 M unwind rows and no GNU build id, profiled as a build would
    // run it: its tables and names found in the cache. `--work N` compiles
    // a library of 250 × N functions (1,000 at the default 4).
    Workload {
        name: "rustc",
        source: "(generated: xtask/src/bench/rust_library.rs)",
        language: Language::Rustc,
        helpers: &[],
        args: rust_library::args,
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 3.0,
    },
];

/// The workloads `--quick` runs.
pub(super) const QUICK_WORKLOADS: &[&str] = &["chain", "recursion"];

/// Where the bench's workloads are built.
pub(super) fn workload_dir() -> PathBuf {
    target_dir().join("bench")
}

/// Builds the wrapper that times every workload run (`measure.c`, beside
/// this file) into the bench directory.
pub(super) fn build_measure() -> Result<PathBuf> {
    let dir = workload_dir();
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("measure.c");
    std::fs::write(&source, include_str!("../measure.c"))?;
    let binary = dir.join("measure");
    crate::run_checked(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&binary)
            .arg(&source),
    )
    .context("cannot build the bench's measure wrapper")?;
    Ok(binary)
}

/// Builds `tests/workloads/SOURCE` as `language` into the bench directory
/// (or writes the generated input that `work` units need).
pub(super) fn build_source(
    source: &str,
    name: &str,
    language: Language,
    work: u32,
) -> Result<PathBuf> {
    match language {
        Language::Rustc => rust_library::prepare(&workload_dir(), work),
        Language::Source => crate::build_workload(source, "bench", name),
        Language::BigProgram => {
            let out_dir = workload_dir();
            std::fs::create_dir_all(&out_dir)?;
            let binary = out_dir.join(name);
            let assembly = out_dir.join(format!("{name}.s"));
            let main = out_dir.join(format!("{name}.cpp"));
            std::fs::write(&assembly, big_program::assembly())?;
            std::fs::write(&main, big_program::MAIN_CPP)?;
            crate::run_checked(&mut big_program::build_command(&binary, &main, &assembly))
                .context("cannot build the big program")?;
            Ok(binary)
        }
    }
}

pub(super) fn build_workload(workload: &Workload, work: u32) -> Result<PathBuf> {
    for helper in workload.helpers {
        let name = helper.trim_end_matches(".c");
        build_source(helper, name, Language::Source, work)?;
    }
    build_source(workload.source, workload.name, workload.language, work)
}
