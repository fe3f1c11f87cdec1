//! One entry's results judged against perf record, and the tables the test prints.
use std::fmt::Write as _;

use super::measure::{Measured, Tool};
use super::{
    Entry, COMPLETENESS_TOLERANCE_POINTS, FREQUENCY_HZ, MAX_MARKED_COMPLETE_ELSEWHERE,
    MIN_BIG_COMPLETE_PERCENT, MIN_BIG_SAMPLE_RATIO, MIN_DDPROF_COMPLETE_PERCENT,
    MIN_IN_KERNEL_SHARE, MIN_SAMPLE_RATIO, SAMPLE_RATIO_TOLERANCE,
};

/// One entry's figures: the three tools, each measured or failed.
pub struct EntryResult {
    pub entry: &'static Entry,
    pub runs: Vec<(Tool, Result<Measured, String>)>,
}

impl EntryResult {
    pub fn get(&self, tool: Tool) -> Option<&Result<Measured, String>> {
        self.runs.iter().find(|(t, _)| *t == tool).map(|(_, r)| r)
    }

    /// What the issue requires of the ddprof engines, one line per failure:
    /// complete stacks no more than 3 points below perf record's, at least
    /// 90 % of the expected samples (or 3 points below perf record's share
    /// when that is lower), perf record's top leaf function among ddprof's
    /// top 5.
    pub fn failures(&self) -> Vec<String> {
        let name = self.entry.name;
        let mut failures = Vec::new();
        let reference = match self.get(Tool::PerfRecord) {
            Some(Ok(reference)) => Some(reference),
            Some(Err(error)) => {
                failures.push(format!("{name} / perf record: {}", first_line(error)));
                None
            }
            None => None,
        };
        for tool in [Tool::DdprofAuto, Tool::DdprofPerf] {
            let label = tool.label();
            let measured = match self.get(tool) {
                Some(Ok(measured)) => measured,
                Some(Err(error)) => {
                    failures.push(format!("{name} / {label}: {}", first_line(error)));
                    continue;
                }
                None => continue,
            };
            let elsewhere: u64 = measured
                .marked_complete_elsewhere
                .iter()
                .map(|(_, n)| n)
                .sum();
            if elsewhere > MAX_MARKED_COMPLETE_ELSEWHERE {
                failures.push(format!(
                    "{name} / {label}: {elsewhere} samples not marked truncated do not reach a \
                     thread's entry (outermost frames first): {:?}",
                    &measured.marked_complete_elsewhere
                        [..measured.marked_complete_elsewhere.len().min(5)]
                ));
            }
            if self.entry.big && tool == Tool::DdprofAuto {
                match measured.in_kernel {
                    Some((kernel, perf))
                        if (kernel as f64) >= MIN_IN_KERNEL_SHARE * (kernel + perf) as f64 => {}
                    Some((kernel, perf)) => failures.push(format!(
                        "{name} / {label}: {kernel} of {} samples unwound in the kernel, at least \
                         {:.0} % required",
                        kernel + perf,
                        100.0 * MIN_IN_KERNEL_SHARE
                    )),
                    None => failures.push(format!(
                        "{name} / {label}: the BPF engine did not run (no exit line)"
                    )),
                }
                if measured.complete_percent() < MIN_BIG_COMPLETE_PERCENT {
                    failures.push(format!(
                        "{name} / {label}: {:.1} % complete stacks, at least {MIN_BIG_COMPLETE_PERCENT:.0} % required",
                        measured.complete_percent()
                    ));
                }
            }
            // The perf engine copies what perf record copies: on a big
            // program whose stacks outgrow the copy (rustc: perf record
            // 90.2-91.9 %), it cannot beat perf record by much.
            let floor = match reference {
                Some(reference) if self.entry.big && tool == Tool::DdprofPerf => {
                    MIN_DDPROF_COMPLETE_PERCENT
                        .min(reference.complete_percent() - COMPLETENESS_TOLERANCE_POINTS)
                }
                _ => MIN_DDPROF_COMPLETE_PERCENT,
            };
            if measured.complete_percent() < floor {
                failures.push(format!(
                    "{name} / {label}: {:.1} % complete stacks, at least {floor:.1} % required",
                    measured.complete_percent()
                ));
            }
            let min_ratio = if self.entry.big {
                MIN_BIG_SAMPLE_RATIO
            } else {
                min_sample_ratio(reference.map(Measured::sample_ratio))
            };
            if measured.sample_ratio() < min_ratio {
                failures.push(format!(
                    "{name} / {label}: {} samples, {:.1} % of the {:.0} expected ({:.2} s CPU × {FREQUENCY_HZ} Hz); at least {:.1} % required (perf record: {})",
                    measured.samples,
                    100.0 * measured.sample_ratio(),
                    measured.expected_samples(),
                    measured.cpu.as_secs_f64(),
                    100.0 * min_ratio,
                    reference.map_or("no run".to_string(), |r| format!(
                        "{:.1} %",
                        100.0 * r.sample_ratio()
                    ))
                ));
            }
            let Some(reference) = reference else { continue };
            let tolerance = if self.entry.big && tool == Tool::DdprofAuto {
                0.0
            } else {
                COMPLETENESS_TOLERANCE_POINTS
            };
            let floor = reference.complete_percent() - tolerance;
            if measured.complete_percent() < floor {
                failures.push(format!(
                    "{name} / {label}: {:.1} % complete stacks, perf record {:.1} % (at least {floor:.1} % required)",
                    measured.complete_percent(),
                    reference.complete_percent()
                ));
            }
            // In a flat profile (rustc: the top three leaves within 0.3
            // points of 1.8 %) the order is noise: the function may also be
            // outside the top five if it has at least 3/4 of its share.
            if let Some((top, share)) = reference.top_leaves(1).first() {
                let ours = measured.top_leaves(5);
                if !ours.iter().any(|(f, _)| f == top) && measured.leaf_share(top) < 0.75 * share {
                    failures.push(format!(
                        "{name} / {label}: perf record's top leaf function `{top}` ({share:.1} %) is not in its top 5: {}",
                        format_leaves(&ours)
                    ));
                }
            }
        }
        failures
    }
}

/// The least share of the expected samples a ddprof engine must deliver,
/// given perf record's share on the same command (if it ran).
pub fn min_sample_ratio(perf_record: Option<f64>) -> f64 {
    match perf_record {
        Some(ratio) => MIN_SAMPLE_RATIO.min(ratio - SAMPLE_RATIO_TOLERANCE),
        None => MIN_SAMPLE_RATIO,
    }
}

pub(super) fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

pub(super) fn format_leaves(leaves: &[(&str, f64)]) -> String {
    leaves
        .iter()
        .map(|(f, share)| format!("`{}` {share:.1} %", f.replace('|', "\\|")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The markdown table: entry × tool, samples against expected, complete
/// stacks, the default engine's share unwound in the kernel, top-3 leaf
/// functions.
pub fn table(results: &[EntryResult]) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "| entry | tool | CPU (s) | samples | expected | samples / expected | complete stacks | in the kernel | top-3 leaf functions |"
    )
    .unwrap();
    writeln!(
        out,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    .unwrap();
    for result in results {
        for (tool, run) in &result.runs {
            match run {
                Ok(m) => writeln!(
                    out,
                    "| {} | {} | {:.2} | {} | {:.0} | {:.0} % | {:.1} % | {} | {} |",
                    result.entry.name,
                    tool.label(),
                    m.cpu.as_secs_f64(),
                    m.samples,
                    m.expected_samples(),
                    100.0 * m.sample_ratio(),
                    m.complete_percent(),
                    m.in_kernel
                        .map(|(kernel, perf)| format!(
                            "{:.2} %",
                            100.0 * kernel as f64 / (kernel + perf).max(1) as f64
                        ))
                        .unwrap_or_default(),
                    format_leaves(&m.top_leaves(3))
                ),
                Err(error) => writeln!(
                    out,
                    "| {} | {} | failed: {} | | | | | | |",
                    result.entry.name,
                    tool.label(),
                    first_line(error).replace('|', "\\|")
                ),
            }
            .unwrap();
        }
    }
    out
}

/// Per entry and tool: the top-5 leaf functions, the workload's processes,
/// samples of other processes, and the tool's notes (engine, warnings).
pub fn details(results: &[EntryResult]) -> String {
    let mut out = String::new();
    for result in results {
        writeln!(out, "{}: {}", result.entry.name, result.entry.what).unwrap();
        for (tool, run) in &result.runs {
            match run {
                Ok(m) => {
                    writeln!(
                        out,
                        "  {}: processes={} foreign_samples={}\n    top-5 leaves: {}\n    outermost frames: {}",
                        tool.label(),
                        m.processes,
                        m.foreign_samples,
                        format_leaves(&m.top_leaves(5)),
                        format_leaves(&m.top_outermost(5))
                    )
                    .unwrap();
                    for note in &m.notes {
                        writeln!(out, "    {note}").unwrap();
                    }
                }
                Err(error) => writeln!(out, "  {}: failed: {error}", tool.label()).unwrap(),
            }
        }
    }
    out
}
