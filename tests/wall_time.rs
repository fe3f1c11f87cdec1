//! `sWALL`: wall time, where threads wait as well as where they run,
//! against the waits each thread of `waits.c` measures with its own clock,
//! and against independent tracers of the same run, summed as `offcputime`
//! sums (bcc's `offcputime` needs kprobes, which this kernel lacks, and
//! kernel headers it cannot find): bpftrace on the `sched_switch`
//! tracepoint (each thread's time, by kernel stack), and `perf record` of
//! it with DWARF stacks (by user stack).
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ddprof_tests::guards::Scratch;
use ddprof_tests::outputs::{only_pprof, pprof_files};
use ddprof_tests::pprof::Profile;
use ddprof_tests::workloads::build_workload;
use ddprof_tests::{run_without_input as run, text};

/// One test at a time: each measures waits, which the others' CPU use
/// would lengthen (the truth too, but a busy CPU mixes run-queue waits in).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The wait function of each thread that waits, and what it waits in (the
/// kernel frame its waits fold to).
const WAITS: [(&str, &str, &str); 3] = [
    ("sleeper", "sleep_half", "nanosleep"),
    ("waiter", "wait_for_lock", "futex"),
    ("reader", "read_pipe", "pipe_read"),
];

/// What a thread of the workload measured: (wait, CPU, alive) in seconds.
fn truths(stdout: &str) -> HashMap<String, (f64, f64, f64)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("truth ")?.split_whitespace();
            let name = words.next()?.to_string();
            let mut field = |key: &str| -> Option<f64> {
                let value: f64 = words.next()?.strip_prefix(key)?.parse().ok()?;
                Some(value / 1e9)
            };
            Some((
                name,
                (field("wait_ns=")?, field("cpu_ns=")?, field("alive_ns=")?),
            ))
        })
        .collect()
}

/// One sample of the profile: its thread, its functions (innermost first),
/// how many of its innermost frames are the kernel's, its CPU time and wall
/// time (seconds).
struct WallSample {
    thread: String,
    functions: Vec<String>,
    kernel_frames: usize,
    cpu: f64,
    wall: f64,
}

fn wall_samples(profile: &Profile) -> Vec<WallSample> {
    let types = profile.sample_types();
    let column = |name: &str| {
        types
            .iter()
            .position(|(kind, unit)| kind == name && unit == "nanoseconds")
            .unwrap_or_else(|| panic!("no {name} column: {types:?}"))
    };
    let (cpu, wall) = (column("cpu-time"), column("wall-time"));
    let kernel_mapping: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|mapping| profile.string(mapping.filename) == "[kernel.kallsyms]")
        .map(|mapping| mapping.id)
        .collect();
    let locations: HashMap<u64, u64> = profile
        .location
        .iter()
        .map(|location| (location.id, location.mapping_id))
        .collect();
    profile
        .stacks()
        .into_iter()
        .zip(profile.labels())
        .zip(&profile.sample)
        .map(|(((functions, values), labels), sample)| WallSample {
            thread: labels
                .iter()
                .find(|(key, _)| key == "thread_name")
                .map(|(_, value)| value.clone())
                .unwrap_or_default(),
            functions,
            kernel_frames: sample
                .location_id
                .iter()
                .take_while(|id| kernel_mapping.contains(&locations[id]))
                .count(),
            cpu: values[cpu] as f64 / 1e9,
            wall: values[wall] as f64 / 1e9,
        })
        .collect()
}

/// Runs `waits SECONDS MODE` under ddprof with `events` (and `args`): its
/// stdout, the profiler's stderr and the profiles written.
fn run_waits(
    scratch: &Path,
    events: &str,
    args: &[&str],
    seconds: &str,
    mode: &str,
) -> (String, String, Vec<std::path::PathBuf>) {
    let waits = build_workload("waits.c");
    let out = scratch.join("out");
    let output: Output = run(ddprof_tests::ddprof_command()
        .arg("--output")
        .arg(&out)
        .args(["-l", "notice", "-e", events])
        .args(args)
        .arg("--")
        .arg(&waits)
        .args([seconds, mode]));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let mut files = pprof_files(&out);
    files.sort();
    (text(&output.stdout), stderr, files)
}

/// [`run_waits`] for 3 s, with its one profile.
fn profile_waits(
    scratch: &Path,
    events: &str,
    args: &[&str],
    mode: &str,
) -> (String, String, Profile) {
    let (stdout, stderr, files) = run_waits(scratch, events, args, "3", mode);
    assert_eq!(files.len(), 1, "{stderr}");
    let profile = Profile::read_gzipped(&files[0]).unwrap();
    (stdout, stderr, profile)
}

/// The wall time of `thread`'s samples that pass through `function`.
fn wall_in(samples: &[WallSample], thread: &str, function: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.thread == thread && s.functions.iter().any(|f| f == function))
        .map(|s| s.wall)
        .sum()
}

fn thread_wall(samples: &[WallSample], thread: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.thread == thread)
        .map(|s| s.wall)
        .sum()
}

/// A number of the wall-time line the profiler logged: `N WHAT`.
fn logged(stderr: &str, what: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|line| {
            let line = line.split("wall time: ").nth(1)?;
            let before = line.split(what).next()?;
            before.split_whitespace().last()?.parse::<u64>().ok()
        })
        .sum()
}

#[test]
fn each_threads_waits_and_wall_time_match_its_own_clocks() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-threads");
    let (stdout, stderr, profile) = profile_waits(&scratch.0, "sCPU freq=999;sWALL", &[], "all");
    let truths = truths(&stdout);
    assert_eq!(truths.len(), 5, "{stdout}");
    assert!(
        profile
            .sample_types()
            .contains(&("wall-time".into(), "nanoseconds".into())),
        "{:?}",
        profile.sample_types()
    );
    let samples = wall_samples(&profile);
    for (thread, function, reason) in WAITS {
        let (wait, _, _) = truths[thread];
        let profiled = wall_in(&samples, thread, function);
        println!("{thread}: {profiled:.3} s of wall time in {function}, {wait:.3} s measured");
        assert!(
            (profiled - wait).abs() <= 0.10 * wait,
            "{thread}: {profiled:.3} s of wall time in {function}, {wait:.3} s measured\n{stderr}"
        );
        // Its waits' stacks: one kernel frame, the wait's reason, then the
        // user stack that waited. (Off-CPU samples have no CPU time.) The
        // thread may also be preempted in the function's own code, around
        // the call (`clock_gettime` in the vDSO): a wait for a CPU, whose
        // frame says so, and a sliver of the time.
        let waits: Vec<&WallSample> = samples
            .iter()
            .filter(|s| {
                s.thread == thread && s.cpu == 0.0 && s.functions.iter().any(|f| f == function)
            })
            .collect();
        assert!(
            !waits.is_empty(),
            "{thread}: no off-CPU sample in {function}"
        );
        let preempted =
            |frame: &str| frame.contains("exit_to_user_mode") || frame.contains("irqentry");
        let mut in_reason = 0.0;
        for sample in &waits {
            assert_eq!(sample.kernel_frames, 1, "{thread}: {:?}", sample.functions);
            let frame = &sample.functions[0];
            assert!(
                frame.contains(reason) || preempted(frame),
                "{thread}: the wait's frame is {:?}, expected one about {reason}",
                sample.functions
            );
            if frame.contains(reason) {
                in_reason += sample.wall;
            }
        }
        let off_cpu: f64 = waits.iter().map(|s| s.wall).sum();
        assert!(
            in_reason >= 0.95 * off_cpu,
            "{thread}: {in_reason:.3} s of {off_cpu:.3} s off CPU in {function} about {reason}"
        );
    }
    // Every thread's wall time is its lifetime: on a CPU (CPU samples) and
    // off it (waits, and waits for a CPU).
    for (thread, (_, _, alive)) in &truths {
        let wall = thread_wall(&samples, thread);
        println!("{thread}: {wall:.3} s of wall time, alive {alive:.3} s");
        assert!(
            (wall - alive).abs() <= 0.10 * alive,
            "{thread}: {wall:.3} s of wall time, alive {alive:.3} s\n{stderr}"
        );
    }
    // The CPU-time column is the CPU samples' alone, unchanged.
    let cpu: f64 = samples.iter().map(|s| s.cpu).sum();
    let measured_cpu: f64 = truths.values().map(|(_, cpu, _)| cpu).sum();
    assert!(
        (cpu - measured_cpu).abs() <= 0.10 * measured_cpu,
        "{cpu:.3} s of CPU time profiled, {measured_cpu:.3} s measured"
    );
    // The profile says how its wall time was sampled.
    let comments = profile.comments();
    for said in [
        "ddprof.wall_time.threshold_ns=0",
        "ddprof.wall_time.max_probability=1",
        "ddprof.wall_time.stacks_per_cpu_second_at_most=1000",
    ] {
        assert!(comments.iter().any(|c| c == said), "{said}: {comments:?}");
    }
    assert!(
        comments.iter().any(|c| c
            .strip_prefix("ddprof.wall_time.stacks=")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 1000)),
        "{comments:?}"
    );
    // The per-period line counts the switches and what became of them.
    assert!(
        logged(&stderr, "switch-outs of profiled threads") > 1000,
        "{stderr}"
    );
    assert!(logged(&stderr, "waits weighed") > 1000, "{stderr}");
}

#[test]
fn a_thread_that_sleeps_half_the_time_splits_its_wall_time_in_two() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-sleeper");
    let (stdout, stderr, profile) =
        profile_waits(&scratch.0, "sCPU freq=999;sWALL", &[], "sleeper");
    let (wait, _, alive) = truths(&stdout)["sleeper"];
    let samples = wall_samples(&profile);
    let total = thread_wall(&samples, "sleeper");
    let sleeping = wall_in(&samples, "sleeper", "sleep_half") / total;
    let computing = wall_in(&samples, "sleeper", "compute_half") / total;
    let measured = wait / alive;
    println!(
        "sleeper: {:.1} % in sleep_half, {:.1} % in compute_half; measured {:.1} % asleep",
        sleeping * 100.0,
        computing * 100.0,
        measured * 100.0
    );
    // About half and half (4 ms each way; the truth says how much exactly).
    assert!(
        (measured - 0.5).abs() < 0.1,
        "measured {measured:.3}\n{stdout}"
    );
    assert!(
        (sleeping - measured).abs() <= 0.05,
        "{:.1} % of the wall time in sleep_half, {:.1} % measured\n{stderr}",
        sleeping * 100.0,
        measured * 100.0
    );
    assert!(
        (computing - (1.0 - measured)).abs() <= 0.05,
        "{:.1} % of the wall time in compute_half, {:.1} % measured",
        computing * 100.0,
        (1.0 - measured) * 100.0
    );
}

/// Runs `waits 3.5 long` with 1 s periods (and `args`): its stdout, the
/// profiler's stderr and the time in `long_sleep` of each period's profile.
fn sleep_per_period(scratch: &Path, args: &[&str]) -> (String, String, Vec<f64>) {
    let mut all = vec!["--upload-period", "1"];
    all.extend_from_slice(args);
    let (stdout, stderr, files) = run_waits(scratch, "sCPU;sWALL", &all, "3.5", "long");
    let slept = files
        .iter()
        .map(|file| {
            let profile = Profile::read_gzipped(file).unwrap();
            wall_in(&wall_samples(&profile), "long_sleeper", "long_sleep")
        })
        .collect();
    (stdout, stderr, slept)
}

#[test]
fn a_wait_across_periods_is_split_between_their_profiles() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-periods");
    let (stdout, stderr, slept) = sleep_per_period(&scratch.0, &[]);
    let (wait, _, alive) = truths(&stdout)["long_sleeper"];
    // Each period's profile holds the part of the 3.5 s sleep it saw: the
    // periods wholly inside it about 1 s each, none more than its length.
    println!("long_sleep per period: {slept:.3?}; measured {wait:.3} s, alive {alive:.3} s");
    assert!(
        slept.iter().filter(|&&s| s > 0.8).count() >= 2,
        "{slept:?}\n{stderr}"
    );
    assert!(slept.iter().all(|&s| s < 1.3), "{slept:?}\n{stderr}");
    let total: f64 = slept.iter().sum();
    assert!(
        (total - wait).abs() <= 0.05 * wait,
        "{total:.3} s of {wait:.3} s\n{stderr}"
    );
}

/// A worker that retires (`--worker-period 1`: after each period) hands
/// the waits under way to the next one, which gets their switch-ins: the
/// 3.5 s sleep is whole across the restarts, not cut at the first (before,
/// only the first period's part of it was in the profiles).
#[test]
fn a_wait_under_way_when_the_worker_restarts_is_carried_to_the_next() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-restarts");
    let (stdout, stderr, slept) = sleep_per_period(&scratch.0, &["--worker-period", "1"]);
    let restarts: u64 = stderr
        .lines()
        .filter_map(|line| line.split("worker_restarts=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no summary\n{stderr}"));
    assert!(restarts >= 2, "{restarts} restarts\n{stderr}");
    assert!(
        stderr.contains("threads off a CPU taken over from the previous worker"),
        "{stderr}"
    );
    let (wait, _, _) = truths(&stdout)["long_sleeper"];
    let total: f64 = slept.iter().sum();
    println!(
        "long_sleep per period over {restarts} worker restarts: {slept:.3?}, {total:.3} s; \
         measured {wait:.3} s"
    );
    assert!(
        (total - wait).abs() <= 0.05 * wait,
        "{total:.3} s of {wait:.3} s: {slept:?}\n{stderr}"
    );
    // Each switch-in found its stack in the worker that read it.
    let orphans = logged(&stderr, "switch-ins without their stack");
    assert_eq!(orphans, 0, "{stderr}");
}

#[test]
fn waits_drawn_with_a_probability_weigh_its_inverse() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-probability");
    let (stdout, stderr, profile) = profile_waits(
        &scratch.0,
        "sCPU freq=999;sWALL probability=0.5",
        &[],
        "all",
    );
    let truths = truths(&stdout);
    let samples = wall_samples(&profile);
    // ~1,000 reads of ~3 ms, half of them drawn: within 12 % (3.7 standard
    // deviations of the estimate).
    let (wait, _, _) = truths["reader"];
    let profiled = wall_in(&samples, "reader", "read_pipe");
    let switch_outs = logged(&stderr, "switch-outs of profiled threads") as f64;
    let stacks = logged(&stderr, "stacks taken") as f64;
    println!(
        "probability 0.5: {profiled:.3} s in read_pipe, {wait:.3} s measured; {stacks} stacks \
         of {switch_outs} switch-outs"
    );
    assert!(
        (profiled - wait).abs() <= 0.12 * wait,
        "{profiled:.3} s in read_pipe, {wait:.3} s measured\n{stderr}"
    );
    assert!(
        profile
            .comments()
            .contains(&"ddprof.wall_time.max_probability=0.5".to_string()),
        "{:?}",
        profile.comments()
    );
    assert!(
        (0.4..=0.6).contains(&(stacks / switch_outs)),
        "{stacks} stacks of {switch_outs} switch-outs\n{stderr}"
    );
}

#[test]
fn waits_under_the_threshold_are_left_out_and_counted() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-threshold");
    // Every wait of the five threads is 1-8 ms; the main thread's, in
    // pthread_join, lasts the whole run.
    let (_, stderr, profile) =
        profile_waits(&scratch.0, "sCPU;sWALL threshold=50000000", &[], "all");
    let samples = wall_samples(&profile);
    let off_cpu = |named: &dyn Fn(&str) -> bool| -> f64 {
        samples
            .iter()
            .filter(|s| named(&s.thread))
            .map(|s| s.wall - s.cpu)
            .sum()
    };
    let short = off_cpu(&|thread| thread != "waits");
    let joining = off_cpu(&|thread| thread == "waits");
    println!(
        "threshold 50 ms: {short:.3} s off CPU kept of the short waits, {joining:.3} s of the \
         join; {} waits under the threshold",
        logged(&stderr, "under the threshold")
    );
    assert!(short < 0.1, "{short:.3} s off CPU kept\n{stderr}");
    assert!(joining > 2.5, "{joining:.3} s in the join\n{stderr}");
    assert!(logged(&stderr, "under the threshold") > 1000, "{stderr}");
    assert!(
        stderr.contains("waits under 50000000 ns left out"),
        "{stderr}"
    );
}

#[test]
fn include_kernel_keeps_every_kernel_frame_of_a_wait() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-kernel");
    let (_, _, profile) = profile_waits(&scratch.0, "sCPU;sWALL", &["--include-kernel"], "all");
    let samples = wall_samples(&profile);
    let reads: Vec<&WallSample> = samples
        .iter()
        .filter(|s| {
            s.thread == "reader" && s.cpu == 0.0 && s.functions.iter().any(|f| f == "read_pipe")
        })
        .collect();
    assert!(!reads.is_empty());
    for sample in reads {
        assert!(sample.kernel_frames >= 3, "{:?}", sample.functions);
        assert!(
            sample
                .functions
                .iter()
                .any(|f| f == "__schedule" || f == "schedule"),
            "{:?}",
            sample.functions
        );
    }
}

#[test]
fn the_perf_engine_says_in_one_line_that_wall_time_needs_ebpf() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-perf");
    let (stdout, stderr, profile) =
        profile_waits(&scratch.0, "sCPU;sWALL", &["--engine", "perf"], "sleeper");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("sWALL is not sampled"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(
        said[0].contains("wall time needs the eBPF engine"),
        "{stderr}"
    );
    assert!(!profile
        .sample_types()
        .iter()
        .any(|(kind, _)| kind == "wall-time"));
    assert!(truths(&stdout).contains_key("sleeper"), "{stdout}");
}

/// bpftrace's off-CPU time of the workload's threads from the
/// `sched_switch` tracepoint: from each switch-out to the next switch-in of
/// the same thread (what `offcputime` sums), per thread (`@off`) and per
/// thread and kernel stack at the switch-out (`@reason`).
const OFF_CPU_SCRIPT: &str = r#"
tracepoint:sched:sched_switch
/args->prev_comm == "sleeper" || args->prev_comm == "waiter" || args->prev_comm == "reader" ||
 args->prev_comm == "holder" || args->prev_comm == "writer"/
{
  @start[args->prev_pid] = nsecs;
  @stack[args->prev_pid] = kstack(16);
}
tracepoint:sched:sched_switch
/@start[args->next_pid]/
{
  @off[args->next_comm] = sum(nsecs - @start[args->next_pid]);
  @reason[args->next_comm, @stack[args->next_pid]] = sum(nsecs - @start[args->next_pid]);
  delete(@start[args->next_pid]);
  delete(@stack[args->next_pid]);
}
"#;

/// The reason for a wait in a kernel stack (innermost first, `name+off`
/// frames): the first frame after the scheduler's functions.
fn wait_reason(frames: &[String]) -> String {
    let scheduler = |name: &str| {
        name.starts_with("__schedule")
            || name == "schedule"
            || name.starts_with("schedule_")
            || name.starts_with("preempt_schedule")
            || name.contains("cond_resched")
    };
    let names: Vec<&str> = frames
        .iter()
        .map(|frame| frame.split('+').next().unwrap_or(frame))
        .collect();
    let first = names.iter().position(|name| scheduler(name)).unwrap_or(0);
    names[first..]
        .iter()
        .find(|name| !scheduler(name))
        .unwrap_or(&"?")
        .to_string()
}

/// bpftrace's `@reason[COMM, STACK]: NANOS` entries, by thread and reason
/// (seconds).
fn traced_reasons(lines: &[String]) -> HashMap<(String, String), f64> {
    let mut reasons = HashMap::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in lines {
        if let Some(rest) = line.strip_prefix("@reason[") {
            current = Some((rest.trim().trim_end_matches(',').to_string(), Vec::new()));
        } else if let Some((thread, frames)) = current.as_mut() {
            match line.trim().strip_prefix("]: ") {
                Some(nanos) => {
                    let reason = wait_reason(frames);
                    *reasons.entry((thread.clone(), reason)).or_insert(0.0) +=
                        nanos.parse::<f64>().unwrap_or(0.0) / 1e9;
                    current = None;
                }
                None => frames.push(line.trim().to_string()),
            }
        }
    }
    reasons
}

#[test]
fn off_cpu_time_per_thread_matches_a_tracer_of_the_same_run() {
    let _one = one_at_a_time();
    if Command::new("bpftrace").arg("--version").output().is_err() {
        panic!(
            "bpftrace is not installed: `cargo xtask test` installs it (apt-get install bpftrace)"
        );
    }
    let scratch = Scratch::new("wall-time-bpftrace");
    // bpftrace attaches tracepoints through tracefs, which a new machine
    // may not have mounted.
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let mounted = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|status| status.success());
        assert!(mounted, "cannot mount tracefs at /sys/kernel/tracing");
    }
    let mut tracer = Command::new("bpftrace")
        .args(["-e", OFF_CPU_SCRIPT])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = ddprof_tests::launcher::Lines::new(tracer.stdout.take().unwrap());
    assert!(
        lines.find("Attaching", Duration::from_secs(30)).is_some(),
        "bpftrace did not start"
    );
    std::thread::sleep(Duration::from_millis(500));
    let (_, stderr, profile) = profile_waits(&scratch.0, "sCPU freq=999;sWALL", &[], "all");
    // SAFETY: kill sends a signal to the tracer, a child of this process.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let traced: HashMap<String, f64> = lines
        .rest(Duration::from_secs(30))
        .iter()
        .filter_map(|line| {
            let rest = line.strip_prefix("@off[")?;
            let (name, value) = rest.split_once("]: ")?;
            Some((name.to_string(), value.trim().parse::<f64>().ok()? / 1e9))
        })
        .collect();
    let _ = tracer.wait();
    let reasons = traced_reasons(&lines.rest(Duration::ZERO));
    let samples = wall_samples(&profile);
    for thread in ["sleeper", "waiter", "reader", "holder", "writer"] {
        let profiled: f64 = samples
            .iter()
            .filter(|s| s.thread == thread)
            .map(|s| s.wall - s.cpu)
            .sum();
        let reference = traced[thread];
        println!("{thread}: {profiled:.3} s off CPU profiled, {reference:.3} s traced by bpftrace");
        assert!(
            (profiled - reference).abs() <= 0.10 * reference.max(0.1),
            "{thread}: {profiled:.3} s off CPU profiled, {reference:.3} s traced\n{stderr}"
        );
    }
    // The same reasons for the waits, with the same weights: each reason
    // that holds a tenth of a thread's off-CPU time per bpftrace, within
    // 10 % in the profile (its off-CPU samples' one kernel frame).
    let mut profiled_reasons: HashMap<(String, String), f64> = HashMap::new();
    for sample in samples
        .iter()
        .filter(|s| s.cpu == 0.0 && s.kernel_frames == 1)
    {
        *profiled_reasons
            .entry((sample.thread.clone(), sample.functions[0].clone()))
            .or_insert(0.0) += sample.wall;
    }
    for thread in ["sleeper", "waiter", "reader"] {
        let traced_total = traced[thread];
        let mut compared = 0;
        for ((_, reason), &seconds) in reasons.iter().filter(|((t, _), _)| t == thread) {
            if seconds < 0.1 * traced_total {
                continue;
            }
            compared += 1;
            let profiled = profiled_reasons
                .get(&(thread.to_string(), reason.clone()))
                .copied()
                .unwrap_or(0.0);
            println!("{thread}: {reason}: {profiled:.3} s profiled, {seconds:.3} s traced");
            assert!(
                (profiled - seconds).abs() <= 0.10 * seconds,
                "{thread}, {reason}: {profiled:.3} s profiled, {seconds:.3} s traced\n\
                 profiled: {profiled_reasons:?}\ntraced: {reasons:?}"
            );
        }
        assert!(compared >= 1, "{thread}: no reason traced: {reasons:?}");
    }
}

/// Off-CPU seconds by thread name and user stack (the workload's functions,
/// innermost first).
type OffCpuStacks = HashMap<(String, Vec<String>), f64>;

/// What `perf script` printed of `perf record -e sched:sched_switch` (every
/// CPU, a DWARF stack copy at each switch), read as `offcputime` sums it:
/// each thread's time from a switch-out to its next switch-in, by the
/// switch-out's user stack (the workload's own functions, innermost first),
/// for the threads named `threads`; and the names of the workload's
/// functions perf saw (not inlined).
fn perf_off_cpu_stacks(script: &str, threads: &[&str]) -> (OffCpuStacks, HashSet<String>) {
    let number = |words: &[&str], key: &str| -> Option<u32> {
        words
            .iter()
            .find_map(|word| word.strip_prefix(key)?.parse().ok())
    };
    // By thread id: its name, its switch-out's time and frames.
    let mut off: HashMap<u32, (String, u64, Vec<String>)> = HashMap::new();
    let mut stacks = OffCpuStacks::new();
    let mut names = HashSet::new();
    // The switch-out whose frames are being read.
    let mut reading: Option<u32> = None;
    for line in script.lines() {
        if line.contains(" prev_pid=") {
            reading = None;
            let words: Vec<&str> = line.split_whitespace().collect();
            let time = words.iter().find_map(|word| {
                let seconds: f64 = word.strip_suffix(':')?.parse().ok()?;
                Some((seconds * 1e9).round() as u64)
            });
            let (Some(time), Some(prev), Some(next)) = (
                time,
                number(&words, "prev_pid="),
                number(&words, "next_pid="),
            ) else {
                continue;
            };
            if let Some((name, since, frames)) = off.remove(&next) {
                *stacks.entry((name, frames)).or_insert(0.0) +=
                    time.saturating_sub(since) as f64 / 1e9;
            }
            let name = words
                .iter()
                .find_map(|word| word.strip_prefix("prev_comm="))
                .unwrap_or("");
            if threads.contains(&name) {
                off.insert(prev, (name.to_string(), time, Vec::new()));
                reading = Some(prev);
            }
        } else if let Some((_, _, frames)) = reading.and_then(|tid| off.get_mut(&tid)) {
            // `ADDRESS SYMBOL (DSO)`; an inlined frame says `(inlined)`.
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [_, symbol, .., dso] = words[..] {
                if dso.ends_with("/waits)") {
                    names.insert(symbol.to_string());
                    frames.push(symbol.to_string());
                }
            }
        }
    }
    (stacks, names)
}

/// The user stacks of the waits against `perf record` of the same run
/// (`offcputime`'s sum from perf's DWARF-unwound stacks: bcc cannot run
/// here, and bpftrace walks user stacks with frame pointers, which skip the
/// frame that called the wait's libc function): each of the waits' stacks
/// that holds a tenth of a thread's time in its wait function in perf
/// (`sleep_half` ← `sleeper`, `wait_for_lock` ← `waiter`, `read_pipe` ←
/// `reader`), within 10 % in the profile; and none the profile puts there
/// that perf does not.
#[test]
fn off_cpu_user_stacks_match_perf_record_of_the_same_run() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-perf");
    const THREADS: [&str; 3] = ["sleeper", "waiter", "reader"];
    let data = scratch.0.join("switches.data");
    let filter = THREADS
        .iter()
        .map(|name| format!("prev_comm == \"{name}\" || next_comm == \"{name}\""))
        .collect::<Vec<_>>()
        .join(" || ");
    // The workload runs with a copy of libc of its own: perf 6.1 shares one
    // object per library among the processes that map it, and in about a
    // run in five then failed to unwind through the workload's libc (its
    // stacks ended at the wait's libc function; 18 runs of 18 unwound with
    // a copy). perf starts it (started otherwise, the same happened), and
    // it waits on its stdin for ddprof to attach.
    let libraries = scratch.0.join("lib");
    std::fs::create_dir_all(&libraries).unwrap();
    std::fs::copy(
        "/lib/x86_64-linux-gnu/libc.so.6",
        libraries.join("libc.so.6"),
    )
    .unwrap();
    let waits = build_workload("waits.c");
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-a", "-e", "sched:sched_switch"])
        .args([
            "--call-graph",
            "dwarf,8192",
            "-m",
            "512",
            "--filter",
            &filter,
        ])
        .arg("-o")
        .arg(&data)
        .args(["--", "env"])
        .arg(format!("LD_LIBRARY_PATH={}", libraries.display()))
        .arg(&waits)
        .args(["3", "all", "go"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("perf: {error} (cargo xtask test installs linux-perf)"));
    let mut workload = ddprof_tests::launcher::Lines::new(perf.stdout.take().unwrap());
    let pid = workload
        .find("pid ", Duration::from_secs(30))
        .and_then(|line| line.strip_prefix("pid ")?.trim().parse::<u32>().ok())
        .expect("the workload did not start under perf");
    let out = scratch.0.join("out");
    let mut ddprof = ddprof_tests::ddprof_command()
        .arg("--output")
        .arg(&out)
        .args(["-l", "notice", "-e", "sCPU freq=999;sWALL", "-p"])
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut logs = ddprof_tests::launcher::Lines::new(ddprof.stderr.take().unwrap());
    assert!(
        logs.find("attached to", Duration::from_secs(60)).is_some(),
        "ddprof did not attach: {:?}",
        logs.rest(Duration::ZERO)
    );
    std::io::Write::write_all(&mut perf.stdin.take().unwrap(), b"g").unwrap();
    let recorded = perf.wait_with_output().unwrap();
    assert!(
        recorded.status.success(),
        "perf: {}",
        text(&recorded.stderr)
    );
    let stdout = workload.rest(Duration::from_secs(10)).join("\n");
    assert!(stdout.contains("truth reader"), "{stdout}");
    let status = ddprof.wait().unwrap();
    let stderr = logs.rest(Duration::from_secs(10)).join("\n");
    assert!(status.success(), "{stderr}");
    let profile = only_pprof(&out, &stderr);
    let script = Command::new("perf")
        .args([
            "script",
            "--ns",
            "-F",
            "comm,tid,time,trace,ip,sym,dso",
            "-i",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(script.status.success(), "{}", text(&script.stderr));
    let script = text(&script.stdout);
    let (traced, names) = perf_off_cpu_stacks(&script, &THREADS);
    assert!(
        ["sleep_half", "wait_for_lock", "read_pipe"]
            .iter()
            .all(|name| names.contains(*name)),
        "perf unwound no wait into the workload: {names:?}\n{}",
        &script[..script.len().min(3000)]
    );
    // The profile's off-CPU samples, by the same key.
    let mut profiled = OffCpuStacks::new();
    for sample in wall_samples(&profile).iter().filter(|s| s.cpu == 0.0) {
        let frames: Vec<String> = sample
            .functions
            .iter()
            .filter(|function| names.contains(*function))
            .cloned()
            .collect();
        *profiled
            .entry((sample.thread.clone(), frames))
            .or_insert(0.0) += sample.wall;
    }
    // The waits' stacks, each starting at the workload's wait function.
    // (A thread preempted in the vDSO, at the end of `clock_gettime`'s
    // system call, has no stack in perf, which does not unwind the vDSO;
    // those are compared by reason with bpftrace above.)
    for (thread, function, _) in WAITS {
        let of_the_wait = |stacks: &OffCpuStacks| {
            stacks
                .iter()
                .filter(|((name, frames), _)| {
                    name == thread && frames.first().is_some_and(|first| first == function)
                })
                .map(|((_, frames), seconds)| (frames.clone(), *seconds))
                .collect::<HashMap<Vec<String>, f64>>()
        };
        let (by_perf, by_ddprof) = (of_the_wait(&traced), of_the_wait(&profiled));
        let least = 0.1 * by_perf.values().sum::<f64>();
        let mut top: Vec<&Vec<String>> = by_perf
            .iter()
            .chain(&by_ddprof)
            .filter(|(_, seconds)| **seconds >= least)
            .map(|(frames, _)| frames)
            .collect();
        top.sort();
        top.dedup();
        assert!(
            !top.is_empty(),
            "{thread}: no stack in {function}\n{traced:?}"
        );
        for frames in top {
            let perf = by_perf.get(frames).copied().unwrap_or(0.0);
            let ddprof = by_ddprof.get(frames).copied().unwrap_or(0.0);
            println!(
                "{thread}: {}: {ddprof:.3} s profiled, {perf:.3} s by perf",
                frames.join(" <- ")
            );
            assert!(
                (ddprof - perf).abs() <= 0.10 * perf.max(ddprof),
                "{thread}, {frames:?}: {ddprof:.3} s profiled, {perf:.3} s by perf\n\
                 profiled: {profiled:?}\nperf: {traced:?}\n{stderr}"
            );
        }
    }
}

/// With `-p`, the threads already off a CPU at the attach (`waits 3 long`:
/// the main thread in `pthread_join` from the start, `long_sleeper` in a
/// 3 s `nanosleep` from 0.2 s; ddprof attaches at ~0.6 s) are parked as off
/// a CPU from then: their waits count, with their whole stacks, from the
/// attach to their end (before, neither had any: they switched out before
/// the program was there, and the main thread never switches in again
/// until its end).
#[test]
fn threads_off_a_cpu_at_the_attach_count_from_it() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-attach");
    let waits = build_workload("waits.c");
    let mut workload = Command::new(&waits)
        .args(["3", "long"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let out = scratch.0.join("out");
    let output = run(ddprof_tests::ddprof_command()
        .arg("--output")
        .arg(&out)
        .args(["-l", "notice", "-e", "sCPU;sWALL", "-p"])
        .arg(workload.id().to_string()));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let _ = workload.wait();
    assert!(
        stderr.contains("2 threads off a CPU at the start")
            && stderr.contains("2 of their stacks complete"),
        "{stderr}"
    );
    let profile = only_pprof(&out, &stderr);
    let samples = wall_samples(&profile);
    let joined = wall_in(&samples, "waits", "main");
    let slept = wall_in(&samples, "long_sleeper", "long_sleep");
    let profiled = profile.duration_nanos as f64 / 1e9;
    println!(
        "after the attach: main {joined:.3} s in pthread_join, long_sleeper {slept:.3} s in \
         long_sleep, of a {profiled:.3} s profile"
    );
    // Both waited from the attach until the sleep's end (the main thread
    // ~4 ms more, while the sleeper computed): most of the profile's time.
    assert!(
        joined > 0.75 * profiled && joined <= 1.02 * profiled,
        "{joined:.3} s of {profiled:.3} s\n{stderr}"
    );
    assert!(
        (joined - slept).abs() <= 0.05 * joined,
        "main {joined:.3} s, long_sleeper {slept:.3} s\n{stderr}"
    );
    // Whole stacks: from `_start` and from the thread's start.
    for (thread, root) in [("waits", "_start"), ("long_sleeper", "start_thread")] {
        assert!(
            samples.iter().any(|s| s.thread == thread
                && s.cpu == 0.0
                && s.wall > 0.5
                && s.functions.iter().any(|f| f == root)),
            "{thread}: no whole stack of its wait\n{stderr}"
        );
    }
}

/// The threads of `waits` start after the events are attached: their
/// copies of the per-task events (`sCS` here) run the BPF program without
/// the link's cookie that names the event. Their samples must stay `sCS`
/// samples, neither CPU time nor the end of a wait (an `sCS` sample is
/// taken in the switch itself, after the switch-out's stack).
#[test]
fn other_events_of_threads_started_later_are_theirs_not_cpu_time() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("wall-time-inherited");
    let (_, stderr, profile) =
        profile_waits(&scratch.0, "sCPU;sCS;sWALL", &["--engine", "bpf"], "all");
    let types = profile.sample_types();
    let column = |name: &str| types.iter().position(|(kind, _)| kind == name).unwrap();
    let (cpu_samples, cpu_time, switches) =
        (column("cpu-samples"), column("cpu-time"), column("sCS"));
    let stacks = profile.stacks();
    let labels = profile.labels();
    // At 99 Hz a CPU sample stands for ~10 ms: one of a switch (weight 1)
    // taken for CPU time would be a few nanoseconds.
    let tiny: Vec<&(Vec<String>, Vec<i64>)> = stacks
        .iter()
        .filter(|(_, values)| {
            values[cpu_samples] > 0 && values[cpu_time] < 100_000 * values[cpu_samples]
        })
        .collect();
    assert!(
        tiny.is_empty(),
        "CPU samples of a few ns: {:?}",
        &tiny[..tiny.len().min(3)]
    );
    // The reader switches out ~1,000 times (each write wakes it).
    let reader_switches: i64 = stacks
        .iter()
        .zip(&labels)
        .filter(|(_, labels)| labels.contains(&("thread_name".into(), "reader".into())))
        .map(|((_, values), _)| values[switches])
        .sum();
    println!("reader: {reader_switches} sCS samples");
    assert!(reader_switches > 200, "{reader_switches}\n{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("wall time: "))
        .unwrap_or_else(|| panic!("no wall time line\n{stderr}"));
    let without: u64 = line
        .split(" stacks without their switch-in")
        .next()
        .and_then(|before| before.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        without * 100 <= logged(&stderr, "waits weighed"),
        "{without} stacks ended without their switch-in: {line}"
    );
}
