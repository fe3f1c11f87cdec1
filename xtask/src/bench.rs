//! `cargo xtask bench`: ddprof's engines against `perf record` and samply on
//! the same workloads, at the same frequency, several runs each.
//!
//! How each figure is measured:
//! - **wall**: the workload's own elapsed time, from `xtask measure`, a tiny
//!   wrapper that runs it and reports its wall and CPU time (fixed-work
//!   workloads, so profiling overhead shows as a longer run).
//! - **profiler CPU**: every run lives in a fresh cpuacct cgroup, which
//!   counts the CPU of all its processes, ddprof's detached profiler
//!   included; the workload's own CPU (from the wrapper) is subtracted.
//! - **samples**: what the tool itself reports (ddprof's `summary:` line,
//!   perf's "(N samples)").
//! - **peak RSS**: the profiler process's VmHWM, polled while it runs
//!   (ddprof reports its own in the summary line).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{build_all, have, say, target_dir, workspace_root};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Runs per (workload, tool)
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Sampling frequency for every tool (Hz)
    #[arg(long, default_value_t = 999)]
    pub freq: u32,
    /// Work units per workload run (about one second of CPU each)
    #[arg(long, default_value_t = 4)]
    pub work: u32,
    /// Workloads to run (default: all)
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Tools to run (default: all)
    #[arg(long, value_delimiter = ',')]
    pub tools: Vec<String>,
    /// Write docs/Benchmarks.md from this run
    #[arg(long)]
    pub write_docs: bool,
    /// Measure this ddprof binary (e.g. the static one of `cargo xtask dist`) instead of building one
    #[arg(long)]
    pub ddprof: Option<PathBuf>,
}

/// A workload of tests/workloads, built with the tests' flags.
struct Workload {
    name: &'static str,
    source: &'static str,
    /// Arguments that make it do a fixed amount of work.
    args: fn(u32) -> Vec<String>,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "chain",
        source: "chain.c",
        args: |work| vec!["--work".into(), work.to_string()],
    },
    Workload {
        name: "recursion",
        source: "recursion.c",
        args: |work| vec!["--work".into(), work.to_string()],
    },
];

const TOOLS: &[&str] = &[
    "unprofiled",
    "ddprof-bpf",
    "ddprof-perf",
    "perf-dwarf",
    "perf-fp",
    "samply",
];

#[derive(Debug, Default, Clone)]
struct RunResult {
    wall: Duration,
    profiler_cpu: Option<Duration>,
    samples: Option<u64>,
    full_stacks: Option<u64>,
    peak_rss_kib: Option<u64>,
    output_bytes: Option<u64>,
}

struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    fn create(name: &str) -> Result<Self> {
        let path = Path::new("/sys/fs/cgroup/cpuacct").join(name);
        if !path.parent().unwrap().is_dir() {
            bail!("no cpuacct cgroup hierarchy at /sys/fs/cgroup/cpuacct (cgroup v1 needed for `xtask bench`)");
        }
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path)
            .with_context(|| format!("cannot create {} (run as root)", path.display()))?;
        Ok(Self { path })
    }

    fn usage(&self) -> Result<Duration> {
        let text = std::fs::read_to_string(self.path.join("cpuacct.usage"))?;
        Ok(Duration::from_nanos(text.trim().parse()?))
    }

    fn is_empty(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map_or(true, |s| s.trim().is_empty())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The samply version the bench measures.
const SAMPLY_VERSION: &str = "0.13.1";

/// The one-line fix that lets samply run on machines without a hardware PMU
/// (it reads the ENOENT of the `cycles` event as EPERM and exits instead of
/// falling back to cpu-clock), kept beside the project.
fn samply_patch() -> PathBuf {
    workspace_root().join("../shared/bench/samply-pmu-less.patch")
}

/// samply from crates.io, patched with [`samply_patch`] when the patch is
/// there, built once into target/bench-tools. The report says which.
fn samply() -> Option<PathBuf> {
    let root = target_dir().join("bench-tools");
    let binary = root.join("bin/samply");
    if binary.is_file() {
        return Some(binary);
    }
    let patch = samply_patch();
    if !patch.is_file() {
        say(&format!(
            "installing samply {SAMPLY_VERSION} from crates.io, unpatched ({} not found: it \
             will fail on machines without a hardware PMU)",
            patch.display()
        ));
        let status = Command::new("cargo")
            .args([
                "install",
                "samply",
                "--version",
                SAMPLY_VERSION,
                "--locked",
                "--root",
            ])
            .arg(&root)
            .status()
            .ok()?;
        return (status.success() && binary.is_file()).then_some(binary);
    }
    say(&format!(
        "building samply {SAMPLY_VERSION} from crates.io with {} into target/bench-tools (once)",
        patch.display()
    ));
    let source = samply_source(&root)?;
    let patched = Command::new("patch")
        .current_dir(&source)
        .args(["-p1", "--forward", "-i"])
        .arg(&patch)
        .status()
        .ok()?;
    if !patched.success() {
        say("the samply patch did not apply");
        return None;
    }
    let status = Command::new("cargo")
        .args(["install", "--locked", "--root"])
        .arg(&root)
        .arg("--path")
        .arg(&source)
        .status()
        .ok()?;
    (status.success() && binary.is_file()).then_some(binary)
}

/// A fresh copy of samply's published source under `root`, fetched through
/// a throw-away crate that depends on its binary (an artifact dependency:
/// samply has no library, and cargo ignores an ordinary dependency on it).
fn samply_source(root: &Path) -> Option<PathBuf> {
    let fetcher = root.join("samply-fetch");
    std::fs::create_dir_all(fetcher.join("src")).ok()?;
    std::fs::write(
        fetcher.join("Cargo.toml"),
        format!(
            "[package]\nname = \"samply-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\nsamply = {{ version = \"={SAMPLY_VERSION}\", artifact = \"bin\" }}\n\
             [workspace]\n"
        ),
    )
    .ok()?;
    std::fs::write(fetcher.join("src/lib.rs"), "").ok()?;
    let nightly = crate::bpf_toolchain::pinned_nightly().ok()?;
    let metadata = Command::new("cargo")
        .current_dir(&fetcher)
        .arg(format!("+{nightly}"))
        .args(["metadata", "-Z", "bindeps", "--format-version", "1"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&metadata.stdout);
    // The manifest path of the samply package, e.g.
    // "…/registry/src/…/samply-0.13.1/Cargo.toml".
    let marker = format!("samply-{SAMPLY_VERSION}/Cargo.toml");
    let end = text.find(&marker)? + marker.len() - "/Cargo.toml".len();
    let start = text[..end].rfind('"')? + 1;
    let registry_copy = PathBuf::from(&text[start..end]);
    let source = root.join(format!("samply-{SAMPLY_VERSION}-patched"));
    let _ = std::fs::remove_dir_all(&source);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&registry_copy)
        .arg(&source)
        .status()
        .ok()?;
    if !copied.success() {
        return None;
    }
    // The copy sits under this workspace's target/: keep cargo from taking
    // it for one of the workspace's members.
    let manifest = source.join("Cargo.toml");
    let mut text = std::fs::read_to_string(&manifest).ok()?;
    text.push_str("\n[workspace]\n");
    std::fs::write(&manifest, text).ok()?;
    Some(source)
}

fn build_workload(workload: &Workload) -> Result<PathBuf> {
    crate::build_c_workload(workload.source, "bench", workload.name)
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    };
    entries.flatten().map(|e| dir_size(&e.path())).sum()
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("VmHWM:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })
}

/// The command line of one tool around the measured workload.
fn command_line(
    tool: &str,
    ddprof: &Path,
    samply: Option<&Path>,
    freq: u32,
    out: &Path,
    measured: &[String],
) -> Option<Vec<String>> {
    let path = |p: &Path| p.display().to_string();
    let mut line: Vec<String> = match tool {
        "unprofiled" => vec![],
        "ddprof-bpf" | "ddprof-perf" => vec![
            path(ddprof),
            "--engine".into(),
            tool.trim_start_matches("ddprof-").into(),
            "-e".into(),
            format!("sCPU freq={freq}"),
            "--upload-period".into(),
            "600".into(),
            "--log-level".into(),
            "notice".into(),
            "--output".into(),
            path(out),
            "--".into(),
        ],
        "perf-dwarf" => vec![
            "perf".into(),
            "record".into(),
            "-F".into(),
            freq.to_string(),
            "--call-graph".into(),
            "dwarf,32768".into(),
            "-o".into(),
            path(&out.join("perf.data")),
            "--".into(),
        ],
        "perf-fp" => vec![
            "perf".into(),
            "record".into(),
            "-F".into(),
            freq.to_string(),
            "-g".into(),
            "-o".into(),
            path(&out.join("perf.data")),
            "--".into(),
        ],
        "samply" => vec![
            path(samply?),
            "record".into(),
            "--save-only".into(),
            "-r".into(),
            freq.to_string(),
            "-o".into(),
            path(&out.join("profile.json.gz")),
            "--".into(),
        ],
        _ => return None,
    };
    line.extend(measured.iter().cloned());
    Some(line)
}

fn run_once(tool: &str, line: &[String], run_id: &str) -> Result<RunResult> {
    let cgroup = Cgroup::create(&format!("ddprof-bench-{run_id}"))?;
    let procs = cgroup.path.join("cgroup.procs");
    let mut command = Command::new(&line[0]);
    command
        .args(&line[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Join the cgroup before exec so that everything the tool starts is counted.
    use std::os::unix::process::CommandExt;
    let procs_for_child = procs.clone();
    // SAFETY: the closure only writes a file (async-signal-safe enough for a
    // freshly forked single-threaded child) before exec.
    unsafe {
        command.pre_exec(move || std::fs::write(&procs_for_child, b"0"));
    }
    let before = cgroup.usage()?;
    let child = command
        .spawn()
        .with_context(|| format!("cannot run {line:?}"))?;
    let pid = child.id();
    let watcher = std::thread::spawn(move || {
        let mut peak = None;
        while let Some(hwm) = vm_hwm_kib(pid) {
            peak = Some(hwm);
            std::thread::sleep(Duration::from_millis(50));
        }
        peak
    });
    let output = child.wait_with_output()?;
    let polled_peak = watcher.join().unwrap_or(None);
    // ddprof's profiler outlives the command briefly (final flush): wait for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cgroup.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let total = cgroup.usage()?.saturating_sub(before);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        // Some tools explain themselves on stdout, some after a blank line.
        let stdout = String::from_utf8_lossy(&output.stdout);
        let reason = stderr
            .lines()
            .chain(stdout.lines())
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        bail!("{tool} failed ({}): {}", output.status, reason.trim());
    }
    let measure_line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("measure:"))
        .context("the workload wrapper printed no measure: line")?;
    let wall = Duration::from_nanos(field(measure_line, "wall_ns").unwrap_or(0));
    let workload_cpu = Duration::from_nanos(field(measure_line, "cpu_ns").unwrap_or(0));
    let mut result = RunResult {
        wall,
        ..Default::default()
    };
    if tool != "unprofiled" {
        result.profiler_cpu = Some(total.saturating_sub(workload_cpu));
    }
    if tool.starts_with("ddprof") {
        let summary = stderr
            .lines()
            .rev()
            .find(|l| l.contains("summary:"))
            .unwrap_or("");
        result.samples = field(summary, "samples");
        result.full_stacks = field(summary, "full_stacks");
        result.peak_rss_kib = field(summary, "peak_rss_kib");
    } else if tool.starts_with("perf") {
        result.samples = stderr.lines().find_map(|l| {
            l.split('(')
                .nth(1)?
                .strip_suffix(" samples) ]")?
                .parse()
                .ok()
        });
        result.peak_rss_kib = polled_peak;
    } else if tool == "samply" {
        result.peak_rss_kib = polled_peak;
    }
    Ok(result)
}

/// The command line as a shell would need it typed.
fn shell_words(line: &[String]) -> String {
    line.iter()
        .map(|word| {
            if word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=,:".contains(c))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

pub fn measure(command: &[String]) -> Result<std::process::ExitCode> {
    let started = Instant::now();
    let status = Command::new(&command[0]).args(&command[1..]).status()?;
    let wall = started.elapsed();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    let cpu = Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()));
    eprintln!(
        "measure: wall_ns={} cpu_ns={}",
        wall.as_nanos(),
        cpu.as_nanos()
    );
    Ok(if status.success() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let ddprof = match &args.ddprof {
        Some(binary) => binary.clone(),
        None => build_all(true)?,
    };
    let measure_exe = std::env::current_exe()?;
    let samply = if args.tools.is_empty() || args.tools.iter().any(|t| t == "samply") {
        samply()
    } else {
        None
    };
    let tools: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| args.tools.is_empty() || args.tools.iter().any(|a| a == t))
        .filter(|t| !t.starts_with("perf") || have("perf"))
        .collect();
    let mut report = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    writeln!(report, "# Benchmarks\n")?;
    writeln!(
        report,
        "Generated by `cargo xtask bench --runs {} --freq {} --work {}{}{}` on {} CPUs, kernel {}.",
        args.runs,
        args.freq,
        args.work,
        if args.write_docs { " --write-docs" } else { "" },
        args.ddprof
            .as_ref()
            .map(|binary| format!(" --ddprof {}", binary.display()))
            .unwrap_or_default(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        kernel.trim()
    )?;
    if samply.is_some() {
        writeln!(
            report,
            "samply {SAMPLY_VERSION} is built from crates.io{}.\n",
            if samply_patch().is_file() {
                " with `shared/bench/samply-pmu-less.patch` applied (the one-line fix that lets it \
                 fall back to cpu-clock on machines without a hardware PMU, like this one)"
            } else {
                ", unpatched"
            }
        )?;
    }
    writeln!(report, "Medians of {} runs. *overhead*: the workload's wall time over its unprofiled wall time. *profiler CPU*: CPU of every process in the run's cgroup minus the workload's own CPU. *CPU/1000 samples*: profiler CPU per thousand samples the tool reports.\n", args.runs)?;
    for workload in WORKLOADS
        .iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|a| a == w.name))
    {
        let binary = build_workload(workload)?;
        let mut measured = vec![
            measure_exe.display().to_string(),
            "measure".into(),
            "--".into(),
            binary.display().to_string(),
        ];
        measured.extend((workload.args)(args.work));
        writeln!(report, "## {}\n", workload.name)?;
        writeln!(report, "| tool | wall (s) | overhead | profiler CPU (ms) | samples | CPU/1000 samples (ms) | full stacks | peak RSS (MiB) | output (KiB) |")?;
        writeln!(
            report,
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        )?;
        let mut baseline_wall = None;
        let mut commands = BTreeMap::new();
        // Every tool's command line, then the runs interleaved (run 1 of
        // every tool, then run 2, …) so that a slow spell of the machine
        // weighs on every tool alike instead of on one row.
        let mut lines: Vec<(&str, PathBuf, Option<Vec<String>>)> = Vec::new();
        for tool in &tools {
            let out = target_dir()
                .join("bench/out")
                .join(format!("{}-{tool}", workload.name));
            let line = command_line(tool, &ddprof, samply.as_deref(), args.freq, &out, &measured)
                .map(|line| {
                    if line.is_empty() {
                        measured.clone()
                    } else {
                        line
                    }
                });
            if let Some(line) = &line {
                commands.insert(tool.to_string(), shell_words(line));
            }
            lines.push((tool, out, line));
        }
        let mut results: BTreeMap<&str, Vec<RunResult>> = BTreeMap::new();
        let mut failures: BTreeMap<&str, String> = BTreeMap::new();
        for run in 0..args.runs {
            for (tool, out, line) in &lines {
                let Some(line) = line else { continue };
                if failures.contains_key(tool) {
                    continue;
                }
                let _ = std::fs::remove_dir_all(out);
                std::fs::create_dir_all(out)?;
                say(&format!("{} / {tool}: run {}", workload.name, run + 1));
                match run_once(tool, line, &format!("{}-{tool}-{run}", workload.name)) {
                    Ok(mut result) => {
                        result.output_bytes = Some(dir_size(out));
                        results.entry(tool).or_default().push(result);
                    }
                    Err(error) => {
                        failures.insert(tool, format!("{error:#}"));
                    }
                }
            }
        }
        for (tool, _, line) in &lines {
            if line.is_none() {
                writeln!(report, "| {tool} | not available | | | | | | | |")?;
                continue;
            }
            if let Some(failure) = failures.get(tool) {
                writeln!(
                    report,
                    "| {tool} | failed: {} | | | | | | | |",
                    failure.replace('|', "/")
                )?;
                continue;
            }
            let results = results.remove(tool).unwrap_or_default();
            // The median over the runs of one figure (runs without it are skipped).
            let median_of = |figure: &dyn Fn(&RunResult) -> Option<f64>| {
                median(results.iter().filter_map(figure).collect())
            };
            let wall = median_of(&|r| Some(r.wall.as_secs_f64())).unwrap_or(0.0);
            if *tool == "unprofiled" {
                baseline_wall = Some(wall);
            }
            let overhead = baseline_wall
                .map(|b| format!("{:.3}×", wall / b))
                .unwrap_or_default();
            let cpu_ms = median_of(&|r| Some(r.profiler_cpu?.as_secs_f64() * 1e3));
            let samples = median_of(&|r| Some(r.samples? as f64));
            let per_thousand = median_of(&|r| {
                Some(r.profiler_cpu?.as_secs_f64() * 1e3 / (r.samples? as f64 / 1000.0))
            });
            let full =
                median_of(&|r| Some(r.full_stacks? as f64 / r.samples?.max(1) as f64 * 100.0));
            let rss = median_of(&|r| Some(r.peak_rss_kib? as f64 / 1024.0));
            let bytes = median_of(&|r| Some(r.output_bytes? as f64 / 1024.0));
            let show = |v: Option<f64>, digits: usize| {
                v.map(|v| format!("{v:.digits$}"))
                    .unwrap_or_else(|| "–".into())
            };
            writeln!(
                report,
                "| {tool} | {wall:.3} | {overhead} | {} | {} | {} | {} | {} | {} |",
                show(cpu_ms, 1),
                show(samples, 0),
                show(per_thousand, 2),
                full.map(|f| format!("{f:.1} %"))
                    .unwrap_or_else(|| "–".into()),
                show(rss, 1),
                show(bytes, 0)
            )?;
        }
        writeln!(report, "\nCommands:\n")?;
        for (tool, line) in commands {
            writeln!(report, "- {tool}: `{line}`")?;
        }
        writeln!(report)?;
    }
    println!("{report}");
    if args.write_docs {
        let path = workspace_root().join("docs/Benchmarks.md");
        // The corpus section comes from the corpus test, not from here.
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let kept = old.find(CORPUS_SECTION).map_or("", |start| &old[start..]);
        std::fs::write(&path, format!("{report}{kept}"))?;
        say("wrote docs/Benchmarks.md");
    }
    Ok(())
}

/// The heading of docs/Benchmarks.md's section on the real-program corpus
/// (tests/corpus.rs), which `--write-docs` keeps.
const CORPUS_SECTION: &str = "## Real-program corpus";
