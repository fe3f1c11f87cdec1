//! `cargo xtask bench`: ddprof's engines against `perf record` and samply on
//! the same workloads, at two sampling frequencies, several runs each; then
//! the start-up of `ddprof --global`, and the targets of issues 10 and 32.
//!
//! How each figure is measured (the report says it too):
//! - **wall**: the workload's own elapsed time, from `measure` (measure.c),
//!   a tiny C wrapper that runs it and reports its wall and CPU time
//!   (fixed-work workloads, so profiling overhead shows as a longer run).
//! - **tool CPU**: every run lives in a fresh cgroup (cgroup v1 `cpuacct`,
//!   else cgroup v2 `cpu.stat`), which counts the CPU of all its processes,
//!   ddprof's detached profiler included; the workload's own CPU (from the
//!   wrapper) is subtracted. For perf, `perf script` runs afterwards in a
//!   cgroup of its own and its CPU is added: perf only unwinds (dwarf) and
//!   names frames there, and a profile is what every tool must produce.
//! - **marginal CPU per sample** and **fixed CPU**: from the runs at the
//!   lowest and highest frequency, (CPU@hi − CPU@lo) / (samples@hi −
//!   samples@lo), and CPU@lo − samples@lo × marginal.
//! - **samples** and **root share**: read back from each tool's own output
//!   (ddprof's `stacks.folded`, `perf script`, samply's profile and its
//!   presymbolicated `.syms.json`) with one rule for all: a stack reaches
//!   the root when its outermost frame is [`ROOT_FRAMES`] or one of the
//!   workload's thread entries.
//! - **peak RSS**: the highest sum of `VmRSS` over the tool's processes
//!   (every process of the run's cgroup that is not the workload's),
//!   sampled every 50 ms; for perf, the higher of `perf record`'s and
//!   `perf script`'s.
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::{build_all, have, say, target_dir, workspace_root};

mod allocations;
mod cgroup;
mod global;
mod report;
mod runs;
mod samply;
mod stacks;
mod trace_context;
mod workloads;

use global::{global_startup, GlobalStartup};
use report::{
    marginal_spread, per_freq, show, show_marginal, write_global_section, write_targets,
    BenchResults, Medians, ToolFigures, CORPUS_SECTION,
};
use runs::{command_line, run_fresh, shell_words, RunContext, RunResult};
use samply::{samply, samply_patch, SAMPLY_VERSION};
use stacks::{perf_script_args, ROOT_FRAMES};
use workloads::{
    build_measure, build_workload, workload_dir, Workload, QUICK_WORKLOADS, WORKLOADS,
};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Runs per (workload, tool, frequency); the report gives medians
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Sampling frequencies (Hz); the marginal CPU per sample comes from the lowest and the highest
    #[arg(long, value_delimiter = ',', default_values_t = [99u32, 999])]
    pub freq: Vec<u32>,
    /// Work units per workload run (about one second of CPU each)
    #[arg(long, default_value_t = 4)]
    pub work: u32,
    /// Workloads to run (default: all; chain,recursion with --quick)
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Tools to run (default: all)
    #[arg(long, value_delimiter = ',')]
    pub tools: Vec<String>,
    /// Seconds `ddprof --global` runs in the start-up step (0: skip the step)
    #[arg(long, default_value_t = 5)]
    pub global_seconds: u32,
    /// Smoke test: 1 run, the chain and recursion workloads (unless --runs / --workloads say otherwise)
    #[arg(long)]
    pub quick: bool,
    /// Write docs/Benchmarks.md from this run
    #[arg(long)]
    pub write_docs: bool,
    /// Measure this ddprof binary (e.g. the static one of `cargo xtask dist`) instead of building one
    #[arg(long)]
    pub ddprof: Option<PathBuf>,
    /// Runs per program and mode of the allocation section (0: skip it)
    #[arg(long, default_value_t = 5)]
    pub allocation_runs: usize,
    /// Only the allocation section
    #[arg(long)]
    pub only_allocations: bool,
    /// The allocation section's modes, by name, comma-separated (default:
    /// all; `unprofiled`, the baseline, always runs)
    #[arg(long, value_delimiter = ',')]
    pub allocation_modes: Vec<String>,
    /// Runs per mode of the trace context section (0: skip it)
    #[arg(long, default_value_t = 5)]
    pub trace_context_runs: usize,
    /// Only the trace context section
    #[arg(long)]
    pub only_trace_context: bool,
}

/// The corpus's generator of the big program, the same source.
#[path = "../../tests/harness/big_program.rs"]
mod big_program;
/// The corpus's reader of `perf script`'s output, the same source.
#[path = "../../tests/harness/perf_script.rs"]
mod perf_script;
mod rust_library;

const TOOLS: &[&str] = &[
    "unprofiled",
    "ddprof-bpf",
    "ddprof-bpf-wall",
    "ddprof-perf",
    "perf-fp",
    "perf-dwarf-8k",
    "perf-dwarf-32k",
    "samply",
];

pub fn run(args: &BenchArgs) -> Result<()> {
    let runs = if args.quick && args.runs == 3 {
        1
    } else {
        args.runs
    };
    let mut freqs = args.freq.clone();
    freqs.sort_unstable();
    freqs.dedup();
    if freqs.is_empty() || freqs.contains(&0) {
        bail!("--freq needs one or more frequencies above 0 Hz, e.g. --freq 99,999");
    }
    let selected: Vec<String> = if args.workloads.is_empty() && args.quick {
        QUICK_WORKLOADS.iter().map(|w| w.to_string()).collect()
    } else {
        args.workloads.clone()
    };
    for name in &selected {
        if !WORKLOADS.iter().any(|w| w.name == name) {
            bail!(
                "unknown workload `{name}` (known: {})",
                WORKLOADS
                    .iter()
                    .map(|w| w.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    for name in &args.tools {
        if !TOOLS.contains(&name.as_str()) {
            bail!("unknown tool `{name}` (known: {})", TOOLS.join(", "));
        }
    }
    let ddprof = match &args.ddprof {
        Some(binary) => binary.clone(),
        None => build_all(true)?,
    };
    if args.only_trace_context {
        let mut report = String::new();
        let runs = args.trace_context_runs.max(1);
        trace_context::trace_context_section(&ddprof, runs, &mut report)?;
        let command = format!("--only-trace-context --trace-context-runs {runs}");
        return finish_only_section(report, &command, "## Trace context\n", args.write_docs);
    }
    if args.only_allocations {
        let mut report = String::new();
        let runs = args.allocation_runs.max(1);
        allocations::allocation_section(&ddprof, runs, &args.allocation_modes, &mut report)?;
        let mut command = format!("--only-allocations --allocation-runs {runs}");
        if !args.allocation_modes.is_empty() {
            command += &format!(" --allocation-modes '{}'", args.allocation_modes.join(","));
        }
        return finish_only_section(report, &command, "## Allocations\n", args.write_docs);
    }
    let measure_exe = build_measure()?;
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
    let workloads: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|w| selected.is_empty() || selected.iter().any(|a| a == w.name))
        .collect();
    let freq_list = freqs
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" / ");
    let mut report = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    writeln!(report, "# Benchmarks\n")?;
    writeln!(
        report,
        "Generated by `cargo xtask bench --runs {runs} --freq {} --work {}{}{}{}{}{}` on {} CPUs, kernel {}.",
        freqs.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        args.work,
        if selected.is_empty() {
            String::new()
        } else {
            format!(" --workloads {}", selected.join(","))
        },
        if args.tools.is_empty() {
            String::new()
        } else {
            format!(" --tools {}", args.tools.join(","))
        },
        if args.global_seconds == 5 {
            String::new()
        } else {
            format!(" --global-seconds {}", args.global_seconds)
        },
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
            "samply {SAMPLY_VERSION} is built from crates.io{}, and run with \
             `--unstable-presymbolicate` so that it names frames during the run as ddprof does.\n",
            if samply_patch().is_file() {
                " with `shared/bench/samply-pmu-less.patch` applied (the one-line fix that lets it \
                 fall back to cpu-clock on machines without a hardware PMU, like this one)"
            } else {
                ", unpatched"
            }
        )?;
    }
    writeln!(
        report,
        "Medians of {runs} runs per tool and frequency; each workload does `--work {}` (about {} s of CPU) \
         whatever the frequency. Each run starts after `sync(2)`, so that the previous run's output \
         (perf.data: up to 150 MB) is not written back during it; each run's figures are in the \
         command's log. Before the measured runs of a workload, each ddprof engine runs it once \
         with an empty cache directory (`--debug-cache` set to a new directory: the *first run* \
         line under each table, what a one-off `ddprof -- COMMAND` costs) and once, unmeasured, \
         with its default cache directory (`~/.cache/ddprof`), so that every measured run finds \
         the workload's unwind tables and names kept there, as a restarted service or a replaced \
         worker does.\n\n\
         - *tool CPU*: CPU of every process in the run's cgroup minus the workload's own CPU \
         (measured by the `measure` wrapper, `xtask/src/measure.c`, a small C program so that \
         the tools, which profile it too, have next to nothing of it to symbolize); for perf, plus the CPU of `perf script` \
         (`{}`), which does perf's unwinding (dwarf) and symbolization.\n\
         - *marginal CPU / sample*: (CPU@{hi} − CPU@{lo}) / (samples@{hi} − samples@{lo}) of the \
         medians; in brackets, the lowest and highest of the same figure taken round by round \
         (run *i* at {lo} Hz with run *i* at {hi} Hz): a tool whose fixed CPU moves from run to \
         run by more than its whole {lo}-to-{hi} Hz difference has a wide or negative spread, and \
         its median figure says little. \
         *fixed CPU*: CPU@{lo} − samples@{lo} × marginal (start-up, exit, per-run work).\n\
         - *slowdown*: the workload's wall time over its unprofiled wall time. *workload CPU \
         added / sample*: (the workload's CPU − its unprofiled CPU) / samples: the kernel's work \
         at each sample (timer interrupt, stack copy, and the BPF program's unwinding) is \
         charged to the task it interrupts, so it is there and not in *tool CPU*.\n\
         - *peak RSS*: the highest sum of `VmRSS` over the tool's processes (those of the run's \
         cgroup not running the workload's executables), sampled every 50 ms, or the highest \
         `VmHWM` of one of them if higher (peaks shorter than 50 ms); for perf, the \
         higher of `perf record`'s and `perf script`'s. (Not the memory cgroup's peak: it \
         would count the workload and the page cache of the tool's output.)\n\
         - *samples*, *root share*: read back from each tool's output (ddprof's `stacks.folded`, \
         `perf script`, samply's `profile.json.gz` with its `.syms.json`); a stack reaches the \
         root when its outermost frame is one of {} (symbol versions, offsets and leading \
         underscores ignored: samply drops the first underscore of ELF symbols) or \
         the workload's thread entry function. *lost*: ddprof's summary; perf's \
         `PERF_RECORD_LOST` records; samply does not say. *output*: every file the tool \
         wrote (ddprof: pprof, `flamegraph.svg`, `stacks.folded`; perf: `perf.data`; samply: \
         `profile.json.gz` and its `.syms.json`).\n",
        args.work,
        args.work,
        shell_words(&perf_script_args(Path::new("perf.data"))),
        ROOT_FRAMES
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", "),
        lo = freqs[0],
        hi = freqs[freqs.len() - 1],
    )?;
    let mut results = BenchResults::default();
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    for workload in &workloads {
        let binary = build_workload(workload, args.work)?;
        let mut workload_exes: HashSet<PathBuf> = HashSet::new();
        workload_exes.insert(canonical(&measure_exe));
        workload_exes.insert(canonical(&binary));
        for helper in workload.helpers {
            workload_exes.insert(canonical(
                &workload_dir().join(helper.trim_end_matches(".c")),
            ));
        }
        workload_exes.insert(canonical(Path::new("/bin/true")));
        let context = RunContext {
            workload,
            workload_exes: Arc::new(workload_exes),
        };
        let mut measured = vec![
            measure_exe.display().to_string(),
            binary.display().to_string(),
        ];
        measured.extend((workload.args)(args.work, &workload_dir()));
        // Every (tool, frequency)'s command line, then the runs interleaved
        // (run 1 of every one, then run 2, …) so that a slow spell of the
        // machine weighs on every tool alike instead of on one row.
        let mut commands: Vec<String> = Vec::new();
        let mut lines: Vec<(&str, u32, PathBuf, Option<Vec<String>>)> = Vec::new();
        for tool in &tools {
            let tool_freqs: &[u32] = if *tool == "unprofiled" {
                &freqs[..1]
            } else {
                &freqs
            };
            for &freq in tool_freqs {
                let out = target_dir()
                    .join("bench/out")
                    .join(format!("{}-{tool}-{freq}", workload.name));
                let line = command_line(tool, &ddprof, samply.as_deref(), freq, &out, &measured)
                    .map(|line| {
                        if line.is_empty() {
                            measured.clone()
                        } else {
                            line
                        }
                    });
                if let Some(line) = &line {
                    let label = if *tool == "unprofiled" {
                        tool.to_string()
                    } else {
                        format!("{tool} @ {freq} Hz")
                    };
                    commands.push(format!("- {label}: `{}`", shell_words(line)));
                    if tool.starts_with("perf") {
                        commands.push(format!(
                            "  then `{}`",
                            shell_words(&perf_script_args(&out.join("perf.data")))
                        ));
                    }
                }
                lines.push((tool, freq, out, line));
            }
        }
        // ddprof's first run of a workload, with an empty cache directory
        // (what a one-off `ddprof -- COMMAND` costs), measured apart; then
        // one unmeasured run that fills the default cache directory, so that
        // every measured round finds it as a restarted service would.
        for (tool, freq, out, line) in &lines {
            let Some(line) = line else { continue };
            // (The wall-time run's start-up is the CPU-only run's.)
            if !tool.starts_with("ddprof-") || *tool == "ddprof-bpf-wall" || *freq != freqs[0] {
                continue;
            }
            let cache = target_dir()
                .join("bench/cold-cache")
                .join(format!("{}-{tool}", workload.name));
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache)?;
            let mut cold_line = line.clone();
            cold_line.splice(
                1..1,
                ["--debug-cache".to_string(), cache.display().to_string()],
            );
            commands.push(format!(
                "- {tool} @ {freq} Hz, first run with an empty cache: `{}`",
                shell_words(&cold_line)
            ));
            for (label, line) in [("empty cache", &cold_line), ("warm-up", line)] {
                say(&format!("{} / {tool} @ {freq} Hz: {label}", workload.name));
                let run_id = format!(
                    "{}-{tool}-{freq}-{}",
                    workload.name,
                    label.replace(' ', "-")
                );
                match run_fresh(tool, line, out, &run_id, &context) {
                    Ok(result) if label == "empty cache" => {
                        let key = (workload.name.to_string(), tool.to_string());
                        results.first_runs.insert(key, result);
                    }
                    Ok(_) => {}
                    // The measured rounds meet and report the failure.
                    Err(error) => say(&format!("{tool}: {error:#}")),
                }
            }
            let _ = std::fs::remove_dir_all(&cache);
        }
        let mut outcomes: BTreeMap<(&str, u32), Vec<RunResult>> = BTreeMap::new();
        let mut failures: BTreeMap<&str, String> = BTreeMap::new();
        for run in 0..runs {
            for (tool, freq, out, line) in &lines {
                let Some(line) = line else { continue };
                if failures.contains_key(tool) {
                    continue;
                }
                say(&format!(
                    "{} / {tool} @ {freq} Hz: run {}",
                    workload.name,
                    run + 1
                ));
                let run_id = format!("{}-{tool}-{freq}-{run}", workload.name);
                match run_fresh(tool, line, out, &run_id, &context) {
                    Ok(result) => {
                        outcomes.entry((tool, *freq)).or_default().push(result);
                    }
                    Err(error) => {
                        say(&format!("{tool}: {error:#}"));
                        failures.insert(tool, format!("{error:#}"));
                    }
                }
            }
        }
        let baseline = outcomes
            .get(&("unprofiled", freqs[0]))
            .map(|r| Medians::of(r));
        writeln!(report, "## {}\n", workload.name)?;
        if let Some(base) = baseline {
            writeln!(
                report,
                "Unprofiled: wall {} s, CPU {} s.\n",
                show(base.wall_s, 3),
                show(base.workload_cpu_ms.map(|ms| ms / 1e3), 3)
            )?;
        }
        writeln!(
            report,
            "| tool | marginal CPU / sample (µs; per-round low … high) | fixed CPU (ms) | tool CPU @ {freq_list} Hz (ms) | \
             slowdown @ {freq_list} Hz | workload CPU added / sample @ {hi} Hz (µs) | peak RSS (MiB) | \
             samples @ {freq_list} Hz | lost | root share | output (KiB) |",
            hi = freqs[freqs.len() - 1]
        )?;
        writeln!(
            report,
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        )?;
        for tool in tools.iter().filter(|t| **t != "unprofiled") {
            if !lines
                .iter()
                .any(|(t, _, _, line)| t == tool && line.is_some())
            {
                writeln!(report, "| {tool} | not available | | | | | | | | | |")?;
                continue;
            }
            let key = (workload.name.to_string(), tool.to_string());
            if let Some(failure) = failures.get(tool) {
                writeln!(
                    report,
                    "| {tool} | failed: {} | | | | | | | | | |",
                    failure.replace('|', "/")
                )?;
                results.tools.insert(
                    key,
                    ToolFigures {
                        failure: Some(failure.clone()),
                        ..Default::default()
                    },
                );
                continue;
            }
            let per: Vec<(u32, Medians)> = freqs
                .iter()
                .map(|&f| {
                    (
                        f,
                        outcomes
                            .get(&(*tool, f))
                            .map(|r| Medians::of(r))
                            .unwrap_or_default(),
                    )
                })
                .collect();
            let mut figures = ToolFigures::compute(per);
            if let (Some(low), Some(high)) = (freqs.first(), freqs.last()) {
                figures.marginal_spread_us = marginal_spread(
                    outcomes.get(&(*tool, *low)).map_or(&[], |r| r.as_slice()),
                    outcomes.get(&(*tool, *high)).map_or(&[], |r| r.as_slice()),
                );
            }
            let slowdown = |m: &Medians| Some(m.wall_s? / baseline?.wall_s?);
            // What sampling costs inside the workload (the kernel's work at
            // each sample, the BPF program's unwinding included, is charged
            // to the task it interrupts).
            let added_per_sample = |m: &Medians| {
                Some((m.workload_cpu_ms? - baseline?.workload_cpu_ms?) / m.samples? * 1e3)
            };
            let high = figures.at_highest().copied().unwrap_or_default();
            let rss = figures
                .per_freq
                .iter()
                .filter_map(|(_, m)| m.rss_mib)
                .reduce(f64::max);
            writeln!(
                report,
                "| {tool} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                show_marginal(&figures),
                show(figures.fixed_ms, 1),
                per_freq(&figures, |m| m.tool_cpu_ms, 1),
                per_freq(&figures, |m| slowdown(m), 3),
                show(added_per_sample(&high), 1),
                show(rss, 1),
                per_freq(&figures, |m| m.samples, 0),
                show(high.lost, 0),
                high.root_share
                    .map(|f| format!("{f:.1} %"))
                    .unwrap_or_else(|| "–".into()),
                show(high.output_kib, 0)
            )?;
            figures.workload_added_us = added_per_sample(&high);
            results.tools.insert(key, figures);
        }
        let first_runs: Vec<String> = results
            .first_runs
            .iter()
            .filter(|((w, _), _)| w == workload.name)
            .map(|((_, tool), run)| {
                format!(
                    "{tool} {} ms ({} % of the workload's CPU), peak RSS {} MiB",
                    show(run.tool_cpu.map(|cpu| cpu.as_secs_f64() * 1e3), 1),
                    show(run.tool_cpu_percent(), 2),
                    show(run.peak_rss_mib(), 1)
                )
            })
            .collect();
        if !first_runs.is_empty() {
            writeln!(
                report,
                "\nFirst run at {} Hz with an empty cache directory (unwind tables compiled and \
                 names resolved during the run, as for a one-off `ddprof -- COMMAND`; the rows above \
                 find them cached): {}.",
                freqs[0],
                first_runs.join("; ")
            )?;
        }
        writeln!(report, "\nCommands:\n")?;
        for line in commands {
            writeln!(report, "{line}")?;
        }
        writeln!(report)?;
    }
    if args.global_seconds > 0 {
        say(&format!("ddprof --global for {} s", args.global_seconds));
        let global =
            global_startup(&ddprof, args.global_seconds, freqs[0]).unwrap_or_else(|error| {
                GlobalStartup {
                    command: String::new(),
                    startup_cpu: None,
                    startup_wall: None,
                    total_cpu: Duration::ZERO,
                    total_wall: Duration::ZERO,
                    peak_rss_kib: 0,
                    log_lines: Vec::new(),
                    failure: Some(format!("{error:#}")),
                }
            });
        write_global_section(&mut report, &global, args.global_seconds)?;
        results.global = Some(global);
    }
    if args.allocation_runs > 0 {
        if let Err(error) = allocations::allocation_section(
            &ddprof,
            args.allocation_runs,
            &args.allocation_modes,
            &mut report,
        ) {
            writeln!(report, "## Allocations\n\nNot measured: {error:#}\n")?;
        }
    }
    if args.trace_context_runs > 0 {
        if let Err(error) =
            trace_context::trace_context_section(&ddprof, args.trace_context_runs, &mut report)
        {
            writeln!(report, "## Trace context\n\nNot measured: {error:#}\n")?;
        }
    }
    write_targets(&mut report, &results, &freqs, args.work)?;
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

/// Ends a run of one section (`cargo xtask bench COMMAND`): says how it
/// was made, prints it, and with `--write-docs` puts it in
/// docs/Benchmarks.md in place of the section of an earlier run.
fn finish_only_section(
    mut report: String,
    command: &str,
    heading: &str,
    write_docs: bool,
) -> Result<()> {
    writeln!(
        report,
        "(`cargo xtask bench {command}`, {} CPUs, kernel {}.)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    )?;
    println!("{report}");
    if write_docs {
        replace_section(&report, heading)?;
        say(&format!(
            "wrote the {} section of docs/Benchmarks.md",
            heading.trim_start_matches("## ").trim_end().to_lowercase()
        ));
    }
    Ok(())
}

/// Puts `section` (starting with `heading`) in docs/Benchmarks.md in place
/// of the one of an earlier run, else before the corpus's section.
fn replace_section(section: &str, heading: &str) -> Result<()> {
    let path = workspace_root().join("docs/Benchmarks.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let (before, after) = match old.find(heading) {
        Some(start) => {
            let rest = &old[start + 1..];
            let end = rest
                .find("\n## ")
                .map_or(old.len(), |end| start + 1 + end + 1);
            (&old[..start], &old[end..])
        }
        None => match old.find(CORPUS_SECTION) {
            Some(start) => (&old[..start], &old[start..]),
            None => (old.as_str(), ""),
        },
    };
    std::fs::write(&path, format!("{before}{section}{after}"))?;
    Ok(())
}
