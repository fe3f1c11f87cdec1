//! The eBPF engine on this kernel: the real program loaded and attached to
//! task-clock events of real processes, whose stacks (built without frame
//! pointers) are unwound in the kernel with the DWARF rows the engine loads.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ddprof::bpf::EngineChoice;
use ddprof::bpf::{
    choose_engine, BpfEngine, BpfEngineOptions, BpfError, BpfProgram, Engine, MapSizes,
};
use ddprof::events::parse_events;
use ddprof::events::{self, EventOptions, Scope};
use ddprof::process::ProcessTable;
use ddprof::sample::{Sample, StackEnd};
use ddprof_common::sample::{BpfCounter, MAX_USER_FRAMES};
use ddprof_tests::guards::{monotonic_nanos, KillOnDrop};
use object::{Object, ObjectSegment, ObjectSymbol};

/// Builds `tests/workloads/bpf_stacks.c` without frame pointers (once: the
/// tests run in parallel threads).
fn workload_binary() -> PathBuf {
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINARY
        .get_or_init(|| ddprof_tests::workloads::build_workload("bpf_stacks.c"))
        .clone()
}

/// Starts the workload and waits until it runs its own code.
fn start_workload(binary: &Path, mode: &str, seconds: f64) -> KillOnDrop {
    let mut child = Command::new(binary)
        .args([mode, &seconds.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("workload starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    KillOnDrop(child)
}

/// Function names of an ELF file's symbol table, by ELF virtual address.
struct Symbols {
    path: String,
    functions: Vec<(u64, u64, String)>,
    /// `(p_offset, p_vaddr, p_filesz)` of the loadable segments.
    segments: Vec<(u64, u64, u64)>,
}

impl Symbols {
    fn read(path: &Path) -> Symbols {
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let mut functions: Vec<(u64, u64, String)> = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .map(|s| (s.address(), s.size(), s.name().unwrap_or("").to_string()))
            .collect();
        functions.sort();
        let segments = file
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, s.address(), size)
            })
            .collect();
        Symbols {
            path: path.to_string_lossy().into_owned(),
            functions,
            segments,
        }
    }

    fn name_at(&self, vaddr: u64) -> Option<&str> {
        let index = self.functions.partition_point(|f| f.0 <= vaddr);
        let (start, size, name) = self.functions.get(index.checked_sub(1)?)?;
        (vaddr < start + size).then_some(name.as_str())
    }

    /// The names of a sample's frames: functions of this file by name, other
    /// files as `[file name]`, unmapped PCs as `?`.
    fn names(&self, processes: &ProcessTable, sample: &Sample) -> Vec<String> {
        sample
            .frames
            .iter()
            .enumerate()
            .map(|(i, &pc)| {
                let lookup = if i == 0 { pc } else { pc - 1 };
                let Some(mapping) = processes.find_mapping(sample.pid, lookup) else {
                    return "?".to_string();
                };
                if mapping.file.path != self.path {
                    let base = mapping.file.path.rsplit('/').next().unwrap_or("");
                    return format!("[{base}]");
                }
                let offset = mapping.file_offset_of(lookup);
                self.segments
                    .iter()
                    .find(|(start, _, size)| offset >= *start && offset < start + size)
                    .and_then(|(start, vaddr, _)| self.name_at(offset - start + vaddr))
                    .unwrap_or("?")
                    .to_string()
            })
            .collect()
    }
}

struct Profile {
    samples: Vec<Sample>,
    processes: ProcessTable,
    engine: BpfEngine,
}

/// Samples wanted per profile. The machine's CPUs are shared, so a profile
/// runs until it has them (or `PROFILE_TIMEOUT`), not for a fixed time.
const WANTED_SAMPLES: usize = 400;
const PROFILE_TIMEOUT: Duration = Duration::from_secs(15);

/// Samples `pid` with the BPF engine.
fn profile(pid: u32) -> Profile {
    profile_with(pid, false)
}

/// Samples `pid`, also in the kernel when `include_kernel`.
fn profile_with(pid: u32, include_kernel: bool) -> Profile {
    let specs = parse_events("sCPU freq=499").unwrap();
    let options = EventOptions {
        stack_sample_size: 8,
        include_kernel,
        // The program's bpf_get_stack reads the kernel call chain the event
        // samples: it must ask for one.
        kernel_stacks: include_kernel,
    };
    let fds = events::open_all(&specs, Scope::Process(pid as i32), &options)
        .expect("root opens task-clock events on its child");
    let mut processes = ProcessTable::new();
    processes
        .load_from_proc(pid)
        .expect("the workload is alive");
    let mut engine = BpfEngine::new(
        fds,
        BpfEngineOptions {
            workload_pids: vec![pid],
            kernel_stacks: true,
            ..BpfEngineOptions::default()
        },
    )
    .expect("the BPF engine starts");
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < PROFILE_TIMEOUT && samples.len() < WANTED_SAMPLES {
        let outcome = engine
            .poll(
                &mut processes,
                Duration::from_millis(100),
                &mut |_, sample| {
                    samples.push(sample);
                },
            )
            .expect("poll works");
        if outcome.finished {
            break;
        }
    }
    Profile {
        samples,
        processes,
        engine,
    }
}

fn report(profile: &Profile, label: &str) {
    let mut ends = std::collections::BTreeMap::new();
    for sample in &profile.samples {
        *ends.entry(format!("{:?}", sample.end)).or_insert(0) += 1;
    }
    let depths: Vec<usize> = profile
        .samples
        .iter()
        .take(5)
        .map(|s| s.frames.len())
        .collect();
    eprintln!("{label}: stack ends {ends:?}, first depths {depths:?}");
    // Known when `kernel.bpf_stats_enabled` is 1 (nothing asserts on time).
    if let Some((time, runs)) = profile.engine.program().run_stats() {
        if runs > 0 {
            eprintln!(
                "{label}: the BPF program ran {runs} times, {:?} per sample on average",
                time / runs as u32
            );
        }
    }
    let stats = profile.engine.program().stats();
    eprintln!(
        "{label}: {} samples; program {} insns, {} verified, loaded in {:?}; {}; tables {:?}; counters: {}",
        profile.samples.len(),
        stats.instructions.unwrap_or(0),
        stats.verified_instructions.unwrap_or(0),
        stats.load_time,
        profile.engine.memory(),
        profile.engine.table_stats(),
        profile.engine.counters().unwrap(),
    );
}

#[test]
fn program_passes_the_verifier() {
    let program = BpfProgram::load(MapSizes::minimal(), true).expect("verifier accepts");
    let stats = program.stats();
    eprintln!("verifier: {stats:?}");
    assert!(stats.instructions.unwrap_or(0) > 100);
    assert!(stats.verified_instructions.unwrap_or(0) > 0);
}

#[test]
fn chain_without_frame_pointers_unwinds_to_main() {
    let binary = workload_binary();
    let symbols = Symbols::read(&binary);
    let child = start_workload(&binary, "chain", 60.0);
    let pid = child.0.id();
    let profile = profile(pid);
    drop(child);
    report(&profile, "chain");

    let ours: Vec<&Sample> = profile.samples.iter().filter(|s| s.pid == pid).collect();
    assert!(ours.len() >= 200, "only {} samples", ours.len());
    assert_eq!(
        ours.len(),
        profile.samples.len(),
        "samples of other processes"
    );
    let mut complete_with_main = 0;
    let mut leaf_samples = 0;
    for sample in &ours {
        let names = symbols.names(&profile.processes, sample);
        if sample.end == StackEnd::Complete && names.iter().any(|n| n == "main") {
            complete_with_main += 1;
        }
        if names.first().map(String::as_str) == Some("chain_leaf") {
            leaf_samples += 1;
            assert_eq!(
                names[..4],
                ["chain_leaf", "chain_middle", "chain_outer", "main"],
                "frames {names:?} ({:?})",
                sample.end
            );
            // Below main: libc's start code, then the end of the stack.
            assert!(
                names[4..]
                    .iter()
                    .all(|n| n.starts_with('[') || n == "_start"),
                "{names:?}"
            );
        }
    }
    assert!(
        leaf_samples * 10 >= ours.len() * 8,
        "{leaf_samples} of {} in the leaf",
        ours.len()
    );
    assert!(
        complete_with_main * 100 >= ours.len() * 99,
        "{complete_with_main} of {} samples reached main and the root",
        ours.len()
    );
    let counters = profile.engine.counters().unwrap();
    assert_eq!(counters.get(BpfCounter::HandedToPerf), 0);
    assert_eq!(profile.engine.losses().lost, 0);
    // libc and the workload have tables in the row map.
    assert!(profile.engine.table_stats().files_loaded >= 2);
}

#[test]
fn recursion_300_deep_reaches_main() {
    let binary = workload_binary();
    let symbols = Symbols::read(&binary);
    let child = start_workload(&binary, "recurse", 60.0);
    let pid = child.0.id();
    let profile = profile(pid);
    drop(child);
    report(&profile, "recurse");

    assert!(
        profile.samples.len() >= 200,
        "only {} samples",
        profile.samples.len()
    );
    let mut complete_with_main = 0;
    let mut deepest = 0;
    for sample in &profile.samples {
        let names = symbols.names(&profile.processes, sample);
        let main_at = names.iter().position(|n| n == "main");
        if sample.end == StackEnd::Complete && main_at.is_some() {
            complete_with_main += 1;
        }
        if names.first().map(String::as_str) == Some("chain_leaf") {
            let recursions = names.iter().filter(|n| *n == "recurse").count();
            assert_eq!(
                recursions,
                301,
                "{:?} frames: {:?}",
                sample.end,
                &names[..8]
            );
            assert_eq!(main_at, Some(302), "{names:?}");
            deepest = deepest.max(sample.frames.len());
        }
        assert!(sample.frames.len() <= MAX_USER_FRAMES);
    }
    assert!(deepest >= 303, "no sample in the leaf (deepest {deepest})");
    assert!(
        complete_with_main * 100 >= profile.samples.len() * 99,
        "{complete_with_main} of {} samples reached main and the root",
        profile.samples.len()
    );
    assert_eq!(
        profile
            .engine
            .counters()
            .unwrap()
            .get(BpfCounter::DepthLimit),
        0
    );
}

#[test]
fn samples_in_the_kernel_unwind_the_user_stack_from_the_saved_registers() {
    let binary = workload_binary();
    let symbols = Symbols::read(&binary);
    let child = start_workload(&binary, "syscall", 60.0);
    let pid = child.0.id();
    let profile = profile_with(pid, true);
    drop(child);
    report(&profile, "syscall");

    let in_kernel: Vec<&Sample> = profile
        .samples
        .iter()
        .filter(|s| !s.kernel_frames.is_empty())
        .collect();
    assert!(
        in_kernel.len() * 2 >= profile.samples.len() && !in_kernel.is_empty(),
        "{} of {} samples in the kernel",
        in_kernel.len(),
        profile.samples.len()
    );
    let mut reached_main = 0;
    for sample in &in_kernel {
        assert!(sample
            .kernel_frames
            .iter()
            .all(|&pc| pc >= 0xffff_8000_0000_0000));
        let names = symbols.names(&profile.processes, sample);
        // The user stack starts at the system call in libc's read().
        if let Some(leaf) = names.iter().position(|n| n == "read_leaf") {
            assert!(
                names[..leaf].iter().all(|n| n.starts_with('[')),
                "{names:?}"
            );
            assert_eq!(
                names[leaf..leaf + 4],
                ["read_leaf", "chain_middle", "chain_outer", "main"]
            );
        }
        if sample.end == StackEnd::Complete && names.iter().any(|n| n == "main") {
            reached_main += 1;
        }
    }
    assert!(
        reached_main * 100 >= in_kernel.len() * 99,
        "{reached_main} of {} kernel samples unwound to main",
        in_kernel.len()
    );
    assert_eq!(
        profile
            .engine
            .counters()
            .unwrap()
            .get(BpfCounter::NoUserContext),
        0
    );
}

#[test]
fn exec_and_new_mappings_reach_the_maps_through_process_events() {
    exec_then_profile(true);
}

#[test]
fn exec_and_new_mappings_reach_the_maps_from_the_table_at_each_poll() {
    exec_then_profile(false);
}

/// The shell `pid` execs the workload after the engine started on it; the
/// process events of the exec go to the table, and to the engine's hook
/// when `hooks` (else the engine finds the changes in the table at poll).
fn exec_then_profile(hooks: bool) {
    use ddprof::process::ProcessEvent;
    let binary = workload_binary();
    let symbols = Symbols::read(&binary);
    // A shell that execs the workload after the engine has started on it.
    let mut child = KillOnDrop(
        Command::new("sh")
            .arg("-c")
            .arg(format!("read line; exec {} chain 60", binary.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let specs = parse_events("sCPU freq=499").unwrap();
    let fds = events::open_all(
        &specs,
        Scope::Process(pid as i32),
        &EventOptions {
            stack_sample_size: 8,
            include_kernel: false,
            kernel_stacks: false,
        },
    )
    .unwrap();
    let mut processes = ProcessTable::new();
    processes.load_from_proc(pid).unwrap();
    let mut engine = BpfEngine::new(
        fds,
        BpfEngineOptions {
            workload_pids: vec![pid],
            ..BpfEngineOptions::default()
        },
    )
    .unwrap();
    assert!(engine.tracked_processes().contains(&pid));
    // Let the shell exec, and wait for the new image to run.
    use std::io::Write;
    writeln!(child.0.stdin.as_mut().unwrap()).unwrap();
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // What the perf records of the same events say, in their order: the
    // exec (comm with the exec flag), then the new image's mappings.
    let exec = ProcessEvent::Comm {
        pid,
        tid: pid,
        name: "bpf_stacks".into(),
        exec: true,
    };
    processes.apply(&exec);
    if hooks {
        engine.on_process_event(&exec, &processes);
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for record in maps
        .lines()
        .filter_map(|line| ddprof::process::parse_maps_line(pid, line))
    {
        let event = ProcessEvent::Map(record);
        processes.apply(&event);
        if hooks {
            engine.on_process_event(&event, &processes);
        }
    }
    if !hooks {
        // The first poll brings the maps up to date.
        engine
            .poll(&mut processes, Duration::ZERO, &mut |_, _| {})
            .unwrap();
    }
    // Only samples taken from now on are sure to see the updated maps.
    let updated_at = monotonic_nanos();
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < PROFILE_TIMEOUT
        && samples
            .iter()
            .filter(|s: &&Sample| s.time > updated_at)
            .count()
            < WANTED_SAMPLES
    {
        engine
            .poll(
                &mut processes,
                Duration::from_millis(100),
                &mut |_, sample| samples.push(sample),
            )
            .unwrap();
    }
    // Samples taken after the maps were updated: the workload's own code.
    let ours: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.pid == pid && s.time > updated_at)
        .collect();
    assert!(ours.len() >= 100, "{} samples", ours.len());
    let reached_main = ours
        .iter()
        .filter(|s| {
            s.end == StackEnd::Complete && symbols.names(&processes, s).iter().any(|n| n == "main")
        })
        .count();
    assert!(
        reached_main * 100 >= ours.len() * 99,
        "{reached_main} of {} samples after exec reached main",
        ours.len()
    );

    drop(child);
    let exit = ProcessEvent::Exit { pid, tid: pid };
    processes.apply(&exit);
    if hooks {
        engine.on_process_event(&exit, &processes);
    } else {
        engine.sync(&processes);
    }
    assert!(!engine.tracked_processes().contains(&pid));
}

/// The biggest libLLVM / libstdc++ on the machine.
fn biggest_shared_library() -> Option<PathBuf> {
    let mut roots = vec![
        PathBuf::from("/usr/lib"),
        PathBuf::from("/usr/local/lib"),
        PathBuf::from("/usr/lib64"),
    ];
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".rustup/toolchains"));
    }
    let mut best: Option<(u64, PathBuf)> = None;
    let mut stack = roots;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let wanted = (name.starts_with("libLLVM") || name.starts_with("libstdc++"))
                && name.contains(".so");
            if !wanted || !kind.is_file() {
                continue;
            }
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if best.as_ref().is_none_or(|(s, _)| size > *s) {
                best = Some((size, path));
            }
        }
    }
    best.map(|(_, path)| path)
}

#[test]
fn biggest_library_table_loads_and_verifies() {
    let library = biggest_shared_library().expect("libstdc++ or libLLVM is installed");
    // Its table, compiled the way the engine does.
    let mut cache = ddprof::unwind::TableCache::with_limit(1 << 30);
    let metadata = std::fs::metadata(&library).unwrap();
    let mapped = ddprof::files::MappedFile {
        path: library.to_string_lossy().into_owned(),
        dev: std::os::unix::fs::MetadataExt::dev(&metadata),
        inode: std::os::unix::fs::MetadataExt::ino(&metadata),
    };
    let compile_started = Instant::now();
    let table = cache
        .load(std::process::id(), &mapped, None)
        .expect("the library has CFI");
    let compile_time = compile_started.elapsed();
    let rows = table.table.rows.len() as u32;

    let mut sleeper = KillOnDrop(Command::new("sleep").arg("30").spawn().unwrap());
    let specs = parse_events("sCPU freq=99").unwrap();
    let fds = events::open_all(
        &specs,
        Scope::Process(sleeper.id() as i32),
        &EventOptions {
            stack_sample_size: 8,
            include_kernel: false,
            kernel_stacks: false,
        },
    )
    .unwrap();
    let engine = BpfEngine::new(
        fds,
        BpfEngineOptions {
            table_rows: Some(rows),
            ..BpfEngineOptions::default()
        },
    );
    let mut engine = engine.expect("the program verifies with a row map for the biggest table");
    let loaded = engine
        .load_file(&mapped.path)
        .expect("the table fits the row map sized for it");
    sleeper.stop();
    eprintln!(
        "{}: {} rows, {} bytes ({:.1} MiB) in the row map, compiled in {compile_time:?}; \
         program {:?}; {}",
        library.display(),
        loaded.rows,
        loaded.bytes,
        loaded.bytes as f64 / (1 << 20) as f64,
        engine.program().stats(),
        engine.memory()
    );
    assert_eq!(loaded.rows, rows);
    assert!(rows > 1000, "{rows} rows");
    assert_eq!(
        engine.stored_rows(loaded.first_row, loaded.rows).unwrap(),
        &table.table.rows[..],
        "the row map holds exactly the compiled rows"
    );
    assert_eq!(engine.memory().table_used_bytes, loaded.bytes);
}

const CHILD_ENV: &str = "DDPROF_BPF_TEST_UNPRIVILEGED_CHILD";

#[test]
fn unprivileged_load_is_refused_with_a_clear_message() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // Running as `nobody` (see below).
        let error = BpfProgram::load(MapSizes::minimal(), false)
            .err()
            .expect("nobody cannot load BPF");
        assert!(matches!(error, BpfError::Permission(_)), "{error:?}");
        println!("LOAD ERROR: {error}");
        let decision = choose_engine(EngineChoice::Auto).unwrap();
        assert_eq!(decision.engine, Engine::Perf);
        println!("AUTO: {}", decision.reason);
        assert!(matches!(
            choose_engine(EngineChoice::Bpf),
            Err(BpfError::Permission(_))
        ));
        return;
    }
    let output = ddprof_tests::as_nobody(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unprivileged_load_is_refused_with_a_clear_message",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .expect("setpriv runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed: {stdout}\n{stderr}");
    eprintln!("{stdout}");
    let message = stdout
        .lines()
        .find(|l| l.starts_with("LOAD ERROR: "))
        .expect("the child ran the check");
    assert!(message.contains("not permitted"), "{message}");
    assert!(message.contains("CAP_BPF"), "{message}");
    let auto = stdout.lines().find(|l| l.starts_with("AUTO: ")).unwrap();
    assert!(
        auto.starts_with("AUTO: perf engine: loading BPF is not permitted"),
        "{auto}"
    );
    assert_eq!(auto.lines().count(), 1);
}

#[test]
fn auto_choice_picks_bpf_as_root() {
    let decision = choose_engine(EngineChoice::Auto).unwrap();
    assert_eq!(decision.engine, Engine::Bpf, "{}", decision.reason);
    let forced = choose_engine(EngineChoice::Bpf).unwrap();
    assert_eq!(forced.engine, Engine::Bpf);
}

/// Runs `ddprof --engine bpf` on a command and returns its folded stacks:
/// `(process;frame;frame…, count)`, outermost frame first.
fn ddprof_bpf_folded(command: &[&str]) -> Vec<(Vec<String>, u64)> {
    let output_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "bpf-e2e-{}-{}",
        std::process::id(),
        command[0].rsplit('/').next().unwrap_or("")
    ));
    let _ = std::fs::remove_dir_all(&output_dir);
    let status = Command::new(ddprof_tests::ddprof_bin())
        .args(["--engine", "bpf", "--event", "sCPU freq=499", "--output"])
        .arg(&output_dir)
        .args(["--log-level", "warn", "--"])
        .args(command)
        .status()
        .expect("ddprof runs");
    assert!(status.success(), "ddprof {command:?}: {status}");
    // The profiler daemon writes the file (atomically) after the command
    // has exited.
    let path = output_dir.join("stacks.folded");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "ddprof never wrote {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let folded = std::fs::read_to_string(&path).unwrap();
    folded
        .lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_string).collect(),
                count.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn ddprof_with_the_bpf_engine_unwinds_forked_and_execd_children() {
    let forker = ddprof_tests::workloads::build_workload("forker.c");
    let child = ddprof_tests::workloads::build_workload("forker_child.c");
    let stacks = ddprof_bpf_folded(&[forker.to_str().unwrap(), "3", child.to_str().unwrap()]);
    // A stack reaches the process's entry when its outermost frame (after
    // the process name) is `_start` (the program's, or ld.so's while it
    // loads and links the program: time in the kernel is sampled too, and
    // exec, the loader and exit take a few percent of a 30 ms child) or
    // ld.so's `_dl_start_user`, where its CFI marks the root.
    let of = |process: &str| -> (u64, u64) {
        let lines = stacks.iter().filter(|(frames, _)| frames[0] == process);
        let total: u64 = lines.clone().map(|(_, n)| n).sum();
        let rooted: u64 = lines
            .filter(|(frames, _)| {
                frames
                    .get(1)
                    .is_some_and(|root| root == "_start" || root == "_dl_start_user")
            })
            .map(|(_, n)| n)
            .sum();
        (rooted, total)
    };
    let (child_rooted, child_total) = of("forker_child");
    let (parent_rooted, parent_total) = of("forker");
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let unattributed: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0].starts_with("[pid "))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "forker: {parent_rooted}/{parent_total} samples reach the entry; \
         forker_child: {child_rooted}/{child_total}; {unattributed}/{total} of unknown processes"
    );
    assert!(
        child_total >= 50,
        "{child_total} samples of the exec'd children"
    );
    // Samples are merged with the perf records by time: even a process that
    // has exited by the time its samples are read is known by name. (A child
    // can be sampled before its parent writes the fork record; if it is gone
    // by then, /proc cannot name it either: a few percent at most.)
    assert!(
        unattributed * 100 <= total * 3,
        "{unattributed} of {total} unattributed"
    );
    // Each child lives 30 ms. Until its mappings reach the BPF maps (the
    // next poll), the program hands its samples to the perf engine, which
    // unwinds them from the kernel's stack copy: nothing is cut short. (The
    // parent, which mostly waits, has too few samples for a ratio alone;
    // a sample taken between a fork and its record may stay unresolved.)
    let reached = parent_rooted + child_rooted;
    let sampled = parent_total + child_total;
    assert!(
        reached * 100 >= sampled * 98,
        "{reached} of {sampled} samples of forker and its children reach the entry"
    );
    let expected = ["main", "forker_child_work", "forker_child_burn"];
    assert!(stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "forker_child")
        .any(|(frames, _)| frames.windows(3).any(|w| w == expected)));
}

#[test]
fn ddprof_with_the_bpf_engine_unwinds_threads() {
    let threads = ddprof_tests::workloads::build_workload("threads.c");
    let stacks = ddprof_bpf_folded(&[threads.to_str().unwrap(), "2"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let rooted: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "start_thread" || f == "main"))
        .map(|(_, n)| n)
        .sum();
    let worker_b: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames.windows(4).any(|w| {
                w == [
                    "thread_b_work",
                    "thread_b_step",
                    "thread_b_middle",
                    "thread_b_leaf",
                ]
            })
        })
        .map(|(_, n)| n)
        .sum();
    eprintln!("threads: {rooted}/{total} samples rooted, {worker_b} in worker-b's chain");
    assert!(total >= 200, "{total} samples");
    assert!(rooted * 100 >= total * 99, "{rooted} of {total} rooted");
    assert!(
        worker_b * 4 >= total,
        "{worker_b} of {total} in worker-b's chain"
    );
}

/// The program hands the samples of processes its maps do not describe yet
/// to the perf engine (it returns 1: the kernel writes the sample with its
/// stack copy). Every one of them must reach the profile: a shell loop of
/// short-lived children is sampled at the rate its CPU time calls for, and
/// the summary says how many went that way. (Until the entry point stopped
/// using aya's `#[perf_event]` wrapper, which returns 0 whatever the
/// function returns, they were all dropped: 27 % of the expected samples.)
#[test]
fn samples_handed_to_the_perf_engine_reach_the_profile() {
    let child = ddprof_tests::workloads::build_workload("forker_child.c");
    let output_dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bpf-handoff-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&output_dir);
    let frequency = 999.0;
    let run = ddprof_tests::processes::run_reaped(
        Command::new(ddprof_tests::ddprof_bin())
            .args(["--engine", "bpf", "--event", "sCPU freq=999", "--output"])
            .arg(&output_dir)
            .args(["--log-level", "notice", "--"])
            .args(["sh", "-c", "for i in $(seq 60); do \"$0\" 40; done"])
            .arg(&child),
        Duration::from_secs(120),
    )
    .expect("ddprof runs");
    let (reaped, stderr) = (run.reaped, run.stderr);
    assert!(reaped.status.success(), "{stderr}");
    let summary = ddprof_tests::outputs::summary_fields(&stderr);
    let expected = reaped.cpu.as_secs_f64() * frequency;
    let samples = summary["samples"] as f64;
    let handed: u64 = stderr
        .lines()
        .find_map(|line| {
            let rest = line.split("unwound in the kernel, ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no hand-off line:\n{stderr}"));
    eprintln!(
        "{samples} samples for {:.2} s of CPU ({expected:.0} expected), {handed} handed to the perf engine",
        reaped.cpu.as_secs_f64()
    );
    assert!(handed > 0, "no sample was handed over:\n{stderr}");
    assert!(
        samples >= expected * 0.9,
        "{samples} samples, {expected:.0} expected:\n{stderr}"
    );
    assert!(
        summary["full_stacks"] as f64 >= samples * 0.97,
        "{summary:?}"
    );
}
