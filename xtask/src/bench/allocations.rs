//! The allocation section of `cargo xtask bench`: what `sALLOC` costs the
//! programs it samples, beside CPU-only profiling and heaptrack, on real
//! allocation-heavy programs (python3, sqlite3) and the tests' workload of
//! known proportions.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::report::{median, show};
use super::runs::shell_words;
use crate::{have, say, workspace_root};

/// The profiler settings compared, each a prefix of the command.
const MODES: &[&str] = &[
    "unprofiled",
    "ddprof sCPU",
    "ddprof sCPU;sALLOC",
    "ddprof sCPU;sALLOC mode=sl",
    "heaptrack",
];

/// The modes of the cost table: the hooks alone (a mean no program
/// reaches: nothing sampled), and every allocation sampled; each with and
/// without the live heap; (mode, `-e`, pairs timed).
const COST_MODES: &[(&str, &str, &str)] = &[
    ("unprofiled", "", "20000000"),
    (
        "hooks, nothing sampled",
        "sALLOC p=1099511627776",
        "20000000",
    ),
    (
        "hooks and live table, nothing sampled",
        "sALLOC p=1099511627776 m=sl",
        "20000000",
    ),
    ("every allocation sampled", "sALLOC p=1", "200000"),
    (
        "every allocation sampled, live heap",
        "sALLOC p=1 m=sl",
        "200000",
    ),
];

/// One program: a name and its command line.
struct Program {
    name: &'static str,
    command: Vec<String>,
}

/// What one mode's runs of one program gave.
#[derive(Default)]
struct Figures {
    wall_s: Vec<f64>,
    profiler_cpu_ms: Vec<f64>,
}

fn programs(scratch: &Path) -> Result<Vec<Program>> {
    // The script `tests/allocations.rs` checks against heaptrack.
    let script = workspace_root().join("tests/workloads/dicts.py");
    let sql = scratch.join("build.sql");
    std::fs::write(
        &sql,
        "create table t(id integer primary key, name text, payload blob);\n\
         with recursive n(i) as (select 1 union all select i + 1 from n where i < 300000)\n\
         insert into t select i, 'name-' || i, randomblob(200 + i % 900) from n;\n\
         create index t_name on t(name);\n\
         select count(*), sum(length(payload)) from t;\n",
    )?;
    // Built as the tests build it.
    let workload = crate::build_workload("allocations.c", "bench", "allocations")?;
    let text = |path: &Path| path.display().to_string();
    Ok(vec![
        Program {
            name: "python3 (dicts, lists, json)",
            command: vec!["/usr/bin/python3".into(), text(&script)],
        },
        Program {
            name: "sqlite3 (a 300,000-row table and its index)",
            command: vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "rm -f {db} && sqlite3 {db} < {sql}",
                    db = text(&scratch.join("bench.db")),
                    sql = text(&sql)
                ),
            ],
        },
        Program {
            name: "allocations (the tests' workload, 1.5 GiB)",
            command: vec![text(&workload), "1536".into()],
        },
    ])
}

/// The command line of `mode` around `command`.
fn wrapped(mode: &str, ddprof: &Path, output: &Path, command: &[String]) -> Vec<String> {
    let mut line: Vec<String> = match mode {
        "unprofiled" => Vec::new(),
        "heaptrack" => vec![
            "heaptrack".into(),
            "-o".into(),
            output.join("heaptrack").display().to_string(),
        ],
        _ => {
            let events = mode.trim_start_matches("ddprof ");
            vec![
                ddprof.display().to_string(),
                "-e".into(),
                events.into(),
                "--output".into(),
                output.display().to_string(),
                "-l".into(),
                "notice".into(),
                "--".into(),
            ]
        }
    };
    line.extend(command.iter().cloned());
    line
}

/// The allocation section: `runs` runs of each program in each mode,
/// interleaved, medians.
pub(super) fn allocation_section(ddprof: &Path, runs: usize, report: &mut String) -> Result<()> {
    if !have("heaptrack") || !have("sqlite3") {
        bail!("the allocation section needs heaptrack and sqlite3 (apt-get install heaptrack sqlite3)");
    }
    let scratch: PathBuf =
        std::env::temp_dir().join(format!("ddprof-bench-alloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let programs = programs(&scratch)?;
    writeln!(
        report,
        "## Allocations\n\n\
         What `sALLOC` (mean 512 KiB, the default) costs the programs it samples: each \
         program's wall time (the command's, as its caller sees it), median of {runs} runs, \
         the modes interleaved run by run; *slowdown* is over the unprofiled median; *profiler \
         CPU* is ddprof's summary (`profiler_cpu_ms`, its processes' CPU). heaptrack records \
         every allocation (the exact reference of `tests/allocations.rs`).\n"
    )?;
    for program in &programs {
        say(&format!("allocations: {}", program.name));
        let mut figures: Vec<Figures> = MODES.iter().map(|_| Figures::default()).collect();
        let mut lines = Vec::new();
        for _ in 0..runs {
            for (index, mode) in MODES.iter().enumerate() {
                let output = scratch.join(format!("out-{index}"));
                let _ = std::fs::remove_dir_all(&output);
                std::fs::create_dir_all(&output)?;
                let line = wrapped(mode, ddprof, &output, &program.command);
                if lines.len() < MODES.len() {
                    lines.push(shell_words(&line));
                }
                let start = Instant::now();
                let run = Command::new(&line[0])
                    .args(&line[1..])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .output()
                    .with_context(|| format!("running {}", line[0]))?;
                let wall = start.elapsed().as_secs_f64();
                if !run.status.success() {
                    bail!(
                        "{} failed: {}",
                        shell_words(&line),
                        String::from_utf8_lossy(&run.stderr)
                    );
                }
                figures[index].wall_s.push(wall);
                let stderr = String::from_utf8_lossy(&run.stderr);
                if let Some(cpu) = stderr
                    .lines()
                    .filter(|line| line.contains("summary:"))
                    .flat_map(|line| line.split_whitespace())
                    .find_map(|word| word.strip_prefix("profiler_cpu_ms="))
                    .and_then(|value| value.parse::<f64>().ok())
                {
                    figures[index].profiler_cpu_ms.push(cpu);
                }
            }
        }
        let baseline = median(figures[0].wall_s.clone());
        writeln!(report, "### {}\n", program.name)?;
        writeln!(report, "| mode | wall (s) | slowdown | profiler CPU (ms) |")?;
        writeln!(report, "|---|---|---|---|")?;
        for (mode, figures) in MODES.iter().zip(&figures) {
            let wall = median(figures.wall_s.clone());
            let slowdown = wall.zip(baseline).map(|(wall, base)| wall / base);
            writeln!(
                report,
                "| {mode} | {} | {} | {} |",
                show(wall, 3),
                show(slowdown, 3),
                show(median(figures.profiler_cpu_ms.clone()), 0)
            )?;
        }
        writeln!(report, "\nCommands:\n")?;
        for line in lines {
            writeln!(report, "    {line}")?;
        }
        writeln!(report)?;
    }
    cost_table(ddprof, runs, &scratch, report)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// What the target pays per allocation and per sample: `malloc_cost`'s
/// nanoseconds per malloc+free pair (its thread's CPU time), medians of
/// `runs`, unprofiled and in each of [`COST_MODES`].
fn cost_table(ddprof: &Path, runs: usize, scratch: &Path, report: &mut String) -> Result<()> {
    say("allocations: cost per allocation and per sample");
    let program = scratch.join("malloc_cost");
    crate::run_checked(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&program)
            .arg(workspace_root().join("xtask/src/bench/malloc_cost.c")),
    )
    .context("cannot build the bench's malloc_cost")?;
    let mut nanos: Vec<Vec<f64>> = COST_MODES.iter().map(|_| Vec::new()).collect();
    let mut lines = Vec::new();
    for _ in 0..runs {
        for (index, (_, events, pairs)) in COST_MODES.iter().enumerate() {
            let mode = if events.is_empty() {
                "unprofiled".to_string()
            } else {
                format!("ddprof {events}")
            };
            let command = [program.display().to_string(), pairs.to_string()];
            let line = wrapped(&mode, ddprof, &scratch.join("cost-out"), &command);
            if lines.len() < COST_MODES.len() {
                lines.push(shell_words(&line));
            }
            let run = Command::new(&line[0])
                .args(&line[1..])
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("running {}", line[0]))?;
            let stdout = String::from_utf8_lossy(&run.stdout);
            let Some(value) = stdout
                .split_whitespace()
                .skip_while(|word| *word != "ns_per_pair")
                .nth(1)
                .and_then(|value| value.parse::<f64>().ok())
            else {
                bail!("{} printed no ns_per_pair: {stdout}", shell_words(&line));
            };
            nanos[index].push(value);
        }
    }
    let unprofiled = median(nanos[0].clone());
    writeln!(
        report,
        "### What the target pays\n\n\
         `malloc_cost` (xtask/src/bench/malloc_cost.c): malloc+free pairs of 16-271 bytes, \
         the thread's CPU time per pair, median of {runs} runs. With every allocation sampled, \
         the pair's time over the unprofiled one is the price of one sample (the uprobe's \
         trap and the kernel's copy of registers and 32 KB of stack).\n\n\
         | mode | ns per pair | over unprofiled (ns) |\n|---|---|---|"
    )?;
    for ((mode, _, _), values) in COST_MODES.iter().zip(&nanos) {
        let value = median(values.clone());
        let over = value.zip(unprofiled).map(|(value, base)| value - base);
        writeln!(
            report,
            "| {mode} | {} | {} |",
            show(value, 1),
            show(over, 1)
        )?;
    }
    writeln!(report, "\nCommands:\n")?;
    for line in lines {
        writeln!(report, "    {line}")?;
    }
    writeln!(report)?;
    Ok(())
}
