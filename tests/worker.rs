//! The profiler's parent and worker processes (issue 11), with real
//! processes: a worker killed with SIGKILL is replaced and the profiles after
//! it hold the workload; restarting the worker every period loses no sample
//! (counted against the workload's own CPU time); SIGTERM to the profiler
//! flushes the open period and leaves the target running; a worker over
//! `--worker-max-rss` is replaced at the end of a period.
//!
//! The workload is `chain` (one thread busy the whole time): sampled every
//! millisecond of its CPU time (`sCPU period=1000000`), it takes one sample
//! per millisecond of CPU time that `wait4` reports for it.
use ddprof_tests::corpus::{read_pprof, FunctionNames};
use ddprof_tests::e2e::Scratch;
use ddprof_tests::guards::KillOnDrop;
use ddprof_tests::launcher::{is_running, wait_until_gone};
use ddprof_tests::outputs::{pprof_files, summary_fields};
use ddprof_tests::processes::wait_with_cpu_time;
use ddprof_tests::workloads::build_workload;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// One sample per millisecond of the workload's CPU time.
const SAMPLING: &str = "sCPU period=1000000";

/// `/proc/PID/status` field `name`.
fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .map(|value| value.trim().to_string())
}

/// The processes named `comm` whose command line holds `marker` (this
/// test's output directory: the profiler and its workers, forked without an
/// exec, keep the `ddprof` command line).
fn processes_named(comm: &str, marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == comm)
            && std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        {
            pids.push(pid);
        }
    }
    pids
}

/// Waits up to 10 s for a `ddprof-worker` of this test other than `not`,
/// whose parent is the `ddprof-profiler` of this test.
fn wait_for_worker(marker: &str, not: Option<u32>) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let parents = processes_named("ddprof-profiler", marker);
        let worker = processes_named("ddprof-worker", marker)
            .into_iter()
            .filter(|&pid| Some(pid) != not)
            .find(|&pid| {
                status_field(pid, "PPid:")
                    .and_then(|ppid| ppid.parse().ok())
                    .is_some_and(|ppid: u32| parents.contains(&ppid))
            });
        if let Some(worker) = worker {
            return worker;
        }
        assert!(
            Instant::now() < deadline,
            "no worker of the profiler {parents:?} (other than {not:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ddprof -l notice -e SAMPLING OPTIONS --output OUT -- CHAIN SECONDS`,
/// started with its stderr piped.
fn wrap_chain(options: &[&str], out: &Path, chain: &Path, seconds: u32) -> Child {
    ddprof_tests::ddprof_command()
        .args(["-l", "notice", "-e", SAMPLING])
        .args(options)
        .arg("--output")
        .arg(out)
        .arg("--")
        .arg(chain)
        .arg(seconds.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `chain SECONDS` on its own (a target for `-p`), killed when dropped.
fn start_chain(chain: &Path, seconds: u32) -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new(chain)
            .arg(seconds.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// `ddprof -l notice -e SAMPLING OPTIONS --output OUT -p PID`, its stderr
/// as given.
fn attach_to(pid: u32, options: &[&str], out: &Path, stderr: Stdio) -> Child {
    ddprof_tests::ddprof_command()
        .args(["-l", "notice", "-e", SAMPLING])
        .args(options)
        .arg("--output")
        .arg(out)
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Reads a child's stderr to its end on another thread (the detached
/// profiler shares it: the end comes when it exits).
fn read_stderr(child: &mut Child) -> std::thread::JoinHandle<String> {
    let mut pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut text = String::new();
        pipe.read_to_string(&mut text).unwrap();
        text
    })
}

/// (samples, samples in `chain_leaf_70`) of the profiles in `files`.
fn samples_of(files: &[PathBuf]) -> (u64, u64) {
    let mut names = FunctionNames::default();
    let (mut total, mut leaf) = (0, 0);
    for file in files {
        for (_, stack) in read_pprof(file, &mut names).unwrap() {
            total += stack.count;
            if stack.frames.iter().any(|f| f == "chain_leaf_70") {
                leaf += stack.count;
            }
        }
    }
    (total, leaf)
}

/// The CPU time `pid` used so far (`utime + stime` of `/proc/PID/stat`), in ms.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, fields) = stat.rsplit_once(')').unwrap();
    let ticks: u64 = fields
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|field| field.parse::<u64>().unwrap())
        .sum();
    // SAFETY: sysconf has no memory effects.
    ticks * 1000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64
}

fn modified(file: &Path) -> SystemTime {
    std::fs::metadata(file).unwrap().modified().unwrap()
}

#[test]
fn a_killed_worker_is_replaced_and_the_profiles_after_it_hold_the_workload() {
    let chain = build_workload("chain.c");
    for engine in ["bpf", "perf"] {
        let out = Scratch::new(&format!("worker-kill-{engine}"));
        let marker = out.0.to_string_lossy().into_owned();
        let mut ddprof = wrap_chain(&["--engine", engine, "-u", "1"], &out.0, &chain, 6);
        let stderr = read_stderr(&mut ddprof);
        let first = wait_for_worker(&marker, None);
        std::thread::sleep(Duration::from_millis(2500));
        let killed_at = SystemTime::now();
        let cpu_at_kill = cpu_ms(ddprof.id());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(first as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let second = wait_for_worker(&marker, Some(first));
        // ddprof exec'd into the workload: this is the target's own status.
        let target = wait_with_cpu_time(ddprof.id(), Duration::from_secs(60)).unwrap();
        let stderr = stderr.join().unwrap();
        assert!(target.status.success(), "{engine}: {:?}", target.status);
        assert!(
            stderr.contains(&format!(
                "profiler worker pid={first} was killed by signal 9 (SIGKILL)"
            )),
            "{engine}: the death is logged:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "worker started pid={second} (restart #1, cause crash: was killed by signal 9"
            )),
            "{engine}: the new worker is logged:\n{stderr}"
        );
        let after: Vec<PathBuf> = pprof_files(&out.0)
            .into_iter()
            .filter(|file| modified(file) > killed_at)
            .collect();
        let (samples, leaf) = samples_of(&after);
        let summary = summary_fields(&stderr);
        // One sample per ms of the workload's CPU time: the profiles
        // written since the kill hold (at least) the samples of the CPU
        // time it used since, less those the kernel could not deliver
        // while no worker read the buffers (counted as lost), and its
        // known function.
        let expected = (target.cpu.as_millis() as u64).saturating_sub(cpu_at_kill);
        let lost = summary["lost"];
        eprintln!(
            "{engine}: workers {first} then {second}; {} profiles after the kill: {samples} \
             samples ({leaf} in chain_leaf_70, {lost} lost in the run) for {expected} ms",
            after.len()
        );
        assert!(
            (samples + lost) * 100 >= expected * 95,
            "{engine}: {samples} samples after the kill, {expected} ms of the workload's \
             CPU time since:\n{stderr}"
        );
        assert!(leaf * 2 >= samples, "{engine}: {leaf} of {samples}");
        assert_eq!(summary["worker_restarts"], 1, "{engine}");
        assert_eq!(
            samples_of(&pprof_files(&out.0)).0,
            summary["samples"],
            "{engine}: the profiles hold the summary's samples"
        );
    }
}

/// Runs `chain SECONDS` under ddprof with `extra` options; returns (the
/// workload's CPU time by wait4, the summary, the samples of the profiles,
/// stderr).
fn profile_chain(
    engine: &str,
    seconds: u32,
    extra: &[&str],
    name: &str,
) -> (
    Duration,
    std::collections::HashMap<String, u64>,
    u64,
    String,
) {
    let chain = build_workload("chain.c");
    let out = Scratch::new(name);
    let options = [&["--engine", engine, "-u", "1"][..], extra].concat();
    let mut ddprof = wrap_chain(&options, &out.0, &chain, seconds);
    let stderr = read_stderr(&mut ddprof);
    let target = wait_with_cpu_time(ddprof.id(), Duration::from_secs(60)).unwrap();
    let stderr = stderr.join().unwrap();
    assert!(target.status.success(), "{name}: {:?}", target.status);
    let summary = summary_fields(&stderr);
    let (samples, _) = samples_of(&pprof_files(&out.0));
    (target.cpu, summary, samples, stderr)
}

#[test]
fn restarting_the_worker_every_period_loses_no_sample() {
    for engine in ["bpf", "perf"] {
        let (cpu, summary, samples, stderr) = profile_chain(
            engine,
            6,
            &["--worker-period", "1"],
            &format!("worker-every-period-{engine}"),
        );
        let restarts = stderr
            .matches("cause period: 1 upload periods done")
            .count();
        assert!(
            restarts >= 4,
            "{engine}: {restarts} restarts logged:\n{stderr}"
        );
        assert_eq!(summary["worker_restarts"], restarts as u64, "{engine}");
        // Every sample the workers delivered is in a profile.
        assert_eq!(samples, summary["samples"], "{engine}:\n{stderr}");
        // And those are what the kernel took: one per ms of CPU time, less
        // what the summary counts as lost.
        let expected = cpu.as_millis() as f64;
        let delivered = (summary["samples"] + summary["lost"]) as f64;
        eprintln!(
            "{engine}: {restarts} restarts, {samples} samples + {} lost for {expected} ms of CPU",
            summary["lost"]
        );
        assert!(
            (delivered - expected).abs() <= 0.05 * expected,
            "{engine}: {delivered} samples for {expected} ms of CPU time:\n{stderr}"
        );
        // A planned restart hands the buffers over: what was due is
        // delivered, not merely counted lost.
        assert!(
            samples as f64 >= 0.95 * expected,
            "{engine}: {samples} samples delivered ({} counted lost) for {expected} ms of CPU \
             time:\n{stderr}",
            summary["lost"]
        );

        // The same run with the default worker period counts the same.
        let (cpu_default, summary_default, samples_default, stderr_default) =
            profile_chain(engine, 6, &[], &format!("worker-default-period-{engine}"));
        assert_eq!(summary_default["worker_restarts"], 0, "{engine}");
        assert_eq!(samples_default, summary_default["samples"], "{engine}");
        let per_ms = |samples: u64, cpu: Duration| samples as f64 / cpu.as_millis() as f64;
        let (restarted, kept) = (
            per_ms(summary["samples"] + summary["lost"], cpu),
            per_ms(
                summary_default["samples"] + summary_default["lost"],
                cpu_default,
            ),
        );
        assert!(
            (restarted - kept).abs() <= 0.05 * kept,
            "{engine}: {restarted} samples per ms restarting every period, {kept} \
             without:\n{stderr_default}"
        );
    }
}

/// `--worker-max-rss 4` (the least allowed): a worker's RSS at the end of a
/// period (its code alone is ~4 MiB of ddprof's pages, then libc's, the ring
/// buffer's pages, its heap) is well over it, so every worker is replaced
/// after its first period (at most its second), for its RSS.
#[test]
fn a_worker_over_its_rss_bound_is_replaced_at_the_end_of_a_period() {
    let (cpu, summary, samples, stderr) =
        profile_chain("bpf", 6, &["--worker-max-rss", "4"], "worker-max-rss");
    let restarts = stderr.matches("cause rss: ").count();
    assert!(
        restarts >= 3,
        "{restarts} restarts for RSS logged:\n{stderr}"
    );
    assert!(stderr.contains("over --worker-max-rss 4 MiB"), "{stderr}");
    assert!(!stderr.contains("cause period:"), "{stderr}");
    assert_eq!(summary["worker_restarts"], restarts as u64);
    // No worker lived more than two periods.
    assert!(
        summary["profiles"] <= 2 * (restarts as u64 + 1),
        "{restarts} restarts for {} profiles:\n{stderr}",
        summary["profiles"]
    );
    assert_eq!(samples, summary["samples"]);
    let expected = cpu.as_millis() as f64;
    let delivered = (summary["samples"] + summary["lost"]) as f64;
    assert!(
        (delivered - expected).abs() <= 0.05 * expected,
        "{delivered} samples for {expected} ms of CPU time:\n{stderr}"
    );
}

/// SIGTERM to the profiler in the middle of its first period: the period's
/// samples are in a profile, the profiler exits 0, the target runs on.
#[test]
fn sigterm_flushes_the_open_period_and_leaves_the_target_running() {
    let chain = build_workload("chain.c");
    // -p: the profiler in the foreground.
    {
        let out = Scratch::new("worker-sigterm-pid");
        let mut target = start_chain(&chain, 6);
        let mut ddprof = attach_to(target.id(), &["-u", "60"], &out.0, Stdio::piped());
        let stderr = read_stderr(&mut ddprof);
        let marker = out.0.to_string_lossy().into_owned();
        wait_for_worker(&marker, None);
        let cpu_at_start = cpu_ms(target.id());
        std::thread::sleep(Duration::from_secs(2));
        let cpu_at_stop = cpu_ms(target.id());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(ddprof.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = ddprof.wait().unwrap();
        let stderr = stderr.join().unwrap();
        assert!(status.success(), "{status:?}\n{stderr}");
        assert!(
            is_running(target.id() as i32),
            "the target still runs after the profiler's exit"
        );
        let (samples, leaf) = samples_of(&pprof_files(&out.0));
        let expected = cpu_at_stop - cpu_at_start;
        assert!(
            expected > 200 && samples * 100 >= expected * 95,
            "{samples} samples, {expected} ms of the target's CPU time while profiled:\n{stderr}"
        );
        assert!(leaf * 2 >= samples, "{leaf} of {samples}");
        assert_eq!(samples, summary_fields(&stderr)["samples"]);
        assert!(target.0.wait().unwrap().success());
    }
    // A launched command: SIGTERM to its detached profiler.
    {
        let out = Scratch::new("worker-sigterm-daemon");
        let marker = out.0.to_string_lossy().into_owned();
        let mut ddprof = wrap_chain(&["-u", "60"], &out.0, &chain, 6);
        let stderr = read_stderr(&mut ddprof);
        wait_for_worker(&marker, None);
        let profiler = processes_named("ddprof-profiler", &marker)[0];
        let target_pid = ddprof.id();
        let cpu_at_start = cpu_ms(target_pid);
        std::thread::sleep(Duration::from_secs(2));
        let cpu_at_stop = cpu_ms(target_pid);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(profiler as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert!(
            wait_until_gone(profiler as i32, Duration::from_secs(30)),
            "the profiler exits"
        );
        assert!(is_running(target_pid as i32), "the target runs on");
        let (samples, leaf) = samples_of(&pprof_files(&out.0));
        let expected = cpu_at_stop - cpu_at_start;
        assert!(
            expected > 200 && samples * 100 >= expected * 95,
            "{samples} samples, {expected} ms of the target's CPU time while profiled"
        );
        assert!(leaf * 2 >= samples, "{leaf} of {samples}");
        assert!(processes_named("ddprof-worker", &marker).is_empty());
        let target = wait_with_cpu_time(ddprof.id(), Duration::from_secs(60)).unwrap();
        assert!(target.status.success(), "{:?}", target.status);
        let stderr = stderr.join().unwrap();
        assert_eq!(samples, summary_fields(&stderr)["samples"], "{stderr}");
    }
}

/// Workers killed one after the other, each before it delivered a period:
/// the restarts back off (0 s, 1 s, 2 s), and the run still ends with the
/// workload profiled and its status unchanged.
#[test]
fn workers_that_keep_dying_are_restarted_with_backoff() {
    let chain = build_workload("chain.c");
    let out = Scratch::new("worker-backoff");
    let marker = out.0.to_string_lossy().into_owned();
    let mut ddprof = wrap_chain(&["--engine", "perf", "-u", "60"], &out.0, &chain, 8);
    let stderr = read_stderr(&mut ddprof);
    let mut worker = wait_for_worker(&marker, None);
    let mut killed = Vec::new();
    for _ in 0..3 {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(worker as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        killed.push(worker);
        worker = wait_for_worker(&marker, Some(worker));
    }
    let target = wait_with_cpu_time(ddprof.id(), Duration::from_secs(60)).unwrap();
    let stderr = stderr.join().unwrap();
    assert!(target.status.success(), "{:?}", target.status);
    for (pid, delay) in killed.iter().zip([0, 1, 2]) {
        assert!(
            stderr.contains(&format!(
                "profiler worker pid={pid} was killed by signal 9 (SIGKILL); restarting it in \
                 {delay} s"
            )),
            "worker {pid}, {delay} s:\n{stderr}"
        );
    }
    let summary = summary_fields(&stderr);
    assert_eq!(summary["worker_restarts"], 3);
    let (samples, leaf) = samples_of(&pprof_files(&out.0));
    assert_eq!(samples, summary["samples"]);
    assert!(samples > 0 && leaf * 2 >= samples, "{leaf} of {samples}");
}

/// The descriptors of `pid` that are unwind table maps of the BPF engine
/// (array maps with `BPF_F_MMAPABLE | BPF_F_INNER_MAP`, as `fdinfo` shows
/// them).
fn table_maps_held_by(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target == Path::new("anon_inode:bpf-map"))
        })
        .filter(|fd| {
            std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .is_ok_and(|info| {
                info.lines().any(|line| line == "map_type:\t2")
                    && info.lines().any(|line| line == "map_flags:\t0x1400")
            })
        })
        .count()
}

/// Before: with `-p`, the parent loaded the target's unwind tables into the
/// kernel before it forked the first worker, and kept their descriptors
/// for its whole run: after a worker restart (which empties the slots) the
/// parent still held that kernel memory, counted nowhere. Control: the
/// worker holds table maps (the target's). ddprof: the parent none.
#[test]
fn the_parent_holds_none_of_its_workers_unwind_tables() {
    let chain = build_workload("chain.c");
    let out = Scratch::new("worker-parent-tables");
    let mut target = start_chain(&chain, 5);
    let mut ddprof = KillOnDrop(attach_to(
        target.id(),
        &["-u", "60", "--engine", "bpf"],
        &out.0,
        Stdio::null(),
    ));
    let marker = out.0.to_string_lossy().into_owned();
    let worker = wait_for_worker(&marker, None);
    let parent = ddprof.id();
    // The worker loads the tables after it is named: looked at until it
    // holds them (a slow machine takes longer), the parent each time.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut in_worker, mut in_parent) = (0, 0);
    while in_worker == 0 && in_parent == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        in_worker = table_maps_held_by(worker);
        in_parent = table_maps_held_by(parent);
    }
    in_parent = in_parent.max(table_maps_held_by(parent));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(parent as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = ddprof.0.wait();
    let _ = target.0.kill();
    assert!(
        in_worker >= 1,
        "control: the worker {worker} holds no table map"
    );
    assert_eq!(in_parent, 0, "the parent {parent} holds table maps");
}
