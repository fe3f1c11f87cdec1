//! The start-up of `ddprof --global`.
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::cgroup::{Cgroup, RssSampler};
use super::runs::shell_words;
use crate::target_dir;

/// What `ddprof --global` cost to start.
#[derive(Debug, Clone)]
pub(super) struct GlobalStartup {
    pub(super) command: String,
    /// CPU of the ddprof processes when the start-up was done (`start-up: done`).
    pub(super) startup_cpu: Option<Duration>,
    pub(super) startup_wall: Option<Duration>,
    /// CPU over the whole run, and its length.
    pub(super) total_cpu: Duration,
    pub(super) total_wall: Duration,
    pub(super) peak_rss_kib: u64,
    /// ddprof's own `start-up:` and `engine:` lines.
    pub(super) log_lines: Vec<String>,
    pub(super) failure: Option<String>,
}

/// Runs `ddprof --global` for `seconds` in a cgroup of its own and takes
/// the cgroup's CPU when ddprof logs that its start-up is done.
pub(super) fn global_startup(ddprof: &Path, seconds: u32, freq: u32) -> Result<GlobalStartup> {
    let out = target_dir().join("bench/out/global");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let line: Vec<String> = vec![
        ddprof.display().to_string(),
        "--global".into(),
        "-e".into(),
        format!("sCPU freq={freq}"),
        "--upload-period".into(),
        "600".into(),
        "--log-level".into(),
        "info".into(),
        "--output".into(),
        out.display().to_string(),
    ];
    let cgroup = Arc::new(Cgroup::create("ddprof-bench-global")?);
    let mut command = cgroup.command(&line, Stdio::null());
    let before = cgroup.usage()?;
    let rss = RssSampler::start(cgroup.procs_file(), Arc::new(HashSet::new()));
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {line:?}"))?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let watched = cgroup.clone();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        let mut done_at = None;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("start-up: done") && done_at.is_none() {
                done_at = Some((watched.usage().ok(), started.elapsed()));
            }
            // The start-up steps, the engine chosen and the program's
            // figures; not the engine's later notices.
            let message = line.split_once(": ").map_or(line.as_str(), |(_, m)| m);
            let message = message.split_once(": ").map_or(message, |(_, m)| m);
            if message.starts_with("start-up:")
                || message.starts_with("engine:")
                || message.starts_with("BPF engine: ") && message.contains(" verified ")
                || message.starts_with("summary:")
                || line.contains("error")
            {
                lines.push(line);
            }
        }
        (lines, done_at)
    });
    std::thread::sleep(Duration::from_secs(seconds.into()));
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait()?;
    let total_wall = started.elapsed();
    let (log_lines, done_at) = reader.join().unwrap_or_default();
    cgroup.wait_until_empty();
    let total_cpu = cgroup.usage()?.saturating_sub(before);
    let peak_rss_kib = rss.finish();
    let (startup_cpu, startup_wall) = match done_at {
        Some((cpu, wall)) => (cpu.map(|c| c.saturating_sub(before)), Some(wall)),
        None => (None, None),
    };
    let failure = (!status.success() && startup_cpu.is_none()).then(|| {
        format!(
            "ddprof --global exited with {status}: {}",
            log_lines.last().map_or("no message", String::as_str)
        )
    });
    Ok(GlobalStartup {
        command: shell_words(&line),
        startup_cpu,
        startup_wall,
        total_cpu,
        total_wall,
        peak_rss_kib,
        log_lines,
        failure,
    })
}
