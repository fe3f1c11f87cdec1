//! The trace context section of `cargo xtask bench`: what reading a
//! thread's published request context costs at each sample, as the BPF
//! program's own run time (`kernel.bpf_stats_enabled`: the kernel times
//! every run), on one server of fake requests (`tests/workloads/
//! trace_requests.rs`) whose threads publish their span ids through
//! `libdd-otel-thread-ctx` (OTEP 4947) or `custom-labels`, or publish
//! nothing while their process exports the variables, or whose copy has
//! the variables hidden (no publisher: the program's map lookup alone).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::report::{median, show};
use super::runs::shell_words;
use crate::{run_checked, say, target_dir, workspace_root};

/// (row, the server's binary: `None` the one built, `Some` the copy with
/// its variables hidden, its ABI argument).
const MODES: &[(&str, bool, &str)] = &[
    ("no publisher (the variables hidden)", true, "none"),
    ("publisher, no context on the thread", false, "none"),
    ("OTEP 4947 context (libdd-otel-thread-ctx)", false, "otel"),
    ("custom-labels set (3 labels)", false, "labels"),
];

/// What one run said: the program's mean run time, its runs, and the
/// samples that carried a context.
#[derive(Debug, Clone, Copy)]
struct Run {
    nanos_per_run: f64,
    runs: f64,
    with_context: f64,
}

pub(super) fn trace_context_section(ddprof: &Path, runs: usize, report: &mut String) -> Result<()> {
    let server = build_server()?;
    let hidden = hidden_copy(&server)?;
    let stats = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let before = std::fs::read_to_string(stats).context("reading kernel.bpf_stats_enabled")?;
    std::fs::write(stats, "1").context("enabling kernel.bpf_stats_enabled (needs root)")?;
    let measured = (|| -> Result<Vec<Vec<Run>>> {
        let mut figures = vec![Vec::new(); MODES.len()];
        // Run 1 of every mode, then run 2, …: a slow spell weighs on all.
        for round in 0..runs {
            for (index, (name, hide, abi)) in MODES.iter().enumerate() {
                let binary = if *hide { &hidden } else { &server };
                say(&format!("trace context: {name}, run {}", round + 1));
                figures[index].push(run_once(ddprof, binary, abi)?);
            }
        }
        Ok(figures)
    })();
    let _ = std::fs::write(stats, before.trim());
    let figures = measured?;
    writeln!(report, "## Trace context\n")?;
    writeln!(
        report,
        "What the BPF program costs per sample when it reads the request context a thread \
         published (the program runs in the sampled task's time: this is added to the \
         service's CPU), from the kernel's own timing of each run (`kernel.bpf_stats_enabled`). \
         One server of fake requests, 2 threads, each request ~15 ms in `request_work` with \
         its span ids published, then ~5 ms with none (`tests/workloads/trace_requests.rs`, \
         built with the real publisher crates). Medians of {runs} runs each of \
         `{}` (ABI `none`, `otel`, `labels`); the *no publisher* row runs a copy of the \
         server whose variables are hidden (`otel_thread_ctx_v1` stripped from `.symtab`, \
         `custom_labels_abi_version` renamed), so that the program only looks the process up.\n",
        shell_words(&command_line(ddprof, &server, "ABI")),
    )?;
    writeln!(
        report,
        "| mode | program ns / sample (lowest … highest run) | added to the first row | samples \
         with a context |"
    )?;
    writeln!(report, "| --- | --- | --- | --- |")?;
    let base = median(figures[0].iter().map(|run| run.nanos_per_run).collect());
    for ((name, ..), runs) in MODES.iter().zip(&figures) {
        let nanos = median(runs.iter().map(|run| run.nanos_per_run).collect());
        let lowest = runs.iter().map(|run| run.nanos_per_run).reduce(f64::min);
        let highest = runs.iter().map(|run| run.nanos_per_run).reduce(f64::max);
        let share = median(
            runs.iter()
                .map(|run| 100.0 * run.with_context / run.runs.max(1.0))
                .collect(),
        );
        let added = match (nanos, base) {
            (Some(nanos), Some(base)) => Some(nanos - base),
            _ => None,
        };
        writeln!(
            report,
            "| {name} | {} ({} … {}) | {} | {} % |",
            show(nanos, 0),
            show(lowest, 0),
            show(highest, 0),
            show(added, 0),
            show(share, 1)
        )?;
    }
    writeln!(report)?;
    Ok(())
}

fn command_line(ddprof: &Path, server: &Path, abi: &str) -> Vec<String> {
    [
        ddprof.display().to_string(),
        "-l".into(),
        "info".into(),
        "--engine".into(),
        "bpf".into(),
        "-e".into(),
        "sCPU freq=999".into(),
        "--".into(),
        server.display().to_string(),
        abi.into(),
        "4".into(),
        "2".into(),
    ]
    .to_vec()
}

fn run_once(ddprof: &Path, server: &Path, abi: &str) -> Result<Run> {
    let words = command_line(ddprof, server, abi);
    let output = Command::new(&words[0])
        .args(&words[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", shell_words(&words)))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!("{} failed: {log}", shell_words(&words));
    }
    // "BPF program: N runs, X ns each on average"
    let program = log
        .lines()
        .find_map(|line| line.split_once("BPF program: ")?.1.split_once(" runs, "))
        .and_then(|(runs, rest)| {
            let nanos = rest.split_once(" ns each")?.0;
            Some((runs.parse::<f64>().ok()?, nanos.parse::<f64>().ok()?))
        });
    let Some((runs, nanos_per_run)) = program else {
        bail!("no `BPF program: … ns each` line in the log (is bpf_stats enabled?): {log}");
    };
    let with_context = log
        .lines()
        .find_map(|line| {
            let rest = line.split_once("BPF engine: ")?.1;
            let (count, tail) = rest.split_once(' ')?;
            tail.starts_with("samples carried the request context")
                .then(|| count.parse::<f64>().ok())?
        })
        .unwrap_or(0.0);
    Ok(Run {
        nanos_per_run,
        runs,
        with_context,
    })
}

/// Builds the server (a binary of the tests' package).
fn build_server() -> Result<PathBuf> {
    run_checked(Command::new("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "-p",
        "ddprof-tests",
        "--bin",
        "trace-requests",
    ]))?;
    Ok(target_dir().join("release/trace-requests"))
}

/// A copy of the server in which ddprof finds no publisher: the OTEP
/// variable stripped from `.symtab` (a program's is looked for there) and
/// `custom_labels_abi_version` renamed in `.dynstr` (a set is read only
/// with that version).
fn hidden_copy(server: &Path) -> Result<PathBuf> {
    let copy = target_dir().join("bench/trace-requests-hidden");
    std::fs::create_dir_all(copy.parent().unwrap_or(Path::new(".")))?;
    run_checked(
        Command::new("objcopy")
            .arg("--strip-symbol=otel_thread_ctx_v1")
            .arg(server)
            .arg(&copy),
    )?;
    let mut bytes = std::fs::read(&copy)?;
    let name = b"custom_labels_abi_version\0";
    let mut renamed = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(name.len()).position(|w| w == name) {
        bytes[at + found] = b'x';
        at += found + name.len();
        renamed += 1;
    }
    if renamed == 0 {
        bail!(
            "{} has no custom_labels_abi_version to hide",
            server.display()
        );
    }
    std::fs::write(&copy, bytes)?;
    Ok(copy)
}
