//! Aggregation, symbolization, pprof and local outputs on real processes and
//! real files: a C workload with a known call chain is built and started,
//! samples are made of real return addresses inside it, and the process is
//! gone before symbolization. Every pprof file is read back with
//! `go tool pprof -raw`.
use ddprof_tests::guards::monotonic_nanos;
use ddprof_tests::outputs::{go_pprof, pprof_files};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use ddprof::aggregate::{Aggregator, AggregatorOptions, PeriodProfile};
use ddprof::output::{FoldedStacks, LocalOutput};
use ddprof::process::ProcessTable;
use ddprof::profile::{self, ProfileMetadata};
use ddprof::sample::{Sample, StackEnd};
use ddprof::symbolize::{SymbolizedProfile, Symbolizer, SymbolizerOptions};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

const WORKLOAD: &str = "output_chain";
const PERIOD_NANOS: u64 = 1_000_000_000 / 99;

fn workload_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("workloads/{WORKLOAD}.c"))
}

/// A fresh scratch directory per test.
fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddprof-output-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Builds the workload with `-O2 -g` into `dir`.
fn build_workload(dir: &Path) -> PathBuf {
    build_workload_as(&dir.join(WORKLOAD), &[])
}

fn build_workload_as(binary: &Path, defines: &[&str]) -> PathBuf {
    run(Command::new("cc")
        .args(["-O2", "-g", "-pthread"])
        .args(defines)
        .arg("-o")
        .arg(binary)
        .arg(workload_source()));
    binary.to_path_buf()
}

/// The line of the source that carries `marker`.
fn line_of(marker: &str) -> u32 {
    let source = std::fs::read_to_string(workload_source()).unwrap();
    let index = source
        .lines()
        .position(|line| line.contains(marker))
        .unwrap_or_else(|| panic!("{marker} not in the workload"));
    index as u32 + 1
}

/// A started workload, killed when dropped.
struct Running {
    child: Child,
}

impl Running {
    fn start(binary: &Path) -> Self {
        Self::start_with(binary, &[])
    }

    fn start_with(binary: &Path, args: &[&str]) -> Self {
        Self::spawn(Command::new(binary).args(args))
    }

    fn spawn(command: &mut Command) -> Self {
        let child = command.spawn().unwrap();
        let mut running = Running { child };
        // Wait until the worker thread exists and has its name.
        let deadline = Instant::now() + Duration::from_secs(20);
        while running.thread_named("output_worker").is_none() {
            assert!(
                Instant::now() < deadline,
                "the workload's worker never appeared"
            );
            if let Ok(Some(status)) = running.child.try_wait() {
                panic!("the workload exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        running
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn thread_named(&self, name: &str) -> Option<u32> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).ok()?;
        tasks.flatten().find_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| task.file_name().to_str()?.parse().ok())?
        })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", self.pid()));
    }
}

/// Functions and call sites of an ELF file, from its symbol table and code.
struct Elf {
    data: Vec<u8>,
}

impl Elf {
    fn read(path: &Path) -> Self {
        Elf {
            data: std::fs::read(path).unwrap(),
        }
    }

    fn file(&self) -> object::File<'_> {
        object::File::parse(self.data.as_slice()).unwrap()
    }

    /// (address, size) of a function, from .symtab or .dynsym.
    fn function(&self, name: &str) -> (u64, u64) {
        let file = self.file();
        file.symbols()
            .chain(file.dynamic_symbols())
            .find(|s| s.name() == Ok(name) && s.size() > 0)
            .map(|s| (s.address(), s.size()))
            .unwrap_or_else(|| panic!("no function {name}"))
    }

    /// Return addresses (virtual) of the direct calls from `caller` to `callee`.
    fn return_addresses(&self, caller: &str, callee: &str) -> Vec<u64> {
        let (start, size) = self.function(caller);
        let (target, _) = self.function(callee);
        let file = self.file();
        let text = file
            .sections()
            .find(|s| s.address() <= start && start < s.address() + s.size())
            .unwrap();
        let code = text.data().unwrap();
        let code = &code[(start - text.address()) as usize..][..size as usize];
        let mut found = Vec::new();
        for at in 0..code.len().saturating_sub(4) {
            // `call rel32` (E8): the target is relative to the next instruction.
            if code[at] != 0xe8 {
                continue;
            }
            let rel = i32::from_le_bytes(code[at + 1..at + 5].try_into().unwrap());
            let next = start + at as u64 + 5;
            if next.wrapping_add(rel as i64 as u64) == target {
                found.push(next);
            }
        }
        assert!(!found.is_empty(), "{caller} does not call {callee}");
        found
    }

    fn file_offset(&self, vaddr: u64) -> u64 {
        let file = self.file();
        let segment = file
            .segments()
            .find(|s| s.address() <= vaddr && vaddr < s.address() + s.size())
            .unwrap_or_else(|| panic!("{vaddr:#x} is in no segment"));
        vaddr - segment.address() + segment.file_range().0
    }
}

/// The address in `pid` of the file offset `offset` of the file at `path`.
fn runtime_address(table: &ProcessTable, pid: u32, path: &Path, offset: u64) -> u64 {
    let path = path.canonicalize().unwrap();
    table
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| {
            Path::new(&m.file.path) == path
                && m.file_offset <= offset
                && offset < m.file_offset + (m.end - m.start)
        })
        .map(|m| m.start + offset - m.file_offset)
        .unwrap_or_else(|| panic!("{} offset {offset:#x} not mapped in {pid}", path.display()))
}

/// Real stacks of the workload's two threads, innermost first.
struct Stacks {
    main: Vec<u64>,
    worker: Vec<u64>,
    /// Program counters spread over `output_hot`, for varied leaves.
    hot_pcs: Vec<u64>,
    /// 1,000 program counters spread over the C library's code.
    libc_pcs: Vec<u64>,
}

fn workload_stacks(table: &ProcessTable, pid: u32, binary: &Path, elf: &Elf) -> Stacks {
    let at = |vaddr: u64| runtime_address(table, pid, binary, elf.file_offset(vaddr));
    let ret = |caller: &str, callee: &str| at(elf.return_addresses(caller, callee)[0]);
    let (hot, hot_size) = elf.function("output_hot");
    let hot_pcs: Vec<u64> = (0..hot_size).step_by(4).map(|o| at(hot + o)).collect();
    let chain = [
        hot_pcs[1],
        ret("output_leaf", "output_hot"),
        ret("output_middle", "output_leaf"),
        ret("output_outer", "output_middle"),
    ];
    let mut main = chain.to_vec();
    main.push(ret("main", "output_outer"));
    // The C library's frame under main, as a return address in libc.
    let libc = table
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| m.file.path.contains("/libc.so"))
        .map(|m| PathBuf::from(&m.file.path))
        .expect("the workload maps libc");
    let libc_elf = Elf::read(&libc);
    let libc_code = table
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| Path::new(&m.file.path) == libc)
        .unwrap();
    let libc_pcs = (0..1000)
        .map(|k| libc_code.start + k * 64)
        .filter(|pc| *pc < libc_code.end)
        .collect();
    let (start_main, _) = libc_elf.function("__libc_start_main");
    main.push(runtime_address(
        table,
        pid,
        &libc,
        libc_elf.file_offset(start_main + 0x20),
    ));
    let mut worker = chain.to_vec();
    worker.push(ret("output_worker_main", "output_outer"));
    Stacks {
        main,
        worker,
        hot_pcs,
        libc_pcs,
    }
}

fn sample(pid: u32, tid: u32, index: u64, frames: Vec<u64>, end: StackEnd) -> Sample {
    Sample {
        pid,
        tid,
        time: monotonic_nanos() + index * PERIOD_NANOS,
        cpu: 0,
        event: 0,
        weight: PERIOD_NANOS,
        scaled_count: ddprof::events::COUNT_UNIT,
        frames,
        kernel_frames: vec![],
        heap: None,
        off_cpu: None,
        trace: None,
        end,
    }
}

fn go_pprof_raw(file: &Path) -> String {
    go_pprof(&["-raw"], file)
}

fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
}

/// Symbolizes and writes one profile; returns the file written.
fn write_profile(
    output: &LocalOutput,
    symbolizer: &mut Symbolizer,
    period: PeriodProfile,
) -> (PathBuf, SymbolizedProfile) {
    let start = period.start;
    let symbolized = symbolizer.symbolize(period);
    let bytes = profile::encode_pprof(
        &symbolized,
        &ProfileMetadata {
            events: Vec::new(),
            sampling_period_nanos: PERIOD_NANOS,
            comments: Vec::new(),
        },
    )
    .unwrap();
    (output.write_profile(&bytes, start).unwrap(), symbolized)
}

#[test]
fn exited_process_is_symbolized_and_every_output_reads_back() {
    let dir = scratch_dir("chain");
    let binary = build_workload(&dir);
    let elf = Elf::read(&binary);
    let mut running = Running::start(&binary);
    let pid = running.pid();
    let worker_tid = running.thread_named("output_worker").unwrap();
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();
    let stacks = workload_stacks(&table, pid, &binary, &elf);

    let mut aggregator = Aggregator::new(AggregatorOptions::new(true));
    let start = SystemTime::now();
    let mut index = 0;
    let mut next = || {
        index += 1;
        index
    };
    for _ in 0..60 {
        let s = sample(pid, pid, next(), stacks.main.clone(), StackEnd::Complete);
        aggregator.add(&table, &s);
    }
    for _ in 0..40 {
        let s = sample(
            pid,
            worker_tid,
            next(),
            stacks.worker.clone(),
            StackEnd::Complete,
        );
        aggregator.add(&table, &s);
    }
    // A stack that leaves every mapping and stops early.
    for _ in 0..5 {
        let frames = [&stacks.worker[..3], &[0x10]].concat();
        let s = sample(pid, worker_tid, next(), frames, StackEnd::BadAddress);
        aggregator.add(&table, &s);
    }

    // The process exits before anything is symbolized.
    running.kill();
    table.exit(pid, pid);
    assert!(table.get(pid).is_none());
    assert!(!Path::new(&format!("/proc/{pid}")).exists());

    let period = aggregator.take_period(start, start + Duration::from_secs(60));
    assert_eq!(period.stats.samples, 105);
    assert_eq!(period.stats.full_stacks, 100);

    let plain_dir = dir.join("plain");
    let inlined_dir = dir.join("inlined");
    let plain_output = LocalOutput::create(&plain_dir, WORKLOAD).unwrap();
    let inlined_output = LocalOutput::create(&inlined_dir, WORKLOAD).unwrap();
    let mut plain = Symbolizer::new(SymbolizerOptions::default());
    let mut inlined = Symbolizer::new(SymbolizerOptions {
        inlined_functions: true,
        ..SymbolizerOptions::default()
    });
    let (_, symbolized) = write_profile(&plain_output, &mut plain, period.clone());
    write_profile(&inlined_output, &mut inlined, period);

    // A second, final period at exit, as the profiler writes one.
    let mut folded = FoldedStacks::default();
    folded.add(&symbolized);
    let last = aggregator.take_period(
        start + Duration::from_secs(60),
        start + Duration::from_secs(61),
    );
    let (_, last) = write_profile(&plain_output, &mut plain, last);
    folded.add(&last);
    let finals = plain_output.finish(&folded).unwrap();

    let plain_files = pprof_files(&plain_dir);
    assert_eq!(plain_files.len(), 2, "{plain_files:?}");
    let name = plain_files[0].file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("output_chain-") && name.ends_with("Z.pprof"),
        "{name}"
    );
    for file in &plain_files {
        go_pprof_raw(file);
    }

    let source = format!("{}", workload_source().display());
    let raw = go_pprof_raw(&plain_files[0]);
    assert_contains(&raw, "PeriodType: cpu-time nanoseconds");
    assert_contains(&raw, "cpu-samples/count cpu-time/nanoseconds");
    assert_contains(&raw, &format!("process_id:[{pid}]"));
    assert_contains(&raw, &format!("thread id:[{worker_tid}]"));
    assert_contains(&raw, "thread_name:[output_worker]");
    assert_contains(&raw, "process_name:[output_chain]");
    assert_contains(&raw, "end_timestamp_ns:[");
    for function in [
        "output_hot",
        "output_leaf",
        "output_middle",
        "output_outer",
        "output_worker_main",
        " main ",
        "__libc_start_main",
        "[unknown]",
        "[truncated]",
    ] {
        assert_contains(&raw, function);
    }
    for (function, marker) in [
        ("output_middle", "LINE_MIDDLE_CALLS_LEAF"),
        ("output_outer", "LINE_OUTER_CALLS_MIDDLE"),
        ("output_worker_main", "LINE_WORKER_CALLS_OUTER"),
    ] {
        assert_contains(&raw, &format!("{function} {source}:{} ", line_of(marker)));
    }
    assert!(!raw.contains("output_mix"), "no inlined frames without -I");
    // The mapping carries the binary's path and build id.
    let build_id = ddprof::files::read_build_id(binary.to_str().unwrap()).unwrap();
    let build_id: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_contains(&raw, &format!("{} {build_id}", binary.display()));

    // With -I the inlined function is its own line of the caller's location,
    // innermost first.
    let inlined_files = pprof_files(&inlined_dir);
    let raw = go_pprof_raw(&inlined_files[0]);
    let mix = format!("output_mix {source}:{} ", line_of("LINE_MIX_CALLS_HOT"));
    let leaf = format!("output_leaf {source}:{} ", line_of("LINE_LEAF_CALLS_MIX"));
    let location = raw
        .lines()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|pair| pair[0].contains(&mix))
        .map(|pair| pair[1].to_string())
        .unwrap_or_else(|| panic!("no {mix:?} in:\n{raw}"));
    assert!(location.contains(&leaf), "{location:?} should be {leaf:?}");

    // Folded stacks: root first, counts summing to the samples.
    let folded_text = std::fs::read_to_string(&finals.folded).unwrap();
    let total: u64 = folded_text
        .lines()
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 105);
    // glibc names the function __libc_start_main or __libc_start_main_impl.
    let main_line = folded_text
        .lines()
        .find(|line| line.starts_with("output_chain;__libc_start_main"))
        .unwrap_or_else(|| panic!("no libc root in:\n{folded_text}"));
    assert!(
        main_line.ends_with(";main;output_outer;output_middle;output_leaf;output_hot 60"),
        "{main_line}"
    );
    assert_contains(
        &folded_text,
        "output_chain;output_worker_main;output_outer;output_middle;output_leaf;output_hot 40\n",
    );
    assert_contains(
        &folded_text,
        "output_chain;[truncated];[unknown];output_middle;output_leaf;output_hot 5\n",
    );

    // The flame graph is well-formed XML naming the hot functions.
    let svg = std::fs::read_to_string(&finals.flamegraph).unwrap();
    let mut reader = quick_xml::Reader::from_str(&svg);
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(_)) => elements += 1,
            Ok(_) => {}
            Err(e) => panic!("flamegraph.svg is not valid XML: {e}"),
        }
    }
    assert!(elements > 10);
    assert!(svg.trim_start().starts_with("<?xml") && svg.contains("<svg"));
    for function in ["output_hot", "output_leaf", "output_worker_main"] {
        assert_contains(&svg, function);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Strips `binary` into `stripped`, its debug information moving to `debug`
/// (compressed in the format `compress` names, `zlib` or `zstd`, as
/// distributions ship it) and linked by name.
fn split_debug_info(binary: &Path, stripped: &Path, debug: &Path, compress: Option<&str>) {
    let mut objcopy = Command::new("objcopy");
    objcopy.arg("--only-keep-debug");
    if let Some(format) = compress {
        objcopy.arg(format!("--compress-debug-sections={format}"));
    }
    run(objcopy.arg(binary).arg(debug));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(stripped)
        .arg(binary));
    // The link is relative to the debug file's directory.
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(stripped)
        .current_dir(debug.parent().unwrap()));
}

/// Moves `debug`, the split debug file of `stripped`, to where debug
/// directories keep it by build id under `debug_dir`; returns that path
/// relative to `debug_dir` (`.build-id/xx/rest.debug`).
fn install_by_build_id(stripped: &Path, debug: &Path, debug_dir: &Path) -> String {
    let build_id = ddprof::files::read_build_id(stripped.to_str().unwrap()).unwrap();
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let relative = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    let installed = debug_dir.join(&relative);
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::rename(debug, &installed).unwrap();
    relative
}

/// In `dir`: `chain_stripped`, `binary` stripped, with its debug file
/// (compressed as `compress` says) installed by build id under `dir/debug`;
/// returns the stripped binary, that debug directory and the debug file's
/// path in it.
fn stripped_with_debug_dir(
    binary: &Path,
    dir: &Path,
    compress: Option<&str>,
) -> (PathBuf, PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let stripped = dir.join("chain_stripped");
    let debug = dir.join("chain_stripped.debug");
    split_debug_info(binary, &stripped, &debug, compress);
    let debug_dir = dir.join("debug");
    let relative = install_by_build_id(&stripped, &debug, &debug_dir);
    (stripped, debug_dir, relative)
}

/// Samples `binary`'s main thread chain once, with the process gone before
/// symbolization, and returns the symbolized function names and lines.
fn symbolize_chain(binary: &Path, symbols_from: &Elf, options: SymbolizerOptions) -> Vec<String> {
    let mut running = Running::start(binary);
    let pid = running.pid();
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();
    let stacks = workload_stacks(&table, pid, binary, symbols_from);
    let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
    aggregator.add(
        &table,
        &sample(pid, pid, 0, stacks.main.clone(), StackEnd::Complete),
    );
    running.kill();
    table.exit(pid, pid);
    let now = SystemTime::now();
    let period = aggregator.take_period(now, now);
    let symbolized = Symbolizer::new(options).symbolize(period);
    let stack = &symbolized.period.stacks[0];
    stack
        .iter()
        .flat_map(|&frame| symbolized.frames[frame as usize].iter())
        .map(|line| {
            let file = line.file.rsplit('/').next().unwrap();
            format!("{}@{file}:{}", line.function, line.line)
        })
        .collect()
}

#[test]
fn stripped_binaries_use_split_debug_info() {
    let dir = scratch_dir("split");
    let binary = build_workload(&dir);
    let symbols = Elf::read(&binary);
    let middle = format!(
        "output_middle@{WORKLOAD}.c:{}",
        line_of("LINE_MIDDLE_CALLS_LEAF")
    );

    // The debug file next to the binary, found through .gnu_debuglink.
    let linked = dir.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    let stripped = linked.join("chain_stripped");
    split_debug_info(
        &binary,
        &stripped,
        &linked.join("chain_stripped.debug"),
        None,
    );
    let names = symbolize_chain(&stripped, &symbols, SymbolizerOptions::default());
    assert_eq!(names[0].split('@').next(), Some("output_hot"), "{names:?}");
    assert!(names.contains(&middle), "{names:?}");

    // The debug file only in a debug directory's .build-id tree.
    let (stripped, debug_dir, _) = stripped_with_debug_dir(&binary, &dir.join("by-build-id"), None);

    // Without the debug directory nothing names the functions.
    let names = symbolize_chain(&stripped, &symbols, SymbolizerOptions::default());
    assert!(
        names[..4].iter().all(|n| n.starts_with("[chain_stripped]")),
        "{names:?}"
    );
    let names = symbolize_chain(
        &stripped,
        &symbols,
        SymbolizerOptions {
            debug_dirs: vec![debug_dir.clone()],
            ..SymbolizerOptions::default()
        },
    );
    assert_eq!(names[0].split('@').next(), Some("output_hot"), "{names:?}");
    assert!(names.contains(&middle), "{names:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether any section of the ELF file at `path` is compressed.
fn has_compressed_sections(path: &Path) -> bool {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.sections().any(|section| {
        matches!(section.flags(), object::SectionFlags::Elf { sh_flags, .. }
            if sh_flags.contains(object::elf::SHF_COMPRESSED))
    })
}

/// Sections the debug cache's copies keep without their bytes: location
/// lists, which no symbolizer reads.
const LOCATION_LISTS: [&str; 2] = [".debug_loc", ".debug_loclists"];

/// Checks that `copy` holds every section of the compressed `original`,
/// inflated: the same names, types, addresses and bytes (the original's
/// inflated by `object`, not by the code that wrote the copy), but for the
/// location lists, which are there with no bytes, in a file `object` and
/// `readelf` both read without complaint.
fn assert_inflated_copy_of(copy: &Path, original: &Path) {
    let original_bytes = std::fs::read(original).unwrap();
    let copy_bytes = std::fs::read(copy).unwrap();
    let original_elf = object::File::parse(&*original_bytes).unwrap();
    let copy_elf = object::File::parse(&*copy_bytes).unwrap();
    let sections = |elf: &object::File| -> Vec<(String, u64, object::SectionKind)> {
        elf.sections()
            .map(|s| (s.name().unwrap().to_string(), s.address(), s.kind()))
            .collect()
    };
    assert_eq!(sections(&copy_elf), sections(&original_elf), "{copy:?}");
    let mut inflated = 0;
    let mut emptied = 0;
    for (from, to) in original_elf.sections().zip(copy_elf.sections()) {
        let name = from.name().unwrap();
        let expected = from.uncompressed_data().unwrap();
        assert_eq!(
            to.compressed_data().unwrap().format,
            object::CompressionFormat::None,
            "{name} is still compressed in {copy:?}"
        );
        if LOCATION_LISTS.contains(&name) {
            assert!(!expected.is_empty(), "{name} of {original:?} is empty");
            assert_eq!(to.size(), 0, "{name} kept its bytes in {copy:?}");
            emptied += 1;
            continue;
        }
        assert!(
            to.data().unwrap() == &*expected,
            "{name} differs in {copy:?}"
        );
        // Mapped tables (.symtab) are read in place only when aligned.
        if let Some((offset, _)) = to.file_range() {
            assert_eq!(
                offset % to.align().max(1),
                0,
                "{name} is not aligned in {copy:?}"
            );
        }
        if from.compressed_data().unwrap().format != object::CompressionFormat::None {
            inflated += 1;
        }
    }
    assert!(inflated >= 3, "only {inflated} sections were compressed");
    assert_eq!(
        emptied, 1,
        "{original:?} has no .debug_loclists (gcc -O2 -g)"
    );
    // readelf finds what the original had to say about itself, no more
    // (libc's debug file: "Unable to find program interpreter name").
    let complaints = |path: &Path| {
        let readelf = Command::new("readelf")
            .args(["--wide", "--file-header", "--program-headers", "--sections"])
            .arg("--debug-dump=info,line")
            .arg(path)
            .output()
            .unwrap();
        assert!(readelf.status.success(), "readelf {path:?}");
        String::from_utf8_lossy(&readelf.stderr).into_owned()
    };
    assert_eq!(
        complaints(copy),
        complaints(original),
        "readelf on {copy:?}"
    );
}

#[test]
fn compressed_split_debug_info_is_decompressed_once_into_the_debug_cache() {
    for format in ["zlib", "zstd"] {
        decompressed_once_into_the_debug_cache(format);
    }
}

fn decompressed_once_into_the_debug_cache(format: &str) {
    let dir = scratch_dir(&format!("debug-cache-{format}"));
    let binary = build_workload(&dir);
    let symbols = Elf::read(&binary);
    let cache_dir = dir.join("cache");
    let with_cache = |debug_dir: &Path| SymbolizerOptions {
        debug_dirs: vec![debug_dir.to_path_buf()],
        debug_cache: Some(cache_dir.clone()),
        ..SymbolizerOptions::default()
    };

    // The debug file as the linker wrote it names the frames...
    let (plain_stripped, plain_debug_dir, _) =
        stripped_with_debug_dir(&binary, &dir.join("plain"), None);
    let uncompressed = symbolize_chain(&plain_stripped, &symbols, with_cache(&plain_debug_dir));
    let middle = format!(
        "output_middle@{WORKLOAD}.c:{}",
        line_of("LINE_MIDDLE_CALLS_LEAF")
    );
    assert!(uncompressed.contains(&middle), "{uncompressed:?}");
    assert!(!cache_dir.exists(), "nothing to inflate");

    // ... and compressed as distributions ship it (blazesym, built without
    // zstd here, cannot read a zstd one itself)...
    let (stripped, debug_dir, relative) =
        stripped_with_debug_dir(&binary, &dir.join("compressed"), Some(format));
    let installed = debug_dir.join(&relative);
    assert!(has_compressed_sections(&installed));
    let with_cache = || with_cache(&debug_dir);
    // ... and the copy in the cache names them the same, lines included.
    let first = symbolize_chain(&stripped, &symbols, with_cache());
    assert_eq!(first, uncompressed);
    let copy = cache_dir.join(&relative);
    assert_inflated_copy_of(&copy, &installed);
    use std::os::unix::fs::MetadataExt;
    let written = std::fs::metadata(&copy).unwrap();
    assert!(written.len() > std::fs::metadata(&installed).unwrap().len());

    // A later run reads the copy as it is (not rewritten), and only the
    // copy: the same names with the original moved away.
    let aside = dir.join("aside.debug");
    std::fs::rename(&installed, &aside).unwrap();
    let second = symbolize_chain(&stripped, &symbols, with_cache());
    assert_eq!(second, uncompressed);
    assert_eq!(std::fs::metadata(&copy).unwrap().ino(), written.ino());
    std::fs::rename(&aside, &installed).unwrap();

    // A copy that is not an ELF file any more (the disk, a user) is
    // written again: the same names, lines included. (Before, it was used as
    // it was: a zstd original's functions then came from its symbol table,
    // without lines, at every later run.)
    std::fs::write(&copy, b"not an ELF file").unwrap();
    let damaged = symbolize_chain(&stripped, &symbols, with_cache());
    assert_eq!(damaged, uncompressed);
    assert_inflated_copy_of(&copy, &installed);

    // An original whose compressed DWARF is damaged: no copy, and no
    // partial file left behind; the functions are still named, from the
    // debug file's symbol table (the stripped binary has none), without
    // lines.
    std::fs::remove_dir_all(&cache_dir).unwrap();
    let damage = damage_compressed_section(&installed, ".debug_info");
    let damaged = symbolize_chain(&stripped, &symbols, with_cache());
    assert_named_without_lines(&damaged, &uncompressed);
    let left: Vec<_> = walk_files(&cache_dir.join(".build-id"));
    assert!(left.is_empty(), "{damage}: left {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `named` holds the functions of `reference` (`function@file:line`), and
/// where `reference` has a line, `named` has none: names from a symbol
/// table.
fn assert_named_without_lines(named: &[String], reference: &[String]) {
    let functions = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .map(|name| name.split('@').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(functions(named), functions(reference), "{named:?}");
    for (name, with_line) in named.iter().zip(reference) {
        if !with_line.ends_with("@:0") {
            assert!(name.ends_with("@:0"), "{name} has a line: {named:?}");
        }
    }
}

/// Overwrites the last half of section `name`'s compressed bytes in the ELF
/// file at `path` with zeros; returns what was done, for messages.
fn damage_compressed_section(path: &Path, name: &str) -> String {
    let mut bytes = std::fs::read(path).unwrap();
    let (offset, size) = {
        let elf = object::File::parse(&*bytes).unwrap();
        let section = elf.section_by_name(name).unwrap();
        section.file_range().unwrap()
    };
    let from = (offset + size / 2) as usize;
    bytes[from..(offset + size) as usize].fill(0);
    std::fs::write(path, bytes).unwrap();
    format!("{name} of {path:?} zeroed from byte {from}")
}

/// Every file under `dir` (none when `dir` does not exist).
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// libc's own split debug file (Debian's libc6-dbg, zlib-compressed, 74
/// sections): the copy holds every section inflated, byte for byte.
#[test]
fn the_copy_of_libcs_split_debug_file_holds_every_section_inflated() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so"))
        .expect("this test is linked against glibc");
    let build_id = ddprof::files::read_build_id(libc).unwrap();
    let system_debug = PathBuf::from("/usr/lib/debug");
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let original = system_debug.join(format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]));
    assert!(
        original.is_file(),
        "{original:?} is missing: install libc6-dbg (cargo xtask test does)"
    );
    assert!(has_compressed_sections(&original), "{original:?}");
    let dir = scratch_dir("libc-debug-copy");
    let cache = ddprof::symbolize::DebugCache::new(dir.join(".build-id"));
    let copy = cache
        .copy_for(libc, &build_id, std::slice::from_ref(&system_debug))
        .unwrap()
        .expect("a compressed debug file gets a copy");
    assert_inflated_copy_of(&copy.location, &original);
    // A damaged copy (cut short, as a full disk or a crash could leave one
    // behind another writer's back) is written again, not kept: before,
    // every later run took it as it was and named libc without lines.
    let location = copy.location.clone();
    drop(copy);
    let length = std::fs::metadata(&location).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&location)
        .unwrap()
        .set_len(length / 2)
        .unwrap();
    let again = cache
        .copy_for(libc, &build_id, &[system_debug])
        .unwrap()
        .expect("a compressed debug file gets a copy");
    assert_inflated_copy_of(&again.location, &original);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Not a pass/fail check of speed: prints the figures for the report (run
/// with `--nocapture`), and checks that the large profile is complete.
#[test]
fn measures_a_busy_minute_profile() {
    let dir = scratch_dir("measure");
    let binary = build_workload(&dir);
    let elf = Elf::read(&binary);
    let running = Running::start(&binary);
    let pid = running.pid();
    let worker_tid = running.thread_named("output_worker").unwrap();
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();
    let stacks = workload_stacks(&table, pid, &binary, &elf);

    // 59 s at 99 Hz on 2 busy threads, leaves spread over the hot function.
    let per_thread = 59 * 99;
    let make_samples = |leaves: &[u64]| -> Vec<Sample> {
        let mut samples = Vec::with_capacity(2 * per_thread);
        for index in 0..per_thread as u64 {
            for (tid, stack) in [(pid, &stacks.main), (worker_tid, &stacks.worker)] {
                let mut frames = stack.clone();
                frames[0] = leaves[index as usize % leaves.len()];
                samples.push(sample(pid, tid, index, frames, StackEnd::Complete));
            }
        }
        samples
    };
    let make_period = |aggregator: &mut Aggregator, leaves: &[u64]| {
        let start = SystemTime::now();
        for s in make_samples(leaves) {
            aggregator.add(&table, &s);
        }
        aggregator.take_period(start, start + Duration::from_secs(59))
    };
    let mut aggregator = Aggregator::new(AggregatorOptions::new(true));
    let first = make_period(&mut aggregator, &stacks.hot_pcs);
    // Files already known: the steady-state cost of one add().
    let timed_samples = make_samples(&stacks.hot_pcs);
    let mut timed = Aggregator::new(AggregatorOptions::new(true));
    timed.add(&table, &timed_samples[0]);
    let aggregate_start = Instant::now();
    for s in &timed_samples {
        timed.add(&table, s);
    }
    let aggregate_time = aggregate_start.elapsed();
    let second = make_period(&mut aggregator, &stacks.hot_pcs);
    // Leaves all over the C library: files already parsed, addresses new.
    let third = make_period(&mut aggregator, &stacks.libc_pcs);
    assert_eq!(first.stats.samples, 2 * per_thread as u64);

    let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
    let cold_start = Instant::now();
    let cold = symbolizer.symbolize(first);
    let cold_time = cold_start.elapsed();
    let warm_start = Instant::now();
    let _warm = symbolizer.symbolize(second);
    let warm_time = warm_start.elapsed();
    let new_addresses_start = Instant::now();
    let new_addresses = symbolizer.symbolize(third);
    let new_addresses_time = new_addresses_start.elapsed();
    let new_leaves = new_addresses.period.frames.len();

    let metadata = ProfileMetadata {
        events: Vec::new(),
        sampling_period_nanos: PERIOD_NANOS,
        comments: Vec::new(),
    };
    let encode_start = Instant::now();
    let bytes = profile::encode_pprof(&cold, &metadata).unwrap();
    let encode_time = encode_start.elapsed();
    let mut no_timeline = Aggregator::new(AggregatorOptions::new(false));
    let aggregated = symbolizer.symbolize(make_period(&mut no_timeline, &stacks.hot_pcs));
    let aggregated_bytes = profile::encode_pprof(&aggregated, &metadata).unwrap();

    let output = LocalOutput::create(&dir.join("out"), WORKLOAD).unwrap();
    let file = output.write_profile(&bytes, cold.period.start).unwrap();
    let raw = go_pprof_raw(&file);
    let samples_in_file = raw
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(2)
        .take_while(|l| !l.starts_with("Locations"))
        .filter(|l| l.trim_start().starts_with("1 "))
        .count();
    assert_eq!(samples_in_file, 2 * per_thread);

    println!(
        "measure: samples={} distinct_stacks={} pprof_gz_bytes={} (timeline) pprof_gz_bytes_without_timeline={} \
         aggregate_ns_per_sample={:.0} symbolize_cold_ms={:.2} symbolize_warm_ms={:.2} \
         symbolize_warm_files_{}_new_frames_ms={:.2} encode_ms={:.2}",
        2 * per_thread,
        cold.period.stacks.len(),
        bytes.len(),
        aggregated_bytes.len(),
        aggregate_time.as_secs_f64() * 1e9 / (2 * per_thread) as f64,
        cold_time.as_secs_f64() * 1e3,
        warm_time.as_secs_f64() * 1e3,
        new_leaves,
        new_addresses_time.as_secs_f64() * 1e3,
        encode_time.as_secs_f64() * 1e3,
    );
    drop(running);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The address of a kernel function, from /proc/kallsyms.
fn kernel_function(name: &str) -> u64 {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let address = kallsyms
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.next()?;
            let kind = fields.next()?;
            (matches!(kind, "T" | "t") && fields.next() == Some(name))
                .then(|| u64::from_str_radix(address, 16).ok())?
        })
        .unwrap_or_else(|| panic!("{name} not in /proc/kallsyms"));
    assert_ne!(
        address, 0,
        "kernel addresses are hidden: set kernel.kptr_restrict=0"
    );
    address
}

#[test]
fn jit_and_kernel_frames_are_named_after_the_process_exits() {
    let dir = scratch_dir("jit");
    let binary = build_workload(&dir);
    let elf = Elf::read(&binary);
    let mut running = Running::start_with(&binary, &["jit"]);
    let pid = running.pid();
    let perf_map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    assert!(perf_map.exists(), "the workload wrote no perf map");
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();
    let stacks = workload_stacks(&table, pid, &binary, &elf);
    let jit = table
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| m.file.path.is_empty())
        .map(|m| m.start)
        .expect("the JIT page is an anonymous executable mapping");
    let syscall = kernel_function("do_syscall_64");

    let mut frames = vec![jit + 0x10];
    frames.extend_from_slice(&stacks.worker[1..]);
    let mut jit_sample = sample(pid, pid, 0, frames, StackEnd::Complete);
    jit_sample.kernel_frames = vec![syscall + 0x10];
    let mut aggregator = Aggregator::new(AggregatorOptions::new(true));
    let now = SystemTime::now();
    aggregator.add(&table, &jit_sample);
    let first = aggregator.take_period(now, now);
    aggregator.add(&table, &jit_sample);
    let second = aggregator.take_period(now, now);
    running.kill();
    table.exit(pid, pid);

    let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
    let names = |symbolized: &SymbolizedProfile| -> Vec<String> {
        symbolized.stack_names(0).map(|n| n.to_string()).collect()
    };
    let first = symbolizer.symbolize(first);
    let first_names = names(&first);
    assert_eq!(
        first_names[first_names.len() - 3..],
        ["output_leaf", "output_jit_stub", "do_syscall_64"],
        "{first_names:?}"
    );
    // The map's content outlives its file.
    std::fs::remove_file(&perf_map).unwrap();
    let second = symbolizer.symbolize(second);
    assert_eq!(names(&second), first_names);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_of_another_mount_namespace_are_read_from_it() {
    let dir = scratch_dir("mntns");
    // The host sees `output_chain` at this path; the process, in its own
    // mount namespace, runs a different build over the same path.
    let host_binary = build_workload(&dir);
    let container_binary = build_workload_as(
        &dir.join("container_chain"),
        &[
            "-Doutput_hot=container_hot",
            "-Doutput_leaf=container_leaf",
            "-Doutput_middle=container_middle",
            "-Doutput_outer=container_outer",
        ],
    );
    let script = format!(
        "mount --bind {} {} && exec {}",
        container_binary.display(),
        host_binary.display(),
        host_binary.display()
    );
    let mut running = Running::spawn(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(script),
    );
    let pid = running.pid();
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();

    let elf = Elf::read(&container_binary);
    let at = |vaddr: u64| runtime_address(&table, pid, &host_binary, elf.file_offset(vaddr));
    let ret = |caller: &str, callee: &str| at(elf.return_addresses(caller, callee)[0]);
    let frames = vec![
        at(elf.function("container_hot").0 + 4),
        ret("container_leaf", "container_hot"),
        ret("container_middle", "container_leaf"),
        ret("container_outer", "container_middle"),
        ret("main", "container_outer"),
    ];
    let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
    aggregator.add(&table, &sample(pid, pid, 0, frames, StackEnd::Complete));
    running.kill();
    table.exit(pid, pid);

    let now = SystemTime::now();
    let period = aggregator.take_period(now, now);
    let file = &period.files[0];
    assert_eq!(Path::new(&file.path), host_binary.canonicalize().unwrap());
    let container_id = ddprof::files::read_build_id(container_binary.to_str().unwrap());
    assert_eq!(
        file.build_id, container_id,
        "the build id is the container's file's"
    );
    let symbolized = Symbolizer::new(SymbolizerOptions::default()).symbolize(period);
    let names: Vec<String> = symbolized.stack_names(0).map(|n| n.to_string()).collect();
    assert_eq!(
        names,
        [
            "main",
            "container_outer",
            "container_middle",
            "container_leaf",
            "container_hot"
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of the workload, started, whose file is deleted while it runs.
struct DeletedBinary {
    running: Running,
    binary: PathBuf,
    elf: Elf,
}

impl DeletedBinary {
    fn start(dir: &Path, name: &str) -> Self {
        let binary = build_workload_as(&dir.join(name), &[]);
        let elf = Elf::read(&binary);
        let running = Running::start(&binary);
        Self {
            running,
            binary,
            elf,
        }
    }

    fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// As when a package upgrade removes a running service's binary.
    fn delete(&self) {
        std::fs::remove_file(&self.binary).unwrap();
    }

    /// `output_middle → output_leaf → output_hot`, at the addresses of the
    /// mapping `path` names (the binary's path, marked deleted or not).
    fn frames(&self, table: &ProcessTable, path: &str) -> Vec<u64> {
        let mapping = table
            .get(self.pid())
            .unwrap()
            .mappings
            .iter()
            .find(|m| m.file.path == path)
            .cloned()
            .unwrap_or_else(|| panic!("no mapping of {path}"));
        let elf = &self.elf;
        let at = |vaddr: u64| mapping.start + elf.file_offset(vaddr) - mapping.file_offset;
        vec![
            at(elf.function("output_hot").0 + 4),
            at(elf.return_addresses("output_leaf", "output_hot")[0]),
            at(elf.return_addresses("output_middle", "output_leaf")[0]),
        ]
    }

    fn path(&self) -> String {
        self.binary.to_str().unwrap().to_string()
    }
}

/// The stacks of a symbolized period, outermost first.
fn symbolized_stacks(symbolized: &SymbolizedProfile) -> Vec<Vec<String>> {
    (0..symbolized.period.stacks.len() as u32)
        .map(|stack| {
            symbolized
                .stack_names(stack)
                .map(|n| n.to_string())
                .collect()
        })
        .collect()
}

const DELETED_STACK: [&str; 4] = ["[truncated]", "output_middle", "output_leaf", "output_hot"];

/// Binaries deleted while their process runs, symbolized after the
/// process exited, in the three ways the profiler learns of them: the
/// process table as the exec's mmap records give it (the path as it was,
/// no mark), first sampled before or after the deletion, and as
/// `/proc/PID/maps` gives it after the deletion (` (deleted)` mark).
#[test]
fn binaries_deleted_while_running_are_still_symbolized() {
    let dir = scratch_dir("deleted");
    let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
    let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
    let end = StackEnd::NoUnwindInfo;

    // Sampled before and after the deletion.
    let mut before = DeletedBinary::start(&dir, "deleted_after_sampled");
    let mut table = ProcessTable::new();
    table.load_from_proc(before.pid()).unwrap();
    let frames = before.frames(&table, &before.path());
    aggregator.add(
        &table,
        &sample(before.pid(), before.pid(), 0, frames.clone(), end),
    );
    before.delete();
    aggregator.add(&table, &sample(before.pid(), before.pid(), 1, frames, end));
    // First sampled after the deletion, under the path it was mapped by.
    let mut after = DeletedBinary::start(&dir, "deleted_before_sampled");
    table.load_from_proc(after.pid()).unwrap();
    after.delete();
    let frames = after.frames(&table, &after.path());
    aggregator.add(&table, &sample(after.pid(), after.pid(), 2, frames, end));
    // Read from /proc after the deletion.
    let mut marked = DeletedBinary::start(&dir, "deleted_before_read");
    marked.delete();
    table.load_from_proc(marked.pid()).unwrap();
    let frames = marked.frames(&table, &format!("{} (deleted)", marked.path()));
    aggregator.add(&table, &sample(marked.pid(), marked.pid(), 3, frames, end));
    // Every process is gone before the period is symbolized.
    for running in [&mut before, &mut after, &mut marked] {
        running.running.kill();
        table.exit(running.pid(), running.pid());
    }
    let now = SystemTime::now();
    let period = aggregator.take_period(now, now);
    let mut paths: Vec<&str> = period.files.iter().map(|f| f.path.as_str()).collect();
    paths.sort();
    let mut expected = [before.path(), after.path(), marked.path()];
    expected.sort();
    assert_eq!(paths, expected, "files are named without the deleted mark");
    let symbolized = symbolizer.symbolize(period);
    let stacks = symbolized_stacks(&symbolized);
    assert_eq!(stacks.len(), 3, "{stacks:?}");
    for stack in &stacks {
        assert_eq!(stack, &DELETED_STACK, "{stacks:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file unused for a whole period is let go, and held again, through the
/// process's mapping, when the process uses it again after its deletion.
#[test]
fn deleted_binaries_are_held_again_when_used_again() {
    let dir = scratch_dir("deleted-again");
    let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
    let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
    let end = StackEnd::NoUnwindInfo;
    let mut running = DeletedBinary::start(&dir, "deleted_in_idle_period");
    let pid = running.pid();
    let mut table = ProcessTable::new();
    table.load_from_proc(pid).unwrap();
    let frames = running.frames(&table, &running.path());
    let take = |aggregator: &mut Aggregator| {
        let now = SystemTime::now();
        aggregator.take_period(now, now)
    };

    aggregator.add(&table, &sample(pid, pid, 0, frames.clone(), end));
    let first = take(&mut aggregator);
    assert!(first.files[0].is_held());
    let first_path = first.files[0].open_path.clone();
    assert_eq!(
        symbolized_stacks(&symbolizer.symbolize(first)),
        [DELETED_STACK]
    );
    // A period without samples of the file lets it go.
    let idle = take(&mut aggregator);
    assert!(
        idle.files[0].is_held(),
        "still held for the period that used it"
    );
    symbolizer.symbolize(idle);
    let let_go = take(&mut aggregator);
    assert!(!let_go.files[0].is_held());
    symbolizer.symbolize(let_go);

    running.delete();
    aggregator.add(&table, &sample(pid, pid, 1, frames, end));
    running.running.kill();
    table.exit(pid, pid);
    let again = take(&mut aggregator);
    assert!(
        again.files[0].is_held(),
        "held again through /proc/{pid}/map_files"
    );
    eprintln!(
        "read through {first_path}, then {}",
        again.files[0].open_path
    );
    // A symbolizer that has not read the file yet: it must read it now.
    let mut fresh = Symbolizer::new(SymbolizerOptions::default());
    assert_eq!(symbolized_stacks(&fresh.symbolize(again)), [DELETED_STACK]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Names of the symbols a file defines (`.symtab` and `.dynsym`), as
/// `nm --defined-only` lists them: the names its frames can have.
fn symbol_names(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data).unwrap();
    let mut names: Vec<String> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|symbol| symbol.is_definition())
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What a readable name must not keep of Rust's legacy mangling: its
/// escapes and its `::h<16 hex digits>` hash.
fn rust_mangling_left(name: &str) -> bool {
    let hash = name
        .rsplit_once("::h")
        .is_some_and(|(_, tail)| tail.len() == 16 && tail.bytes().all(|b| b.is_ascii_hexdigit()));
    hash || ["$LT$", "$GT$", "$u20$", "$C$", "$RF$", "$u7b$"]
        .iter()
        .any(|escape| name.contains(escape))
}

/// A Rust release binary of this machine: the toolchain's `rustfmt` (v0
/// mangling), and the release binaries of this workspace and workload
/// (legacy, and v0 for the standard library); C++ from the workload and
/// libstdc++.
#[test]
fn demangles_every_symbol_of_real_rust_and_cpp_binaries() {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let libstdcxx = Command::new("c++")
        .arg("-print-file-name=libstdc++.so.6")
        .output()
        .expect("c++ runs");
    let libstdcxx = PathBuf::from(String::from_utf8_lossy(&libstdcxx.stdout).trim());
    let binaries = [
        sysroot.join("bin/rustfmt"),
        ddprof_tests::ddprof_bin().to_path_buf(),
        ddprof_tests::workloads::build_workload("chain.rs"),
        ddprof_tests::workloads::build_workload("chain.cpp"),
        libstdcxx,
    ];
    for binary in &binaries {
        let names = symbol_names(binary);
        let (mut rust, mut cpp, mut cpp_kept) = (0usize, 0usize, Vec::<String>::new());
        for name in &names {
            let demangled = ddprof::symbolize::demangle(name);
            let is_rust = rustc_demangle_accepts(name);
            if is_rust {
                rust += 1;
                assert!(
                    !rust_mangling_left(&demangled) && demangled != *name,
                    "{}: {name} demangled to {demangled}",
                    binary.display()
                );
            } else if name.starts_with("_Z") {
                cpp += 1;
                assert!(
                    !rust_mangling_left(&demangled),
                    "{}: {name} demangled to {demangled}",
                    binary.display()
                );
                if demangled == *name {
                    cpp_kept.push(name.clone());
                }
            }
        }
        eprintln!(
            "{}: {} symbols, {rust} Rust and {} C++ demangled, {} C++ kept mangled {:?}",
            binary.display(),
            names.len(),
            cpp - cpp_kept.len(),
            cpp_kept.len(),
            &cpp_kept[..cpp_kept.len().min(3)]
        );
        assert!(
            rust + cpp >= 5,
            "{}: too few mangled names",
            binary.display()
        );
        assert!(
            cpp_kept.len() * 1000 <= cpp,
            "{}: C++ names left mangled: {cpp_kept:?}",
            binary.display()
        );
    }
}

/// Whether `name` is a Rust symbol: legacy (`_ZN…17h<hash>E`, with an
/// optional `.llvm.` suffix) or v0 (`_R`).
fn rustc_demangle_accepts(name: &str) -> bool {
    if name.starts_with("_R") {
        return true;
    }
    let path = name.split(".llvm.").next().unwrap_or(name);
    path.starts_with("_ZN")
        && path.len() > 20
        && path.ends_with('E')
        && path.is_char_boundary(path.len() - 20)
        && path[path.len() - 20..].starts_with("17h")
        && path[path.len() - 17..path.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// Every function of real Rust release binaries, symbolized as profiles
/// are (blazesym's DWARF and ELF symbols, then demangling), has a readable
/// name: this workspace's ddprof (legacy mangling, line-tables-only DWARF)
/// and the toolchain's rustfmt (v0 mangling).
#[test]
fn rust_functions_are_symbolized_with_readable_names() {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    for binary in [
        ddprof_tests::ddprof_bin().to_path_buf(),
        sysroot.join("bin/rustfmt"),
    ] {
        let binary = binary.canonicalize().unwrap();
        let data = std::fs::read(&binary).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        // Mapped as the kernel would map it, at an arbitrary base.
        const BASE: u64 = 0x5500_0000_0000;
        let pid = std::process::id();
        let mut table = ProcessTable::new();
        let metadata = std::fs::metadata(&binary).unwrap();
        let mut code = Vec::new();
        for segment in elf.segments() {
            let executable = matches!(
                segment.flags(),
                object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0
            );
            if !executable {
                continue;
            }
            let (offset, size) = segment.file_range();
            code.push((segment.address(), segment.address() + size, offset));
            table.add_mapping(&ddprof::process::MappingRecord {
                pid,
                start: BASE + segment.address(),
                len: size,
                file_offset: offset,
                dev: std::os::unix::fs::MetadataExt::dev(&metadata),
                inode: std::os::unix::fs::MetadataExt::ino(&metadata),
                prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
                path: binary.to_string_lossy().into_owned(),
            });
        }
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let mut functions = 0;
        // File offset → the names of the symbols starting there.
        let mut symbols_at: std::collections::HashMap<u64, Vec<String>> = Default::default();
        for symbol in elf.symbols() {
            let address = symbol.address();
            let in_code = code
                .iter()
                .find(|(start, end, _)| (*start..*end).contains(&address));
            let (Some((start, _, offset)), Ok(name)) = (in_code, symbol.name()) else {
                continue;
            };
            if symbol.kind() != object::SymbolKind::Text || symbol.size() == 0 {
                continue;
            }
            functions += 1;
            symbols_at
                .entry(address - start + offset)
                .or_default()
                .push(name.to_string());
            let frames = vec![BASE + address];
            aggregator.add(
                &table,
                &sample(pid, pid, functions, frames, StackEnd::Complete),
            );
        }
        let now = SystemTime::now();
        let symbolized = Symbolizer::new(SymbolizerOptions::default())
            .symbolize(aggregator.take_period(now, now));
        let mut unreadable = Vec::new();
        let mut rust_functions = 0;
        for (frame, lines) in symbolized.period.frames.iter().zip(&symbolized.frames) {
            let ddprof::aggregate::Frame::File { offset, .. } = frame else {
                panic!("{frame:?} is not in the binary");
            };
            let name = &*lines.last().unwrap().function;
            // A Rust function's name is a path (`crate::module::function`,
            // `<Type as Trait>::method`): DWARF's bare names are qualified.
            let rust = symbols_at[offset].iter().all(|s| rustc_demangle_accepts(s));
            rust_functions += usize::from(rust);
            if rust_mangling_left(name)
                || name.starts_with("_ZN")
                || name.starts_with("_R")
                || name.starts_with('[')
                || (rust && !name.contains("::"))
            {
                unreadable.push((symbols_at[offset][0].clone(), name.to_string()));
            }
        }
        eprintln!(
            "{}: {functions} functions, {} frames ({rust_functions} Rust), {} unreadable {:?}",
            binary.display(),
            symbolized.frames.len(),
            unreadable.len(),
            &unreadable[..unreadable.len().min(5)]
        );
        assert!(
            functions > 1000,
            "{}: {functions} functions",
            binary.display()
        );
        assert!(
            unreadable.is_empty(),
            "{}: {unreadable:?}",
            binary.display()
        );
    }
}
