//! `cargo xtask soak`: ddprof beside a busy, churning program for a long
//! time (30 minutes by default), with the resident memory and CPU time of
//! every profiler process (the daemon and its worker) read each minute, to show that nothing grows.
//!
//! The profiled command is a shell running, for the whole soak, the chain
//! workload (one CPU, steady stacks) and the churn workload (4 exec'd
//! children a second, every tenth running 80 ms; a dlopen/dlclose of a
//! plugin each second), sampled at 999 Hz with a profile every minute.
//! The report (also written to `target/soak/report.md`) is the per-minute
//! series and the run's summary line; the soak fails when the RSS of the
//! last minute is more than 10 % above the median of the minutes after the
//! first five (the first minutes fill caches and ring buffers).
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Minutes the soak runs
    #[arg(long, default_value_t = 30)]
    minutes: u64,
    /// Engine: auto, bpf or perf
    #[arg(long, default_value = "auto")]
    engine: String,
    /// Sampling frequency in Hz
    #[arg(long, default_value_t = 999)]
    frequency: u64,
}

/// One reading of the profiler's processes.
#[derive(Default)]
struct Reading {
    minute: u64,
    processes: usize,
    /// RSS of every profiler process, summed.
    rss_kib: u64,
    /// Of which the `ddprof-worker`'s.
    worker_rss_kib: u64,
    /// Proportional set size summed (pages the parent and its forked
    /// worker share are counted once).
    pss_kib: u64,
    cpu: Duration,
}

/// The profiler's processes: the daemon and, when it runs one, its worker.
const PROFILER_COMMS: [&str; 2] = ["ddprof-profiler", "ddprof-worker"];

/// `key:` of a `/proc` status-like file, in KiB.
fn kib_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// RSS, PSS and CPU time of every profiler process (see [`PROFILER_COMMS`])
/// whose command line holds `marker`.
fn read_profilers(marker: &str) -> Reading {
    let ticks = 100.0; // USER_HZ
    let mut reading = Reading::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return reading;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !PROFILER_COMMS.contains(&comm.trim()) {
            continue;
        }
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let rollup = std::fs::read_to_string(path.join("smaps_rollup")).unwrap_or_default();
        reading.processes += 1;
        let rss = kib_field(&status, "VmRSS:");
        reading.rss_kib += rss;
        if comm.trim() == "ddprof-worker" {
            reading.worker_rss_kib += rss;
        }
        reading.pss_kib += kib_field(&rollup, "Pss:");
        // Fields after the command name: utime and stime are the 12th and
        // 13th (fields 14 and 15 of the whole line), cutime and cstime the
        // 14th and 15th.
        if let Some((_, rest)) = stat.rsplit_once(')') {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let stime: f64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            // cutime and cstime: the workers the daemon has reaped.
            let reaped: f64 = fields[13.min(fields.len())..15.min(fields.len())]
                .iter()
                .filter_map(|v| v.parse::<f64>().ok())
                .sum();
            reading.cpu += Duration::from_secs_f64((utime + stime + reaped) / ticks);
        }
    }
    reading
}

pub fn run(args: &SoakArgs) -> Result<()> {
    let ddprof = crate::build_all(true)?;
    let chain = crate::build_workload("chain.c", "soak", "chain")?;
    let churn = crate::build_workload("churn.c", "soak", "churn")?;
    let child = crate::build_workload("forker_child.c", "soak", "forker_child")?;
    let plugin = crate::build_workload("churn_plugin.c", "soak", "libchurn_plugin.so")?;
    let seconds = args.minutes * 60;
    let out: PathBuf = crate::target_dir().join(format!("soak/out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let script = format!(
        "'{churn}' {seconds} '{child}' '{plugin}' {processes} {seconds} > /dev/null & \
         '{chain}' {seconds}; wait",
        churn = churn.display(),
        child = child.display(),
        plugin = plugin.display(),
        chain = chain.display(),
        processes = seconds * 4,
    );
    let mut command = Command::new(&ddprof);
    command
        .args(["-l", "notice", "--engine", &args.engine, "-u", "60"])
        .arg("-e")
        .arg(format!("sCPU freq={}", args.frequency))
        .arg("--output")
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let shown = format!("{command:?}");
    crate::say(&format!("soak for {} min: {shown}", args.minutes));
    let mut running = command.spawn().context("cannot start ddprof")?;
    let stderr = running.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let marker = out.to_string_lossy().into_owned();
    let started = Instant::now();
    let mut readings = Vec::new();
    for minute in 1..=args.minutes {
        let due = Duration::from_secs(minute * 60);
        while started.elapsed() < due {
            if running.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let reading = Reading {
            minute,
            ..read_profilers(&marker)
        };
        if reading.processes == 0 {
            break;
        }
        crate::say(&format!(
            "minute {minute}: {} profiler process(es), RSS {:.1} MiB (worker {:.1} MiB), PSS {:.1} MiB, CPU {:.2} s",
            reading.processes,
            mib(reading.rss_kib),
            mib(reading.worker_rss_kib),
            mib(reading.pss_kib),
            reading.cpu.as_secs_f64()
        ));
        readings.push(reading);
    }
    let status = running.wait()?;
    let log = log.join().unwrap_or_default();
    let summary = log
        .iter()
        .find(|l| l.contains("summary:"))
        .cloned()
        .unwrap_or_else(|| "(no summary line)".into());

    let mut report = format!(
        "Soak of {} min, `--engine {}` at {} Hz, {}\n\nCommand: `{shown}`\n\n\
                  | minute | profiler processes | RSS, all (MiB) | of which the worker (MiB) | PSS, all (MiB) | profiler CPU (s, cumulative) |\n\
         | --- | --- | --- | --- | --- | --- |\n",
        args.minutes,
        args.engine,
        args.frequency,
        chrono_free_now()
    );
    for r in &readings {
        report.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
            r.minute,
            r.processes,
            mib(r.rss_kib),
            mib(r.worker_rss_kib),
            mib(r.pss_kib),
            r.cpu.as_secs_f64()
        ));
    }
    report.push_str(&format!("\n`{summary}`\n"));
    let settled: Vec<u64> = readings
        .iter()
        .filter(|r| r.minute > 5)
        .map(|r| r.rss_kib)
        .collect();
    let verdict = match (settled.len(), readings.last()) {
        (n, Some(last)) if n >= 3 => {
            let mut sorted = settled.clone();
            sorted.sort_unstable();
            let median = sorted[sorted.len() / 2];
            let growth = last.rss_kib as f64 / median as f64 - 1.0;
            let flat = growth <= 0.10;
            report.push_str(&format!(
                "\nRSS of the last minute {:.1} MiB against the median {:.1} MiB of minutes 6..{}: \
                 {:+.1} % ({}).\n",
                last.rss_kib as f64 / 1024.0,
                median as f64 / 1024.0,
                last.minute,
                growth * 100.0,
                if flat { "flat" } else { "GROWING" }
            ));
            Some(flat)
        }
        _ => None,
    };
    let path = crate::target_dir().join("soak/report.md");
    std::fs::write(&path, &report)?;
    println!("{report}");
    crate::say(&format!("report written to {}", path.display()));
    let _ = std::fs::remove_dir_all(&out);
    if !status.success() {
        bail!("the profiled command failed ({status})");
    }
    match verdict {
        Some(true) => Ok(()),
        Some(false) => bail!("the profiler's RSS kept growing"),
        None => {
            crate::say("too short to judge growth (needs more than 8 minutes)");
            Ok(())
        }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The time now in UTC, `YYYY-MM-DD HH:MM` (from `date`, to avoid a clock
/// crate for one line).
fn chrono_free_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
