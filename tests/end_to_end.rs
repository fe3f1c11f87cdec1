//! ddprof as a user runs it: the real binary wraps a real workload, and the
//! files it leaves behind are read back with `go tool pprof` and parsed.
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ddprof_tests::ddprof_bin;
use ddprof_tests::e2e::{self, folded, run, Scratch};
use ddprof_tests::guards::KillOnDrop;
use ddprof_tests::launcher::Lines;
use ddprof_tests::outputs::{go_pprof, pprof_files, summary_fields as summary};
use ddprof_tests::workloads::{build_workload, resume, spawn_stopped};

/// [`ddprof`] with `--engine ENGINE`, for the shared scenarios.
fn ddprof_with_engine(engine: &str) -> impl Fn(&Path) -> Command + '_ {
    move |output| {
        let mut command = ddprof(output);
        command.args(["--engine", engine]);
        command
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

#[test]
fn the_bpf_engine_wraps_the_chain_workload_into_pprof_flamegraph_and_folded_stacks() {
    e2e::wraps_the_chain_workload(&ddprof_with_engine("bpf"), "bpf");
}

#[test]
fn the_perf_engine_wraps_the_chain_workload_into_pprof_flamegraph_and_folded_stacks() {
    e2e::wraps_the_chain_workload(&ddprof_with_engine("perf"), "perf");
}

/// ddprof writing into `output`, logging at debug level (the stores say
/// what they read), with its caches in `cache`.
fn with_debug_log_and_cache(output: &Path, cache: &Path) -> Command {
    let mut command = ddprof_tests::ddprof_command();
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .arg("--output")
        .arg(output)
        .args(["-l", "debug", "--debug-cache"])
        .arg(cache);
    command
}

/// The unwind tables a run compiles are kept in the cache directory, and a
/// later run of either engine reads them instead of compiling them; a
/// stored table that is damaged is compiled again and written anew, and
/// every run's stacks are whole.
#[test]
fn a_later_run_reads_the_unwind_tables_an_earlier_run_compiled() {
    let chain = build_workload("chain.c");
    let cache = Scratch::new("table-store");
    let profile = |engine: &str| {
        let out = Scratch::new(&format!("table-store-{engine}"));
        let (output, stderr) = run(with_debug_log_and_cache(&out.0, &cache.0)
            .args(["--engine", engine])
            .args(["-e", "sCPU freq=999", "--"])
            .arg(&chain)
            .arg("1"));
        assert!(output.status.success(), "{stderr}");
        let summary = summary(&stderr);
        assert!(summary["samples"] > 300, "{summary:?}");
        assert!(
            summary["full_stacks"] * 100 >= summary["samples"] * 99,
            "{engine}: {summary:?}"
        );
        stderr
    };
    let read_from_store = format!("unwind table of {} read from the store", chain.display());
    let stored = || -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(cache.0.join("unwind"))
            .map(|prefixes| {
                prefixes
                    .flatten()
                    .flat_map(|prefix| std::fs::read_dir(prefix.path()).into_iter().flatten())
                    .flatten()
                    .map(|file| file.path())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    };

    let first = profile("bpf");
    assert!(!first.contains("read from the store"), "{first}");
    let written = stored();
    // The workload, libc, ld.so, at least.
    assert!(written.len() >= 3, "{written:?}");

    for engine in ["perf", "bpf"] {
        let later = profile(engine);
        assert!(later.contains(&read_from_store), "{engine}:\n{later}");
        assert_eq!(stored(), written, "nothing is written again");
    }

    // One flipped byte in every stored table: each is compiled again (the
    // run's stacks still whole) and written anew for the next run.
    for path in &written {
        let mut bytes = std::fs::read(path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(path, &bytes).unwrap();
    }
    let damaged = profile("bpf");
    assert!(!damaged.contains(&read_from_store), "{damaged}");
    assert!(damaged.contains("is stale or corrupt"), "{damaged}");
    let after = profile("perf");
    assert!(after.contains(&read_from_store), "{after}");
}

/// The names a run resolves are kept in the cache directory by build id,
/// and a later run names its frames from there without parsing the files:
/// every location both runs sampled has the same function, file, line and
/// symbol. A damaged store file is resolved again, never read.
#[test]
fn a_later_run_names_frames_from_the_symbols_an_earlier_run_resolved() {
    let chain = build_workload("chain.c");
    let cache = Scratch::new("symbol-store");
    let profile = |name: &str| -> (String, HashMap<String, String>) {
        let out = Scratch::new(&format!("symbol-store-{name}"));
        let (output, stderr) = run(with_debug_log_and_cache(&out.0, &cache.0)
            .args(["-e", "sCPU freq=999", "--"])
            .arg(&chain)
            .arg("1"));
        assert!(output.status.success(), "{stderr}");
        let profiles = pprof_files(&out.0);
        assert_eq!(profiles.len(), 1, "{profiles:?}");
        // Locations `N: 0xADDR M=K name file:line s=0(system name)`, by
        // file and offset in it: the addresses a profile gives files depend
        // on the other files sampled. Mappings: `K: 0xSTART/0xLIMIT/0xOFF PATH …`.
        let raw = go_pprof(&["-raw"], &profiles[0]);
        let section = |title: &str| -> Vec<String> {
            raw.lines()
                .skip_while(|line| !line.starts_with(title))
                .skip(1)
                .take_while(|line| !line.is_empty() && !line.starts_with(char::is_alphabetic))
                .map(str::to_string)
                .collect()
        };
        let hex = |text: &str| u64::from_str_radix(text.trim_start_matches("0x"), 16).unwrap();
        let mappings: HashMap<String, (u64, u64, String)> = section("Mappings")
            .iter()
            .filter_map(|line| {
                let (id, rest) = line.trim().split_once(": ")?;
                let mut words = rest.split_whitespace();
                let bounds: Vec<u64> = words.next()?.split('/').map(hex).collect();
                let path = words.next()?.to_string();
                Some((id.to_string(), (bounds[0], bounds[2], path)))
            })
            .collect();
        assert!(!mappings.is_empty(), "{raw}");
        // A location's inlined functions follow it on lines of their own;
        // frames outside any mapping (`[unknown]`) have none to key them.
        let mut locations: HashMap<String, String> = HashMap::new();
        let mut current: Option<String> = None;
        for line in section("Locations") {
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or_default();
            if !first.ends_with(':') {
                if let Some(place) = &current {
                    let description = locations.get_mut(place).unwrap();
                    description.push_str(" | ");
                    description.push_str(line.trim());
                }
                continue;
            }
            let address = hex(words.next().unwrap_or("0x0"));
            let mapping = words.next().unwrap_or_default().trim_start_matches("M=");
            current = mappings
                .get(mapping)
                .map(|(start, offset, path)| format!("{path}+{:#x}", address - start + offset));
            if let Some(place) = &current {
                locations.insert(place.clone(), words.collect::<Vec<_>>().join(" "));
            }
        }
        (stderr, locations)
    };
    let read_from_store = format!(
        "addresses of {} read from the symbol store",
        chain.display()
    );

    let (first, resolved) = profile("first");
    assert!(!first.contains("read from the symbol store"), "{first}");
    let (later, named_from_store) = profile("later");
    assert!(later.contains(&read_from_store), "{later}");
    let common: Vec<&String> = resolved
        .keys()
        .filter(|place| named_from_store.contains_key(*place))
        .collect();
    // The call sites of the chain (and libc's), at least.
    assert!(common.len() >= 8, "{resolved:?}\n{named_from_store:?}");
    for place in common {
        assert_eq!(resolved[place], named_from_store[place], "{place}");
    }
    assert!(
        named_from_store
            .values()
            .any(|name| name.starts_with("chain_e ") && name.contains("chain.c:")),
        "{named_from_store:?}"
    );

    // One flipped byte in every stored file: the names are resolved again.
    let stored: Vec<std::path::PathBuf> = std::fs::read_dir(cache.0.join("symbols"))
        .unwrap()
        .flatten()
        // The prefix directories (not the mark of the last eviction).
        .filter(|prefix| prefix.path().is_dir())
        .flat_map(|prefix| std::fs::read_dir(prefix.path()).unwrap().flatten())
        .map(|file| file.path())
        .collect();
    assert!(stored.len() >= 2, "the workload and libc: {stored:?}");
    for path in &stored {
        let mut bytes = std::fs::read(path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(path, &bytes).unwrap();
    }
    let (damaged, resolved_again) = profile("damaged");
    assert!(!damaged.contains(&read_from_store), "{damaged}");
    assert!(damaged.contains("symbol store: "), "{damaged}");
    assert!(
        damaged
            .lines()
            .any(|line| line.contains("symbol store: ") && line.contains("is stale or corrupt")),
        "{damaged}"
    );
    assert!(
        resolved_again
            .values()
            .any(|name| name.starts_with("chain_e ") && name.contains("chain.c:")),
        "{resolved_again:?}"
    );
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
    // nobody must be able to write its profiles: its own directory (ddprof
    // refuses one that other users can write, 777 say).
    std::os::unix::fs::chown(&out.0, Some(65534), Some(65534)).unwrap();
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
fn the_bpf_engine_unwinds_and_names_the_plt_stubs_of_a_static_program() {
    unwinds_and_names_the_plt_stubs_of_a_static_program("bpf");
}

#[test]
fn the_perf_engine_unwinds_and_names_the_plt_stubs_of_a_static_program() {
    unwinds_and_names_the_plt_stubs_of_a_static_program("perf");
}

/// A static program's `.plt` holds 8-byte IFUNC stubs without CFI: before
/// they had rows, 6 % of this program's samples ended truncated in them,
/// and the stubs were named `_init` (the symbol before `.plt`).
///
/// How many samples land on a stub's one `jmp` depends on the CPU: ~5 % on
/// the Intel hosts this was written on, 0.03-0.5 % on an AMD EPYC (Zen 4)
/// host, where a run had none in 2,000 (flushing the stubs' GOT slots
/// only moved the samples into the functions). So the stubs' share is
/// asserted on Intel CPUs only; on others the stacks' completeness and
/// names still are, and the stubs' rows and names are unit-tested
/// (`unwind::plt`, `symbolize::plt`).
fn unwinds_and_names_the_plt_stubs_of_a_static_program(engine: &str) {
    let program = build_workload("strings_static.c");
    let out = Scratch::new(&format!("static-plt-{engine}"));
    let (output, stderr) = run(ddprof(&out.0)
        .args(["--engine", engine, "-e", "sCPU freq=999", "--"])
        .arg(&program)
        .arg("2"));
    assert!(output.status.success(), "{stderr}");
    let stacks = folded(&out.0);
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    let complete: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.get(1).is_some_and(|root| root == "_start"))
        .map(|(_, count)| count)
        .sum();
    let in_stub = |stub: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.last().is_some_and(|leaf| leaf == stub))
            .map(|(_, count)| count)
            .sum()
    };
    let stubs = ["memcpy@plt", "strlen@plt", "memset@plt"].map(in_stub);
    let described = stacks
        .iter()
        .map(|(frames, count)| format!("{} {count}", frames.join(";")))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(total >= 1000, "{engine}: {total} samples\n{described}");
    assert!(
        complete * 100 >= total * 99,
        "{engine}: {complete} of {total} samples reach _start\n{described}"
    );
    // ~5 % of the samples are in the stubs (on Intel), each named after
    // its IFUNC; none after `_init`.
    let intel = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|cpuinfo| cpuinfo.contains("GenuineIntel"));
    eprintln!("{engine}: samples in the stubs {stubs:?} of {total} (Intel: {intel})");
    assert!(
        !intel || stubs.iter().sum::<u64>() * 100 >= total * 2,
        "{engine}: samples in memcpy@plt, strlen@plt, memset@plt: {stubs:?} of {total}\n{described}"
    );
    assert!(
        !stacks
            .iter()
            .any(|(frames, _)| frames.iter().any(|f| f == "_init")),
        "{engine}: a frame named _init\n{described}"
    );
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
    // Both engines profile the very same run of the workload (`-p`), which
    // waits, stopped before its exec, until both have set up (events mapped
    // and enabled: `start-up: done`): each sees the whole run. (Started at
    // once, the engine whose start-up took longer
    // under the suite's load missed the start, and with it a stretch of the
    // threads' varying shares: 54 % vs 49 % once.)
    let threads = build_workload("threads.c");
    let mut workload = KillOnDrop(spawn_stopped(&threads, &["3"]));
    let pid = workload.id().to_string();
    let outputs: Vec<(&str, Scratch)> = ["bpf", "perf"]
        .into_iter()
        .map(|e| (e, Scratch::new(&format!("diff-{e}"))))
        .collect();
    let mut profilers: Vec<_> = outputs
        .iter()
        .map(|(engine, out)| {
            let mut profiler = ddprof_tests::ddprof_command()
                .args(["-l", "info", "--output"])
                .arg(&out.0)
                .args(["--engine", engine, "-e", "sCPU freq=999", "-p", &pid])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("ddprof starts");
            let stderr = Lines::new(profiler.stderr.take().unwrap());
            (KillOnDrop(profiler), stderr)
        })
        .collect();
    for ((engine, _), (_, stderr)) in outputs.iter().zip(&mut profilers) {
        assert!(
            stderr
                .find("start-up: done", Duration::from_secs(30))
                .is_some(),
            "{engine}: {:?}",
            stderr.seen
        );
    }
    resume(&workload);
    assert!(workload.wait().unwrap().success());
    let mut shares = Vec::new();
    for ((engine, out), (mut profiler, mut stderr)) in outputs.iter().zip(profilers) {
        let status = profiler.wait().unwrap();
        let stderr = stderr.rest(Duration::from_secs(30)).join("\n");
        assert!(status.success(), "{engine}: {stderr}");
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

/// `-p` on a server that starts a thread per request: 1,000 threads alive,
/// each replaced as it ends (thread_churn.c). Before: the attach listed the
/// threads again until no new one appeared, and mapped a buffer for every
/// thread on every CPU: 2,136-2,244 buffers of 1 MiB, 1.1 s (perf) and 13 s
/// (BPF) of CPU before the first sample; 3,000 threads started at once kept
/// the listing going until the process ended, unprofiled. Now the threads
/// are listed once after the main thread's events are open (it starts
/// them, and they inherit those), and up to 64 events of a CPU share one
/// buffer: 30-32 buffers, 0.1 s. Judged by the kernel's view of the
/// profiler (its `[perf_event]` mappings) and by the samples of a thread
/// that burns 1 s of its own CPU time (`CLOCK_THREAD_CPUTIME_ID`) at 99 Hz
/// once the profiler is up: ~99, where a thread opened twice would count
/// twice (~198). Under contention, samples by timer credit the busy thread
/// more or less than its CPU time: alone 96-104 in 30 runs, beside another
/// thread_churn 94-119, in suite runs 117, 118 and 124, and 81 in one CI
/// run (145 samples for the process's 1,329 ms, the profiler's loop waiting
/// 315 ms for a CPU). One way to lose some: a per-CPU timer due while the
/// host has descheduled the virtual CPU takes one sample when it runs
/// again, not one per period missed. The bound, 60-150, is what the test exists for: a thread left
/// unprofiled (0) or opened twice (~198), and the failure names the
/// machine's steal and idle time during the burn. (At 999 Hz, the suite's run at 581561b lost 567 samples in full
/// buffers while the loop waited 214 ms for a CPU beside the other engine's
/// run: 2 MiB of 32 KB stack copies hold ~60 ms at that rate; at 99 Hz
/// 1 MiB holds ~330 ms.) With `descriptor_limit` (`prlimit --nofile`), the threads whose
/// events would pass it are left out with one warning, and the rest are
/// profiled (before: `perf_event_open failed: Too many open files`, exit
/// 1, nothing profiled).
fn attaches_to_a_thread_per_request_server(engine: &str, descriptor_limit: Option<u32>) {
    use std::io::Write;
    let binary = build_workload("thread_churn.c");
    let mut workload = KillOnDrop(
        Command::new(&binary)
            .args(["1000", "1000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("thread_churn starts"),
    );
    let mut stdout = Lines::new(workload.0.stdout.take().unwrap());
    assert!(
        stdout.find("ready", Duration::from_secs(30)).is_some(),
        "thread_churn never had its 1,000 threads"
    );
    let out = Scratch::new(&format!("churn-attach-{engine}-{descriptor_limit:?}"));
    let mut command = match descriptor_limit {
        Some(limit) => {
            let mut prlimit = Command::new("prlimit");
            prlimit
                .arg(format!("--nofile={limit}:{limit}"))
                .arg(ddprof_bin());
            prlimit
        }
        None => ddprof_tests::ddprof_command(),
    };
    let mut profiler = KillOnDrop(
        command
            .args(["-l", "info", "--output"])
            .arg(&out.0)
            .args(["--engine", engine, "-e", "sCPU freq=99", "-p"])
            .arg(workload.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ddprof starts"),
    );
    let mut stderr = Lines::new(profiler.0.stderr.take().unwrap());
    assert!(
        stderr
            .find("start-up: done", Duration::from_secs(30))
            .is_some(),
        "{engine}: the attach did not finish while threads came and went: {:?}",
        stderr.seen
    );
    // Each perf buffer the profiler maps is a `[perf_event]` mapping.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", profiler.id())).unwrap();
    let buffers = maps
        .lines()
        .filter(|line| line.contains("[perf_event]"))
        .count();
    let cpus = std::thread::available_parallelism().unwrap().get();
    // ceil(1,001 / 64) = 16 per CPU, and the BPF engine's one per CPU.
    assert!(
        buffers <= cpus * 17,
        "{engine}: {buffers} perf buffers mapped for 1,000 threads on {cpus} CPUs"
    );
    let machine_before = machine_times();
    let mut go = workload.0.stdin.take().unwrap();
    go.write_all(b"go\n").unwrap();
    drop(go);
    assert!(workload.0.wait().unwrap().success());
    let machine_during = machine_times().since(&machine_before);
    let status = profiler.0.wait().unwrap();
    let log = [stderr.seen.clone(), stderr.rest(Duration::from_secs(30))]
        .concat()
        .join("\n");
    assert!(status.success(), "{engine}: {log}");
    let left_out = log
        .lines()
        .find(|line| line.contains("threads of process") && line.contains("are not profiled"));
    match descriptor_limit {
        Some(limit) => assert!(
            left_out.is_some_and(
                |line| line.contains(&format!("descriptor limit (ulimit -n, {limit})"))
            ),
            "{engine}: no warning of the threads left out under {limit} descriptors:\n{log}"
        ),
        None => assert!(left_out.is_none(), "{engine}: {left_out:?}"),
    }
    let stacks = folded(&out.0);
    let busy: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|frame| frame == "thread_churn_busy"))
        .map(|(_, count)| count)
        .sum();
    let complete: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames
                .windows(2)
                .any(|pair| pair[0] == "thread_churn_burner" && pair[1] == "thread_churn_busy")
        })
        .map(|(_, count)| count)
        .sum();
    assert!(
        (60..=150).contains(&busy),
        "{engine}: {busy} samples in thread_churn_busy for 1 s of its thread's CPU at 99 Hz \
         (the machine during the burn: {machine_during}):\n{log}"
    );
    assert!(
        complete * 100 >= busy * 95,
        "{engine}: {complete} of {busy} under their caller"
    );
}

/// The machine's CPU time by kind, from the first line of `/proc/stat`, in
/// clock ticks.
struct MachineTimes {
    busy: u64,
    idle: u64,
    steal: u64,
}

impl MachineTimes {
    fn since(&self, earlier: &MachineTimes) -> MachineTimes {
        MachineTimes {
            busy: self.busy.saturating_sub(earlier.busy),
            idle: self.idle.saturating_sub(earlier.idle),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }
}

impl std::fmt::Display for MachineTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ticks busy, {} idle, {} stolen by the host",
            self.busy, self.idle, self.steal
        )
    }
}

fn machine_times() -> MachineTimes {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat is readable");
    // cpu user nice system idle iowait irq softirq steal ...
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    let field = |index: usize| fields.get(index).copied().unwrap_or(0);
    MachineTimes {
        busy: field(0) + field(1) + field(2) + field(5) + field(6),
        idle: field(3) + field(4),
        steal: field(7),
    }
}

#[test]
fn the_bpf_engine_attaches_to_a_thread_per_request_server() {
    attaches_to_a_thread_per_request_server("bpf", None);
}

#[test]
fn the_perf_engine_attaches_to_a_thread_per_request_server() {
    attaches_to_a_thread_per_request_server("perf", None);
}

/// 1,200 descriptors: room for ~230 of the 1,000 threads' events (an event
/// per CPU, and the sampler's duplicate of each) on 2 CPUs; the burner,
/// started first, is among them.
#[test]
fn the_bpf_engine_attaches_within_the_descriptor_limit() {
    attaches_to_a_thread_per_request_server("bpf", Some(1200));
}

#[test]
fn the_perf_engine_attaches_within_the_descriptor_limit() {
    attaches_to_a_thread_per_request_server("perf", Some(1200));
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

#[test]
fn the_perf_engine_names_samples_before_an_exec_after_the_program_that_ran() {
    e2e::names_samples_before_an_exec_after_the_program_that_ran(
        &ddprof_with_engine("perf"),
        "perf",
    );
}

#[test]
fn the_bpf_engine_names_samples_before_an_exec_after_the_program_that_ran() {
    e2e::names_samples_before_an_exec_after_the_program_that_ran(&ddprof_with_engine("bpf"), "bpf");
}

#[test]
fn the_perf_engine_symbolizes_a_binary_deleted_while_it_runs() {
    e2e::symbolizes_a_binary_deleted_while_it_runs(&ddprof_with_engine("perf"), "perf");
}

#[test]
fn the_bpf_engine_symbolizes_a_binary_deleted_while_it_runs() {
    e2e::symbolizes_a_binary_deleted_while_it_runs(&ddprof_with_engine("bpf"), "bpf");
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
                // A BPF program's JIT'd code (`bpf_prog_TAG_NAME`) is in
                // kallsyms only while it is loaded: ddprof's own was
                // sampled once (CI at 352cecb), and is gone by now.
                assert!(
                    frames[entry..]
                        .iter()
                        .all(|f| kernel_names.contains(f) || f.starts_with("bpf_prog_")),
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
