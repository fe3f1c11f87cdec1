//! The wrapper launcher, `-p`, `--global` and configuration, tested on real
//! processes: `ddprof -- COMMAND` must be invisible to COMMAND (PID, exit
//! status, signals, capabilities), must always run it, and must fail clearly
//! on bad input.
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use ddprof_tests::ddprof_bin;
use ddprof_tests::guards::KillOnDrop;
use ddprof_tests::launcher::{
    capability_lines, deny_perf_event_open, hex_field, hex_status_lines, is_running, number_field,
    wait_until_gone, Lines,
};
use ddprof_tests::{run_without_input as run, text};

const SIGCHLD_PROBE: &str = env!("CARGO_BIN_EXE_sigchld-probe");
const TIMEOUT: Duration = Duration::from_secs(20);

/// Capability numbers the tests look for.
const CAP_KILL: u32 = 5;
const CAP_SETUID: u32 = 7;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn ddprof() -> Command {
    ddprof_tests::ddprof_command_with_scratch_output("launcher")
}

/// ddprof's own warning lines (not the daemon's start-up notice or the
/// stub profiler's error).
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.starts_with("ddprof[") && line.contains("]: warning: "))
        .collect()
}

/// The warnings of the launcher, whose PID is the command's (the profiler
/// daemon may have its own to say).
fn launcher_warnings<'a>(stderr: &'a str, command_pid: &str) -> Vec<&'a str> {
    let prefix = format!("ddprof[{command_pid}]: ");
    warnings(stderr)
        .into_iter()
        .filter(|line| line.starts_with(&prefix))
        .collect()
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "ddprof-launcher-test-{}-{name}",
        std::process::id()
    ))
}

#[test]
fn the_command_keeps_the_callers_pid() {
    // Its profiles go to a scratch directory, not `./ddprof-out` in the
    // source tree.
    let script = format!(
        "echo $$; exec {} --output {} -- sh -c 'echo $$'",
        ddprof_bin().display(),
        temp_path("callers-pid").display()
    );
    let output = run(Command::new("sh").args(["-c", &script]));
    let stdout = text(&output.stdout);
    let pids: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        pids.len(),
        2,
        "stdout: {stdout}, stderr: {}",
        text(&output.stderr)
    );
    assert_eq!(
        pids[0], pids[1],
        "the command must run with the launcher's PID"
    );
    assert!(output.status.success());
    assert!(
        launcher_warnings(&text(&output.stderr), pids[1]).is_empty(),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn the_command_exit_status_is_the_callers() {
    let status = |script: &str| run(ddprof().args(["--", "sh", "-c", script])).status;
    assert_eq!(status("exit 0").code(), Some(0));
    assert_eq!(status("exit 3").code(), Some(3));
    let killed = status("kill -TERM $$");
    assert_eq!(killed.code(), None);
    assert_eq!(killed.signal(), Some(libc::SIGTERM));
}

#[test]
fn missing_and_unexecutable_commands_exit_like_a_shell() {
    let output = run(ddprof().args(["--", "ddprof-no-such-command-anywhere"]));
    assert_eq!(output.status.code(), Some(127));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("ddprof-no-such-command-anywhere: command not found"),
        "{stderr}"
    );

    let output = run(ddprof().args(["--", "/no/such/dir/program"]));
    assert_eq!(output.status.code(), Some(127));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("/no/such/dir/program: No such file or directory"),
        "{stderr}"
    );

    let not_executable = temp_path("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\necho should not run\n").unwrap();
    let output = run(ddprof().arg("--").arg(&not_executable));
    assert_eq!(output.status.code(), Some(126));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(!text(&output.stdout).contains("should not run"));
    std::fs::remove_file(not_executable).unwrap();
}

#[test]
fn commands_are_found_on_the_path() {
    let output = run(ddprof()
        .args(["--", "sh", "-c", "echo found"])
        .env("PATH", "/usr/bin:/bin"));
    assert_eq!(text(&output.stdout), "found\n");
}

/// The probe counts SIGCHLD: check that it does, so that the next test's
/// "no SIGCHLD" means something.
#[test]
fn the_sigchld_probe_counts_its_own_children() {
    let mut probe = Command::new(SIGCHLD_PROBE)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = Lines::new(probe.stdout.take().unwrap());
    assert!(stdout.find("ready", TIMEOUT).is_some());
    let mut stdin = probe.stdin.take().unwrap();
    stdin.write_all(b"spawn\nreport\n").unwrap();
    let report = stdout.find("sigchld=", TIMEOUT).unwrap();
    assert!(number_field(&report, "sigchld").unwrap() >= 1, "{report}");
    assert!(probe.wait().unwrap().success());
}

/// The profiler daemon dies (killed with SIGKILL if it is still running)
/// while the command runs: the command is untouched and gets no SIGCHLD.
#[test]
fn the_command_survives_the_profiler_and_gets_no_sigchld() {
    let mut launched = ddprof()
        .args(["--log-level", "notice", "--", SIGCHLD_PROBE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = Lines::new(launched.stdout.take().unwrap());
    let mut stderr = Lines::new(launched.stderr.take().unwrap());
    let ready = stdout
        .find("ready pid=", TIMEOUT)
        .expect("the probe started");
    assert_eq!(number_field(&ready, "pid"), Some(u64::from(launched.id())));

    let started = stderr
        .find("profiler started:", TIMEOUT)
        .expect("the profiler daemon logs its start");
    let daemon = number_field(&started, "pid").unwrap() as i32;
    assert_ne!(daemon as u32, launched.id());
    let comm = std::fs::read_to_string(format!("/proc/{daemon}/comm")).unwrap_or_default();
    if is_running(daemon) && comm.trim() == "ddprof-profiler" {
        // SAFETY: kill sends a signal to a PID we just read; it touches no memory.
        unsafe { libc::kill(daemon, libc::SIGKILL) };
    }
    assert!(
        wait_until_gone(daemon, TIMEOUT),
        "the daemon {daemon} did not die"
    );

    let mut stdin = launched.stdin.take().unwrap();
    stdin.write_all(b"report\n").unwrap();
    let report = stdout.find("sigchld=", TIMEOUT).expect("the probe reports");
    assert_eq!(report, "sigchld=0", "the command received SIGCHLD");
    let status = launched.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn the_command_runs_when_events_cannot_be_opened_and_one_warning_says_why() {
    let output =
        run(deny_perf_event_open(&mut ddprof()).args(["--", "sh", "-c", "echo ran; exit 5"]));
    assert_eq!(text(&output.stdout), "ran\n");
    assert_eq!(output.status.code(), Some(5));
    let stderr = text(&output.stderr);
    let warnings = warnings(&stderr);
    assert_eq!(warnings.len(), 1, "exactly one warning: {stderr}");
    assert!(
        warnings[0].contains("perf_event_paranoid"),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("without profiling"), "{}", warnings[0]);
    assert_eq!(
        stderr.lines().count(),
        1,
        "nothing else on stderr: {stderr}"
    );
}

/// With several events and none opened, none of them is said to be left
/// out while the others run (none does): one warning, as with one event.
#[test]
fn no_event_is_said_left_out_when_none_opens() {
    let output = run(deny_perf_event_open(&mut ddprof()).args([
        "-e",
        "sCPU;sPF;sCS",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]));
    assert_eq!(text(&output.stdout), "ran\n");
    let stderr = text(&output.stderr);
    let warnings = warnings(&stderr);
    assert_eq!(warnings.len(), 1, "exactly one warning: {stderr}");
    assert!(warnings[0].contains("without profiling"), "{}", warnings[0]);
}

#[test]
fn log_modes_route_or_silence_the_warning() {
    let output =
        run(deny_perf_event_open(&mut ddprof()).args(["--log-mode", "disabled", "--", "true"]));
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "");

    let output =
        run(deny_perf_event_open(&mut ddprof()).args(["--log-mode", "stdout", "--", "true"]));
    assert!(output.status.success());
    assert_eq!(
        warnings(&text(&output.stdout)).len(),
        1,
        "{}",
        text(&output.stdout)
    );
    assert_eq!(text(&output.stderr), "");

    let output =
        run(deny_perf_event_open(&mut ddprof()).args(["--log-level", "error", "--", "true"]));
    assert_eq!(text(&output.stderr), "");

    // A file (the C++ ddprof's `-o PATH`), appended to: the launcher's and
    // the profiler's lines, nothing on stderr; the command does not get
    // the descriptor.
    let dir = std::env::temp_dir().join(format!("ddprof-launcher-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("ddprof.log");
    std::fs::write(&log, "earlier line\n").unwrap();
    let output = run(deny_perf_event_open(&mut ddprof())
        .arg("-o")
        .arg(&log)
        .args([
            "--",
            "sh",
            "-c",
            "ls -l /proc/self/fd | grep -c ddprof.log || true",
        ]));
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "");
    assert_eq!(
        text(&output.stdout),
        "0\n",
        "the command inherited the log file"
    );
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(written.starts_with("earlier line\n"), "{written}");
    assert_eq!(warnings(&written).len(), 1, "{written}");
    // Where another user could point it: a link, or their file, is not
    // written; the logs go to stderr, with one line saying why.
    let link = dir.join("link.log");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let output = run(deny_perf_event_open(&mut ddprof())
        .arg("--log-mode")
        .arg(&link)
        .args(["--", "true"]));
    assert!(output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with(&format!(
            "ddprof: warning: cannot log to {}: it is a symbolic link; logging to stderr\n",
            link.display()
        )),
        "{stderr}"
    );
    // (and the launcher's own warning after it)
    assert_eq!(warnings(&stderr).len(), 1, "{stderr}");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    let theirs = dir.join("theirs.log");
    std::fs::write(&theirs, "").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let output = run(deny_perf_event_open(&mut ddprof())
        .env("DD_PROFILING_NATIVE_LOG_MODE", &theirs)
        .args(["--", "true"]));
    assert!(output.status.success());
    assert!(
        text(&output.stderr).contains("it belongs to uid 65534, not to this user"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(std::fs::read(&theirs).unwrap(), b"");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn enable_false_is_a_pure_pass_through() {
    // Under the filter any perf_event_open attempt would warn: none is made.
    let output = run(deny_perf_event_open(&mut ddprof())
        .env("DD_PROFILING_ENABLED", "false")
        .args(["--log-level", "debug", "--", "sh", "-c", "echo ran; exit 4"]));
    assert_eq!(text(&output.stdout), "ran\n");
    assert_eq!(output.status.code(), Some(4));
    assert_eq!(text(&output.stderr), "");

    let output = run(ddprof().args(["--enable", "false", "-l", "debug", "--", "true"]));
    assert!(output.status.success());
    assert_eq!(text(&output.stderr), "", "no profiler was started");
}

fn command_capabilities(command: &mut Command) -> Vec<(String, u64)> {
    let output = run(command);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let capabilities = capability_lines(&text(&output.stdout));
    assert_eq!(capabilities.len(), 5, "{}", text(&output.stdout));
    capabilities
}

#[test]
fn the_command_gets_the_capabilities_it_would_have_without_ddprof() {
    let read_status = ["grep", "^Cap", "/proc/self/status"];
    let without = command_capabilities(Command::new(read_status[0]).args(&read_status[1..]));
    let with = command_capabilities(ddprof().arg("--").args(read_status));
    assert_eq!(with, without);

    // An unprivileged caller with an ambient capability keeps it.
    let setpriv = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=+net_raw",
        "--ambient-caps=+net_raw",
    ];
    let without = command_capabilities(Command::new("setpriv").args(setpriv).args(read_status));
    let with = command_capabilities(
        Command::new("setpriv")
            .args(setpriv)
            .arg(ddprof_bin())
            .arg("--")
            .args(read_status),
    );
    assert_eq!(with, without);
    assert!(without
        .iter()
        .any(|(key, value)| key == "CapAmb" && *value != 0));
}

/// Ignores SIGPIPE and SIGCHLD and blocks SIGUSR1 in the spawned process,
/// as some callers do.
fn with_unusual_signal_state(command: &mut Command) -> &mut Command {
    // SAFETY: runs in the forked child before exec: signal() and
    // sigprocmask() on stack data only.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut blocked);
            libc::sigaddset(&mut blocked, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut());
            Ok(())
        })
    }
}

#[test]
fn the_command_gets_the_callers_signal_state() {
    let read_status = ["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"];
    let without =
        run(with_unusual_signal_state(&mut Command::new(read_status[0])).args(&read_status[1..]));
    let with = run(with_unusual_signal_state(&mut ddprof())
        .args(["--log-level", "notice", "--"])
        .args(read_status));
    assert_eq!(text(&with.stdout), text(&without.stdout));
    let state = hex_status_lines(&text(&without.stdout), "Sig");
    let bit = |signal: i32| 1u64 << (signal - 1);
    assert_eq!(
        state[0].1 & bit(libc::SIGUSR1),
        bit(libc::SIGUSR1),
        "SIGUSR1 blocked"
    );
    let ignored = bit(libc::SIGPIPE) | bit(libc::SIGCHLD);
    assert_eq!(state[1].1 & ignored, ignored, "SIGPIPE and SIGCHLD ignored");
    // ... and with SIGCHLD ignored the profiler still started.
    assert!(
        text(&with.stderr).contains("profiler started:"),
        "{}",
        text(&with.stderr)
    );

    let without = run(Command::new(read_status[0]).args(&read_status[1..]));
    let with = run(ddprof().arg("--").args(read_status));
    assert_eq!(text(&with.stdout), text(&without.stdout));
}

#[test]
fn drop_capabilities_removes_admin_perfmon_and_bpf_everywhere() {
    let read_status = ["grep", "^Cap", "/proc/self/status"];
    let without = command_capabilities(Command::new(read_status[0]).args(&read_status[1..]));
    let dropped = (1u64 << CAP_SYS_ADMIN) | (1 << CAP_PERFMON) | (1 << CAP_BPF);
    let with = command_capabilities(
        ddprof()
            .arg("--drop-capabilities")
            .arg("--")
            .args(read_status),
    );
    for ((key, before), (_, after)) in without.iter().zip(&with) {
        assert_eq!(after & dropped, 0, "{key} still has {after:#x}");
        assert_eq!(*after, before & !dropped, "{key}: only those three go");
    }
}

#[test]
fn the_profiler_keeps_only_the_capabilities_it_uses_and_is_sandboxed() {
    let output = run(ddprof().args(["--log-level", "notice", "--", "true"]));
    let stderr = text(&output.stderr);
    let started = stderr
        .lines()
        .find(|line| line.contains("profiler started:"))
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    let allowed: u64 = [2u32, 14, 19, 21, 38, 39, 40]
        .iter()
        .fold(0, |mask, cap| mask | (1 << cap));
    for set in ["effective", "permitted", "bounding"] {
        let value = hex_field(started, set).unwrap_or_else(|| panic!("no {set} in {started}"));
        assert_eq!(
            value & !allowed,
            0,
            "{set}={value:#x} has more than it uses"
        );
        assert_eq!(value & (1 << CAP_KILL), 0);
        assert_eq!(value & (1 << CAP_SETUID), 0);
    }
    // It cannot signal or trace the command either (seccomp filter mode).
    assert_eq!(number_field(started, "seccomp"), Some(2), "{started}");
    // The tests run as root: what it keeps is really kept.
    assert_ne!(
        hex_field(started, "effective").unwrap() & (1 << CAP_SYS_PTRACE),
        0
    );
}

#[test]
fn switch_user_runs_the_command_as_that_user() {
    let output = run(ddprof().args([
        "--switch-user",
        "nobody",
        "--log-level",
        "notice",
        "--",
        "sh",
        "-c",
        "echo $$; id -u; id -g; grep ^CapEff /proc/self/status",
    ]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[1], "65534", "{stdout}");
    assert_eq!(lines[2], "65534", "{stdout}");
    assert_eq!(capability_lines(lines[3]), vec![("CapEff".to_string(), 0)]);
    let stderr = text(&output.stderr);
    assert!(launcher_warnings(&stderr, lines[0]).is_empty(), "{stderr}");
    // The events were handed over before the switch: it is profiled.
    assert!(stderr.contains("profiler started:"), "{stderr}");

    let output = run(ddprof().args([
        "--switch-user",
        "no-such-user-ddprof",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]));
    // Typed on the command line: a usage error (tests/cli.rs covers the
    // environment and the config file).
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        text(&output.stdout),
        "",
        "the command must not run as the caller"
    );
    assert!(text(&output.stderr).contains("no user `no-such-user-ddprof`"));
}

#[test]
fn bad_pids_fail_with_a_clear_message() {
    let output = run(ddprof().args(["-p", "2147483647"]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no process with PID 2147483647"),
        "{stderr}"
    );

    let output = run(ddprof().args(["--pid", "abc"]));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("--pid"),
        "{}",
        text(&output.stderr)
    );

    // An unprivileged user may not profile init.
    let output = run(ddprof_tests::as_nobody(ddprof_bin()).args(["-p", "1"]));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot profile process 1"), "{stderr}");
    assert!(stderr.contains("perf_event_paranoid"), "{stderr}");
}

#[test]
fn global_without_permission_fails_with_a_clear_message() {
    let output = run(deny_perf_event_open(&mut ddprof()).arg("--global"));
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("cannot profile the whole machine"),
        "{stderr}"
    );
    assert!(stderr.contains("CAP_PERFMON"), "{stderr}");
}

#[test]
fn bad_option_values_name_the_option() {
    for (args, option) in [
        (&["--upload-period", "0", "true"][..], "--upload-period"),
        (&["--log-mode", "loud", "true"][..], "--log-mode"),
        (&["-e", "sFOO", "true"][..], "--event"),
        (
            &["--stack-sample-size", "7", "true"][..],
            "--stack-sample-size",
        ),
        (&["--nice", "99", "true"][..], "--nice"),
    ] {
        let output = run(ddprof().args(args));
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(option), "{args:?}: {stderr}");
    }

    let output = run(&mut ddprof());
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("nothing to profile"));
}

/// Waits for a `summary:` line (written by the profiler at exit) and returns
/// its sample count.
fn summary_samples(stderr: &str) -> u64 {
    ddprof_tests::outputs::summary_fields(stderr)["samples"]
}

/// A busy shell loop, killed when dropped so that a failing test never
/// leaves it spinning.
fn busy_loop() -> KillOnDrop {
    KillOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    )
}

#[test]
fn pid_mode_samples_a_running_process_until_it_exits() {
    let mut workload = busy_loop();
    let profiler = ddprof()
        .args([
            "-l",
            "notice",
            "-e",
            "sCPU freq=999",
            "-p",
            &workload.id().to_string(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    workload.stop();
    let output = profiler.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(summary_samples(&text(&output.stderr)) > 100);
}

#[test]
fn global_mode_samples_until_sigint() {
    let mut workload = busy_loop();
    let profiler = ddprof()
        .args(["-l", "notice", "-e", "sCPU freq=999", "--global"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill sends a signal to our own child; it touches no memory.
    unsafe { libc::kill(profiler.id() as i32, libc::SIGINT) };
    let output = profiler.wait_with_output().unwrap();
    workload.stop();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(summary_samples(&text(&output.stderr)) > 100);
}

#[test]
fn wrapped_command_is_sampled() {
    let output = run(ddprof().args([
        "-l",
        "notice",
        "-e",
        "sCPU freq=999",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
    ]));
    assert!(output.status.success());
    // The daemon writes the summary after the command exits: wait for it.
    assert!(summary_samples(&text(&output.stderr)) > 10);
}

/// The daemon, while it profiles: niced, on one CPU, stdin and stdout on
/// /dev/null, in its own session, not the command's child.
#[test]
fn the_daemon_is_detached_niced_and_pinned() {
    let mut launched = ddprof()
        .args(["-l", "notice", "--nice", "10", "--", "sleep", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Lines::new(launched.stderr.take().unwrap());
    let started = stderr.find("profiler started:", TIMEOUT).unwrap();
    let daemon = number_field(&started, "pid").unwrap() as i32;
    assert!(
        is_running(daemon),
        "the daemon must run as long as the command"
    );
    let stat = std::fs::read_to_string(format!("/proc/{daemon}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // Fields after the command name: state(0) ppid(1) pgrp(2) session(3) ... nice(16).
    assert_ne!(
        fields[1],
        launched.id().to_string(),
        "not the command's child"
    );
    assert_eq!(fields[3], daemon.to_string(), "its own session");
    assert_eq!(fields[16], "10");
    let status = std::fs::read_to_string(format!("/proc/{daemon}/status")).unwrap();
    let cpus = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    assert!(!cpus.contains(',') && !cpus.contains('-'), "{cpus}");
    for fd in [0, 1] {
        let target = std::fs::read_link(format!("/proc/{daemon}/fd/{fd}")).unwrap();
        assert_eq!(target, PathBuf::from("/dev/null"));
    }
    assert!(launched.wait().unwrap().success());
}
