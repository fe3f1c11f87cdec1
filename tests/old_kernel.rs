//! The static ddprof on a Linux 4.15 syscall set (tests/harness/old_kernel.rs):
//! every system call newer than 4.15 answers ENOSYS and `bpf()` EINVAL, in
//! ddprof and in everything it starts. ddprof must still profile the
//! end-to-end workloads completely with the perf engine (the same scenarios
//! and assertions as tests/end_to_end.rs) and say why BPF was not used.
use std::path::Path;
use std::process::{Command, Stdio};

use ddprof_tests::e2e;
use ddprof_tests::old_kernel::{with_linux_4_15_syscalls, LAST_SYSCALL_OF_4_15, SYS_BPF};
use ddprof_tests::static_ddprof_bin;
use ddprof_tests::workloads::build_workload;

/// The static ddprof with `--engine auto`, writing to `output`, under the
/// 4.15 syscall set.
fn ddprof_on_linux_4_15(output: &Path) -> Command {
    let mut command = Command::new(static_ddprof_bin());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DD_") {
            command.env_remove(key);
        }
    }
    command
        .args(["-l", "notice", "--engine", "auto", "--output"])
        .arg(output)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    with_linux_4_15_syscalls(&mut command);
    command
}

/// `syscall_probe NUMBERS…` → (number, errno) for each.
fn probe(numbers: &[u32], old_kernel: bool) -> Vec<(u32, i32)> {
    let mut command = Command::new(build_workload("syscall_probe.c"));
    command.args(numbers.iter().map(u32::to_string));
    if old_kernel {
        with_linux_4_15_syscalls(&mut command);
    }
    let output = command.output().expect("syscall_probe runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let (number, errno) = line.split_once(' ').expect("`NUMBER ERRNO` lines");
            (number.parse().unwrap(), errno.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_filter_answers_like_linux_4_15() {
    // 332 statx (4.11), 298 perf_event_open, 318 getrandom (3.17): there.
    // 333 io_pgetevents and 334 rseq (4.18), 424 pidfd_send_signal (5.1),
    // 434 pidfd_open (5.3), 435 clone3 (5.3), 439 faccessat2 (5.8): not.
    let newer = [333, 334, 424, 434, 435, 439];
    let unfiltered = probe(&newer, false);
    assert!(
        unfiltered.iter().all(|&(_, errno)| errno != libc::ENOSYS),
        "this kernel has them all: {unfiltered:?}"
    );
    let filtered = probe(
        &[
            LAST_SYSCALL_OF_4_15,
            298,
            318,
            SYS_BPF,
            333,
            334,
            424,
            434,
            435,
            439,
        ],
        true,
    );
    for (number, errno) in filtered {
        let expected_errno = match number {
            SYS_BPF => Some(libc::EINVAL),
            n if n > LAST_SYSCALL_OF_4_15 => Some(libc::ENOSYS),
            _ => None,
        };
        match expected_errno {
            Some(expected) => assert_eq!(errno, expected, "system call {number}"),
            None => assert_ne!(errno, libc::ENOSYS, "system call {number} must run"),
        }
    }
}

/// The log says the perf engine samples and why the BPF engine does not.
fn assert_says_why_bpf_was_not_used(stderr: &str) {
    let line = stderr
        .lines()
        .find(|line| line.contains("engine: perf engine: "))
        .unwrap_or_else(|| panic!("no line saying why the perf engine samples:\n{stderr}"));
    assert!(line.contains("BPF"), "the reason must name BPF: {line}");
}

#[test]
fn the_static_ddprof_profiles_the_chain_workload_with_the_perf_engine() {
    let stderr = e2e::wraps_the_chain_workload(&ddprof_on_linux_4_15, "perf");
    assert_says_why_bpf_was_not_used(&stderr);
}

#[test]
fn the_static_ddprof_names_samples_before_an_exec_after_the_program_that_ran() {
    e2e::names_samples_before_an_exec_after_the_program_that_ran(&ddprof_on_linux_4_15, "perf");
}

#[test]
fn the_static_ddprof_symbolizes_a_binary_deleted_while_it_runs() {
    e2e::symbolizes_a_binary_deleted_while_it_runs(&ddprof_on_linux_4_15, "perf");
}

#[test]
fn check_says_the_bpf_program_does_not_load_and_auto_picks_perf() {
    let mut command = Command::new(static_ddprof_bin());
    command.arg("--check").stdin(Stdio::null());
    let output = with_linux_4_15_syscalls(&mut command)
        .output()
        .expect("ddprof --check runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(output.status.success(), "{output:?}");
    let bpf: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("BPF program "))
        .collect();
    assert!(!bpf.is_empty(), "{stdout}");
    assert!(
        bpf.iter().all(|line| line.contains(": does not load: ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("\nperf_event_open: task-clock opens"),
        "{stdout}"
    );
    assert!(stdout.contains("\nengine (auto): perf: "), "{stdout}");
}
