//! Scenarios of the end-to-end tests, shared by the tests that run them
//! against different binaries and kernels (tests/end_to_end.rs with the
//! binary under test, tests/old_kernel.rs with the static one under a 4.15
//! syscall set): each takes `ddprof(output_dir)`, a command running the
//! ddprof to test with its engine chosen and its profiles going to
//! `output_dir`, and makes the same assertions whichever it is.
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

pub use crate::guards::Scratch;
use crate::outputs::{go_pprof, pprof_files, summary_fields as summary};
use crate::workloads::build_workload;

/// Runs to the end: stderr reaches end-of-file only once the detached
/// profiler, which shares it, has written its last line and exited.
pub fn run(command: &mut Command) -> (Output, String) {
    let output = command.output().expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

/// `stacks.folded` as (frames root first, count).
pub fn folded(dir: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(dir.join("stacks.folded"))
        .unwrap()
        .lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("`stack count` lines");
            (
                stack.split(';').map(str::to_string).collect(),
                count.parse().expect("a count"),
            )
        })
        .collect()
}

/// The blocks of `go tool pprof -traces`: (labels, frames innermost first).
pub fn pprof_traces(profile: &Path) -> Vec<(HashMap<String, String>, Vec<String>)> {
    let text = go_pprof(&["-traces"], profile);
    let mut traces = Vec::new();
    for block in text.split("-----------+").skip(1) {
        let mut labels = HashMap::new();
        let mut frames = Vec::new();
        for line in block.lines().skip(1) {
            let line = line.trim();
            if line.is_empty() || line.starts_with("---") {
                continue;
            }
            match line.split_once(":  ") {
                Some((key, value)) if frames.is_empty() => {
                    labels.insert(key.trim().to_string(), value.trim().to_string());
                }
                // The leaf line starts with the sample's value.
                _ => frames.push(line.rsplit("  ").next().unwrap_or(line).trim().to_string()),
            }
        }
        if !frames.is_empty() {
            traces.push((labels, frames));
        }
    }
    traces
}

/// `chain` (70/30 split under a 6-deep chain) for 2 s at 999 Hz: the
/// engine named in the log is `engine`; ≥ 99 % full stacks; one pprof that
/// `go tool pprof` reads, with labels, lines and the whole chain; folded
/// stacks that count every sample; a flame graph. Returns ddprof's stderr.
pub fn wraps_the_chain_workload(ddprof: &dyn Fn(&Path) -> Command, engine: &str) -> String {
    let chain = build_workload("chain.c");
    let out = Scratch::new(&format!("chain-{engine}"));
    let (output, stderr) = run(ddprof(&out.0)
        .args(["-S", "e2e-chain", "-e", "sCPU freq=999", "--"])
        .arg(&chain)
        .arg("2"));
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "engine: {}",
            if engine == "bpf" { "BPF" } else { "perf" }
        )),
        "the {engine} engine must be the one used:\n{stderr}"
    );
    let summary = summary(&stderr);
    let samples = summary["samples"];
    assert!(
        samples > 500,
        "2 s at 999 Hz gave {samples} samples:\n{stderr}"
    );
    assert!(summary["full_stacks"] * 100 >= samples * 99, "{summary:?}");

    // One profile per period (one here) and the whole-run files.
    let profiles = pprof_files(&out.0);
    assert_eq!(profiles.len(), 1, "{profiles:?}");
    let name = profiles[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("e2e-chain-2026") || name.starts_with("e2e-chain-20"),
        "{name}"
    );

    let raw = go_pprof(&["-raw"], &profiles[0]);
    assert!(
        raw.contains("cpu-samples/count") && raw.contains("cpu-time/nanoseconds"),
        "{raw}"
    );
    for label in [
        "process_id",
        "process_name",
        "thread id",
        "thread_name",
        "end_timestamp_ns",
    ] {
        assert!(raw.contains(label), "label {label} missing:\n{raw}");
    }
    assert!(
        raw.contains(&chain.display().to_string()),
        "the mapping names the binary"
    );
    // Functions with their source lines, from the binary's DWARF.
    let chain_lines = raw
        .lines()
        .filter(|l| l.contains("chain_leaf_70") && l.contains("chain.c:"))
        .count();
    assert!(
        chain_lines > 0,
        "chain_leaf_70 with chain.c:LINE expected:\n{raw}"
    );

    // The full chain in order, innermost first, in the pprof traces.
    let traces = go_pprof(&["-traces"], &profiles[0]);
    let expected = [
        "chain_e", "chain_d", "chain_c", "chain_b", "chain_a", "main",
    ];
    let stack_of_leaf: Vec<&str> = traces
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.ends_with("chain_leaf_70"))
        .skip(1)
        .take(expected.len())
        .collect();
    assert_eq!(stack_of_leaf, expected, "{traces}");

    // stacks.folded: root first, counts add up to the samples, 70/30 split.
    let stacks = folded(&out.0);
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    assert_eq!(total, samples, "stacks.folded must count every sample");
    let leaf_total = |leaf: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.last().is_some_and(|f| f == leaf))
            .map(|(_, c)| c)
            .sum()
    };
    let (seventy, thirty) = (leaf_total("chain_leaf_70"), leaf_total("chain_leaf_30"));
    let share = seventy as f64 * 100.0 / (seventy + thirty) as f64;
    assert!(
        (65.0..=75.0).contains(&share),
        "chain_leaf_70 share {share:.1} % ({seventy}/{thirty})"
    );
    for (frames, _) in &stacks {
        assert_eq!(
            frames.first().map(String::as_str),
            Some("chain"),
            "process name first: {frames:?}"
        );
    }

    let svg = std::fs::read_to_string(out.0.join("flamegraph.svg")).unwrap();
    assert!(
        svg.trim_start().starts_with("<?xml") || svg.contains("<svg"),
        "not an SVG"
    );
    assert!(svg.contains("chain_leaf_70") && svg.contains("chain_leaf_30"));
    stderr
}

/// `execer` burns 1 s of CPU under its own name, then execs `forker_child`, which
/// burns 1 s of CPU under its name, in the same process and the same period.
pub fn names_samples_before_an_exec_after_the_program_that_ran(
    ddprof: &dyn Fn(&Path) -> Command,
    engine: &str,
) {
    let execer = build_workload("execer.c");
    let child = build_workload("forker_child.c");
    let out = Scratch::new(&format!("exec-name-{engine}"));
    let (output, stderr) = run(ddprof(&out.0)
        .args(["-e", "sCPU freq=999", "--"])
        .arg(&execer)
        .arg("1")
        .arg(&child)
        .arg("1000"));
    assert!(output.status.success(), "{stderr}");
    let profiles = pprof_files(&out.0);
    assert_eq!(profiles.len(), 1, "one period holds both programs");

    // (process name, leaf) → samples, from the pprof labels.
    let mut named: HashMap<(String, String), u64> = HashMap::new();
    for (labels, frames) in pprof_traces(&profiles[0]) {
        let process = labels.get("process_name").cloned().unwrap_or_default();
        let leaf = frames.first().cloned().unwrap_or_default();
        *named.entry((process, leaf)).or_default() += 1;
    }
    let count = |process: &str, leaf: &str| {
        named
            .get(&(process.to_string(), leaf.to_string()))
            .copied()
            .unwrap_or(0)
    };
    eprintln!("{engine}: samples by (process name, leaf): {named:?}");
    let before = count("execer", "execer_burn");
    let after = count("forker_child", "forker_child_burn");
    // 1 s of CPU each at 999 Hz, less what the other tests' load takes.
    assert!(before > 200 && after > 200, "{engine}: {named:?}");
    assert_eq!(
        count("forker_child", "execer_burn") + count("execer", "forker_child_burn"),
        0,
        "{engine}: samples named after the other program: {named:?}"
    );

    // stacks.folded: the root is the name in force at the sample's time.
    let stacks = folded(&out.0);
    let rooted = |root: &str, leaf: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| {
                frames.first().is_some_and(|f| f == root)
                    && frames.last().is_some_and(|f| f == leaf)
            })
            .map(|(_, count)| count)
            .sum()
    };
    assert_eq!(rooted("execer", "execer_burn"), before, "{stacks:?}");
    assert_eq!(
        rooted("forker_child", "forker_child_burn"),
        after,
        "{stacks:?}"
    );
}

/// As when a package upgrade removes a running service's binary: the copy
/// of `chain` is deleted 0.5 s after it started and runs 2 s more; the
/// profile is written after it exited.
pub fn symbolizes_a_binary_deleted_while_it_runs(ddprof: &dyn Fn(&Path) -> Command, engine: &str) {
    let out = Scratch::new(&format!("deleted-{engine}"));
    let binary = out.0.join("chain_deleted");
    std::fs::copy(build_workload("chain.c"), &binary).unwrap();
    let profile_dir = out.0.join("profiles");
    let profiler = ddprof(&profile_dir)
        .args(["-e", "sCPU freq=999", "--"])
        .arg(&binary)
        .arg("2.5")
        .spawn()
        .expect("ddprof starts");
    // ddprof execs into the command: the pid is the workload's once its
    // name is.
    let comm = format!("/proc/{}/comm", profiler.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&comm).map_or(true, |c| c.trim() != "chain_deleted") {
        assert!(
            std::time::Instant::now() < deadline,
            "the workload did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    std::fs::remove_file(&binary).unwrap();
    let output = profiler.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{engine}: {stderr}");

    let profiles = pprof_files(&profile_dir);
    assert_eq!(profiles.len(), 1, "{profiles:?}");
    let mut leaves: HashMap<String, u64> = HashMap::new();
    for (_, frames) in pprof_traces(&profiles[0]) {
        *leaves
            .entry(frames.first().cloned().unwrap_or_default())
            .or_default() += 1;
    }
    eprintln!("{engine}: samples by leaf: {leaves:?}");
    let total: u64 = leaves.values().sum();
    let named = leaves.get("chain_leaf_70").copied().unwrap_or(0)
        + leaves.get("chain_leaf_30").copied().unwrap_or(0);
    // 2.5 s of CPU at 999 Hz (less what the other tests' load takes),
    // nearly all of it in the two leaves.
    assert!(total > 500, "{engine}: {leaves:?}");
    assert!(
        named * 100 >= total * 95,
        "{engine}: the deleted binary's functions must be named: {leaves:?}"
    );
    assert_eq!(
        leaves.get("[chain_deleted]"),
        None,
        "{engine}: frames named after the file: {leaves:?}"
    );
}
