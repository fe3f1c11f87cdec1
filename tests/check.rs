//! `ddprof --check` on this machine: as root, as nobody, and where
//! perf_event_open is refused (a seccomp filter in the child). Each line
//! is compared with what the machine really allows.
use std::process::{Command, Output};

use ddprof_tests::old_kernel::with_perf_event_open_refused;
use ddprof_tests::{as_nobody, ddprof_bin, run_without_input as run, text};

/// The report's lines, keyed by what comes before the first `: `.
fn lines(output: &Output) -> Vec<(String, String)> {
    text(&output.stdout)
        .lines()
        .map(|line| {
            let (key, value) = line
                .split_once(": ")
                .unwrap_or_else(|| panic!("`fact: value` lines, not {line:?}"));
            (key.to_string(), value.to_string())
        })
        .collect()
}

fn value<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no `{key}:` line in {lines:#?}"))
}

fn bpf_lines(lines: &[(String, String)]) -> Vec<&str> {
    lines
        .iter()
        .filter(|(k, _)| k.starts_with("BPF program "))
        .map(|(_, v)| v.as_str())
        .collect()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// The facts that do not depend on who asks.
fn assert_machine_facts(lines: &[(String, String)]) {
    let keys: Vec<&str> = lines.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys[..5],
        [
            "kernel",
            "btf",
            "perf_event_paranoid",
            "capabilities (effective)",
            "perf_event_open"
        ],
        "{lines:#?}"
    );
    assert_eq!(keys.last(), Some(&"engine (auto)"), "{lines:#?}");
    assert!(value(lines, "kernel").starts_with(&format!(
        "Linux {} ",
        read_trimmed("/proc/sys/kernel/osrelease")
    )));
    assert!(value(lines, "btf").starts_with("/sys/kernel/btf/vmlinux ("));
    assert!(value(lines, "perf_event_paranoid").starts_with(&format!(
        "{} (",
        read_trimmed("/proc/sys/kernel/perf_event_paranoid")
    )));
}

#[test]
fn as_root_every_engine_works_and_auto_picks_bpf() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests run as root (cargo xtask test does)"
    );
    let output = run(Command::new(ddprof_bin()).arg("--check"));
    assert!(output.status.success(), "{output:?}");
    let lines = lines(&output);
    eprintln!("{}", text(&output.stdout));
    assert_machine_facts(&lines);
    let caps = value(&lines, "capabilities (effective)");
    for cap in ["CAP_SYS_ADMIN", "CAP_PERFMON", "CAP_BPF"] {
        assert!(
            caps.split("; lacking").next().unwrap().contains(cap),
            "{caps}"
        );
    }
    assert_eq!(
        value(&lines, "perf_event_open"),
        "task-clock opens (user and kernel time)"
    );
    let bpf = bpf_lines(&lines);
    assert!(!bpf.is_empty(), "{lines:#?}");
    assert!(bpf[0].starts_with("loads and verifies ("), "{bpf:?}");
    assert_eq!(
        value(&lines, "allocations (sALLOC)"),
        "the uprobe program loads and verifies (stacks unwound in the kernel)"
    );
    assert!(
        value(&lines, "engine (auto)").starts_with("BPF: "),
        "{lines:#?}"
    );
}

#[test]
fn as_nobody_bpf_is_refused_and_auto_picks_perf() {
    let output = run(as_nobody(ddprof_bin()).arg("--check"));
    assert!(output.status.success(), "{output:?}");
    let lines = lines(&output);
    eprintln!("{}", text(&output.stdout));
    assert_machine_facts(&lines);
    assert!(value(&lines, "capabilities (effective)").starts_with("none of those ddprof uses"));
    assert_eq!(
        value(&lines, "perf_event_open"),
        "task-clock opens (user time only)"
    );
    for line in bpf_lines(&lines) {
        assert!(
            line.starts_with("does not load: loading BPF is not permitted"),
            "{line}"
        );
    }
    let allocations = value(&lines, "allocations (sALLOC)");
    assert!(
        allocations.starts_with(
            "unwound by the perf engine from stack copies: the bpf_loop variant does not load"
        ),
        "{allocations}"
    );
    let engine = value(&lines, "engine (auto)");
    assert!(
        engine.starts_with("perf: loading BPF is not permitted"),
        "{engine}"
    );
}

#[test]
fn without_perf_event_open_profiling_is_impossible_and_the_exit_status_says_so() {
    let mut command = Command::new(ddprof_bin());
    command.arg("--check");
    let output = run(with_perf_event_open_refused(&mut command));
    eprintln!("{}", text(&output.stdout));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let lines = lines(&output);
    assert_machine_facts(&lines);
    assert!(
        value(&lines, "perf_event_open").starts_with("fails: perf_event_open was refused"),
        "{lines:#?}"
    );
    let engine = value(&lines, "engine (auto)");
    assert!(
        engine.starts_with("none: profiling is impossible here: perf_event_open was refused"),
        "{engine}"
    );
}
