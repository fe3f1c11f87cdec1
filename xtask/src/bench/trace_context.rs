//! The trace context section of `cargo xtask bench`: what reading a
//! thread's published request context costs at each sample, as the BPF
//! program's own run time (`kernel.bpf_stats_enabled`: the kernel times
//! every run), on one server of fake requests (`tests/workloads/
//! trace_requests.rs`) whose threads publish their span ids through
//! `libdd-otel-thread-ctx` (OTEP 4947) or `custom-labels`, or publish
//! nothing while their process exports the variables, or whose copy has
//! the variables hidden (no publisher: the program's map lookup alone);
//! and a Go server of the same requests that sets pprof labels as
//! dd-trace-go does (`tests/workloads/go_trace_requests`), against a copy
//! of it that ddprof does not take for Go.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::report::{median, show};
use super::runs::shell_words;
use crate::{run_checked, say, target_dir, workspace_root};

/// Which server a row runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    /// `trace-requests` with this ABI argument.
    Rust(&'static str),
    /// Its copy with the variables hidden.
    RustHidden,
    /// The Go server.
    Go,
    /// Its copy with its build information renamed (not taken for Go).
    GoHidden,
}

/// (row, its server, the row it is compared with).
const MODES: &[(&str, Server, usize)] = &[
    ("no publisher (the variables hidden)", Server::RustHidden, 0),
    (
        "publisher, no context on the thread",
        Server::Rust("none"),
        0,
    ),
    (
        "OTEP 4947 context (libdd-otel-thread-ctx)",
        Server::Rust("otel"),
        0,
    ),
    ("custom-labels set (3 labels)", Server::Rust("labels"), 0),
    (
        "Go server, not taken for Go (build information renamed)",
        Server::GoHidden,
        4,
    ),
    ("Go pprof labels (3 labels, a map)", Server::Go, 4),
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
    let go_server = build_go_server()?;
    let go_hidden = go_hidden_copy(&go_server)?;
    let stats = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let before = std::fs::read_to_string(stats).context("reading kernel.bpf_stats_enabled")?;
    std::fs::write(stats, "1").context("enabling kernel.bpf_stats_enabled (needs root)")?;
    let measured = (|| -> Result<Vec<Vec<Run>>> {
        let mut figures = vec![Vec::new(); MODES.len()];
        // Run 1 of every mode, then run 2, …: a slow spell weighs on all.
        for round in 0..runs {
            for (index, (name, mode, _)) in MODES.iter().enumerate() {
                let arguments: &[&str] = match mode {
                    Server::Rust(abi) => &[abi, "4", "2"],
                    Server::RustHidden => &["none", "4", "2"],
                    Server::Go | Server::GoHidden => &["2", "4"],
                };
                let binary = match mode {
                    Server::Rust(_) => &server,
                    Server::RustHidden => &hidden,
                    Server::Go => &go_server,
                    Server::GoHidden => &go_hidden,
                };
                say(&format!("trace context: {name}, run {}", round + 1));
                figures[index].push(run_once(ddprof, binary, arguments)?);
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
         `custom_labels_abi_version` renamed), so that the program only looks the process up. \
         The Go rows run the same requests in Go, 2 goroutines locked to their threads, \
         setting pprof labels as dd-trace-go does (`tests/workloads/go_trace_requests`, \
         {}): `{}`, and a copy whose `.go.buildinfo` is renamed (ddprof does not take it for \
         Go), the row the labels' cost is counted from (Go's stacks are not the Rust server's).\n",
        shell_words(&command_line(ddprof, &server, &["ABI", "4", "2"])),
        go_version(),
        shell_words(&command_line(ddprof, &go_server, &["2", "4"])),
    )?;
    writeln!(
        report,
        "| mode | program ns / sample (lowest … highest run) | added to its server's first row \
         | samples \
         with a context |"
    )?;
    writeln!(report, "| --- | --- | --- | --- |")?;
    for ((name, _, compared_with), runs) in MODES.iter().zip(&figures) {
        let base = median(
            figures[*compared_with]
                .iter()
                .map(|run| run.nanos_per_run)
                .collect(),
        );
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

fn command_line(ddprof: &Path, server: &Path, arguments: &[&str]) -> Vec<String> {
    let mut words: Vec<String> = [
        ddprof.display().to_string(),
        "-l".into(),
        "info".into(),
        "--engine".into(),
        "bpf".into(),
        "-e".into(),
        "sCPU freq=999".into(),
        "--".into(),
        server.display().to_string(),
    ]
    .to_vec();
    words.extend(arguments.iter().map(|word| word.to_string()));
    words
}

fn run_once(ddprof: &Path, server: &Path, arguments: &[&str]) -> Result<Run> {
    let words = command_line(ddprof, server, arguments);
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

/// Builds the Go server (`go build`, its cache in the target directory).
fn build_go_server() -> Result<PathBuf> {
    if !crate::have("go") {
        bail!("the trace context section's Go rows need Go: apt-get install golang-go");
    }
    let output = target_dir().join("bench/go-trace-requests");
    std::fs::create_dir_all(target_dir().join("bench"))?;
    run_checked(
        Command::new("go")
            .current_dir(workspace_root().join("tests/workloads/go_trace_requests"))
            .args(["build", "-o"])
            .arg(&output)
            .arg(".")
            .env("GOCACHE", target_dir().join("bench/go-cache"))
            .env("GOPATH", target_dir().join("bench/go-path"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("GOPROXY", "off"),
    )?;
    Ok(output)
}

/// A copy of the Go server whose `.go.buildinfo` section is renamed: ddprof
/// does not take it for Go, so the program only looks the process up.
fn go_hidden_copy(server: &Path) -> Result<PathBuf> {
    let copy = target_dir().join("bench/go-trace-requests-hidden");
    run_checked(
        Command::new("objcopy")
            .arg("--rename-section=.go.buildinfo=.go.buildinfx")
            .arg(server)
            .arg(&copy),
    )?;
    Ok(copy)
}

/// `go version`'s version word (`go1.19.8`), for the report.
fn go_version() -> String {
    Command::new("go")
        .arg("version")
        .output()
        .ok()
        .and_then(|output| {
            String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".into())
}
