//! One run of a tool on a workload: its command line, and what it measured.
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::cgroup::run_in_cgroup;
use super::stacks::{parse_perf_script, perf_script_args, read_folded, read_samply_profile};
use super::workloads::Workload;
use crate::say;

/// The figures of one run of one tool.
#[derive(Debug, Default, Clone)]
pub(super) struct RunResult {
    pub(super) wall: Duration,
    pub(super) workload_cpu: Duration,
    /// CPU of the tool's processes, post-processing (`perf script`) included.
    pub(super) tool_cpu: Option<Duration>,
    pub(super) samples: Option<u64>,
    pub(super) lost: Option<u64>,
    /// Samples whose stack reaches the root ([`ROOT_FRAMES`]).
    pub(super) rooted: Option<u64>,
    pub(super) peak_rss_kib: Option<u64>,
    pub(super) output_bytes: Option<u64>,
}

impl RunResult {
    /// The tool's CPU as a share of the workload's, in %.
    pub(super) fn tool_cpu_percent(&self) -> Option<f64> {
        Some(self.tool_cpu?.as_secs_f64() / self.workload_cpu.as_secs_f64() * 100.0)
    }

    pub(super) fn peak_rss_mib(&self) -> Option<f64> {
        Some(self.peak_rss_kib? as f64 / 1024.0)
    }

    /// One line of this run's figures, so that the log shows the spread
    /// behind each median.
    pub(super) fn summary(&self) -> String {
        let mut line = format!(
            "  wall {:.3} s, workload CPU {:.1} ms",
            self.wall.as_secs_f64(),
            self.workload_cpu.as_secs_f64() * 1e3
        );
        if let Some(cpu) = self.tool_cpu {
            line += &format!(", tool CPU {:.1} ms", cpu.as_secs_f64() * 1e3);
        }
        if let Some(samples) = self.samples {
            line += &format!(", {samples} samples");
        }
        if let Some(rss) = self.peak_rss_kib {
            line += &format!(", peak RSS {:.1} MiB", rss as f64 / 1024.0);
        }
        line
    }
}

pub(super) fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    };
    entries.flatten().map(|e| dir_size(&e.path())).sum()
}

pub(super) fn field(text: &str, key: &str) -> Option<u64> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// The command line of one tool around the measured workload.
pub(super) fn command_line(
    tool: &str,
    ddprof: &Path,
    samply: Option<&Path>,
    freq: u32,
    out: &Path,
    measured: &[String],
) -> Option<Vec<String>> {
    let path = |p: &Path| p.display().to_string();
    let perf_record = |call_graph: &str| -> Vec<String> {
        vec![
            "perf".into(),
            "record".into(),
            "-F".into(),
            freq.to_string(),
            "--call-graph".into(),
            call_graph.into(),
            "-o".into(),
            path(&out.join("perf.data")),
            "--".into(),
        ]
    };
    let ddprof_record = |engine: &str, events: String| -> Vec<String> {
        vec![
            path(ddprof),
            "--engine".into(),
            engine.into(),
            "-e".into(),
            events,
            "--upload-period".into(),
            "600".into(),
            "--log-level".into(),
            "notice".into(),
            "--output".into(),
            path(out),
            "--".into(),
        ]
    };
    let mut line: Vec<String> = match tool {
        "unprofiled" => vec![],
        "ddprof-bpf" | "ddprof-perf" => ddprof_record(
            tool.trim_start_matches("ddprof-"),
            format!("sCPU freq={freq}"),
        ),
        // Wall time too (`sWALL`): what its program costs at every context
        // switch, beside the CPU-only run.
        "ddprof-bpf-wall" => ddprof_record("bpf", format!("sCPU freq={freq};sWALL")),
        "perf-fp" => perf_record("fp"),
        "perf-dwarf-8k" => perf_record("dwarf,8192"),
        "perf-dwarf-32k" => perf_record("dwarf,32768"),
        "samply" => vec![
            path(samply?),
            "record".into(),
            "--save-only".into(),
            "--unstable-presymbolicate".into(),
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

/// What one run needs to know about the workload.
pub(super) struct RunContext<'a> {
    pub(super) workload: &'a Workload,
    pub(super) workload_exes: Arc<HashSet<PathBuf>>,
}

/// [`run_once`] into an emptied `out`, after `sync(2)`: the previous run's
/// output (perf.data: up to 150 MB) is written back to disk now, not by
/// kernel threads during this run, whose tools and workload share the 2
/// CPUs. Logs the run's figures.
pub(super) fn run_fresh(
    tool: &str,
    line: &[String],
    out: &Path,
    run_id: &str,
    context: &RunContext,
) -> Result<RunResult> {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out)?;
    nix::unistd::sync();
    let mut result = run_once(tool, line, out, run_id, context)?;
    result.output_bytes = Some(dir_size(out));
    say(&result.summary());
    Ok(result)
}

pub(super) fn run_once(
    tool: &str,
    line: &[String],
    out: &Path,
    run_id: &str,
    context: &RunContext,
) -> Result<RunResult> {
    let measured = run_in_cgroup(
        line,
        &format!("ddprof-bench-{run_id}"),
        &context.workload_exes,
        None,
    )?;
    let stderr = &measured.stderr;
    if !measured.status.success() {
        // Some tools explain themselves on stdout, some after a blank line.
        let stdout = String::from_utf8_lossy(&measured.stdout);
        let reason = stderr
            .lines()
            .chain(stdout.lines())
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        bail!("{tool} failed ({}): {}", measured.status, reason.trim());
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
        workload_cpu,
        ..Default::default()
    };
    if tool == "unprofiled" {
        return Ok(result);
    }
    let mut tool_cpu = measured.cpu.saturating_sub(workload_cpu);
    let mut peak_rss = measured.peak_rss_kib;
    let entries = context.workload.thread_entries;
    let counts = if tool.starts_with("ddprof") {
        let summary = stderr
            .lines()
            .rev()
            .find(|l| l.contains("summary:"))
            .unwrap_or("");
        let mut counts = read_folded(&out.join("stacks.folded"), entries)?;
        counts.lost = field(summary, "lost");
        // The worker's last symbolization comes just before it exits, often
        // between two 50 ms samples: its VmHWM, which ddprof reads then, is
        // in the summary.
        for process in ["parent_peak_rss_kib", "worker_peak_rss_kib"] {
            peak_rss = peak_rss.max(field(summary, process).unwrap_or(0));
        }
        counts
    } else if tool.starts_with("perf") {
        // perf unwinds (dwarf) and names the frames here: part of the tool.
        let script = perf_script_args(&out.join("perf.data"));
        let mut parsed = None;
        let scripted = run_in_cgroup(
            &script,
            &format!("ddprof-bench-{run_id}-script"),
            &Arc::new(HashSet::new()),
            Some(&mut |stdout| parsed = Some(parse_perf_script(stdout, entries))),
        )?;
        // A reader that stopped at a line it did not expect leaves perf
        // script to die of SIGPIPE: its error says more than the status.
        let counts = parsed
            .context("perf script's output was not read")?
            .context("cannot read perf script's output")?;
        if !scripted.status.success() {
            bail!(
                "perf script failed ({}): {}",
                scripted.status,
                scripted.stderr.lines().next().unwrap_or("no message")
            );
        }
        tool_cpu += scripted.cpu;
        peak_rss = peak_rss.max(scripted.peak_rss_kib);
        counts
    } else {
        read_samply_profile(&out.join("profile.json.gz"), entries)?
    };
    result.tool_cpu = Some(tool_cpu);
    result.peak_rss_kib = Some(peak_rss);
    result.samples = Some(counts.samples);
    result.rooted = Some(counts.rooted);
    result.lost = counts.lost;
    Ok(result)
}

/// The command line as a shell would need it typed.
pub(super) fn shell_words(line: &[String]) -> String {
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
