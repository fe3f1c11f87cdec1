//! ddprof as a user runs it: the real binary wraps a real workload, and the
//! files it leaves behind are read back with `go tool pprof` and parsed.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ddprof_tests::ddprof_bin;
use ddprof_tests::guards::KillOnDrop;
use ddprof_tests::outputs::{go_pprof, pprof_files, summary_fields as summary};
use ddprof_tests::workloads::build_workload;

/// A scratch output directory, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ddprof-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ddprof(output: &Path) -> Command {
    let mut command = ddprof_tests::ddprof_command();
    command
        .args(["-l", "notice", "--output"])
        .arg(output)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs to the end: stderr reaches end-of-file only once the detached
/// profiler, which shares it, has written its last line and exited.
fn run(command: &mut Command) -> (Output, String) {
    let output = command.output().expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

/// `stacks.folded` as (frames root first, count).
fn folded(dir: &Path) -> Vec<(Vec<String>, u64)> {
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

#[test]
fn the_bpf_engine_wraps_the_chain_workload_into_pprof_flamegraph_and_folded_stacks() {
    wraps_the_chain_workload("bpf");
}

#[test]
fn the_perf_engine_wraps_the_chain_workload_into_pprof_flamegraph_and_folded_stacks() {
    wraps_the_chain_workload("perf");
}

fn wraps_the_chain_workload(engine: &str) {
    let chain = build_workload("chain.c");
    let out = Scratch::new(&format!("chain-{engine}"));
    let (output, stderr) = run(ddprof(&out.0)
        .args([
            "--engine",
            engine,
            "-S",
            "e2e-chain",
            "-e",
            "sCPU freq=999",
            "--",
        ])
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
}

#[test]
fn children_that_exit_before_the_flush_are_symbolized() {
    let forker = build_workload("forker.c");
    let child = build_workload("forker_child.c");
    let out = Scratch::new("forker");
    let (output, stderr) = run(ddprof(&out.0)
        .args(["-e", "sCPU freq=999", "--"])
        .arg(&forker)
        .arg("2")
        .arg(&child));
    assert!(output.status.success(), "{stderr}");
    let profiles = pprof_files(&out.0);
    assert_eq!(profiles.len(), 1, "{profiles:?}");
    // Every child exited long before the profile was written at exit.
    let top = go_pprof(&["-top", "-nodecount=200"], &profiles[0]);
    assert!(
        top.contains("forker_child_burn"),
        "children's frames must be named:\n{top}"
    );
    assert!(top.contains("forker_parent_burn"), "{top}");
    // The exec'd children carry their own process name.
    let traces = go_pprof(&["-traces"], &profiles[0]);
    assert!(traces.contains("process_name:  forker_child"), "{traces}");
}

#[test]
fn an_unprivileged_user_profiles_its_own_command_with_the_perf_engine() {
    let chain = build_workload("chain.c");
    let out = Scratch::new("nobody");
    // nobody must be able to write its profiles.
    Command::new("chmod")
        .arg("777")
        .arg(&out.0)
        .status()
        .unwrap();
    let mut command = ddprof_tests::as_nobody(ddprof_bin());
    command
        .args(["-l", "notice", "-e", "sCPU freq=999", "--output"])
        .arg(&out.0)
        .arg("--")
        .arg(&chain)
        .arg("1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (output, stderr) = run(&mut command);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("engine: perf"),
        "the engine choice is logged:\n{stderr}"
    );
    let summary = summary(&stderr);
    assert!(summary["samples"] > 200, "{summary:?}\n{stderr}");
    assert!(
        summary["full_stacks"] * 100 >= summary["samples"] * 99,
        "{summary:?}"
    );
    assert_eq!(pprof_files(&out.0).len(), 1);
}

#[test]
fn lost_samples_are_counted_and_reported() {
    let chain = build_workload("chain.c");
    let out = Scratch::new("lost");
    // The perf engine with two pages of ring buffer for 60 KB stack copies
    // at 9999 Hz.
    let (output, stderr) = run(ddprof(&out.0)
        .args([
            "--engine",
            "perf",
            "--ring-buffer-kib",
            "8",
            "--stack-sample-size",
            "60000",
            "-e",
            "sCPU freq=9999",
            "--",
        ])
        .arg(&chain)
        .arg("1"));
    assert!(output.status.success(), "{stderr}");
    let summary = summary(&stderr);
    assert!(summary["lost"] > 0, "{summary:?}\n{stderr}");
    assert!(
        stderr.contains("samples were lost"),
        "a warning says so:\n{stderr}"
    );
}

#[test]
fn show_samples_prints_one_line_per_sample() {
    let chain = build_workload("chain.c");
    let out = Scratch::new("show");
    let (output, stderr) = run(ddprof(&out.0)
        .args(["--show-samples", "--"])
        .arg(&chain)
        .arg("1"));
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("notice: sample pid="))
        .collect();
    assert_eq!(lines.len() as u64, summary(&stderr)["samples"], "{stderr}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("(chain)") && l.contains("end=Complete")),
        "{lines:?}"
    );
}

/// Shares of each stack (leaf-first names joined), in percent of all samples.
fn stack_shares(stacks: &[(Vec<String>, u64)]) -> HashMap<String, f64> {
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    let mut shares = HashMap::new();
    for (frames, count) in stacks {
        *shares.entry(frames.join(";")).or_insert(0.0) +=
            *count as f64 * 100.0 / total.max(1) as f64;
    }
    shares
}

#[test]
fn bpf_and_perf_engines_agree_on_the_stack_distribution() {
    // Both engines profile the very same run of the workload (`-p`).
    let threads = build_workload("threads.c");
    let mut workload = Command::new(&threads)
        .arg("3")
        .spawn()
        .expect("the workload starts");
    let pid = workload.id().to_string();
    let outputs: Vec<(&str, Scratch)> = ["bpf", "perf"]
        .into_iter()
        .map(|e| (e, Scratch::new(&format!("diff-{e}"))))
        .collect();
    let profilers: Vec<_> = outputs
        .iter()
        .map(|(engine, out)| {
            ddprof(&out.0)
                .args(["--engine", engine, "-e", "sCPU freq=999", "-p", &pid])
                .spawn()
                .expect("ddprof starts")
        })
        .collect();
    assert!(workload.wait().unwrap().success());
    let mut shares = Vec::new();
    for ((engine, out), profiler) in outputs.iter().zip(profilers) {
        let output = profiler.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{engine}: {stderr}");
        let summary = summary(&stderr);
        assert!(summary["samples"] > 1000, "{engine}: {summary:?}");
        shares.push(stack_shares(&folded(&out.0)));
    }
    let (bpf, perf) = (&shares[0], &shares[1]);
    let top = |shares: &HashMap<String, f64>| -> Vec<String> {
        let mut stacks: Vec<(&String, &f64)> =
            shares.iter().filter(|(_, share)| **share >= 5.0).collect();
        stacks.sort_by(|a, b| b.1.total_cmp(a.1));
        stacks.into_iter().map(|(stack, _)| stack.clone()).collect()
    };
    let (bpf_top, perf_top) = (top(bpf), top(perf));
    assert!(!bpf_top.is_empty());
    let mut bpf_sorted = bpf_top.clone();
    let mut perf_sorted = perf_top.clone();
    bpf_sorted.sort();
    perf_sorted.sort();
    assert_eq!(bpf_sorted, perf_sorted, "the same top stacks");
    for stack in &bpf_top {
        let (a, b) = (bpf[stack], perf[stack]);
        assert!(
            (a - b).abs() <= 3.0,
            "{stack}: bpf {a:.1} % vs perf {b:.1} %"
        );
    }
}

#[test]
fn engine_bpf_as_nobody_with_a_pid_exits_non_zero_and_says_why() {
    let mut sleeper = KillOnDrop(ddprof_tests::as_nobody("sleep").arg("10").spawn().unwrap());
    let out = Scratch::new("nobody-bpf");
    Command::new("chmod")
        .arg("777")
        .arg(&out.0)
        .status()
        .unwrap();
    // The target must already be nobody's `sleep`, not root's setpriv on
    // its way there (which nobody may not profile at all).
    let comm = format!("/proc/{}/comm", sleeper.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&comm).map_or(true, |c| c.trim() != "sleep") {
        assert!(std::time::Instant::now() < deadline, "sleep did not start");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let output = ddprof_tests::as_nobody(ddprof_bin())
        .args(["--engine", "bpf", "--output"])
        .arg(&out.0)
        .args(["-p", &sleeper.id().to_string()])
        .output()
        .unwrap();
    sleeper.stop();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "--engine bpf never falls back:\n{stderr}"
    );
    assert!(
        stderr.contains("not permitted") && stderr.contains("CAP_BPF"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one line:\n{stderr}"
    );
}

/// The blocks of `go tool pprof -traces`: (labels, frames innermost first).
fn pprof_traces(profile: &Path) -> Vec<(HashMap<String, String>, Vec<String>)> {
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

#[test]
fn the_perf_engine_names_samples_before_an_exec_after_the_program_that_ran() {
    names_samples_before_an_exec_after_the_program_that_ran("perf");
}

#[test]
fn the_bpf_engine_names_samples_before_an_exec_after_the_program_that_ran() {
    names_samples_before_an_exec_after_the_program_that_ran("bpf");
}

/// `execer` burns 1 s under its own name, then execs `forker_child`, which
/// burns 1 s under its name, in the same process and the same period.
fn names_samples_before_an_exec_after_the_program_that_ran(engine: &str) {
    let execer = build_workload("execer.c");
    let child = build_workload("forker_child.c");
    let out = Scratch::new(&format!("exec-name-{engine}"));
    let (output, stderr) = run(ddprof(&out.0)
        .args(["--engine", engine, "-e", "sCPU freq=999", "--"])
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

#[test]
fn the_perf_engine_symbolizes_a_binary_deleted_while_it_runs() {
    symbolizes_a_binary_deleted_while_it_runs("perf");
}

#[test]
fn the_bpf_engine_symbolizes_a_binary_deleted_while_it_runs() {
    symbolizes_a_binary_deleted_while_it_runs("bpf");
}

/// As when a package upgrade removes a running service's binary: the copy
/// of `chain` is deleted 0.5 s after it started and runs 2 s more; the
/// profile is written after it exited.
fn symbolizes_a_binary_deleted_while_it_runs(engine: &str) {
    let out = Scratch::new(&format!("deleted-{engine}"));
    let binary = out.0.join("chain_deleted");
    std::fs::copy(build_workload("chain.c"), &binary).unwrap();
    let profile_dir = out.0.join("profiles");
    let profiler = ddprof(&profile_dir)
        .args(["--engine", engine, "-e", "sCPU freq=999", "--"])
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

#[test]
fn the_bpf_engine_reports_kernel_frames_with_include_kernel() {
    reports_kernel_frames_with_include_kernel("bpf");
}

#[test]
fn the_perf_engine_reports_kernel_frames_with_include_kernel() {
    reports_kernel_frames_with_include_kernel("perf");
}

/// `dd` copying /dev/zero to /dev/null spends nearly all its time in
/// read(2) and write(2): with `--include-kernel` its samples end in kernel
/// frames named from kallsyms, below dd's own user frames; without it, no
/// kernel frame is reported. Each profile says which it was.
fn reports_kernel_frames_with_include_kernel(engine: &str) {
    for include_kernel in [true, false] {
        let scratch = Scratch::new(&format!("kernel-{engine}-{include_kernel}"));
        let (output, stderr) = run(ddprof(&scratch.0)
            .args([
                "--engine",
                engine,
                "-e",
                "sCPU freq=999",
                "--include-kernel",
            ])
            .arg(include_kernel.to_string())
            .args([
                "--",
                "dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=1M",
                "count=60000",
            ]));
        assert!(output.status.success(), "{engine}: {stderr}");
        let stacks = folded(&scratch.0);
        let total: u64 = stacks.iter().map(|(_, count)| count).sum();
        assert!(total >= 300, "{engine}: {total} samples:\n{stderr}");
        let in_syscall: u64 = stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|frame| frame == "do_syscall_64"))
            .map(|(_, count)| count)
            .sum();
        if include_kernel {
            assert!(
                in_syscall * 2 >= total,
                "{engine}: {in_syscall} of {total} samples in do_syscall_64:\n{stacks:?}"
            );
            // Kernel frames are the innermost: from the system call entry
            // down every frame is a kallsyms name; the root is dd's own.
            let kernel_names = kallsyms_names();
            for (frames, _) in stacks
                .iter()
                .filter(|(frames, _)| frames.iter().any(|frame| frame == "do_syscall_64"))
            {
                let entry = frames.iter().position(|f| f == "do_syscall_64").unwrap();
                assert!(
                    frames[entry..].iter().all(|f| kernel_names.contains(f)),
                    "{engine}: a user frame below the kernel's in {frames:?}"
                );
                assert!(
                    !kernel_names.contains(&frames[0]),
                    "{engine}: no user frame at the root of {frames:?}"
                );
            }
        } else {
            assert_eq!(
                in_syscall, 0,
                "{engine}: kernel frames without --include-kernel"
            );
        }
        let profiles = pprof_files(&scratch.0);
        let comments = go_pprof(&["-comments"], &profiles[0]);
        assert!(
            comments.contains(&format!("ddprof.include_kernel={include_kernel}")),
            "{engine}: {comments}"
        );
    }
}

/// Every function name of the running kernel (root reads real ones).
fn kallsyms_names() -> std::collections::HashSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_string))
        .collect()
}
