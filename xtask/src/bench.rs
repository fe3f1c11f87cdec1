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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{build_all, have, say, target_dir, workspace_root};

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
}

/// How a workload's source is built.
#[derive(Clone, Copy)]
enum Language {
    /// With the tests' flags (`-O2 -fomit-frame-pointer -g -pthread`).
    C,
    /// cargo's release optimisation level (3), no frame pointers, debug
    /// information for symbols and lines, as the tests' Rust workloads.
    RustRelease,
    /// The corpus's generated big program (`tests/harness/big_program.rs`,
    /// shared as source), statically linked.
    BigProgram,
    /// Not built: the stable toolchain's own `rustc` (not rustup's proxy,
    /// which would be a process of its own), compiling a generated library
    /// ([`rust_library`]).
    Rustc,
}

/// The corpus's generator of the big program, the same source.
#[path = "../../tests/harness/big_program.rs"]
mod big_program;
mod rust_library;

/// A workload of tests/workloads.
struct Workload {
    name: &'static str,
    source: &'static str,
    language: Language,
    /// Other programs of tests/workloads it runs (built beside it).
    helpers: &'static [&'static str],
    /// Arguments that make it do `work` units of work, given the directory
    /// the workloads are built in.
    args: fn(u32, &Path) -> Vec<String>,
    /// Functions its threads start in (they count as roots, see [`ROOT_FRAMES`]).
    thread_entries: &'static [&'static str],
    /// One process of small unwind tables, for issue 10's RSS target ("one
    /// profiled process"): the big programs' tables alone are tens of MiB.
    one_small_process: bool,
    /// The most CPU the whole profiler may spend at the lowest frequency,
    /// in % of the workload's (start-up included).
    cpu_share_target: f64,
}

fn work_args(work: u32, _: &Path) -> Vec<String> {
    vec!["--work".into(), work.to_string()]
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "chain",
        source: "chain.c",
        language: Language::C,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "recursion",
        source: "recursion.c",
        language: Language::C,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "threads",
        source: "threads.c",
        language: Language::C,
        helpers: &[],
        args: work_args,
        thread_entries: &["thread_a_work", "thread_b_work"],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "qsort",
        source: "qsort.c",
        language: Language::C,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "chain_rs",
        source: "chain.rs",
        language: Language::RustRelease,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: true,
        cpu_share_target: 1.0,
    },
    Workload {
        name: "forker",
        source: "forker.c",
        language: Language::C,
        helpers: &["forker_child.c"],
        args: |work, dir| {
            vec![
                "--work".into(),
                work.to_string(),
                dir.join("forker_child").display().to_string(),
            ]
        },
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 1.0,
    },
    // Issue 32: a 205 MB static binary (2.4 M unwind rows) with 48 KiB
    // stacks, what the eBPF engine must unwind in the kernel.
    Workload {
        name: "big_static",
        source: "(generated: tests/harness/big_program.rs)",
        language: Language::BigProgram,
        helpers: &[],
        args: work_args,
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 1.0,
    },
    // Issue 32: a compiler whose libraries (librustc_driver, libLLVM) have
    // ~2.3 M unwind rows and no GNU build id, profiled as a build would
    // run it: its tables and names found in the cache. `--work N` compiles
    // a library of 250 × N functions (1,000 at the default 4).
    Workload {
        name: "rustc",
        source: "(generated: xtask/src/bench/rust_library.rs)",
        language: Language::Rustc,
        helpers: &[],
        args: rust_library::args,
        thread_entries: &[],
        one_small_process: false,
        cpu_share_target: 3.0,
    },
];

/// The workloads `--quick` runs.
const QUICK_WORKLOADS: &[&str] = &["chain", "recursion"];

/// Outermost frames of a stack that reached its thread's root: the
/// executable's entry and libc's, and the functions a new thread starts in.
/// Names are compared without a symbol version (`@@GLIBC_2.34`) or offset.
const ROOT_FRAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "clone",
    "clone3",
    "start_thread",
];

const TOOLS: &[&str] = &[
    "unprofiled",
    "ddprof-bpf",
    "ddprof-perf",
    "perf-fp",
    "perf-dwarf-8k",
    "perf-dwarf-32k",
    "samply",
];

/// The figures of one run of one tool.
#[derive(Debug, Default, Clone)]
struct RunResult {
    wall: Duration,
    workload_cpu: Duration,
    /// CPU of the tool's processes, post-processing (`perf script`) included.
    tool_cpu: Option<Duration>,
    samples: Option<u64>,
    lost: Option<u64>,
    /// Samples whose stack reaches the root ([`ROOT_FRAMES`]).
    rooted: Option<u64>,
    peak_rss_kib: Option<u64>,
    output_bytes: Option<u64>,
}

impl RunResult {
    /// The tool's CPU as a share of the workload's, in %.
    fn tool_cpu_percent(&self) -> Option<f64> {
        Some(self.tool_cpu?.as_secs_f64() / self.workload_cpu.as_secs_f64() * 100.0)
    }

    fn peak_rss_mib(&self) -> Option<f64> {
        Some(self.peak_rss_kib? as f64 / 1024.0)
    }

    /// One line of this run's figures, so that the log shows the spread
    /// behind each median.
    fn summary(&self) -> String {
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

/// A cgroup of its own for one run: counts the CPU of every process in it.
struct Cgroup {
    path: PathBuf,
    version: CgroupVersion,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CgroupVersion {
    /// cgroup v1, `cpuacct.usage` (nanoseconds).
    V1,
    /// cgroup v2, `cpu.stat`'s `usage_usec`.
    V2,
}

impl Cgroup {
    fn create(name: &str) -> Result<Self> {
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

    fn usage(&self) -> Result<Duration> {
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

    fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.procs_file())
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Waits (up to a minute) until every process has left: ddprof's
    /// profiler outlives the command briefly (final flush).
    fn wait_until_empty(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The command `line` (program, then arguments), to be started inside
    /// this cgroup: no stdin, `stdout` as given, stderr piped.
    fn command(&self, line: &[String], stdout: Stdio) -> Command {
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
    fn enter_on_spawn(&self, command: &mut Command) {
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
fn vm_rss_and_hwm_kib(pid: u32) -> Option<(u64, u64)> {
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
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    /// `workload_exes`: the executables (canonical paths) of the workload's
    /// processes, whose memory is not the tool's.
    fn start(procs_file: PathBuf, workload_exes: Arc<HashSet<PathBuf>>) -> Self {
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

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// The samply version the bench measures.
const SAMPLY_VERSION: &str = "0.13.1";

/// The one-line fix that lets samply run on machines without a hardware PMU
/// (it reads the ENOENT of the `cycles` event as EPERM and exits instead of
/// falling back to cpu-clock), kept beside the project.
fn samply_patch() -> PathBuf {
    workspace_root().join("../shared/bench/samply-pmu-less.patch")
}

/// samply from crates.io, patched with [`samply_patch`] when the patch is
/// there, built once into target/bench-tools. The report says which.
fn samply() -> Option<PathBuf> {
    let root = target_dir().join("bench-tools");
    let binary = root.join("bin/samply");
    if binary.is_file() {
        return Some(binary);
    }
    let patch = samply_patch();
    if !patch.is_file() {
        say(&format!(
            "installing samply {SAMPLY_VERSION} from crates.io, unpatched ({} not found: it \
             will fail on machines without a hardware PMU)",
            patch.display()
        ));
        let status = Command::new("cargo")
            .args([
                "install",
                "samply",
                "--version",
                SAMPLY_VERSION,
                "--locked",
                "--root",
            ])
            .arg(&root)
            .status()
            .ok()?;
        return (status.success() && binary.is_file()).then_some(binary);
    }
    say(&format!(
        "building samply {SAMPLY_VERSION} from crates.io with {} into target/bench-tools (once)",
        patch.display()
    ));
    let source = samply_source(&root)?;
    let patched = Command::new("patch")
        .current_dir(&source)
        .args(["-p1", "--forward", "-i"])
        .arg(&patch)
        .status()
        .ok()?;
    if !patched.success() {
        say("the samply patch did not apply");
        return None;
    }
    let status = Command::new("cargo")
        .args(["install", "--locked", "--root"])
        .arg(&root)
        .arg("--path")
        .arg(&source)
        .status()
        .ok()?;
    (status.success() && binary.is_file()).then_some(binary)
}

/// A fresh copy of samply's published source under `root`, fetched through
/// a throw-away crate that depends on its binary (an artifact dependency:
/// samply has no library, and cargo ignores an ordinary dependency on it).
fn samply_source(root: &Path) -> Option<PathBuf> {
    let fetcher = root.join("samply-fetch");
    std::fs::create_dir_all(fetcher.join("src")).ok()?;
    std::fs::write(
        fetcher.join("Cargo.toml"),
        format!(
            "[package]\nname = \"samply-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\nsamply = {{ version = \"={SAMPLY_VERSION}\", artifact = \"bin\" }}\n\
             [workspace]\n"
        ),
    )
    .ok()?;
    std::fs::write(fetcher.join("src/lib.rs"), "").ok()?;
    let nightly = crate::bpf_toolchain::pinned_nightly().ok()?;
    let metadata = Command::new("cargo")
        .current_dir(&fetcher)
        .arg(format!("+{nightly}"))
        .args(["metadata", "-Z", "bindeps", "--format-version", "1"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&metadata.stdout);
    // The manifest path of the samply package, e.g.
    // "…/registry/src/…/samply-0.13.1/Cargo.toml".
    let marker = format!("samply-{SAMPLY_VERSION}/Cargo.toml");
    let end = text.find(&marker)? + marker.len() - "/Cargo.toml".len();
    let start = text[..end].rfind('"')? + 1;
    let registry_copy = PathBuf::from(&text[start..end]);
    let source = root.join(format!("samply-{SAMPLY_VERSION}-patched"));
    let _ = std::fs::remove_dir_all(&source);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&registry_copy)
        .arg(&source)
        .status()
        .ok()?;
    if !copied.success() {
        return None;
    }
    // The copy sits under this workspace's target/: keep cargo from taking
    // it for one of the workspace's members.
    let manifest = source.join("Cargo.toml");
    let mut text = std::fs::read_to_string(&manifest).ok()?;
    text.push_str("\n[workspace]\n");
    std::fs::write(&manifest, text).ok()?;
    Some(source)
}

/// Where the bench's workloads are built.
fn workload_dir() -> PathBuf {
    target_dir().join("bench")
}

/// Builds the wrapper that times every workload run (`measure.c`, beside
/// this file) into the bench directory.
fn build_measure() -> Result<PathBuf> {
    let dir = workload_dir();
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("measure.c");
    std::fs::write(&source, include_str!("measure.c"))?;
    let binary = dir.join("measure");
    crate::run_checked(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&binary)
            .arg(&source),
    )
    .context("cannot build the bench's measure wrapper")?;
    Ok(binary)
}

/// Builds `tests/workloads/SOURCE` as `language` into the bench directory
/// (or writes the generated input that `work` units need).
fn build_source(source: &str, name: &str, language: Language, work: u32) -> Result<PathBuf> {
    match language {
        Language::Rustc => rust_library::prepare(&workload_dir(), work),
        Language::C => crate::build_c_workload(source, "bench", name),
        Language::RustRelease => {
            let out_dir = workload_dir();
            std::fs::create_dir_all(&out_dir)?;
            let binary = out_dir.join(name);
            crate::run_checked(
                Command::new("rustc")
                    .args([
                        "-C",
                        "opt-level=3",
                        "-C",
                        "force-frame-pointers=no",
                        "-g",
                        "--edition",
                        "2021",
                        "-o",
                    ])
                    .arg(&binary)
                    .arg(workspace_root().join("tests/workloads").join(source)),
            )
            .with_context(|| format!("cannot build the workload {source}"))?;
            Ok(binary)
        }
        Language::BigProgram => {
            let out_dir = workload_dir();
            std::fs::create_dir_all(&out_dir)?;
            let binary = out_dir.join(name);
            let assembly = out_dir.join(format!("{name}.s"));
            let main = out_dir.join(format!("{name}.cpp"));
            std::fs::write(&assembly, big_program::assembly())?;
            std::fs::write(&main, big_program::MAIN_CPP)?;
            crate::run_checked(&mut big_program::build_command(&binary, &main, &assembly))
                .context("cannot build the big program")?;
            Ok(binary)
        }
    }
}

fn build_workload(workload: &Workload, work: u32) -> Result<PathBuf> {
    for helper in workload.helpers {
        let name = helper.trim_end_matches(".c");
        build_source(helper, name, Language::C, work)?;
    }
    build_source(workload.source, workload.name, workload.language, work)
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    };
    entries.flatten().map(|e| dir_size(&e.path())).sum()
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Whether `name` (as a tool printed it) is a root frame of a workload
/// whose threads start in `thread_entries`.
fn is_root_frame(name: &str, thread_entries: &[&str]) -> bool {
    let name = name.trim();
    let name = name.split('@').next().unwrap_or(name);
    let name = name.split("+0x").next().unwrap_or(name);
    // samply names ELF symbols without their first underscore (`start`,
    // `_libc_start_main_impl`): leading underscores are not compared.
    let bare = |s: &str| s.trim_start_matches('_').to_string();
    let name = bare(name);
    ROOT_FRAMES.iter().any(|root| bare(root) == name)
        || thread_entries.iter().any(|entry| bare(entry) == name)
}

/// Stacks read back from a tool's output.
#[derive(Debug, Default, Clone, Copy)]
struct StackCounts {
    samples: u64,
    rooted: u64,
    lost: Option<u64>,
}

/// ddprof's `stacks.folded`: `process;root;…;leaf COUNT` lines.
fn read_folded(path: &Path, thread_entries: &[&str]) -> Result<StackCounts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut counts = StackCounts::default();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        counts.samples += count;
        // The first name is the process's.
        if stack
            .split(';')
            .nth(1)
            .is_some_and(|root| is_root_frame(root, thread_entries))
        {
            counts.rooted += count;
        }
    }
    Ok(counts)
}

/// The arguments of `perf script` that print one header line per sample,
/// then its frames innermost first (`ADDRESS SYMBOL`), then a blank line;
/// deep stacks whole, no inline expansion (addr2line takes minutes).
fn perf_script_args(perf_data: &Path) -> Vec<String> {
    vec![
        "perf".into(),
        "script".into(),
        "-i".into(),
        perf_data.display().to_string(),
        "-F".into(),
        "comm,tid,ip,sym".into(),
        "--max-stack".into(),
        "1024".into(),
        "--no-inline".into(),
        "--show-lost-events".into(),
    ]
}

/// Parses `perf script`'s output (see [`perf_script_args`]) as it comes.
fn parse_perf_script(output: impl Read, thread_entries: &[&str]) -> StackCounts {
    let mut counts = StackCounts::default();
    let mut in_sample = false;
    let mut outermost: Option<String> = None;
    let mut lost = 0u64;
    let finish = |outermost: &mut Option<String>, counts: &mut StackCounts| {
        counts.samples += 1;
        if outermost
            .take()
            .is_some_and(|name| is_root_frame(&name, thread_entries))
        {
            counts.rooted += 1;
        }
    };
    for line in BufReader::new(output).split(b'\n').map_while(Result::ok) {
        let line = String::from_utf8_lossy(&line);
        if line.trim().is_empty() {
            if in_sample {
                finish(&mut outermost, &mut counts);
                in_sample = false;
            }
            continue;
        }
        if line.contains("PERF_RECORD_LOST") {
            // `… PERF_RECORD_LOST lost 12` / `PERF_RECORD_LOST_SAMPLES lost 3`
            lost += line
                .split_whitespace()
                .skip_while(|w| *w != "lost")
                .nth(1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            // `\t    16a90 _start`: the symbol follows the address.
            let frame = line.trim_start();
            let symbol = frame.split_once(' ').map_or("", |(_, s)| s);
            outermost = Some(symbol.to_string());
        } else {
            if in_sample {
                finish(&mut outermost, &mut counts);
            }
            in_sample = true;
            outermost = None;
        }
    }
    if in_sample {
        finish(&mut outermost, &mut counts);
    }
    counts.lost = Some(lost);
    counts
}

/// samply's profile (the Firefox profiler's processed format, optionally
/// gzip'd) and the `.syms.json` that `--unstable-presymbolicate` writes
/// beside it: threads → samples → stack → frame → func → name, frames named
/// from the symbols file by (library, address) when it has them.
fn read_samply_profile(profile: &Path, thread_entries: &[&str]) -> Result<StackCounts> {
    let bytes =
        std::fs::read(profile).with_context(|| format!("cannot read {}", profile.display()))?;
    let json: serde_json::Value = if bytes.starts_with(&[0x1f, 0x8b]) {
        serde_json::from_reader(flate2::read::GzDecoder::new(&bytes[..]))?
    } else {
        serde_json::from_slice(&bytes)?
    };
    let symbols = read_samply_symbols(&profile.with_extension("syms.json"));
    let libs: Vec<String> = json["libs"]
        .as_array()
        .map(|libs| {
            libs.iter()
                .map(|lib| lib["debugName"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    let index = |value: &serde_json::Value| value.as_u64().map(|v| v as usize);
    let mut counts = StackCounts::default();
    for thread in json["threads"].as_array().into_iter().flatten() {
        let strings = &thread["stringArray"];
        let stack_prefix = &thread["stackTable"]["prefix"];
        let stack_frame = &thread["stackTable"]["frame"];
        let frame_func = &thread["frameTable"]["func"];
        let frame_address = &thread["frameTable"]["address"];
        let func_name = &thread["funcTable"]["name"];
        let func_resource = &thread["funcTable"]["resource"];
        let resource_lib = &thread["resourceTable"]["lib"];
        // The outermost frame's name of each stack, memoized.
        let mut root_of: HashMap<usize, bool> = HashMap::new();
        let mut is_rooted = |mut stack: usize| -> bool {
            let start = stack;
            if let Some(&known) = root_of.get(&start) {
                return known;
            }
            while let Some(prefix) = index(&stack_prefix[stack]) {
                stack = prefix;
            }
            let rooted = index(&stack_frame[stack]).is_some_and(|frame| {
                let func = index(&frame_func[frame]);
                let from_symbols = func
                    .and_then(|func| index(&func_resource[func]))
                    .and_then(|resource| index(&resource_lib[resource]))
                    .and_then(|lib| libs.get(lib))
                    .zip(frame_address[frame].as_u64())
                    .and_then(|(lib, address)| symbols.get(&(lib.clone(), address)));
                let name = match from_symbols {
                    Some(name) => name.as_str(),
                    None => func
                        .and_then(|func| index(&func_name[func]))
                        .and_then(|s| strings[s].as_str())
                        .unwrap_or(""),
                };
                is_root_frame(name, thread_entries)
            });
            root_of.insert(start, rooted);
            rooted
        };
        let samples = &thread["samples"];
        let weights = samples["weight"].as_array();
        for (i, stack) in samples["stack"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let weight = weights.and_then(|w| w.get(i)?.as_u64()).unwrap_or(1);
            counts.samples += weight;
            if index(stack).is_some_and(&mut is_rooted) {
                counts.rooted += weight;
            }
        }
    }
    Ok(counts)
}

/// (library debug name, address) → symbol name, from samply's `.syms.json`.
fn read_samply_symbols(path: &Path) -> HashMap<(String, u64), String> {
    let mut names = HashMap::new();
    let Ok(text) = std::fs::read(path) else {
        return names;
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return names;
    };
    let strings = &json["string_table"];
    for lib in json["data"].as_array().into_iter().flatten() {
        let debug_name = lib["debug_name"].as_str().unwrap_or("").to_string();
        let table = &lib["symbol_table"];
        for known in lib["known_addresses"].as_array().into_iter().flatten() {
            let (Some(address), Some(symbol)) = (known[0].as_u64(), known[1].as_u64()) else {
                continue;
            };
            if let Some(name) = table[symbol as usize]["symbol"]
                .as_u64()
                .and_then(|s| strings[s as usize].as_str())
            {
                names.insert((debug_name.clone(), address), name.to_string());
            }
        }
    }
    names
}

/// The command line of one tool around the measured workload.
fn command_line(
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
    let mut line: Vec<String> = match tool {
        "unprofiled" => vec![],
        "ddprof-bpf" | "ddprof-perf" => vec![
            path(ddprof),
            "--engine".into(),
            tool.trim_start_matches("ddprof-").into(),
            "-e".into(),
            format!("sCPU freq={freq}"),
            "--upload-period".into(),
            "600".into(),
            "--log-level".into(),
            "notice".into(),
            "--output".into(),
            path(out),
            "--".into(),
        ],
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

/// Runs `line` in a fresh cgroup; returns its output, the CPU of every
/// process in the cgroup and the peak summed RSS of those not running one
/// of `workload_exes`.
struct Measured {
    stdout: Vec<u8>,
    stderr: String,
    status: std::process::ExitStatus,
    cpu: Duration,
    peak_rss_kib: u64,
}

fn run_in_cgroup(
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

/// What one run needs to know about the workload.
struct RunContext<'a> {
    workload: &'a Workload,
    workload_exes: Arc<HashSet<PathBuf>>,
}

/// [`run_once`] into an emptied `out`, after `sync(2)`: the previous run's
/// output (perf.data: up to 150 MB) is written back to disk now, not by
/// kernel threads during this run, whose tools and workload share the 2
/// CPUs. Logs the run's figures.
fn run_fresh(
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

fn run_once(
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
        let mut counts = StackCounts::default();
        let scripted = run_in_cgroup(
            &script,
            &format!("ddprof-bench-{run_id}-script"),
            &Arc::new(HashSet::new()),
            Some(&mut |stdout| counts = parse_perf_script(stdout, entries)),
        )?;
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
fn shell_words(line: &[String]) -> String {
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

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// The medians of one (workload, tool, frequency).
#[derive(Debug, Default, Clone, Copy)]
struct Medians {
    wall_s: Option<f64>,
    workload_cpu_ms: Option<f64>,
    tool_cpu_ms: Option<f64>,
    samples: Option<f64>,
    lost: Option<f64>,
    root_share: Option<f64>,
    rss_mib: Option<f64>,
    output_kib: Option<f64>,
}

impl Medians {
    fn of(results: &[RunResult]) -> Self {
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
struct ToolFigures {
    /// Per frequency, lowest first.
    per_freq: Vec<(u32, Medians)>,
    /// µs of tool CPU per extra sample.
    marginal_us: Option<f64>,
    /// The lowest and highest marginal CPU of one round (run *i* at the
    /// lowest and the highest frequency, run back to back): how much the
    /// medians' figure can be trusted.
    marginal_spread_us: Option<(f64, f64)>,
    /// ms of tool CPU that does not grow with the samples.
    fixed_ms: Option<f64>,
    /// µs of the workload's CPU per sample at the highest frequency that
    /// unprofiled runs did not use (the kernel's side of sampling).
    workload_added_us: Option<f64>,
    failure: Option<String>,
}

impl ToolFigures {
    fn compute(per_freq: Vec<(u32, Medians)>) -> Self {
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

    fn at_lowest(&self) -> Option<&Medians> {
        self.per_freq.first().map(|(_, m)| m)
    }

    fn at_highest(&self) -> Option<&Medians> {
        self.per_freq.last().map(|(_, m)| m)
    }
}

/// The lowest and highest marginal CPU (µs per sample) over the rounds:
/// round *i* pairs the *i*-th run at the lowest frequency with the *i*-th
/// at the highest. `None` with fewer than two rounds.
fn marginal_spread(low: &[RunResult], high: &[RunResult]) -> Option<(f64, f64)> {
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
fn worst_first_run(
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
fn show_marginal(figures: &ToolFigures) -> String {
    match (figures.marginal_us, figures.marginal_spread_us) {
        (Some(value), Some((low, high))) => format!("{value:.2} ({low:.2} … {high:.2})"),
        (value, _) => show(value, 2),
    }
}

fn show(value: Option<f64>, digits: usize) -> String {
    value
        .map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// `a / b / …` over the frequencies.
fn per_freq(
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
struct BenchResults {
    /// (workload, tool) → figures.
    tools: BTreeMap<(String, String), ToolFigures>,
    /// (workload, ddprof tool) → its first run, with an empty cache.
    first_runs: BTreeMap<(String, String), RunResult>,
    global: Option<GlobalStartup>,
}

impl BenchResults {
    fn get(&self, workload: &str, tool: &str) -> Option<&ToolFigures> {
        self.tools
            .get(&(workload.to_string(), tool.to_string()))
            .filter(|f| f.failure.is_none())
    }
}

/// What `ddprof --global` cost to start.
#[derive(Debug, Clone)]
struct GlobalStartup {
    command: String,
    /// CPU of the ddprof processes when the start-up was done (`start-up: done`).
    startup_cpu: Option<Duration>,
    startup_wall: Option<Duration>,
    /// CPU over the whole run, and its length.
    total_cpu: Duration,
    total_wall: Duration,
    peak_rss_kib: u64,
    /// ddprof's own `start-up:` and `engine:` lines.
    log_lines: Vec<String>,
    failure: Option<String>,
}

/// Runs `ddprof --global` for `seconds` in a cgroup of its own and takes
/// the cgroup's CPU when ddprof logs that its start-up is done.
fn global_startup(ddprof: &Path, seconds: u32, freq: u32) -> Result<GlobalStartup> {
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
            if !tool.starts_with("ddprof-") || *freq != freqs[0] {
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

fn write_global_section(report: &mut String, global: &GlobalStartup, seconds: u32) -> Result<()> {
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
fn write_targets(
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
const CORPUS_SECTION: &str = "## Real-program corpus";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_frames_ignore_versions_and_offsets() {
        assert!(is_root_frame("__libc_start_main@@GLIBC_2.34", &[]));
        assert!(is_root_frame("_start+0x25", &[]));
        assert!(is_root_frame("clone3", &[]));
        assert!(!is_root_frame("main", &[]));
        assert!(!is_root_frame("[unknown]", &[]));
        assert!(is_root_frame("thread_a_work", &["thread_a_work"]));
        // As samply writes them.
        assert!(is_root_frame("start", &[]));
        assert!(is_root_frame("_libc_start_main_impl", &[]));
    }

    #[test]
    fn perf_script_samples_are_counted_by_their_outermost_frame() {
        let output = "chain  5711 \n\
                      \t           16e09 chain_leaf_70\n\
                      \t           27304 __libc_start_main@@GLIBC_2.34\n\
                      \t           16a90 _start\n\
                      \n\
                      chain  5711 \n\
                      \t           16e09 chain_leaf_70\n\
                      \t           16e34 [unknown]\n\
                      \n\
                      perf 0 [000] 0.0: PERF_RECORD_LOST lost 7\n\
                      worker-a  5712 \n\
                      \t           16e09 thread_a_leaf\n\
                      \t           16e34 thread_a_work\n";
        let counts = parse_perf_script(output.as_bytes(), &["thread_a_work"]);
        assert_eq!(
            (counts.samples, counts.rooted, counts.lost),
            (3, 2, Some(7))
        );
    }

    #[test]
    fn folded_stacks_skip_the_process_name() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stacks.folded");
        std::fs::write(
            &path,
            "chain;_start;__libc_start_main;main;leaf 30\n\
             chain;[truncated];leaf 5\n\
             _start;leaf 1\n",
        )
        .unwrap();
        let counts = read_folded(&path, &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((counts.samples, counts.rooted), (36, 30));
    }

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
