//! Weeks beside a service, compressed: processes and libraries that come and
//! go for two minutes (2000 exec'd children, 200 dlopen/dlclose cycles)
//! under each engine. The profiler's processes (parent and worker) stay
//! under 64 MiB the whole time, and every child that ran 50 ms of CPU or more is in the
//! profiles with its own functions named.
//!
//! `DDPROF_CHURN_SECONDS` shortens the run for development (the counts of
//! children and cycles scale with it).
use ddprof_tests::corpus::{read_pprof, FunctionNames};
use ddprof_tests::outputs::{pprof_files, summary_fields};
use ddprof_tests::workloads::build_workload;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const RSS_BOUND_KIB: u64 = 64 * 1024;

/// The memory of every profiler process (the `ddprof-profiler` parent and
/// its `ddprof-worker`) whose command line (inherited from the `ddprof`
/// that forked it) holds `marker`, in KiB: their summed proportional set
/// size (`Pss` of `/proc/PID/smaps_rollup`), so that the pages the worker
/// shares with its parent since the fork (the ring buffers, the BPF maps,
/// the heap until written) count once, as the machine holds them.
fn profiler_rss_kib(marker: &str) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if !["ddprof-profiler", "ddprof-worker"].contains(&comm.trim()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup")) else {
            continue;
        };
        total += rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

#[test]
fn the_bpf_engine_stays_bounded_under_process_and_library_churn() {
    stays_bounded_under_churn("bpf");
}

#[test]
fn the_perf_engine_stays_bounded_under_process_and_library_churn() {
    stays_bounded_under_churn("perf");
}

fn stays_bounded_under_churn(engine: &str) {
    let seconds: u64 = std::env::var("DDPROF_CHURN_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let processes = 2000 * seconds / 120;
    let cycles = 200 * seconds / 120;
    let churn = build_workload("churn.c");
    let child = build_workload("forker_child.c");
    let plugin = build_workload("churn_plugin.c");
    let out = std::env::temp_dir().join(format!("ddprof-churn-{engine}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);

    // Both engines' tests run at once: the watcher finds this test's
    // profiler processes by the output directory on their command line.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = {
        let stop = stop.clone();
        let marker = out.to_string_lossy().into_owned();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::SeqCst) {
                peak = peak.max(profiler_rss_kib(&marker));
                std::thread::sleep(Duration::from_millis(250));
            }
            peak
        })
    };
    let mut command = ddprof_tests::ddprof_command();
    command
        .args([
            "-l",
            "notice",
            "--engine",
            engine,
            "-e",
            "sCPU freq=999",
            "-u",
            "30",
        ])
        .arg("--output")
        .arg(&out)
        .arg("--")
        .arg(&churn)
        .arg(seconds.to_string())
        .arg(&child)
        .arg(&plugin)
        .arg(processes.to_string())
        .arg(cycles.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut running = command.spawn().unwrap();
    let stderr = running.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text).unwrap();
        text
    });
    let mut child_cpu: HashMap<u32, u64> = HashMap::new();
    for line in BufReader::new(running.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let ["child", pid, micros] = fields[..] {
            child_cpu.insert(pid.parse().unwrap(), micros.parse().unwrap());
        }
    }
    let status = running.wait().unwrap();
    // stderr ends when the detached profiler, which shares it, exits.
    let stderr = stderr_reader.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    let peak_rss_kib = peak.join().unwrap();
    assert!(
        status.success(),
        "{engine}: churn failed: {status:?}\n{stderr}"
    );
    assert_eq!(
        child_cpu.len() as u64,
        processes,
        "{engine}: children reaped"
    );

    let summary = summary_fields(&stderr);
    eprintln!(
        "{engine}: {} children, summary {summary:?}, peak RSS of the profiler processes {} KiB",
        child_cpu.len(),
        peak_rss_kib
    );
    assert!(
        summary["peak_rss_kib"] < RSS_BOUND_KIB,
        "{engine}: the profiler's own peak RSS: {summary:?}"
    );
    assert!(
        peak_rss_kib > 0 && peak_rss_kib < RSS_BOUND_KIB,
        "{engine}: the profiler processes' RSS, sampled every 250 ms, peaked at \
         {peak_rss_kib} KiB"
    );

    // Every child with 50 ms of CPU or more is in the profiles, named.
    let mut names = FunctionNames::default();
    let mut named_pids: HashSet<u32> = HashSet::new();
    let mut seen_pids: HashSet<u32> = HashSet::new();
    let mut plugin_samples = 0;
    let mut total = 0;
    for file in pprof_files(&out) {
        for (pid, stack) in read_pprof(&file, &mut names).unwrap() {
            total += stack.count;
            seen_pids.insert(pid);
            if stack.frames.iter().any(|f| f == "forker_child_work") {
                named_pids.insert(pid);
            }
            if stack.frames.iter().any(|f| f == "churn_plugin_work") {
                plugin_samples += stack.count;
            }
        }
    }
    assert_eq!(
        total, summary["samples"],
        "{engine}: every sample in the profiles"
    );
    let long: Vec<u32> = child_cpu
        .iter()
        .filter(|(_, &micros)| micros >= 50_000)
        .map(|(&pid, _)| pid)
        .collect();
    assert!(
        long.len() as u64 >= processes / 20,
        "{engine}: only {} children ran 50 ms",
        long.len()
    );
    // (pid, CPU µs, whether it has samples at all).
    let missing: Vec<(u32, u64, bool)> = long
        .iter()
        .filter(|pid| !named_pids.contains(pid))
        .map(|&pid| (pid, child_cpu[&pid], seen_pids.contains(&pid)))
        .collect();
    assert!(
        missing.is_empty(),
        "{engine}: {} of {} children with ≥ 50 ms of CPU have no sample naming \
         forker_child_work (pid, CPU µs, sampled at all): {missing:?}",
        missing.len(),
        long.len()
    );
    // The plugin's 3 ms calls, 200 of them: about 600 samples at 999 Hz.
    assert!(
        plugin_samples * 2 >= cycles * 3,
        "{engine}: {plugin_samples} samples in churn_plugin_work for {cycles} cycles"
    );
    let _ = std::fs::remove_dir_all(&out);
}
