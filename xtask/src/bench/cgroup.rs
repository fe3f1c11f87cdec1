//! Measuring one run: a fresh cgroup per run (its CPU), and the tool's
//! processes' resident memory sampled meanwhile.
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A cgroup of its own for one run: counts the CPU of every process in it.
pub(super) struct Cgroup {
    pub(super) path: PathBuf,
    pub(super) version: CgroupVersion,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum CgroupVersion {
    /// cgroup v1, `cpuacct.usage` (nanoseconds).
    V1,
    /// cgroup v2, `cpu.stat`'s `usage_usec`.
    V2,
}

impl Cgroup {
    pub(super) fn create(name: &str) -> Result<Self> {
        let v1 = Path::new("/sys/fs/cgroup/cpuacct");
        let v2 = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|root| {
                root.join("cgroup.procs").is_file() && root.join("cgroup.controllers").is_file()
            });
        let (root, version) = if v1.join("cpuacct.usage").is_file() {
            (v1, CgroupVersion::V1)
        } else if let Some(root) = v2 {
            (root, CgroupVersion::V2)
        } else {
            bail!("no cgroup v1 cpuacct hierarchy nor cgroup v2 mounted under /sys/fs/cgroup (`xtask bench` measures CPU with one)");
        };
        let path = root.join(name);
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path)
            .with_context(|| format!("cannot create {} (run as root)", path.display()))?;
        Ok(Self { path, version })
    }

    pub(super) fn usage(&self) -> Result<Duration> {
        Ok(match self.version {
            CgroupVersion::V1 => {
                let text = std::fs::read_to_string(self.path.join("cpuacct.usage"))?;
                Duration::from_nanos(text.trim().parse()?)
            }
            CgroupVersion::V2 => {
                let text = std::fs::read_to_string(self.path.join("cpu.stat"))?;
                let micros = text
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
                    .context("cpu.stat has no usage_usec")?;
                Duration::from_micros(micros)
            }
        })
    }

    pub(super) fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    pub(super) fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.procs_file())
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Waits (up to a minute) until every process has left: ddprof's
    /// profiler outlives the command briefly (final flush).
    pub(super) fn wait_until_empty(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The command `line` (program, then arguments), to be started inside
    /// this cgroup: no stdin, `stdout` as given, stderr piped.
    pub(super) fn command(&self, line: &[String], stdout: Stdio) -> Command {
        let mut command = Command::new(&line[0]);
        command
            .args(&line[1..])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped());
        self.enter_on_spawn(&mut command);
        command
    }

    /// `command` starts inside this cgroup (it joins before exec, so that
    /// everything it starts is counted).
    pub(super) fn enter_on_spawn(&self, command: &mut Command) {
        use std::os::unix::process::CommandExt;
        let procs = self.procs_file();
        // SAFETY: the closure only writes a file (async-signal-safe enough for a
        // freshly forked single-threaded child) before exec.
        unsafe {
            command.pre_exec(move || std::fs::write(&procs, b"0"));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// `VmRSS` and `VmHWM` (KiB) of a process.
pub(super) fn vm_rss_and_hwm_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
    };
    Some((field("VmRSS:")?, field("VmHWM:").unwrap_or(0)))
}

/// Samples every 50 ms the summed `VmRSS` of a cgroup's processes that
/// are not the workload's, until stopped; returns the highest sum, or the
/// highest `VmHWM` of one of them if higher (a peak shorter than 50 ms, such
/// as a profiler's final symbolization, still counts).
pub(super) struct RssSampler {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    /// `workload_exes`: the executables (canonical paths) of the workload's
    /// processes, whose memory is not the tool's.
    pub(super) fn start(procs_file: PathBuf, workload_exes: Arc<HashSet<PathBuf>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            loop {
                let done = stopping.load(Ordering::Relaxed);
                let pids = std::fs::read_to_string(&procs_file).unwrap_or_default();
                let (mut sum, mut hwm) = (0, 0);
                for (rss, high) in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .filter(|pid| {
                        std::fs::read_link(format!("/proc/{pid}/exe"))
                            .map_or(true, |exe| !workload_exes.contains(&exe))
                    })
                    .filter_map(vm_rss_and_hwm_kib)
                {
                    sum += rss;
                    hwm = hwm.max(high);
                }
                peak = peak.max(sum).max(hwm);
                if done {
                    return peak;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self { stop, thread }
    }

    pub(super) fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Runs `line` in a fresh cgroup; returns its output, the CPU of every
/// process in the cgroup and the peak summed RSS of those not running one
/// of `workload_exes`.
pub(super) struct Measured {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: String,
    pub(super) status: std::process::ExitStatus,
    pub(super) cpu: Duration,
    pub(super) peak_rss_kib: u64,
}

pub(super) fn run_in_cgroup(
    line: &[String],
    cgroup_name: &str,
    workload_exes: &Arc<HashSet<PathBuf>>,
    on_stdout: Option<&mut dyn FnMut(std::process::ChildStdout)>,
) -> Result<Measured> {
    let cgroup = Cgroup::create(cgroup_name)?;
    let mut command = cgroup.command(line, Stdio::piped());
    let before = cgroup.usage()?;
    let rss = RssSampler::start(cgroup.procs_file(), workload_exes.clone());
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {line:?}"))?;
    let stderr_pipe = child.stderr.take();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = stderr_pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let mut stdout = Vec::new();
    if let Some(pipe) = child.stdout.take() {
        match on_stdout {
            Some(consume) => consume(pipe),
            None => {
                let mut pipe = pipe;
                let _ = pipe.read_to_end(&mut stdout);
            }
        }
    }
    let status = child.wait()?;
    let stderr = stderr_reader.join().unwrap_or_default();
    cgroup.wait_until_empty();
    let cpu = cgroup.usage()?.saturating_sub(before);
    let peak_rss_kib = rss.finish();
    Ok(Measured {
        stdout,
        stderr,
        status,
        cpu,
        peak_rss_kib,
    })
}
