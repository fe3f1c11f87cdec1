//! `cargo xtask test`: everything CI checks, in one command.
//!
//! Installs what the tests need (go tool pprof, the corpus's programs and
//! perf), builds the BPF object, a release ddprof and the static one
//! (`dist`), checks formatting, lints and docs, then runs every unit and
//! integration test (root-only ones included), then the end-to-end tests
//! again against the static binary, and prints the totals.
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};

use crate::{build_all, have, run_checked, say, workspace_root};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Debian packages the tests use, by the command they provide.
const PREREQUISITES: &[(&str, &str)] = &[
    ("go", "golang-go"),
    ("setpriv", "util-linux"),
    ("cc", "gcc"),
    ("c++", "g++"),
    ("objcopy", "binutils"),
    // The real-program corpus (tests/corpus.rs): its reference and programs.
    ("perf", "linux-perf"),
    ("openssl", "openssl"),
    ("sqlite3", "sqlite3"),
    ("xz", "xz-utils"),
    ("ld.lld", "lld"),
    // The corpus's big programs: clang++ (libclang-cpp, libLLVM).
    ("clang++", "clang"),
    // Debian's own python3 (the corpus runs /usr/bin/python3, not a pyenv shim).
    ("/usr/bin/python3", "python3"),
    // A JIT that writes perf maps and jitdumps (tests/jit_runtimes.rs).
    ("node", "nodejs"),
    ("unshare", "util-linux"),
    // The exact reference for allocations (tests/allocations.rs).
    ("heaptrack", "heaptrack"),
    ("zstdcat", "zstd"),
    // The reference for off-CPU time (tests/wall_time.rs): a tracer of the
    // sched_switch tracepoint (this kernel has no kprobes for offcputime).
    ("bpftrace", "bpftrace"),
    // RPM's database in a container's root (tests/provenance.rs): made by
    // the real rpm and rpmbuild.
    ("rpmbuild", "rpm"),
    // RPM's Berkeley DB database (tests/provenance.rs, provenance::bdb).
    ("db5.3_load", "db5.3-util"),
    // A musl program that publishes a trace context (tests/trace_context.rs).
    ("musl-gcc", "musl-tools"),
];

/// Debian packages the tests use that provide no command: glibc's detached
/// debug symbols, which name glibc's aliases the way perf record does (the
/// corpus compares function names with it).
const PACKAGES_WITHOUT_COMMAND: &[&str] = &[
    "libc6-dbg",
    // Allocators a program preloads (tests/allocations.rs).
    "libjemalloc2",
    "libtcmalloc-minimal4",
    "libmimalloc2.0",
];

fn package_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
}

fn install_prerequisites() -> Result<()> {
    let missing: Vec<&str> = PREREQUISITES
        .iter()
        .filter(|(command, _)| !have(command))
        .map(|(_, package)| *package)
        .chain(
            PACKAGES_WITHOUT_COMMAND
                .iter()
                .copied()
                .filter(|package| !package_installed(package)),
        )
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "the tests need {missing:?}: install them (apt-get install {})",
            missing.join(" ")
        );
    }
    say(&format!("installing {}", missing.join(" ")));
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Builds the demo workload (the 6-deep chain with a 70/30 split).
pub fn build_demo_workload() -> Result<PathBuf> {
    crate::build_workload("chain.c", "demo", "chain")
}

/// Lines of a failed test's panic message kept for the digest: enough for
/// an accounting test's period lines (CI keeps the end of the log only).
const DIGEST_LINES: usize = 12;
/// Characters kept of each digest line (a period line is ~600).
const DIGEST_LINE_CHARS: usize = 700;

/// Totals of every `test result:` line cargo test printed, and the first
/// lines of each failed test's panic message: printed again last, so that
/// the end of a long log says why the suite failed.
#[derive(Default, Debug)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// The test whose captured output libtest is printing (`---- NAME
    /// stdout ----`).
    failing: Option<String>,
    /// Lines still to keep of the current panic message.
    keep: usize,
    digest: Vec<(String, Vec<String>)>,
}

impl Totals {
    fn add_line(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.failing = Some(name.to_string());
            self.keep = 0;
            return;
        }
        // libtest lists the failed tests' names after their output.
        if line == "failures:" || line.starts_with("test result: ") {
            self.failing = None;
        }
        if let Some(name) = &self.failing {
            // `thread 'NAME' (TID) panicked at FILE:LINE:COLUMN:`
            if line.starts_with("thread '") && line.contains(" panicked at ") {
                self.digest.push((name.clone(), Vec::new()));
                self.keep = DIGEST_LINES;
                return;
            }
            if self.keep > 0 {
                if let Some((_, lines)) = self.digest.last_mut() {
                    lines.push(line.chars().take(DIGEST_LINE_CHARS).collect());
                }
                self.keep -= 1;
                return;
            }
        }
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part
                .split_whitespace()
                .filter(|w| *w != "ok." && *w != "FAILED.");
            let (Some(number), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            match kind {
                "passed" => self.passed += number,
                "failed" => self.failed += number,
                "ignored" => self.ignored += number,
                _ => {}
            }
        }
    }
}

pub fn run(extra: &[String]) -> Result<ExitCode> {
    let started = std::time::Instant::now();
    install_prerequisites()?;
    let binary = build_all(true)?;
    let static_binary = crate::dist::run(crate::host_arch()?)?;
    let root = workspace_root();
    say("checking formatting and docs");
    run_checked(
        Command::new("cargo")
            .current_dir(&root)
            .args(["fmt", "--all", "--check"]),
    )?;
    // A workspace of its own, which `--all` does not reach.
    run_checked(
        Command::new("rustfmt")
            .current_dir(&root)
            .args(["--check", "--edition", "2021"])
            .arg("tests/reference-exporter/src/main.rs"),
    )?;
    crate::docs::run(true)?;

    // Datadog's exporter (tests/reference-exporter, aws-lc and all), the
    // lints (a check build of the whole workspace, ~2.5 min) and the
    // arm64 guest's making (a whole static aarch64 build, ~5 min on two
    // CPUs, its tools, kernel and userland) go on while the tests run:
    // `xtask background`, in the idle scheduling class and a process group
    // of its own. It takes the CPU time the tests leave (the corpus uses
    // ~1.2 CPUs, the churn test's two minutes mostly wait), a test's task
    // that wakes takes its CPU back at once, and it is stopped while the
    // tests that judge scheduling run (`QUIET_TESTS`). Each build in a
    // target directory of its own: the tests' own cargo builds do not wait
    // for their locks.
    say("linting and making the arm64 guest meanwhile (xtask background, idle scheduling class)");
    let mut background = Command::new("chrt")
        .args(["--idle", "0"])
        .arg(std::env::current_exe().context("xtask's own path")?)
        .arg("background")
        .env(crate::CLOCK_ENV, format!("{:.1}", crate::clock_s()))
        .process_group(0)
        .spawn()
        .context("cannot start xtask background (chrt, from util-linux)")?;
    let quiet = Quiet {
        group: background.id() as i32,
    };

    say("running the tests (unit + integration, release)");
    let mut totals = Totals::default();
    let mut every_run_passed = run_counting(
        Command::new("cargo")
            .current_dir(&root)
            .args(["test", "--workspace", "--release", "--no-fail-fast"])
            .args(extra)
            .env("DDPROF_BIN", &binary)
            .env("DDPROF_STATIC_BIN", &static_binary),
        &mut totals,
        Some(&quiet),
    )?;
    // The binary people install is the static one: the end-to-end tests
    // again, against it (the 4.15 tests above already use it).
    say(&format!(
        "running the end-to-end tests against the static ddprof ({})",
        static_binary.display()
    ));
    every_run_passed &= run_counting(
        Command::new("cargo")
            .current_dir(&root)
            .args(["test", "--release", "--no-fail-fast", "-p", "ddprof-tests"])
            .args(["--test", "end_to_end"])
            .args(extra)
            .env("DDPROF_BIN", &static_binary)
            .env("DDPROF_STATIC_BIN", &static_binary),
        &mut totals,
        None,
    )?;
    // arm64: the static arm64 ddprof in an emulated arm64 guest (one
    // check of many runs, counted as one test).
    say("waiting for the lints and the arm64 guest");
    quiet.resume();
    let status = background.wait().context("waiting for xtask background")?;
    let code = status.code().unwrap_or(BACKGROUND_FAILED);
    let lints = if code & (LINTS_FAILED | BACKGROUND_FAILED) == 0 {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "the lints failed (see `cargo clippy` above): {status}"
        ))
    };
    let guest = if code & (GUEST_FAILED | BACKGROUND_FAILED) == 0 {
        crate::arm64_test::prepared()
    } else {
        Err(anyhow::anyhow!(
            "making the arm64 guest failed (see above): {status}"
        ))
    };
    match lints {
        Ok(()) => totals.passed += 1,
        Err(error) => {
            totals.failed += 1;
            totals.digest.push((
                "cargo clippy --workspace --all-targets --release -- -D warnings".into(),
                vec![format!("{error:#}")],
            ));
        }
    }
    say("running the arm64 end-to-end test (qemu)");
    let arm64 = guest
        .context("making the arm64 guest")
        .and_then(crate::arm64_test::run_prepared);
    match arm64 {
        Ok(()) => totals.passed += 1,
        Err(error) => {
            totals.failed += 1;
            totals.digest.push((
                "arm64 (cargo xtask test-arm64)".into(),
                format!("{error:#}").lines().map(String::from).collect(),
            ));
        }
    }
    println!(
        "xtask: {} tests in {:.0} s (ignored: {})",
        totals.passed + totals.failed,
        started.elapsed().as_secs_f64(),
        totals.ignored
    );
    for (test, lines) in &totals.digest {
        println!("xtask: FAILED {test}:");
        for line in lines {
            println!("    {line}");
        }
    }
    println!("{} passed, {} failed", totals.passed, totals.failed);
    if !every_run_passed || totals.failed > 0 || totals.passed == 0 {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `xtask background`'s exit code: bits for what failed.
const LINTS_FAILED: i32 = 1;
const GUEST_FAILED: i32 = 2;
/// Killed, or failed before it could say.
const BACKGROUND_FAILED: i32 = 4;

/// The test binaries during which `xtask background` is stopped: they
/// judge scheduling itself (context switches, off-CPU time, CPU time
/// after a process's events detach) or the profiler's own CPU accounting,
/// which a build beside them changes even in the idle class (wall_time.rs
/// took 162 s instead of 58 and lost a wait; a forked child's exit 125 µs
/// instead of ~60; overhead.rs's perf-engine periods added up to 70 ms of
/// the run's 112).
const QUIET_TESTS: [&str; 3] = ["wall_time.rs", "hostile_targets.rs", "overhead.rs"];

/// `cargo SUBCOMMAND` on Datadog's exporter (tests/reference-exporter, a
/// workspace of its own), in the target directory the harness builds it in
/// (`ddprof_tests::workloads::reference_exporter`, which spells the same
/// command: the test crate cannot call xtask).
fn reference_exporter_cargo(subcommand: &str) -> Command {
    let mut command = Command::new("cargo");
    command
        .current_dir(workspace_root())
        .args([subcommand, "--locked", "--quiet", "--manifest-path"])
        .arg("tests/reference-exporter/Cargo.toml")
        .arg("--target-dir")
        .arg(crate::target_dir().join("reference-exporter"));
    command
}

/// `cargo xtask background`: Datadog's exporter for tests/export.rs, the
/// lints, the arm64 guest; the exit code says what failed.
pub fn background() -> ExitCode {
    // First what a test waits for (tests/export.rs, a few minutes in):
    // the exporter, in the target directory the harness builds it in (a
    // failure here is that test's to report).
    let _ = run_checked(&mut reference_exporter_cargo("build"));
    let lints = run_checked(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args(["clippy", "--workspace", "--all-targets", "--release"])
            .arg("--quiet")
            .arg("--target-dir")
            .arg(crate::target_dir().join("clippy-build"))
            .args(["--", "-D", "warnings"]),
    )
    .and_then(|()| run_checked(reference_exporter_cargo("clippy").args(["--", "-D", "warnings"])));
    say(&format!(
        "lints: {}",
        match &lints {
            Ok(()) => "clean".to_string(),
            Err(error) => format!("failed: {error:#}"),
        }
    ));
    let guest = crate::arm64_test::prepare(&crate::target_dir().join("arm64-build"), true);
    if let Err(error) = &guest {
        say(&format!("making the arm64 guest failed: {error:#}"));
    }
    let code =
        if lints.is_ok() { 0 } else { LINTS_FAILED } | if guest.is_ok() { 0 } else { GUEST_FAILED };
    ExitCode::from(code as u8)
}

/// `xtask background`'s process group, stopped while a test of
/// [`QUIET_TESTS`] runs.
struct Quiet {
    group: i32,
}

/// Never left stopped, whatever ends the run.
impl Drop for Quiet {
    fn drop(&mut self) {
        self.resume();
    }
}

impl Quiet {
    /// Stops or resumes the group as cargo announces a test binary (a
    /// `Running NAME (…)` line).
    fn on_cargo_line(&self, line: &str) {
        let Some(name) = line.trim_start().strip_prefix("Running ") else {
            return;
        };
        if QUIET_TESTS.iter().any(|quiet| name.starts_with(quiet)) {
            self.signal(nix::sys::signal::Signal::SIGSTOP);
        } else {
            self.resume();
        }
    }

    fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        // A group that ended has nothing to stop.
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.group), signal);
    }
}

/// Runs `cargo test …`, echoing its output and adding its `test result:`
/// lines to `totals` (and telling `quiet` which test binary runs, from
/// cargo's `Running` lines on its standard error); whether it succeeded.
fn run_counting(command: &mut Command, totals: &mut Totals, quiet: Option<&Quiet>) -> Result<bool> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not run cargo test")?;
    let stderr = child.stderr.take().expect("piped");
    let (lines, announced) = std::sync::mpsc::channel::<String>();
    let echo = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let watch = |announced: &std::sync::mpsc::Receiver<String>| {
        for line in announced.try_iter() {
            if let Some(quiet) = quiet {
                quiet.on_cargo_line(&line);
            }
        }
    };
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line?;
        watch(&announced);
        println!("{line}");
        totals.add_line(&line);
    }
    let _ = echo.join();
    watch(&announced);
    Ok(child.wait()?.success())
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_cargo_test_result_lines() {
        let mut totals = Totals::default();
        totals.add_line("test result: ok. 11 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s");
        totals.add_line(
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        totals.add_line("running 4 tests");
        assert_eq!((totals.passed, totals.failed, totals.ignored), (14, 1, 2));
    }

    #[test]
    fn keeps_the_first_lines_of_each_failed_tests_panic() {
        let mut totals = Totals::default();
        for line in [
            "failures:",
            "",
            "---- a_test stdout ----",
            "some output the test printed",
            "thread 'a_test' (1234) panicked at tests/x.rs:10:5:",
            "samples 1 + lost 2 must be within 5 %",
            "second line",
            "third line",
            "fourth line",
            "5",
            "6",
            "7",
            "8",
            "9",
            "10",
            "11",
            "twelfth line",
            "thirteenth line, not kept",
            "---- b_test stdout ----",
            "thread 'b_test' panicked at tests/y.rs:1:1:",
            "assertion failed: ok",
            "",
            "failures:",
            "    a_test",
            "thread 'main' panicked at later output:",
            "test result: FAILED. 0 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            totals.add_line(line);
        }
        assert_eq!(totals.failed, 2);
        let names: Vec<&str> = totals.digest.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a_test", "b_test"]);
        assert_eq!(
            totals.digest[0].1,
            [
                "samples 1 + lost 2 must be within 5 %",
                "second line",
                "third line",
                "fourth line",
                "5",
                "6",
                "7",
                "8",
                "9",
                "10",
                "11",
                "twelfth line"
            ]
        );
        assert_eq!(totals.digest[1].1, ["assertion failed: ok", ""]);
    }
}
