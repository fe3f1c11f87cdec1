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
    // The alternative the BPF engine's uprobe program replaces: each
    // sample's stack copied through the perf buffers and unwound by the
    // profiler.
    "ddprof --engine perf sCPU;sALLOC",
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
    (
        "every allocation sampled, perf engine (stack copies)",
        "--engine perf sALLOC p=1",
        "200000",
    ),
];

/// One program: a name and its command line.
struct Program {
    name: &'static str,
    command: Vec<String>,
}

/// What one mode's runs of one program gave, run by run.
#[derive(Default)]
struct Figures {
    wall_s: Vec<f64>,
    /// From the program's exec (`exec_stamp`'s time) to its exit: what it
    /// pays while it runs.
    own_run_s: Vec<f64>,
    /// From the tool's start to the program's exec: what the tool made it
    /// wait.
    start_up_ms: Vec<f64>,
    /// The command's CPU time (user + system, its waited-for children's
    /// included; not ddprof's profiler, which no one here waits for).
    command_cpu_s: Vec<f64>,
    profiler_cpu_ms: Vec<f64>,
    /// ddprof's summary's `alloc_samples`.
    alloc_samples: Vec<f64>,
}

/// What ddprof wrote to `path` once its profiler is done (its `summary:`
/// line, at most 60 s after the command), or what is there for a mode
/// without ddprof.
fn profiler_stderr(path: &Path, mode: &str) -> String {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if !mode.starts_with("ddprof") || text.contains("summary:") || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `exec_stamp` writes).
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
    })
}

/// Builds `xtask/src/bench/NAME.c` into `scratch`.
fn build_helper(name: &str, scratch: &Path) -> Result<PathBuf> {
    let program = scratch.join(name);
    crate::run_checked(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&program)
            .arg(workspace_root().join(format!("xtask/src/bench/{name}.c"))),
    )
    .with_context(|| format!("cannot build the bench's {name}"))?;
    Ok(program)
}

/// The CPU time of this process's waited-for children so far.
fn children_cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |usage| {
        let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        seconds(usage.user_time()) + seconds(usage.system_time())
    })
}

/// The median of the run-by-run ratios `runs[i] / baseline[i]` (each run
/// against the unprofiled run of its own round, so that what the machine
/// did between rounds weighs less), and their lowest and highest.
fn paired_ratio(runs: &[f64], baseline: &[f64]) -> (Option<f64>, Option<(f64, f64)>) {
    let ratios: Vec<f64> = runs
        .iter()
        .zip(baseline)
        .filter(|(_, base)| **base > 0.0)
        .map(|(run, base)| run / base)
        .collect();
    let range = ratios
        .iter()
        .copied()
        .fold(None, |range: Option<(f64, f64)>, ratio| {
            Some(range.map_or((ratio, ratio), |(low, high)| {
                (low.min(ratio), high.max(ratio))
            }))
        });
    (median(ratios), range)
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
            let settings = mode.trim_start_matches("ddprof ");
            let (engine, events) = match settings.strip_prefix("--engine perf ") {
                Some(events) => (&["--engine", "perf"][..], events),
                None => (&[][..], settings),
            };
            let mut line = vec![ddprof.display().to_string()];
            line.extend(engine.iter().map(|word| word.to_string()));
            line.extend([
                "-e".into(),
                events.into(),
                "--output".into(),
                output.display().to_string(),
                "-l".into(),
                "notice".into(),
                "--".into(),
            ]);
            line
        }
    };
    line.extend(command.iter().cloned());
    line
}

/// The allocation section: `runs` runs of each program in each mode,
/// interleaved, medians.
/// `selected`: the modes to run by name (none: all of [`MODES`]); the
/// unprofiled baseline runs whatever the selection.
pub(super) fn allocation_section(
    ddprof: &Path,
    runs: usize,
    selected: &[String],
    report: &mut String,
) -> Result<()> {
    if let Some(unknown) = selected.iter().find(|name| !MODES.contains(&name.as_str())) {
        bail!(
            "no allocation mode `{unknown}`; the modes: {}",
            MODES.join(", ")
        );
    }
    let modes: Vec<&str> = MODES
        .iter()
        .copied()
        .filter(|mode| {
            *mode == "unprofiled" || selected.is_empty() || selected.iter().any(|s| s == mode)
        })
        .collect();
    if (modes.contains(&"heaptrack") && !have("heaptrack")) || !have("sqlite3") {
        bail!("the allocation section needs heaptrack and sqlite3 (apt-get install heaptrack sqlite3)");
    }
    let scratch: PathBuf =
        std::env::temp_dir().join(format!("ddprof-bench-alloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let programs = programs(&scratch)?;
    let stamp = build_helper("exec_stamp", &scratch)?;
    // First: the programs' tables say what their samples cost by it.
    let costs = measure_costs(ddprof, runs, &scratch)?;
    writeln!(
        report,
        "## Allocations\n\n\
         What `sALLOC` (mean 512 KiB, the default) costs the programs it samples: each \
         program's wall time (from the tool's start to the program's exit, not to the end of \
         the profiler's last profile, which it does not wait for), median of {runs} runs, \
         the modes interleaved run by run; *slowdown* is the median of each run's wall time \
         over the unprofiled run of the same round (the lowest and highest of those ratios \
         beside it: this VM's noise). Each program runs through `exec_stamp` \
         (xtask/src/bench/exec_stamp.c: it notes the time, then execs the program in its \
         place), under every tool: *own run* is from that exec to the program's exit, what \
         the program pays while it runs (its slowdown paired the same way); *start-up* is \
         from the tool's start to the exec, what the tool makes it wait first (ddprof: the \
         events opened in the command and handed over, and the BPF program loaded and \
         attached, so that the threads the command starts at once are unwound in the \
         kernel). heaptrack runs the program itself (its library does not follow an exec): \
         its own run includes its start-up (~20 ms, its script). *sampled* is the median \
         of ddprof's `alloc_samples`, and beside it what those samples cost the program by \
         the cost table below (each sample's price there, times the samples; in live mode \
         the price of a sample and its free), in milliseconds and in % of the unprofiled \
         run: what the sampled threads pay at the samples, in a tight loop's terms (with \
         `--engine perf`, not what each sample's 32 KB stack copy costs the program \
         afterwards, in its caches, nor the profiler's unwinding of it on a CPU the \
         program could use). \
         *command CPU* is the command's user + system time \
         (wait4's, its children's included; heaptrack's interpreter too, ddprof's detached \
         profiler not), and *CPU ratio* the same paired median over it; *profiler CPU* is \
         ddprof's summary (`profiler_cpu_ms`, its processes' CPU). heaptrack records every \
         allocation (the exact reference of `tests/allocations.rs`). Every run has \
         `PYTHONHASHSEED=0`: python3's dicts collide alike from run to run.\n"
    )?;
    for program in &programs {
        say(&format!("allocations: {}", program.name));
        let mut figures: Vec<Figures> = modes.iter().map(|_| Figures::default()).collect();
        let mut lines = Vec::new();
        for _ in 0..runs {
            for (index, mode) in modes.iter().enumerate() {
                let output = scratch.join(format!("out-{index}"));
                let _ = std::fs::remove_dir_all(&output);
                std::fs::create_dir_all(&output)?;
                let stamp_file = scratch.join(format!("exec-time-{index}"));
                let _ = std::fs::remove_file(&stamp_file);
                // heaptrack follows the process it starts, not what that
                // one execs (its library takes itself out of the
                // environment): its program runs unstamped, its start-up
                // in its own run.
                let unstamped = *mode == "heaptrack";
                let stamped: Vec<String> = if unstamped {
                    program.command.clone()
                } else {
                    [
                        stamp.display().to_string(),
                        stamp_file.display().to_string(),
                    ]
                    .into_iter()
                    .chain(program.command.iter().cloned())
                    .collect()
                };
                let line = wrapped(mode, ddprof, &output, &stamped);
                if lines.len() < modes.len() {
                    lines.push(shell_words(&line));
                }
                let cpu_before = children_cpu_s();
                let start = Instant::now();
                let start_ns = monotonic_ns();
                // ddprof's stderr goes to a file, and the wall time ends when
                // the command exits: the detached profiler writes to stderr
                // until it has written its last profile, after the command
                // (waiting for a pipe's end would add that to the command's
                // time: 0.33 s on `allocations`).
                let stderr_path = scratch.join(format!("stderr-{index}"));
                let mut child = Command::new(&line[0])
                    .args(&line[1..])
                    // python3's string hashes, and with them its dicts'
                    // collisions, change from run to run otherwise.
                    .env("PYTHONHASHSEED", "0")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&stderr_path)?)
                    .spawn()
                    .with_context(|| format!("running {}", line[0]))?;
                let status = child.wait()?;
                let wall = start.elapsed().as_secs_f64();
                let end_ns = monotonic_ns();
                let stderr = profiler_stderr(&stderr_path, mode);
                if !status.success() {
                    bail!("{} failed: {stderr}", shell_words(&line));
                }
                figures[index].wall_s.push(wall);
                let exec_ns: u64 = if unstamped {
                    start_ns
                } else {
                    std::fs::read_to_string(&stamp_file)
                        .ok()
                        .and_then(|text| text.trim().parse().ok())
                        .filter(|&exec| exec >= start_ns && exec <= end_ns)
                        .with_context(|| format!("{} wrote no exec time", shell_words(&line)))?
                };
                figures[index]
                    .own_run_s
                    .push((end_ns - exec_ns) as f64 / 1e9);
                if !unstamped {
                    figures[index]
                        .start_up_ms
                        .push((exec_ns - start_ns) as f64 / 1e6);
                }
                figures[index]
                    .command_cpu_s
                    .push(children_cpu_s() - cpu_before);
                let summary = |field: &str| {
                    stderr
                        .lines()
                        .filter(|line| line.contains("summary:"))
                        .flat_map(|line| line.split_whitespace())
                        .find_map(|word| word.strip_prefix(field)?.strip_prefix('='))
                        .and_then(|value| value.parse::<f64>().ok())
                };
                if let Some(cpu) = summary("profiler_cpu_ms") {
                    figures[index].profiler_cpu_ms.push(cpu);
                }
                if let Some(samples) = summary("alloc_samples") {
                    figures[index].alloc_samples.push(samples);
                }
            }
        }
        writeln!(report, "### {}\n", program.name)?;
        writeln!(
            report,
            "| mode | wall (s) | slowdown (runs' lowest–highest) | own run (s) | own run's \
             slowdown (lowest–highest) | start-up (ms) | sampled (their cost) | command CPU (s) | \
             CPU ratio | profiler CPU (ms) |"
        )?;
        writeln!(report, "|---|---|---|---|---|---|---|---|---|---|")?;
        let range = |range: Option<(f64, f64)>| {
            range.map_or("–".to_string(), |(low, high)| {
                format!("{low:.3}–{high:.3}")
            })
        };
        let unprofiled_s = median(figures[0].own_run_s.clone()).unwrap_or(0.0);
        for (mode, figures_of_mode) in modes.iter().zip(&figures) {
            let (slowdown, spread) = paired_ratio(&figures_of_mode.wall_s, &figures[0].wall_s);
            let (own_slowdown, own_spread) =
                paired_ratio(&figures_of_mode.own_run_s, &figures[0].own_run_s);
            let (cpu_ratio, _) =
                paired_ratio(&figures_of_mode.command_cpu_s, &figures[0].command_cpu_s);
            let sampled = median(figures_of_mode.alloc_samples.clone())
                .filter(|_| mode.contains("sALLOC"))
                .map_or("–".to_string(), |samples| {
                    let price_ns = costs
                        .sample_price_ns(mode.contains("mode=sl"), mode.contains("--engine perf"));
                    let cost_ms = samples * price_ns.unwrap_or(0.0) / 1e6;
                    format!(
                        "{samples:.0} ({cost_ms:.1} ms, {:.2} %)",
                        100.0 * cost_ms / 1e3 / unprofiled_s.max(1e-9)
                    )
                });
            let start_up = show(median(figures_of_mode.start_up_ms.clone()), 0);
            writeln!(
                report,
                "| {mode} | {} | {} ({}) | {} | {} ({}) | {start_up} | {sampled} | {} | {} | {} |",
                show(median(figures_of_mode.wall_s.clone()), 3),
                show(slowdown, 3),
                range(spread),
                show(median(figures_of_mode.own_run_s.clone()), 3),
                show(own_slowdown, 3),
                range(own_spread),
                show(median(figures_of_mode.command_cpu_s.clone()), 3),
                show(cpu_ratio, 3),
                show(median(figures_of_mode.profiler_cpu_ms.clone()), 0)
            )?;
        }
        writeln!(report, "\nCommands:\n")?;
        for line in lines {
            writeln!(report, "    {line}")?;
        }
        writeln!(report)?;
    }
    costs.write(runs, report)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// `malloc_cost`'s nanoseconds per malloc+free pair in each of
/// [`COST_MODES`], run by run, and the command lines.
struct Costs {
    nanos: Vec<Vec<f64>>,
    lines: Vec<String>,
}

impl Costs {
    /// The median of mode `index`'s runs over the unprofiled run of the
    /// same round (this VM's slow phases last longer than a round).
    fn over_unprofiled(&self, index: usize) -> Option<f64> {
        median(
            self.nanos[index]
                .iter()
                .zip(&self.nanos[0])
                .map(|(value, base)| value - base)
                .collect(),
        )
    }

    /// What one sampled allocation costs the program (with its free, in
    /// live mode; unwound by the perf engine from a stack copy, with
    /// `perf_engine`): every allocation sampled, over the hooks alone.
    fn sample_price_ns(&self, live: bool, perf_engine: bool) -> Option<f64> {
        let (sampled, hooks) = match (live, perf_engine) {
            (_, true) => (5, 1),
            (true, false) => (4, 2),
            (false, false) => (3, 1),
        };
        Some(self.over_unprofiled(sampled)? - self.over_unprofiled(hooks)?)
    }
}

/// What the target pays per allocation and per sample: `malloc_cost`'s
/// nanoseconds per malloc+free pair (its thread's CPU time), `runs` runs,
/// unprofiled and in each of [`COST_MODES`].
fn measure_costs(ddprof: &Path, runs: usize, scratch: &Path) -> Result<Costs> {
    say("allocations: cost per allocation and per sample");
    let program = build_helper("malloc_cost", scratch)?;
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
    Ok(Costs { nanos, lines })
}

impl Costs {
    /// The cost table: medians of the runs.
    fn write(&self, runs: usize, report: &mut String) -> Result<()> {
        writeln!(
            report,
            "### What the target pays\n\n\
             `malloc_cost` (xtask/src/bench/malloc_cost.c): malloc+free pairs of 16-271 bytes, \
             the thread's CPU time per pair, median of {runs} runs; *over unprofiled* is the \
             median of each run's difference with the unprofiled run of the same round. With \
             every allocation sampled, the pair's time over the hooks' alone is the price of \
             one sample (the uprobe's trap and the BPF program's walk of the stack, or with \
             the perf engine the kernel's copy of registers and 32 KB of stack; in live mode, \
             and of its free's).\n\n\
             | mode | ns per pair | over unprofiled (ns) |\n|---|---|---|"
        )?;
        for (index, ((mode, _, _), values)) in COST_MODES.iter().zip(&self.nanos).enumerate() {
            writeln!(
                report,
                "| {mode} | {} | {} |",
                show(median(values.clone()), 1),
                show(self.over_unprofiled(index), 1)
            )?;
        }
        writeln!(report, "\nCommands:\n")?;
        for line in &self.lines {
            writeln!(report, "    {line}")?;
        }
        writeln!(report)?;
        Ok(())
    }
}
