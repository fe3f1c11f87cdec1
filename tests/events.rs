//! The C++ ddprof's other events, sampled: software events and a
//! tracepoint weighed against what the kernel counted for the workload
//! (`getrusage`), each in its own sample type of one profile, with both
//! engines; and the one-line refusal of what this machine cannot sample.
use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use ddprof_tests::guards::Scratch;
use ddprof_tests::outputs::{go_pprof, pprof_files};
use ddprof_tests::pprof::Profile;
use ddprof_tests::workloads::build_workload;
use ddprof_tests::{run_without_input as run, text};

/// Runs ddprof with `args` and then `command`, writing into `out`.
fn profile(out: &Path, args: &[&str], command: &[&str]) -> (Output, String) {
    let output = run(ddprof_tests::ddprof_command()
        .arg("--output")
        .arg(out)
        .args(args)
        .arg("--")
        .args(command));
    let stderr = text(&output.stderr);
    (output, stderr)
}

/// The `key=value` numbers the `events` workload printed.
fn counted(stdout: &str) -> HashMap<String, i64> {
    stdout
        .split_whitespace()
        .filter_map(|word| word.split_once('='))
        .filter_map(|(key, value)| Some((key.to_string(), value.parse().ok()?)))
        .collect()
}

/// The sum of column `column` over the samples whose stack has `function`.
fn weight_in(profile: &Profile, column: usize, function: &str) -> i64 {
    profile
        .stacks()
        .iter()
        .filter(|(names, _)| names.iter().any(|name| name == function))
        .map(|(_, values)| values[column])
        .sum()
}

fn within_10_percent(measured: i64, expected: i64) -> bool {
    (measured - expected).abs() * 10 <= expected
}

/// `-e 'sCPU;sPF p=16 st=8192;sCS;sched:sched_switch l=switches'` on a
/// workload that faults 20,000 pages in one function and sleeps 1,000
/// times in another: one profile with five sample types; the page faults
/// under `events_touch_pages`, and the context switches (software event and
/// tracepoint) under `events_sleep_often`, each within 10 % of what
/// `getrusage` counted around those functions.
fn weighs_software_events_and_a_tracepoint(engine: &str) {
    let events = build_workload("events.c");
    let out = Scratch::new(&format!("events-weights-{engine}"));
    let (output, stderr) = profile(
        &out.0,
        &[
            "--engine",
            engine,
            "-l",
            "notice",
            "-e",
            "sCPU;sPF p=16 st=8192;sCS;sched:sched_switch l=switches",
        ],
        &[events.to_str().unwrap(), "1"],
    );
    assert!(output.status.success(), "{stderr}");
    let counts = counted(&text(&output.stdout));
    let (faults, switches) = (counts["faults"], counts["switches"]);
    // A sleep whose timer expires before its thread is switched out does
    // not switch (one of the suite's runs counted 999 for 1,000 sleeps);
    // the weights are judged against what was counted.
    assert!(faults >= 20_000 && switches >= 990, "{counts:?}");
    let files = pprof_files(&out.0);
    assert_eq!(files.len(), 1, "{stderr}");
    let pprof = Profile::read_gzipped(&files[0]).unwrap();
    let types = pprof.sample_types();
    let expected: Vec<(String, String)> = [
        ("cpu-samples", "count"),
        ("cpu-time", "nanoseconds"),
        ("sPF", "events"),
        ("sCS", "events"),
        ("switches", "events"),
    ]
    .iter()
    .map(|(kind, unit)| (kind.to_string(), unit.to_string()))
    .collect();
    assert_eq!(types, expected);
    let accounting = ddprof_tests::outputs::accounting_lines(&stderr);
    if engine == "bpf" {
        // The faults and the switches are unwound in the kernel (the
        // tracepoint, which takes no perf_event program, through the perf
        // buffers): the program's count says so. Not all: the samples of
        // the process before the maps describe it are handed to the perf
        // engine. The workload faulted first, right after its exec, and
        // how many of its faults came before the description was the
        // machine's timing: 46-79 % in the kernel here, and CI once 46 %
        // (74f6f04) against a bound of 50 %. It sleeps first now (~0.25
        // s): 95-98 % in the kernel, also beside two busy loops; with the
        // program not attached to these events, 3 of ~2,250.
        let in_kernel: i64 = stderr
            .lines()
            .find_map(|line| {
                let (before, _) = line.split_once(" samples unwound in the kernel")?;
                before.rsplit(' ').next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no count of samples unwound in the kernel\n{stderr}"));
        let due = faults / 16 + switches;
        assert!(
            in_kernel * 10 >= due * 8,
            "{in_kernel} samples unwound in the kernel of the ~{due} sPF and sCS samples\n{stderr}"
        );
    }
    let fault_weight = weight_in(&pprof, 2, "events_touch_pages");
    assert!(
        within_10_percent(fault_weight, faults),
        "{engine}: sPF weighs {fault_weight} under events_touch_pages, getrusage counted \
         {faults}\n{accounting}"
    );
    for (column, name) in [(3, "sCS"), (4, "sched:sched_switch")] {
        let switch_weight = weight_in(&pprof, column, "events_sleep_often");
        assert!(
            within_10_percent(switch_weight, switches),
            "{engine}: {name} weighs {switch_weight} under events_sleep_often, getrusage \
             counted {switches}\n{accounting}"
        );
    }
    // Each sample is of one event: its value in one column (two for CPU).
    for (names, values) in pprof.stacks() {
        let columns = values.iter().filter(|value| **value != 0).count();
        assert!(
            (1..=2).contains(&columns),
            "{names:?}: {values:?} is in several events' columns"
        );
    }
    // Labelled as the C++ ddprof labels them.
    let labels = pprof.labels();
    for label in ["sPF", "sCS", "switches"] {
        assert!(
            labels
                .iter()
                .any(|sample| sample.contains(&("tracepoint_type".into(), label.into()))),
            "no sample labelled tracepoint_type={label}"
        );
    }
    // go tool pprof shows them side by side, each by its name.
    let top = go_pprof(&["-sample_index=sPF", "-top"], &files[0]);
    assert!(top.contains("events_touch_pages"), "{top}");
    let top = go_pprof(&["-sample_index=switches", "-top"], &files[0]);
    assert!(top.contains("clock_nanosleep"), "{top}");
}

#[test]
fn weighs_software_events_and_a_tracepoint_bpf() {
    weighs_software_events_and_a_tracepoint("bpf");
}

#[test]
fn weighs_software_events_and_a_tracepoint_perf() {
    weighs_software_events_and_a_tracepoint("perf");
}

/// Whether this machine has a PMU for `hCPU` (it has none: a VM).
fn has_cpu_cycles_counter() -> bool {
    std::process::Command::new("perf")
        .args(["stat", "-x,", "-e", "cycles", "true"])
        .output()
        .map(|output| !text(&output.stderr).contains("<not supported>"))
        .unwrap_or(false)
}

/// A hardware counter on a machine without one, and a tracepoint the
/// kernel lacks: one line each naming the event and why; the command runs,
/// and the other event is sampled.
#[test]
fn events_this_machine_cannot_sample_are_one_line_each_and_the_others_run() {
    let burn = build_workload("hostile_burn.c");
    let out = Scratch::new("events-refused");
    let (output, stderr) = profile(
        &out.0,
        &["-e", "hCPU;sched:no_such_tracepoint;sCPU"],
        &[burn.to_str().unwrap(), "1"],
    );
    assert!(output.status.success(), "{stderr}");
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("is not sampled"))
        .collect();
    let tracepoint_line = "warning: event sched:no_such_tracepoint is not sampled: no tracepoint \
         sched:no_such_tracepoint in this kernel";
    assert!(
        refusals.iter().any(|line| line.contains(tracepoint_line)),
        "{stderr}"
    );
    if has_cpu_cycles_counter() {
        assert_eq!(refusals.len(), 1, "{stderr}");
    } else {
        assert_eq!(refusals.len(), 2, "{stderr}");
        assert!(
            refusals.iter().any(|line| line.contains(
                "warning: event hCPU is not sampled: this machine does not support the hCPU \
                 (CPU cycles) event"
            )),
            "{stderr}"
        );
    }
    let files = pprof_files(&out.0);
    assert_eq!(files.len(), 1, "{stderr}");
    let pprof = Profile::read_gzipped(&files[0]).unwrap();
    // Only what opened has a column.
    let types = pprof.sample_types();
    assert!(
        !types.iter().any(|(kind, _)| kind.contains("no_such")),
        "{types:?}"
    );
    if !has_cpu_cycles_counter() {
        assert!(!types.iter().any(|(kind, _)| kind == "hCPU"), "{types:?}");
    }
    let cpu = types.iter().position(|(kind, _)| kind == "cpu-samples");
    let cpu = cpu.expect("a cpu-samples column");
    let samples: i64 = pprof.stacks().iter().map(|(_, values)| values[cpu]).sum();
    assert!(
        samples >= 50,
        "{samples} CPU samples of a 1 s burn at 99 Hz\n{stderr}"
    );
}

/// Nothing this machine can sample: the command still runs, with its exit
/// status, and the reason is said.
#[test]
fn with_no_event_that_opens_the_command_runs_unprofiled() {
    let out = Scratch::new("events-none");
    let (output, stderr) = profile(
        &out.0,
        &["-e", "sched:no_such_tracepoint"],
        &["sh", "-c", "echo ran; exit 3"],
    );
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert_eq!(text(&output.stdout), "ran\n");
    assert!(
        stderr.contains("no tracepoint sched:no_such_tracepoint in this kernel"),
        "{stderr}"
    );
}

/// The byte offset of field `name` in the raw record of
/// `sched:sched_switch`, from tracefs's `format` file (tracefs mounted if
/// it is not, as ddprof would).
fn sched_switch_field_offset(name: &str) -> usize {
    let dir = Path::new("/sys/kernel/tracing");
    if !dir.join("events").is_dir() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
    }
    let format = std::fs::read_to_string(dir.join("events/sched/sched_switch/format"))
        .expect("tracefs's format of sched:sched_switch");
    let line = format
        .lines()
        .find(|line| line.contains(&format!(" {name};")))
        .unwrap_or_else(|| panic!("no field {name} in\n{format}"));
    line.split(';')
        .find_map(|part| part.trim().strip_prefix("offset:"))
        .and_then(|offset| offset.parse().ok())
        .unwrap_or_else(|| panic!("no offset in {line}"))
}

/// `sched:sched_switch o=OFFSET z=4` weighs each switch by the raw
/// record's `prev_pid`: beside the same tracepoint counted, its column is
/// the workload's pid times the switches, group by group.
#[test]
fn a_tracepoint_is_weighed_by_a_field_of_its_raw_record() {
    let events = build_workload("events.c");
    let offset = sched_switch_field_offset("prev_pid");
    let out = Scratch::new("events-raw");
    let spec = format!("sched:sched_switch;sched:sched_switch o={offset} z=4 l=prev_pid");
    // 600 samples in ~60 ms: the default 1 MiB buffer lost 35 of them in
    // CI at 04e6850 (counted and reported, as due); this test is of the
    // weighing, so its buffers hold the whole burst.
    let (output, stderr) = profile(
        &out.0,
        &["-e", &spec, "--ring-buffer-kib", "32768"],
        &[events.to_str().unwrap(), "1", "100", "300"],
    );
    assert!(output.status.success(), "{stderr}");
    let files = pprof_files(&out.0);
    assert_eq!(files.len(), 1, "{stderr}");
    let pprof = Profile::read_gzipped(&files[0]).unwrap();
    assert_eq!(
        pprof.sample_types(),
        [
            ("sched:sched_switch".to_string(), "events".to_string()),
            ("prev_pid".to_string(), "events".to_string())
        ]
    );
    let pids: Vec<i64> = pprof
        .labels()
        .iter()
        .map(|labels| {
            labels
                .iter()
                .find(|(key, _)| key == "process_id")
                .and_then(|(_, value)| value.parse().ok())
                .expect("a process_id label")
        })
        .collect();
    let (mut counted, mut weighed) = (0, 0);
    for ((names, values), pid) in pprof.stacks().iter().zip(&pids) {
        counted += values[0];
        weighed += values[1] / pid;
        assert_eq!(
            values[1] % pid,
            0,
            "{names:?}: {values:?} is not a multiple of its pid {pid}"
        );
    }
    assert!(counted >= 300, "{counted} switches of 300 sleeps\n{stderr}");
    assert!(
        within_10_percent(weighed, counted),
        "{weighed} switches weighed by prev_pid, {counted} counted\n{stderr}"
    );
}
