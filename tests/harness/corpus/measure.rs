//! Running one tool on one entry and what it measured.
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::programs::{run_checked, Workload};
use super::stacks::{
    parse_perf_script, reaches_entry, read_pprof, without_parameters, FunctionNames, Stack,
};
use super::{Entry, FREQUENCY_HZ, RUN_TIMEOUT};
use crate::guards::Scratch;
use crate::outputs::pprof_files;
use crate::processes::{
    run_reaped, without_address_randomization, workload_processes, ProcessEvents, Reaped,
    RunOutcome,
};

/// The three tools of every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// `ddprof --engine auto`: the default (BPF as root).
    DdprofAuto,
    DdprofPerf,
    PerfRecord,
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::DdprofAuto, Tool::DdprofPerf, Tool::PerfRecord];
    /// The order the tools run in: the perf engine first, so that the
    /// default engine runs with the unwind tables that run compiled in
    /// the store (`--debug-cache`), as every run after a program's first
    /// does. (Cold, a big program's first seconds go to the perf engine
    /// while its tables compile: 0.44 s for the 2.4 M rows of
    /// `big-static`.)
    pub const RUN_ORDER: [Tool; 3] = [Tool::DdprofPerf, Tool::DdprofAuto, Tool::PerfRecord];

    pub fn label(self) -> &'static str {
        match self {
            Tool::DdprofAuto => "ddprof auto",
            Tool::DdprofPerf => "ddprof perf",
            Tool::PerfRecord => "perf record",
        }
    }
}

/// What one tool measured of one entry.
#[derive(Debug, Clone)]
pub struct Measured {
    pub tool: Tool,
    /// CPU time (user + system) of the command and its descendants.
    pub cpu: Duration,
    /// The workload's samples.
    pub samples: u64,
    /// Of those, the ones whose stack reaches the thread's entry.
    pub complete: u64,
    /// Samples ddprof did not mark truncated whose stack does not reach
    /// the thread's entry (by outermost frame): none is allowed.
    pub marked_complete_elsewhere: Vec<(String, u64)>,
    /// The BPF engine's exit line: samples unwound in the kernel and by
    /// the perf engine (ddprof with the BPF engine only).
    pub in_kernel: Option<(u64, u64)>,
    /// Samples per leaf function, most first.
    pub leaves: Vec<(String, u64)>,
    /// Samples per outermost frame, most first: what the completeness
    /// judgment saw.
    pub outermost: Vec<(String, u64)>,
    /// Samples of other processes (not counted above).
    pub foreign_samples: u64,
    /// The workload's processes, as the kernel reported them.
    pub processes: usize,
    /// Log lines worth reading beside the figures (engine, warnings).
    pub notes: Vec<String>,
}

impl Measured {
    pub(super) fn new(
        tool: Tool,
        cpu: Duration,
        stacks: &[(u32, Stack)],
        workload: &HashSet<u32>,
    ) -> Measured {
        let mut samples = 0;
        let mut complete = 0;
        let mut foreign_samples = 0;
        let mut leaves: HashMap<&str, u64> = HashMap::new();
        let mut outermost: HashMap<&str, u64> = HashMap::new();
        let mut marked_complete_elsewhere: HashMap<String, u64> = HashMap::new();
        for (pid, stack) in stacks {
            if !workload.contains(pid) {
                foreign_samples += stack.count;
                continue;
            }
            samples += stack.count;
            if reaches_entry(&stack.frames) {
                complete += stack.count;
            } else if tool != Tool::PerfRecord
                && !stack.frames.iter().any(|frame| frame == "[truncated]")
                // An outermost frame without a name cannot be judged (1 of
                // Go's ~3,900 samples with the perf engine,
                // `[unknown];[unknown];[unknown]`, in one suite run).
                && stack.frames.last().is_some_and(|frame| frame != "[unknown]")
            {
                let tail: Vec<&str> = stack
                    .frames
                    .iter()
                    .rev()
                    .take(3)
                    .map(String::as_str)
                    .collect();
                *marked_complete_elsewhere.entry(tail.join(";")).or_default() += stack.count;
            }
            let leaf = stack.frames.first().map_or("[unknown]", String::as_str);
            *leaves.entry(without_parameters(leaf)).or_default() += stack.count;
            let root = stack.frames.last().map_or("[unknown]", String::as_str);
            *outermost.entry(root).or_default() += stack.count;
        }
        Measured {
            tool,
            cpu,
            samples,
            complete,
            marked_complete_elsewhere: {
                let mut roots: Vec<(String, u64)> = marked_complete_elsewhere.into_iter().collect();
                roots.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                roots
            },
            in_kernel: None,
            leaves: most_first(leaves),
            outermost: most_first(outermost),
            foreign_samples,
            processes: workload.len(),
            notes: Vec::new(),
        }
    }

    /// CPU time × frequency.
    pub fn expected_samples(&self) -> f64 {
        self.cpu.as_secs_f64() * FREQUENCY_HZ as f64
    }

    /// Samples over expected samples.
    pub fn sample_ratio(&self) -> f64 {
        self.samples as f64 / self.expected_samples().max(1.0)
    }

    /// Complete stacks, in percent of the samples.
    pub fn complete_percent(&self) -> f64 {
        100.0 * self.complete as f64 / self.samples.max(1) as f64
    }

    /// The `n` leaf functions with the most samples and their percentages.
    pub fn top_leaves(&self, n: usize) -> Vec<(&str, f64)> {
        self.shares(&self.leaves, n)
    }

    /// The percentage of samples whose leaf is `function` (parameters
    /// ignored).
    pub fn leaf_share(&self, function: &str) -> f64 {
        let function = without_parameters(function);
        self.leaves
            .iter()
            .find(|(f, _)| f == function)
            .map_or(0.0, |(_, count)| {
                100.0 * *count as f64 / self.samples.max(1) as f64
            })
    }

    /// The `n` outermost frames with the most samples and their percentages.
    pub fn top_outermost(&self, n: usize) -> Vec<(&str, f64)> {
        self.shares(&self.outermost, n)
    }

    pub(super) fn shares<'a>(&self, counts: &'a [(String, u64)], n: usize) -> Vec<(&'a str, f64)> {
        counts
            .iter()
            .take(n)
            .map(|(f, count)| {
                (
                    f.as_str(),
                    100.0 * *count as f64 / self.samples.max(1) as f64,
                )
            })
            .collect()
    }
}

pub(super) fn most_first(counts: HashMap<&str, u64>) -> Vec<(String, u64)> {
    let mut counts: Vec<(String, u64)> = counts
        .into_iter()
        .map(|(f, n)| (f.to_string(), n))
        .collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts
}

/// Runs `workload` under `tool`; an error says what went wrong (the command
/// failed, the tool failed or left nothing to read).
pub fn measure(entry: &Entry, workload: &Workload, tool: Tool) -> Result<Measured, String> {
    let scratch = Scratch::new(&format!(
        "corpus-{}-{}",
        entry.name,
        tool.label().replace(' ', "-")
    ));
    let run_dir = scratch.0.join("run");
    std::fs::create_dir_all(&run_dir).map_err(|e| e.to_string())?;
    match tool {
        Tool::DdprofAuto | Tool::DdprofPerf => {
            let engine = if tool == Tool::DdprofAuto {
                "auto"
            } else {
                "perf"
            };
            measure_ddprof(
                workload,
                engine,
                entry.stack_bytes,
                &scratch.0,
                &run_dir,
                tool,
            )
        }
        Tool::PerfRecord => measure_perf_record(workload, entry.stack_bytes, &scratch.0, &run_dir),
    }
}

/// The counts of the BPF engine's exit line (`BPF engine: N samples
/// unwound in the kernel, …, M unwound by the perf engine in all; …`).
pub(super) fn in_kernel_and_by_perf(stderr: &str) -> Option<(u64, u64)> {
    stderr.lines().find_map(|line| {
        let rest = line.split("BPF engine: ").nth(1)?;
        let in_kernel = rest.split_whitespace().next()?.parse().ok()?;
        let before = rest.split(" unwound by the perf engine in all").next()?;
        if before.len() == rest.len() {
            return None;
        }
        Some((in_kernel, before.rsplit(", ").next()?.trim().parse().ok()?))
    })
}

/// What running a tool left.
pub(super) struct ToolRun {
    pub(super) reaped: Reaped,
    pub(super) stderr: String,
    /// The command's processes.
    pub(super) workload: HashSet<u32>,
}

/// Spawns `command` with stderr piped, reaps it with its CPU time, reads
/// stderr to its end (for ddprof, when the profiler, which shares it, has
/// exited) and finds the processes of the command it started.
pub(super) fn run_tool(mut command: Command) -> Result<ToolRun, String> {
    let events = ProcessEvents::listen().map_err(|e| {
        format!("cannot follow the run's processes (netlink process connector, needs root): {e}")
    })?;
    let RunOutcome {
        pid,
        reaped,
        stderr,
    } = run_reaped(&mut command, RUN_TIMEOUT)?;
    let events = events
        .stop()
        .map_err(|e| format!("following the run's processes: {e}"))?;
    let workload = workload_processes(&events, pid);
    if workload.is_empty() {
        return Err(format!(
            "the command never started (no exec seen):\n{stderr}"
        ));
    }
    Ok(ToolRun {
        reaped,
        stderr,
        workload,
    })
}

pub(super) fn measure_ddprof(
    workload: &Workload,
    engine: &str,
    stack_bytes: u32,
    scratch: &Path,
    run_dir: &Path,
    tool: Tool,
) -> Result<Measured, String> {
    let output = scratch.join("ddprof-out");
    let mut command = crate::ddprof_command();
    command
        .args(["--engine", engine, "-e"])
        .arg(format!("sCPU freq={FREQUENCY_HZ}"))
        .arg("--stack-sample-size")
        .arg(stack_bytes.to_string())
        .args(["-l", "notice", "--output"])
        .arg(&output)
        .arg("--")
        .args(&workload.command)
        .current_dir(run_dir);
    // The launcher execs into the command: the child is the command.
    let ToolRun {
        reaped,
        stderr,
        workload,
    } = run_tool(command)?;
    if !reaped.status.success() {
        return Err(format!(
            "the command failed under ddprof ({}):\n{stderr}",
            reaped.status
        ));
    }
    let mut stacks = Vec::new();
    let files = if output.is_dir() {
        pprof_files(&output)
    } else {
        Vec::new()
    };
    if files.is_empty() {
        return Err(format!("ddprof wrote no pprof file:\n{stderr}"));
    }
    let mut names = FunctionNames::default();
    for file in files {
        stacks.extend(read_pprof(&file, &mut names)?);
    }
    let mut measured = Measured::new(tool, reaped.cpu, &stacks, &workload);
    measured.in_kernel = in_kernel_and_by_perf(&stderr);
    measured.notes = stderr
        .lines()
        .filter(|l| l.contains("engine: ") || l.contains("warning") || l.contains("summary:"))
        .map(|l| l.split_once(": ").map_or(l, |(_, rest)| rest).to_string())
        .collect();
    Ok(measured)
}

pub(super) fn perf(buildid_dir: &Path) -> Command {
    let mut command = Command::new("perf");
    command.arg("--buildid-dir").arg(buildid_dir);
    command
}

pub(super) fn measure_perf_record(
    workload: &Workload,
    stack_bytes: u32,
    scratch: &Path,
    run_dir: &Path,
) -> Result<Measured, String> {
    let buildid_dir = scratch.join("buildid");
    for file in &workload.deleted_while_running {
        run_checked(
            perf(&buildid_dir)
                .args(["buildid-cache", "--add"])
                .arg(file),
            "perf buildid-cache",
        );
    }
    let data = scratch.join("perf.data");
    let mut command = perf(&buildid_dir);
    command
        .args([
            "record",
            "--no-buildid-cache",
            "--buildid-mmap",
            "-e",
            "task-clock",
            "-F",
        ])
        .arg(FREQUENCY_HZ.to_string())
        .arg("--call-graph")
        .arg(format!("dwarf,{stack_bytes}"))
        .arg("-o")
        .arg(&data)
        .arg("--")
        .args(&workload.command)
        .current_dir(run_dir);
    // perf record 6.1 keeps the mappings a process had before its exec
    // (its parent's, when a shell or a compiler driver started it, or its
    // own previous program's). With address randomization, its unwinding
    // of such a program then stops at `__libc_start_call_main` in about
    // half the runs (measured here: 0.1 % or 100 % complete, run to run);
    // without it, where the new libc lands where the old one was, it does
    // not. The reference runs without randomization; ddprof runs as users
    // run it.
    without_address_randomization(&mut command);
    // perf record forks the command and waits for it: the command's CPU
    // time is that of perf's children.
    let ToolRun {
        reaped,
        stderr,
        workload,
    } = run_tool(command)?;
    if !reaped.status.success() {
        return Err(format!("perf record failed ({}):\n{stderr}", reaped.status));
    }
    let script = perf(&buildid_dir)
        .args(crate::perf_script::script_args(&data))
        .output()
        .map_err(|e| format!("cannot run perf script: {e}"))?;
    if !script.status.success() {
        return Err(format!(
            "perf script failed: {}",
            String::from_utf8_lossy(&script.stderr)
        ));
    }
    let stacks = parse_perf_script(
        &String::from_utf8_lossy(&script.stdout),
        &mut FunctionNames::default(),
    )?;
    let mut measured = Measured::new(Tool::PerfRecord, reaped.children_cpu, &stacks, &workload);
    measured.notes = stderr
        .lines()
        .filter(|l| l.contains("lost") || l.contains("LOST") || l.contains("Warning"))
        .map(str::to_string)
        .collect();
    Ok(measured)
}
