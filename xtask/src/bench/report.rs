//! Medians, the marginal and fixed CPU, and the report's tables.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;

use super::global::GlobalStartup;
use super::runs::RunResult;
use super::workloads::WORKLOADS;

pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// The medians of one (workload, tool, frequency).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Medians {
    pub(super) wall_s: Option<f64>,
    pub(super) workload_cpu_ms: Option<f64>,
    pub(super) tool_cpu_ms: Option<f64>,
    pub(super) samples: Option<f64>,
    pub(super) lost: Option<f64>,
    pub(super) root_share: Option<f64>,
    pub(super) rss_mib: Option<f64>,
    pub(super) output_kib: Option<f64>,
}

impl Medians {
    pub(super) fn of(results: &[RunResult]) -> Self {
        let median_of = |figure: &dyn Fn(&RunResult) -> Option<f64>| {
            median(results.iter().filter_map(figure).collect())
        };
        Self {
            wall_s: median_of(&|r| Some(r.wall.as_secs_f64())),
            workload_cpu_ms: median_of(&|r| Some(r.workload_cpu.as_secs_f64() * 1e3)),
            tool_cpu_ms: median_of(&|r| Some(r.tool_cpu?.as_secs_f64() * 1e3)),
            samples: median_of(&|r| Some(r.samples? as f64)),
            lost: median_of(&|r| Some(r.lost? as f64)),
            root_share: median_of(&|r| Some(r.rooted? as f64 / r.samples?.max(1) as f64 * 100.0)),
            rss_mib: median_of(&|r| Some(r.peak_rss_kib? as f64 / 1024.0)),
            output_kib: median_of(&|r| Some(r.output_bytes? as f64 / 1024.0)),
        }
    }
}

/// The summary of one (workload, tool) over the frequencies.
#[derive(Debug, Default, Clone)]
pub(super) struct ToolFigures {
    /// Per frequency, lowest first.
    pub(super) per_freq: Vec<(u32, Medians)>,
    /// µs of tool CPU per extra sample.
    pub(super) marginal_us: Option<f64>,
    /// The lowest and highest marginal CPU of one round (run *i* at the
    /// lowest and the highest frequency, run back to back): how much the
    /// medians' figure can be trusted.
    pub(super) marginal_spread_us: Option<(f64, f64)>,
    /// ms of tool CPU that does not grow with the samples.
    pub(super) fixed_ms: Option<f64>,
    /// µs of the workload's CPU per sample at the highest frequency that
    /// unprofiled runs did not use (the kernel's side of sampling).
    pub(super) workload_added_us: Option<f64>,
    pub(super) failure: Option<String>,
}

impl ToolFigures {
    pub(super) fn compute(per_freq: Vec<(u32, Medians)>) -> Self {
        let (mut marginal_us, mut fixed_ms) = (None, None);
        if let (Some((_, low)), Some((_, high))) = (per_freq.first(), per_freq.last()) {
            if let (Some(cpu_lo), Some(cpu_hi), Some(n_lo), Some(n_hi)) =
                (low.tool_cpu_ms, high.tool_cpu_ms, low.samples, high.samples)
            {
                if n_hi > n_lo {
                    let marginal_ms = (cpu_hi - cpu_lo) / (n_hi - n_lo);
                    marginal_us = Some(marginal_ms * 1e3);
                    fixed_ms = Some(cpu_lo - n_lo * marginal_ms);
                }
            }
        }
        Self {
            per_freq,
            marginal_us,
            marginal_spread_us: None,
            fixed_ms,
            workload_added_us: None,
            failure: None,
        }
    }

    pub(super) fn at_lowest(&self) -> Option<&Medians> {
        self.per_freq.first().map(|(_, m)| m)
    }

    pub(super) fn at_highest(&self) -> Option<&Medians> {
        self.per_freq.last().map(|(_, m)| m)
    }
}

/// The lowest and highest marginal CPU (µs per sample) over the rounds:
/// round *i* pairs the *i*-th run at the lowest frequency with the *i*-th
/// at the highest. `None` with fewer than two rounds.
pub(super) fn marginal_spread(low: &[RunResult], high: &[RunResult]) -> Option<(f64, f64)> {
    let per_round: Vec<f64> = low
        .iter()
        .zip(high)
        .filter_map(|(lo, hi)| {
            let (n_lo, n_hi) = (lo.samples? as f64, hi.samples? as f64);
            // Negative when the machine was slower in the low-frequency run.
            let extra_ms = (hi.tool_cpu?.as_secs_f64() - lo.tool_cpu?.as_secs_f64()) * 1e3;
            (n_hi > n_lo).then(|| extra_ms / (n_hi - n_lo) * 1e3)
        })
        .collect();
    if per_round.len() < 2 {
        return None;
    }
    let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let high = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((low, high))
}

/// The highest `value` of `tool`'s first runs (empty cache), with its
/// workload: shown beside the targets, which the measured (cached) runs
/// decide.
pub(super) fn worst_first_run(
    results: &BenchResults,
    tool: &str,
    value: impl Fn(&str, &RunResult) -> Option<f64>,
) -> Option<(String, f64)> {
    results
        .first_runs
        .iter()
        .filter(|((_, t), _)| t == tool)
        .filter_map(|((w, _), run)| Some((w.clone(), value(w, run)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// A marginal CPU figure with its per-round spread: `1.64 (1.20 … 2.10)`.
pub(super) fn show_marginal(figures: &ToolFigures) -> String {
    match (figures.marginal_us, figures.marginal_spread_us) {
        (Some(value), Some((low, high))) => format!("{value:.2} ({low:.2} … {high:.2})"),
        (value, _) => show(value, 2),
    }
}

pub(super) fn show(value: Option<f64>, digits: usize) -> String {
    value
        .map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// `a / b / …` over the frequencies.
pub(super) fn per_freq(
    figures: &ToolFigures,
    value: impl Fn(&Medians) -> Option<f64>,
    digits: usize,
) -> String {
    figures
        .per_freq
        .iter()
        .map(|(_, m)| show(value(m), digits))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Everything measured, for the targets table.
#[derive(Default)]
pub(super) struct BenchResults {
    /// (workload, tool) → figures.
    pub(super) tools: BTreeMap<(String, String), ToolFigures>,
    /// (workload, ddprof tool) → its first run, with an empty cache.
    pub(super) first_runs: BTreeMap<(String, String), RunResult>,
    pub(super) global: Option<GlobalStartup>,
}

impl BenchResults {
    pub(super) fn get(&self, workload: &str, tool: &str) -> Option<&ToolFigures> {
        self.tools
            .get(&(workload.to_string(), tool.to_string()))
            .filter(|f| f.failure.is_none())
    }
}

pub(super) fn write_global_section(
    report: &mut String,
    global: &GlobalStartup,
    seconds: u32,
) -> Result<()> {
    writeln!(report, "## `--global` start-up\n")?;
    if let Some(failure) = &global.failure {
        writeln!(report, "Failed: {failure}\n")?;
        return Ok(());
    }
    writeln!(
        report,
        "`{}` for {seconds} s, then SIGINT, in a cgroup of its own; the start-up's CPU is the \
         cgroup's when ddprof logs `start-up: done`.\n",
        global.command
    )?;
    writeln!(
        report,
        "| start-up CPU (ms) | start-up wall (ms) | whole run CPU (ms) | whole run wall (s) | peak RSS (MiB) |"
    )?;
    writeln!(report, "| --- | --- | --- | --- | --- |")?;
    writeln!(
        report,
        "| {} | {} | {:.0} | {:.1} | {:.1} |\n",
        show(global.startup_cpu.map(|d| d.as_secs_f64() * 1e3), 0),
        show(global.startup_wall.map(|d| d.as_secs_f64() * 1e3), 0),
        global.total_cpu.as_secs_f64() * 1e3,
        global.total_wall.as_secs_f64(),
        global.peak_rss_kib as f64 / 1024.0
    )?;
    if !global.log_lines.is_empty() {
        writeln!(report, "ddprof's own account of its start-up:\n\n```")?;
        for line in &global.log_lines {
            writeln!(report, "{line}")?;
        }
        writeln!(report, "```\n")?;
    }
    Ok(())
}

/// The targets of issue 10, each with the measured figure.
pub(super) fn write_targets(
    report: &mut String,
    results: &BenchResults,
    freqs: &[u32],
    work: u32,
) -> Result<()> {
    writeln!(report, "## Targets (issues 10 and 32)\n")?;
    writeln!(report, "From this run; ratios of medians.\n")?;
    writeln!(report, "| target | measured | |")?;
    writeln!(report, "| --- | --- | --- |")?;
    let verdict = |met: Option<bool>| match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    };
    let workloads_with = |tool: &str| -> Vec<(&str, &ToolFigures)> {
        results
            .tools
            .iter()
            .filter(|((_, t), f)| t == tool && f.failure.is_none())
            .map(|((w, _), f)| (w.as_str(), f))
            .collect()
    };
    // 1. eBPF marginal ≤ 2 µs at any depth.
    let bpf = workloads_with("ddprof-bpf");
    let worst = bpf
        .iter()
        .filter_map(|(w, f)| Some((*w, f.marginal_us?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    writeln!(
        report,
        "| eBPF engine marginal CPU per sample ≤ 2 µs on every workload (the profiler's CPU; \
         the program's unwinding is charged to the workload, in brackets: *workload CPU added*) | {} | {} |",
        worst
            .map(|(w, v)| format!(
                "worst {v:.2} µs ({w}); {}",
                bpf.iter()
                    .map(|(w, f)| format!(
                        "{w} {} ({})",
                        show(f.marginal_us, 2),
                        show(f.workload_added_us, 1)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .unwrap_or_else(|| "–".into()),
        verdict(worst.map(|(_, v)| v <= 2.0))
    )?;
    // 2, 3. On the deep workload: ≤ 1/4 of the perf engine's, ≤ 1/10 of samply's.
    for (other, ratio) in [("ddprof-perf", 4.0), ("samply", 10.0)] {
        let ours = results
            .get("recursion", "ddprof-bpf")
            .and_then(|f| f.marginal_us);
        let theirs = results.get("recursion", other).and_then(|f| f.marginal_us);
        let measured = match (ours, theirs) {
            (Some(a), Some(b)) => format!("{a:.2} vs {b:.2} µs: 1/{:.1}", b / a),
            _ => "–".into(),
        };
        writeln!(
            report,
            "| eBPF marginal CPU per sample ≤ 1/{ratio:.0} of {other}'s on recursion (300 frames) | {measured} | {} |",
            verdict(ours.zip(theirs).map(|(a, b)| a * ratio <= b))
        )?;
    }
    // 4. Whole profiler CPU at the lowest frequency within each workload's
    // target: 1 % (issue 10); 3 % for a warm rustc (issue 32).
    let low = freqs[0];
    let target_of = |workload: &str| {
        WORKLOADS
            .iter()
            .find(|w| w.name == workload)
            .map_or(1.0, |w| w.cpu_share_target)
    };
    let targets: Vec<String> = WORKLOADS
        .iter()
        .filter(|w| w.cpu_share_target != 1.0)
        .map(|w| format!("{} {} %", w.name, w.cpu_share_target))
        .collect();
    for engine in ["ddprof-bpf", "ddprof-perf"] {
        let shares: Vec<(&str, f64)> = workloads_with(engine)
            .iter()
            .filter_map(|(w, f)| {
                let m = f.at_lowest()?;
                Some((*w, m.tool_cpu_ms? / m.workload_cpu_ms? * 100.0))
            })
            .collect();
        // The worst against its own target.
        let worst = shares
            .iter()
            .copied()
            .max_by(|a, b| (a.1 / target_of(a.0)).total_cmp(&(b.1 / target_of(b.0))));
        let first_run = worst_first_run(results, engine, |_, run| run.tool_cpu_percent())
            .map(|(w, v)| format!("; first run with an empty cache: worst {v:.2} % ({w})"))
            .unwrap_or_default();
        writeln!(
            report,
            "| {engine}: whole profiler CPU at {low} Hz < 1 % of the workload's{} (`--work {work}`, start-up included) | {}{first_run} | {} |",
            if targets.is_empty() {
                String::new()
            } else {
                format!(" ({})", targets.join(", "))
            },
            worst
                .map(|(w, v)| format!(
                    "worst {v:.2} % ({w}); {}",
                    shares
                        .iter()
                        .map(|(w, v)| format!("{w} {v:.2} %"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .unwrap_or_else(|| "–".into()),
            verdict(worst.map(|(w, v)| v < target_of(w)))
        )?;
    }
    // 5. Peak RSS ≤ 24 MiB for one profiled process.
    for engine in ["ddprof-bpf", "ddprof-perf"] {
        let peaks: Vec<(&str, f64)> = workloads_with(engine)
            .iter()
            .filter(|(w, _)| {
                WORKLOADS
                    .iter()
                    .any(|x| x.name == *w && x.one_small_process)
            })
            .filter_map(|(w, f)| {
                Some((
                    *w,
                    f.per_freq
                        .iter()
                        .filter_map(|(_, m)| m.rss_mib)
                        .reduce(f64::max)?,
                ))
            })
            .collect();
        let worst = peaks.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
        let first_run = worst_first_run(results, engine, |workload, run| {
            let one_process = WORKLOADS
                .iter()
                .any(|x| x.name == workload && x.one_small_process);
            one_process.then_some(run.peak_rss_mib()?)
        })
        .map(|(w, v)| format!("; first run with an empty cache: worst {v:.1} MiB ({w})"))
        .unwrap_or_default();
        writeln!(
            report,
            "| {engine}: peak RSS ≤ 24 MiB profiling one process (not the big programs: their tables alone are tens of MiB) | {}{first_run} | {} |",
            worst
                .map(|(w, v)| format!("worst {v:.1} MiB ({w})"))
                .unwrap_or_else(|| "–".into()),
            verdict(worst.map(|(_, v)| v <= 24.0))
        )?;
    }
    // 6. perf engine marginal ≤ samply's on every workload.
    let pairs: Vec<(&str, &ToolFigures, &ToolFigures)> = workloads_with("ddprof-perf")
        .iter()
        .filter_map(|(w, f)| {
            let samply = results.get(w, "samply")?;
            (f.marginal_us.is_some() && samply.marginal_us.is_some()).then_some((*w, *f, samply))
        })
        .collect();
    let above = |ours: &ToolFigures, theirs: &ToolFigures| ours.marginal_us > theirs.marginal_us;
    let compared = |(w, ours, theirs): &(&str, &ToolFigures, &ToolFigures)| {
        format!(
            "{w} {} vs {} µs",
            show_marginal(ours),
            show_marginal(theirs)
        )
    };
    let missed: Vec<String> = pairs
        .iter()
        .filter(|(_, ours, theirs)| above(ours, theirs))
        .map(compared)
        .collect();
    writeln!(
        report,
        "| perf engine marginal CPU per sample ≤ samply's on every workload (per-round low … high in brackets) | {} | {} |",
        if pairs.is_empty() {
            "–".to_string()
        } else if missed.is_empty() {
            pairs.iter().map(compared).collect::<Vec<_>>().join(", ")
        } else {
            format!("above on {}", missed.join(", "))
        },
        verdict((!pairs.is_empty()).then_some(missed.is_empty()))
    )?;
    // 7. --global start-up ≤ 1 s of CPU.
    let global = results.global.as_ref().and_then(|g| g.startup_cpu);
    writeln!(
        report,
        "| `--global` start-up ≤ 1 s of CPU | {} | {} |\n",
        global
            .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "–".into()),
        verdict(global.map(|d| d <= Duration::from_secs(1)))
    )?;
    Ok(())
}

/// The heading of docs/Benchmarks.md's section on the real-program corpus
/// (tests/corpus.rs), which `--write-docs` keeps.
pub(super) const CORPUS_SECTION: &str = "## Real-program corpus";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marginal_spread_pairs_the_runs_of_each_round() {
        let run = |cpu_ms: u64, samples: u64| RunResult {
            tool_cpu: Some(Duration::from_millis(cpu_ms)),
            samples: Some(samples),
            ..Default::default()
        };
        // Rounds: (40 - 30) / 3600, (44 - 36) / 3600, (35 - 38) / 3600 samples.
        let low = [run(30, 400), run(36, 400), run(38, 400)];
        let high = [run(40, 4000), run(44, 4000), run(35, 4000)];
        let (lowest, highest) = marginal_spread(&low, &high).unwrap();
        assert!((lowest - -3.0 / 3.6).abs() < 1e-9, "{lowest}");
        assert!((highest - 10.0 / 3.6).abs() < 1e-9, "{highest}");
        // A round missing a figure is left out; one round says nothing.
        let partial = [run(30, 400), RunResult::default()];
        assert_eq!(marginal_spread(&partial, &high[..2]), None);
        assert_eq!(marginal_spread(&low[..1], &high[..1]), None);
        let figures = ToolFigures {
            marginal_us: Some(1.5),
            marginal_spread_us: Some((-0.25, 3.0)),
            ..Default::default()
        };
        assert_eq!(show_marginal(&figures), "1.50 (-0.25 … 3.00)");
    }

    #[test]
    fn marginal_and_fixed_cpu_come_from_the_lowest_and_highest_frequency() {
        let at = |cpu: f64, samples: f64| Medians {
            tool_cpu_ms: Some(cpu),
            samples: Some(samples),
            ..Default::default()
        };
        let figures = ToolFigures::compute(vec![(99, at(30.0, 400.0)), (999, at(66.0, 4000.0))]);
        assert!((figures.marginal_us.unwrap() - 10.0).abs() < 1e-9);
        assert!((figures.fixed_ms.unwrap() - 26.0).abs() < 1e-9);
    }
}
