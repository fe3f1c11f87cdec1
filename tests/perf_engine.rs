//! The perf engine on real perf events and real workloads: process tracking
//! (comm, threads, fork, exec, mappings), loss accounting, an unprivileged
//! user, and the stacks the unwinder produces.
//!
//! Each test builds its workload, starts it (stopped before its exec, like
//! the launcher's target, unless it tests attaching to a running process),
//! opens the sampling events on its pid and polls the engine until every
//! event hangs up, i.e. the workload and its children are gone.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use ddprof::config::Cli;
use ddprof::events::parse_events;
use ddprof::events::{self, EventOptions, Scope};
use ddprof::perf::{PerfEngine, PerfEngineOptions, SampleCounters};
use ddprof::process::ProcessTable;
use ddprof::sample::{LossCounters, Sample, StackEnd};
use ddprof_tests::symbols::{contains_in_order, is_function, starts_with_frames, Symbolizer};
use ddprof_tests::workloads::{build_workload, expect_success, resume, spawn_stopped};

/// A sample and what the process table said about it when it was delivered.
struct Observed {
    sample: Sample,
    process_name: Option<String>,
    thread_name: Option<String>,
    /// Function names of the frames, innermost first (`?` when unknown).
    names: Vec<String>,
    /// Paths of the executable mappings the table had for the process.
    mapped_paths: BTreeSet<String>,
}

impl Observed {
    fn leaf(&self) -> &str {
        self.names.first().map(String::as_str).unwrap_or("?")
    }
}

struct Run {
    pid: u32,
    samples: Vec<Observed>,
    losses: LossCounters,
    counters: SampleCounters,
}

#[derive(Clone, Copy)]
struct RunOptions {
    frequency: u64,
    stack_sample_size: u32,
    engine: PerfEngineOptions,
    /// Start the workload stopped before its exec (else attach while it runs).
    stopped: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            frequency: 999,
            stack_sample_size: ddprof::config::DEFAULT_STACK_SAMPLE_SIZE,
            engine: PerfEngineOptions::default(),
            stopped: true,
        }
    }
}

/// Samples `program args` (and its children) with the perf engine until it is gone.
fn profile(program: &Path, args: &[&str], options: RunOptions) -> Run {
    let spec = parse_events(&format!("sCPU freq={}", options.frequency)).unwrap();
    let event_options = EventOptions {
        stack_sample_size: options.stack_sample_size,
        include_kernel: false,
        kernel_stacks: false,
    };
    let child = if options.stopped {
        spawn_stopped(program, args)
    } else {
        let child = std::process::Command::new(program)
            .args(args)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        // Let it get going (threads, libraries) before attaching.
        std::thread::sleep(Duration::from_millis(200));
        child
    };
    let pid = child.id();
    let events = events::open_all(&spec, Scope::Process(pid as i32), &event_options)
        .expect("open the sampling events on the workload");
    let mut engine = PerfEngine::new(events, options.engine).expect("map the ring buffers");
    if options.stopped {
        resume(&child);
    }
    let mut table = ProcessTable::new();
    let mut symbolizer = Symbolizer::new();
    let mut samples = Vec::new();
    let mut exited_at: Option<Instant> = None;
    let mut child = Some(child);
    loop {
        let outcome = engine
            .poll(
                &mut table,
                Duration::from_millis(100),
                &mut |table, sample| {
                    let process = table.get(sample.pid);
                    samples.push(Observed {
                        process_name: table.process_name(sample.pid).map(str::to_string),
                        thread_name: table
                            .thread_name(sample.pid, sample.tid)
                            .map(str::to_string),
                        names: symbolizer.frame_names(table, sample),
                        mapped_paths: process
                            .map(|p| p.mappings.iter().map(|m| m.file.path.clone()).collect())
                            .unwrap_or_default(),
                        sample: sample.clone(),
                    });
                },
            )
            .expect("poll the perf engine");
        if outcome.finished {
            break;
        }
        // The events hang up when the workload is gone; do not hang if they do not.
        if exited_at.is_none() {
            if let Some(running) = child.as_mut() {
                if running.try_wait().unwrap().is_some() {
                    exited_at = Some(Instant::now());
                }
            }
        }
        if let Some(at) = exited_at {
            assert!(
                at.elapsed() < Duration::from_secs(10),
                "the perf events did not hang up within 10 s of the workload's exit"
            );
        }
    }
    expect_success(child.take().unwrap(), &program.display().to_string());
    let processes: BTreeSet<&str> = samples
        .iter()
        .filter_map(|o: &Observed| o.process_name.as_deref())
        .collect();
    eprintln!(
        "{} {args:?}: {} samples of {} pids {processes:?}, {:?}, {:?}",
        program.file_name().unwrap().to_string_lossy(),
        samples.len(),
        samples
            .iter()
            .map(|o| o.sample.pid)
            .collect::<BTreeSet<_>>()
            .len(),
        engine.losses(),
        engine.sample_counters()
    );
    Run {
        pid,
        samples,
        losses: engine.losses(),
        counters: engine.sample_counters(),
    }
}

fn of_process<'a>(run: &'a Run, name: &'a str) -> impl Iterator<Item = &'a Observed> + 'a {
    run.samples
        .iter()
        .filter(move |o| o.process_name.as_deref() == Some(name))
}

fn fraction(part: usize, whole: usize) -> f64 {
    part as f64 / whole.max(1) as f64
}

#[test]
fn samples_carry_the_pid_comm_and_leaf_functions_in_time_order() {
    let chain = build_workload("chain.c");
    let run = profile(&chain, &["2"], RunOptions::default());
    assert!(
        run.samples.len() >= 100,
        "only {} samples in 2 s at 999 Hz",
        run.samples.len()
    );
    assert!(run.samples.iter().all(|o| o.sample.pid == run.pid));
    assert!(run.samples.iter().all(|o| o.sample.weight > 0));
    assert!(run
        .samples
        .windows(2)
        .all(|w| w[0].sample.time <= w[1].sample.time));
    // The shell before the exec may be sampled; after it, the name is the workload's.
    let chain_samples: Vec<&Observed> = of_process(&run, "chain").collect();
    assert!(
        fraction(chain_samples.len(), run.samples.len()) >= 0.9,
        "{} of {} samples are named `chain`",
        chain_samples.len(),
        run.samples.len()
    );
    // The exec dropped the shell's mappings; the workload's binary is mapped.
    assert!(chain_samples.iter().all(|o| !o
        .mapped_paths
        .iter()
        .any(|p| p.ends_with("/sh") || p.ends_with("/dash"))));
    let in_leaves = chain_samples
        .iter()
        .filter(|o| o.leaf() == "chain_leaf_70" || o.leaf() == "chain_leaf_30")
        .count();
    assert!(
        fraction(in_leaves, chain_samples.len()) >= 0.9,
        "{in_leaves} of {} samples end in the leaves; leaves seen: {:?}",
        chain_samples.len(),
        chain_samples
            .iter()
            .map(|o| o.leaf())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(run.losses.malformed, 0);
    assert_eq!(run.counters.samples, run.samples.len() as u64);
}

#[test]
fn leaves_split_the_cpu_seventy_thirty() {
    let chain = build_workload("chain.c");
    let run = profile(&chain, &["3"], RunOptions::default());
    let leaf_70 = run
        .samples
        .iter()
        .filter(|o| o.leaf() == "chain_leaf_70")
        .count();
    let leaf_30 = run
        .samples
        .iter()
        .filter(|o| o.leaf() == "chain_leaf_30")
        .count();
    assert!(
        leaf_70 + leaf_30 >= 200,
        "{leaf_70} + {leaf_30} leaf samples"
    );
    let share = fraction(leaf_70, leaf_70 + leaf_30);
    eprintln!("chain_leaf_70: {leaf_70}, chain_leaf_30: {leaf_30}");
    assert!(
        (0.65..=0.75).contains(&share),
        "chain_leaf_70 has {:.1} % of the leaf samples ({leaf_70} vs {leaf_30})",
        share * 100.0
    );
}

#[test]
fn a_running_process_is_loaded_from_proc_at_its_first_sample() {
    let chain = build_workload("chain.c");
    let run = profile(
        &chain,
        &["1.5"],
        RunOptions {
            stopped: false,
            ..RunOptions::default()
        },
    );
    assert!(
        run.samples.len() >= 50,
        "only {} samples",
        run.samples.len()
    );
    // Nothing was exec'd while the events were open: the name and the
    // mappings can only come from /proc.
    assert!(run
        .samples
        .iter()
        .all(|o| o.process_name.as_deref() == Some("chain")));
    let resolved = run
        .samples
        .iter()
        .filter(|o| o.leaf().starts_with("chain_"))
        .count();
    assert!(
        fraction(resolved, run.samples.len()) >= 0.9,
        "{resolved} of {} leaves resolved to chain functions",
        run.samples.len()
    );
}

#[test]
fn threads_are_sampled_with_their_names() {
    let threads = build_workload("threads.c");
    let run = profile(&threads, &["2"], RunOptions::default());
    let mut by_thread: BTreeMap<String, (BTreeSet<u32>, usize, usize)> = BTreeMap::new();
    for observed in of_process(&run, "threads") {
        let name = observed.thread_name.clone().unwrap_or_else(|| "?".into());
        let prefix = match name.as_str() {
            "worker-a" => "thread_a_",
            "worker-b" => "thread_b_",
            _ => "-",
        };
        let entry = by_thread.entry(name).or_default();
        entry.0.insert(observed.sample.tid);
        entry.1 += 1;
        if observed.leaf().starts_with(prefix) {
            entry.2 += 1;
        }
    }
    for worker in ["worker-a", "worker-b"] {
        let Some((tids, samples, own)) = by_thread.get(worker) else {
            panic!("no samples of thread {worker}; threads seen: {by_thread:?}");
        };
        assert_eq!(tids.len(), 1, "{worker} has several tids: {tids:?}");
        assert!(!tids.contains(&run.pid), "{worker} runs on the main thread");
        assert!(*samples >= 50, "only {samples} samples of {worker}");
        assert!(
            fraction(*own, *samples) >= 0.9,
            "{own} of {samples} samples of {worker} are in its own functions"
        );
    }
}

#[test]
fn forked_and_execd_children_are_tracked_with_their_own_comm_and_mappings() {
    let forker = build_workload("forker.c");
    let forker_child = build_workload("forker_child.c");
    let run = profile(
        &forker,
        &["2", forker_child.to_str().unwrap()],
        RunOptions::default(),
    );
    let children: Vec<&Observed> = of_process(&run, "forker_child").collect();
    let child_pids: BTreeSet<u32> = children.iter().map(|o| o.sample.pid).collect();
    assert!(
        child_pids.len() >= 3,
        "only {} exec'd children sampled ({} samples); processes seen: {:?}",
        child_pids.len(),
        children.len(),
        run.samples
            .iter()
            .map(|o| o.process_name.clone())
            .collect::<BTreeSet<_>>()
    );
    assert!(!child_pids.contains(&run.pid));
    let child_path = forker_child.to_str().unwrap();
    let forker_path = forker.to_str().unwrap();
    for observed in &children {
        // The exec replaced the parent's image: its mappings are the child's own.
        assert!(
            observed.mapped_paths.iter().any(|p| p == child_path),
            "child {} does not map {child_path}: {:?}",
            observed.sample.pid,
            observed.mapped_paths
        );
        assert!(
            !observed.mapped_paths.iter().any(|p| p == forker_path),
            "child {} still maps the parent's binary",
            observed.sample.pid
        );
    }
    let in_child_code = children
        .iter()
        .filter(|o| o.leaf().starts_with("forker_child_"))
        .count();
    assert!(
        fraction(in_child_code, children.len()) >= 0.8,
        "{in_child_code} of {} child samples resolve to forker_child functions",
        children.len()
    );
    let parent: Vec<&Observed> = run
        .samples
        .iter()
        .filter(|o| o.sample.pid == run.pid)
        .collect();
    assert!(parent
        .iter()
        .any(|o| o.process_name.as_deref() == Some("forker") && o.leaf() == "forker_parent_burn"));
}

#[test]
fn a_tiny_ring_buffer_at_high_frequency_loses_samples_and_says_so() {
    let chain = build_workload("chain.c");
    let run = profile(
        &chain,
        &["1"],
        RunOptions {
            frequency: 9999,
            stack_sample_size: 60000,
            engine: PerfEngineOptions {
                // Room for one 60 KB sample at a time.
                ring_buffer_bytes: 16 * 4096,
                ..PerfEngineOptions::default()
            },
            ..RunOptions::default()
        },
    );
    assert!(
        run.losses.lost > 0,
        "no loss reported with a 64 KiB buffer: {:?}, {} samples",
        run.losses,
        run.samples.len()
    );
    assert!(
        !run.samples.is_empty(),
        "the samples that fit must still arrive"
    );
    assert_eq!(run.losses.malformed, 0);
}

/// Run as `nobody` by `an_unprivileged_user_samples_its_own_child`.
#[test]
#[ignore = "helper: runs as nobody, started by an_unprivileged_user_samples_its_own_child"]
fn unprivileged_helper() {
    let program = std::env::var("DDPROF_TEST_WORKLOAD").expect("DDPROF_TEST_WORKLOAD");
    assert_ne!(nix::unistd::geteuid().as_raw(), 0, "must not run as root");
    let run = profile(Path::new(&program), &["1"], RunOptions::default());
    let named = of_process(&run, "chain").count();
    let in_leaves = of_process(&run, "chain")
        .filter(|o| o.leaf().starts_with("chain_leaf_"))
        .count();
    println!(
        "UNPRIVILEGED samples={} named={named} in_leaves={in_leaves} lost={}",
        run.samples.len(),
        run.losses.lost
    );
    assert!(named >= 50, "only {named} samples named chain");
    assert!(fraction(in_leaves, named) >= 0.9);
}

#[test]
fn an_unprivileged_user_samples_its_own_child() {
    if !nix::unistd::geteuid().is_root() {
        // Already unprivileged: the helper's body is this test.
        return unprivileged_helper();
    }
    let chain = build_workload("chain.c");
    let output = ddprof_tests::as_nobody(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unprivileged_helper",
            "--include-ignored",
            "--nocapture",
        ])
        .env("DDPROF_TEST_WORKLOAD", &chain)
        .output()
        .expect("run setpriv");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("UNPRIVILEGED samples="),
        "the helper failed as nobody: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for line in stdout.lines().filter(|l| l.starts_with("UNPRIVILEGED")) {
        println!("as nobody: {line}");
    }
}

#[test]
fn options_follow_the_command_line() {
    use clap::Parser;
    let perf_options = |args: &[&str]| -> PerfEngineOptions {
        let cli = Cli::parse_from(args);
        ddprof::config::resolve(&cli)
            .unwrap()
            .options
            .profiler
            .sampler
            .perf
    };
    let options = perf_options(&["ddprof", "--ring-buffer-kib", "64", "--", "x"]);
    assert_eq!(options.ring_buffer_bytes, 64 * 1024);
    assert_eq!(
        perf_options(&["ddprof", "--", "x"]).ring_buffer_bytes,
        ddprof::perf::DEFAULT_RING_BUFFER_BYTES
    );
    // At 999 Hz, half of 1 MiB would be ~16 ms of 32 KB samples.
    assert_eq!(
        perf_options(&["ddprof", "-e", "sCPU freq=999", "--", "x"]).ring_buffer_bytes,
        2 * ddprof::perf::DEFAULT_RING_BUFFER_BYTES
    );
}

// ---------------------------------------------------------------------------
// Stacks: these need the DWARF unwinder (the stub returns the leaf only).
// ---------------------------------------------------------------------------

/// Checks that at least 90 % of the workload's samples whose leaf is one of
/// `leaves` have the full expected stack prefix, and that 99 % of its samples
/// reached the root. Returns those samples.
fn assert_stacks(run: &Run, process: &str, leaves: &[&str], callers: &[&str]) {
    let samples: Vec<&Observed> = of_process(run, process).collect();
    assert!(samples.len() >= 50, "only {} samples", samples.len());
    let complete = samples
        .iter()
        .filter(|o| o.sample.end == StackEnd::Complete)
        .count();
    let ends: BTreeMap<String, usize> = samples.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(format!("{:?}", o.sample.end)).or_default() += 1;
        m
    });
    assert!(
        fraction(complete, samples.len()) >= 0.99,
        "{complete} of {} samples reached the root; ends: {ends:?}",
        samples.len()
    );
    let in_leaves: Vec<&&Observed> = samples
        .iter()
        .filter(|o| leaves.iter().any(|leaf| is_function(o.leaf(), leaf)))
        .collect();
    assert!(
        fraction(in_leaves.len(), samples.len()) >= 0.8,
        "{} of {} samples in {leaves:?}",
        in_leaves.len(),
        samples.len()
    );
    let full = in_leaves
        .iter()
        .filter(|o| starts_with_frames(&o.names[1..], callers))
        .count();
    let example = in_leaves
        .iter()
        .find(|o| !starts_with_frames(&o.names[1..], callers))
        .map(|o| o.names.join(" <- "));
    assert!(
        fraction(full, in_leaves.len()) >= 0.9,
        "{full} of {} leaf samples have the callers {callers:?}; e.g. {example:?}",
        in_leaves.len()
    );
}

#[test]
fn c_chain_unwinds_to_main_and_the_root() {
    let chain = build_workload("chain.c");
    let run = profile(&chain, &["2"], RunOptions::default());
    assert_stacks(
        &run,
        "chain",
        &["chain_leaf_70", "chain_leaf_30"],
        &[
            "chain_e", "chain_d", "chain_c", "chain_b", "chain_a", "main",
        ],
    );
    // A process whose code is not changing is unwound as its samples are
    // read, from their stacks in place (only its first samples, taken while
    // its exec's records were held back, are copied).
    let counters = run.counters;
    assert!(
        counters.unwound_in_place * 100 >= counters.samples * 95,
        "{counters:?}"
    );
}

#[test]
fn thread_chains_unwind_to_their_thread_functions() {
    let threads = build_workload("threads.c");
    let run = profile(&threads, &["2"], RunOptions::default());
    let a: Vec<&Observed> = of_process(&run, "threads")
        .filter(|o| o.leaf() == "thread_a_leaf")
        .collect();
    let b: Vec<&Observed> = of_process(&run, "threads")
        .filter(|o| o.leaf() == "thread_b_leaf")
        .collect();
    assert!(a.len() >= 50 && b.len() >= 50, "{} / {}", a.len(), b.len());
    let a_full = a
        .iter()
        .filter(|o| {
            starts_with_frames(
                &o.names,
                &["thread_a_leaf", "thread_a_step", "thread_a_work"],
            )
        })
        .count();
    let b_full = b
        .iter()
        .filter(|o| {
            starts_with_frames(
                &o.names,
                &[
                    "thread_b_leaf",
                    "thread_b_middle",
                    "thread_b_step",
                    "thread_b_work",
                ],
            )
        })
        .count();
    assert!(fraction(a_full, a.len()) >= 0.9, "{a_full} of {}", a.len());
    assert!(fraction(b_full, b.len()) >= 0.9, "{b_full} of {}", b.len());
    let complete = of_process(&run, "threads")
        .filter(|o| o.sample.end == StackEnd::Complete)
        .count();
    assert!(fraction(complete, of_process(&run, "threads").count()) >= 0.99);
}

#[test]
fn qsort_callback_unwinds_through_libc() {
    let qsort = build_workload("qsort.c");
    let run = profile(&qsort, &["2"], RunOptions::default());
    let samples: Vec<&Observed> = of_process(&run, "qsort").collect();
    let in_callback: Vec<&&Observed> = samples
        .iter()
        .filter(|o| o.leaf() == "compare_callback")
        .collect();
    assert!(
        fraction(in_callback.len(), samples.len()) >= 0.8,
        "{} of {} samples in compare_callback",
        in_callback.len(),
        samples.len()
    );
    let through_libc = in_callback
        .iter()
        .filter(|o| {
            contains_in_order(&o.names, &["compare_callback", "sort_many", "main"])
                // At least one frame between the callback and sort_many is libc's.
                && o.names.iter().position(|n| n == "sort_many").unwrap_or(0) >= 2
        })
        .count();
    assert!(
        fraction(through_libc, in_callback.len()) >= 0.9,
        "{through_libc} of {} callback samples unwind through qsort to main",
        in_callback.len()
    );
    let complete = samples
        .iter()
        .filter(|o| o.sample.end == StackEnd::Complete)
        .count();
    assert!(fraction(complete, samples.len()) >= 0.99);
}

#[test]
fn deep_recursion_unwinds_all_300_frames_with_32k_stacks() {
    let recursion = build_workload("recursion.c");
    let run = profile(&recursion, &["2"], RunOptions::default());
    let mut callers = vec!["recurse_deep"; 300];
    callers.extend(["recursion_driver", "main"]);
    assert_stacks(&run, "recursion", &["recursion_leaf"], &callers);
}

#[test]
fn cpp_method_chain_unwinds() {
    let chain = build_workload("chain.cpp");
    let run = profile(&chain, &["2"], RunOptions::default());
    assert_stacks(
        &run,
        "chain_cpp",
        &["leaf_burn"],
        &["stage_three", "stage_two", "stage_one", "run", "main"],
    );
}

#[test]
fn rust_release_chain_unwinds() {
    let chain = build_workload("chain.rs");
    let run = profile(&chain, &["2"], RunOptions::default());
    assert_stacks(
        &run,
        "chain_rs",
        &["rust_chain_leaf"],
        &[
            "rust_chain_inner",
            "rust_chain_middle",
            "rust_chain_outer",
            "main",
        ],
    );
}

/// `--global`: CPU-wide events see every process; the workload is started
/// after the events (fork + exec tracked), everything else already running
/// is loaded from /proc when first sampled. The events never hang up, so
/// the run ends with a flush once the workload is gone.
#[test]
fn global_scope_tracks_a_workload_among_every_process() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "CPU-wide events need root or CAP_PERFMON: run the suite as root (`cargo xtask test`)"
    );
    let chain = build_workload("chain.c");
    let spec = parse_events("sCPU freq=999").unwrap();
    let options = EventOptions {
        stack_sample_size: 8192,
        include_kernel: false,
        kernel_stacks: false,
    };
    let events = events::open_all(&spec, Scope::Global, &options).expect("open CPU-wide events");
    let mut engine = PerfEngine::new(events, PerfEngineOptions::default()).unwrap();
    let mut child = std::process::Command::new(&chain)
        .arg("1.5")
        .spawn()
        .expect("start chain");
    let child_pid = child.id();
    let mut table = ProcessTable::new();
    let mut symbolizer = Symbolizer::new();
    let (mut total, mut pids, mut of_child, mut named, mut in_chain) =
        (0usize, BTreeSet::new(), 0usize, 0usize, 0usize);
    let mut on_sample = |table: &ProcessTable, sample: &Sample| {
        total += 1;
        pids.insert(sample.pid);
        if sample.pid == child_pid {
            of_child += 1;
            if table.process_name(sample.pid) == Some("chain") {
                named += 1;
                let names = symbolizer.frame_names(table, sample);
                if names.first().is_some_and(|n| n.starts_with("chain_")) {
                    in_chain += 1;
                }
            }
        }
    };
    loop {
        let outcome = engine
            .poll(&mut table, Duration::from_millis(100), &mut on_sample)
            .unwrap();
        assert!(!outcome.finished, "CPU-wide events never hang up");
        if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    engine.flush(&mut table, &mut on_sample);
    eprintln!(
        "global: {total} samples of {} pids; chain {of_child} ({named} named, {in_chain} in chain_*); {:?}",
        pids.len(),
        engine.losses()
    );
    assert!(of_child >= 50, "only {of_child} samples of the workload");
    assert!(
        fraction(named, of_child) >= 0.9,
        "{named} of {of_child} named chain"
    );
    assert!(
        fraction(in_chain, named) >= 0.9,
        "{in_chain} of {named} resolve to chain functions"
    );
}
