//! Hostile and broken inputs: a bounded mutation fuzzer over the unwind-table
//! compiler and the ELF/symbol reading path, seeded with this machine's own
//! libraries, and a binary whose `.eh_frame` is garbage, profiled by both
//! engines.
//!
//! The fuzzer is deterministic (`DDPROF_FUZZ_SEED`, default fixed) and
//! bounded (`DDPROF_FUZZ_ITERATIONS` mutated files, default 4000, about
//! half a minute); a failure prints the seed and iteration that reproduce it.
//! Longer runs: `DDPROF_FUZZ_ITERATIONS=100000 cargo test --release -p
//! ddprof-tests --test hostile_inputs -- --nocapture fuzz`.
use ddprof::symbolize::{Symbolizer, SymbolizerOptions};
use ddprof::unwind::compile_elf;
use ddprof_tests::workloads::build_workload;
use object::{Object, ObjectSection};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// xorshift64*: reproducible from its seed, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            0
        } else {
            (self.next() % bound as u64) as usize
        }
    }
}

/// A seed file and the byte ranges worth mutating (the parts the parsers
/// read: headers, CFI, symbol and string tables, notes, DWARF).
struct Seed {
    name: String,
    bytes: Vec<u8>,
    regions: Vec<(String, std::ops::Range<usize>)>,
    /// File offsets inside executable code, to symbolize.
    code_offsets: Vec<u64>,
}

const INTERESTING_SECTIONS: &[&str] = &[
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".symtab",
    ".strtab",
    ".dynsym",
    ".dynstr",
    ".gnu_debuglink",
    ".note.gnu.build-id",
    ".gnu.hash",
    ".debug_info",
    ".debug_abbrev",
    ".debug_line",
    ".debug_str",
    ".debug_line_str",
    ".debug_ranges",
    ".debug_rnglists",
    ".debug_aranges",
    ".plt",
    ".plt.sec",
    ".plt.got",
];

fn seed(path: &Path) -> Option<Seed> {
    let bytes = std::fs::read(path).ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let mut regions = vec![("ELF header".to_string(), 0..64)];
    // Program and section header tables, from the ELF header.
    let field = |at: usize, size: usize| -> usize {
        let mut value = 0u64;
        for (i, byte) in bytes[at..at + size].iter().enumerate() {
            value |= u64::from(*byte) << (8 * i);
        }
        value as usize
    };
    let (phoff, phnum) = (field(0x20, 8), field(0x38, 2));
    let (shoff, shnum) = (field(0x28, 8), field(0x3c, 2));
    regions.push(("program headers".into(), phoff..phoff + phnum * 56));
    regions.push(("section headers".into(), shoff..shoff + shnum * 64));
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        if !INTERESTING_SECTIONS.contains(&name) {
            continue;
        }
        if let Some((offset, size)) = section.file_range() {
            if size > 0 {
                regions.push((name.to_string(), offset as usize..(offset + size) as usize));
            }
        }
    }
    regions.retain(|(_, range)| range.end <= bytes.len() && !range.is_empty());
    let code_offsets: Vec<u64> = file
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n == ".text"))
        .filter_map(|s| s.file_range())
        .flat_map(|(offset, size)| (0..64).map(move |i| offset + size * i / 64))
        .collect();
    Some(Seed {
        name: path.display().to_string(),
        bytes,
        regions,
        code_offsets,
    })
}

/// This machine's libraries and programs (each a few MiB at most), and
/// workloads built by this machine's C and Rust compilers with full DWARF.
fn seeds() -> Vec<Seed> {
    let mut paths: Vec<PathBuf> = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/lib/x86_64-linux-gnu/liblzma.so.5",
        "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/usr/bin/xz",
        "/usr/bin/dd",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|path| path.exists())
    .collect();
    paths.push(build_workload("chain.c"));
    paths.push(build_workload("chain.cpp"));
    paths.push(build_workload("chain.rs"));
    let seeds: Vec<Seed> = paths.iter().filter_map(|path| seed(path)).collect();
    assert!(
        seeds.len() >= 5,
        "too few seed files found: {:?}",
        seeds.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    seeds
}

/// Mutates a copy of `seed`, describing what it did (for reproduction).
fn mutate(seed: &Seed, rng: &mut Rng) -> (Vec<u8>, String) {
    let mut bytes = seed.bytes.clone();
    let mut what = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let (region_name, region) = &seed.regions[rng.below(seed.regions.len())];
        let region = region.clone();
        let len = region.len();
        let at = region.start + rng.below(len);
        match rng.below(7) {
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let at = region.start + rng.below(len);
                    bytes[at] ^= 1 << rng.below(8);
                }
                what.push(format!("bit flips in {region_name}"));
            }
            1 | 2 => {
                // A value a length, count, offset or encoding field would
                // choke on, at any alignment.
                const VALUES: &[u64] = &[
                    0,
                    1,
                    0x7f,
                    0x80,
                    0xff,
                    0xffff,
                    0xffff_fffe,
                    0xffff_ffff,
                    0x8000_0000,
                    u64::MAX,
                    0x7fff_ffff_ffff_ffff,
                ];
                let value = VALUES[rng.below(VALUES.len())];
                let width = [1, 2, 4, 8][rng.below(4)];
                for (i, byte) in value.to_le_bytes()[..width].iter().enumerate() {
                    if at + i < region.end {
                        bytes[at + i] = *byte;
                    }
                }
                what.push(format!(
                    "{width}-byte {value:#x} at {at:#x} in {region_name}"
                ));
            }
            3 => {
                let end = (at + 1 + rng.below(256)).min(region.end);
                for byte in &mut bytes[at..end] {
                    *byte = rng.next() as u8;
                }
                what.push(format!("garbage {at:#x}..{end:#x} in {region_name}"));
            }
            4 => {
                // A chunk of the region copied elsewhere in it: well-formed
                // records in the wrong place (overlaps, loops, bad links).
                let from = region.start + rng.below(len);
                let count = (1 + rng.below(128)).min(region.end - from.max(at));
                bytes.copy_within(from..from + count, at);
                what.push(format!(
                    "{count} bytes {from:#x} -> {at:#x} in {region_name}"
                ));
            }
            5 => {
                let end = (at + 1 + rng.below(64)).min(region.end);
                bytes[at..end].fill(0);
                what.push(format!("zeroed {at:#x}..{end:#x} in {region_name}"));
            }
            _ => {
                // A file truncated at a random place of the region (a file
                // being written, or cut by a full disk).
                bytes.truncate(at);
                what.push(format!("truncated at {at:#x} in {region_name}"));
                break;
            }
        }
    }
    (bytes, what.join("; "))
}

#[derive(Default, Debug)]
struct Outcomes {
    executions: u64,
    compiled: u64,
    compile_errors: BTreeMap<String, u64>,
    rows: u64,
    symbolized_named: u64,
    symbolized_unnamed: u64,
    panics: Vec<String>,
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

thread_local! {
    /// This thread's panics are expected (a fuzzer's parsers), and caught.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keeps the messages of this thread's panics off the output while it
/// lives. The hook is the process's, and the tests of this file run on
/// threads of one process: a silent hook set for a fuzzer (as it was)
/// also silenced a failing assertion of the test running beside it, whose
/// failure then came without a word.
struct QuietPanics;

impl QuietPanics {
    fn on_this_thread() -> Self {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            let default_hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !QUIET.with(std::cell::Cell::get) {
                    default_hook(info);
                }
            }));
        });
        QUIET.with(|quiet| quiet.set(true));
        QuietPanics
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        QUIET.with(|quiet| quiet.set(false));
    }
}

#[test]
fn fuzz_the_table_compiler_and_symbol_reader_with_mutated_system_libraries() {
    let seeds = seeds();
    let iterations = env_number("DDPROF_FUZZ_ITERATIONS", 4000);
    let fuzz_seed = env_number("DDPROF_FUZZ_SEED", 0x00dd_f00d_5eed);
    let mut rng = Rng(fuzz_seed | 1);
    let scratch = std::env::temp_dir().join(format!("ddprof-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let file = scratch.join("mutated.so");

    // A loop or a quadratic blow-up in a parser is a failure too: a watchdog
    // aborts the run, naming the input, when one iteration takes too long.
    let current = Arc::new(AtomicU64::new(u64::MAX));
    let started = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    {
        let (current, started) = (current.clone(), started.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let iteration = current.load(Ordering::SeqCst);
            let since = epoch.elapsed().as_millis() as u64 - started.load(Ordering::SeqCst);
            if iteration != u64::MAX && since > 20_000 {
                eprintln!(
                    "iteration {iteration} (DDPROF_FUZZ_SEED={fuzz_seed}) ran for {since} ms: \
                     a parser loops or blows up"
                );
                std::process::abort();
            }
        });
    }
    // Panics are caught and counted; keep their messages off the output.
    let _quiet = QuietPanics::on_this_thread();

    let mut outcomes = Outcomes::default();
    let began = Instant::now();
    for iteration in 0..iterations {
        let seed = &seeds[rng.below(seeds.len())];
        let (bytes, mutation) = mutate(seed, &mut rng);
        let offsets: Vec<u64> = (0..8)
            .map(|_| seed.code_offsets[rng.below(seed.code_offsets.len())])
            .collect();
        started.store(epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        current.store(iteration, Ordering::SeqCst);
        let describe = || format!("iteration {iteration} ({}: {mutation})", seed.name);

        outcomes.executions += 1;
        match catch_unwind(|| compile_elf(&bytes[..], None)) {
            Ok(Ok(table)) => {
                outcomes.compiled += 1;
                outcomes.rows += table.rows.len() as u64;
                // What the compiler promises the unwinders: sorted rows with
                // non-empty ranges, whatever the input.
                let sorted = table.rows.windows(2).all(|w| w[0].start < w[1].start);
                if !sorted {
                    outcomes
                        .panics
                        .push(format!("{}: rows not sorted", describe()));
                }
                for &offset in &offsets {
                    let _ = table.row_for(offset);
                }
            }
            Ok(Err(error)) => {
                let kind = format!("{error}");
                let kind = kind.split(':').next().unwrap_or_default().to_string();
                *outcomes.compile_errors.entry(kind).or_default() += 1;
            }
            Err(panic) => outcomes.panics.push(format!(
                "{}: compile_elf panicked: {}",
                describe(),
                message(&panic)
            )),
        }

        // The symbol path reads the file from disk, as the profiler does.
        std::fs::write(&file, &bytes).unwrap();
        let path = file.to_str().unwrap();
        outcomes.executions += 1;
        let read = catch_unwind(AssertUnwindSafe(|| {
            let _ = ddprof::files::read_build_id(path);
            let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
            symbolizer.symbolize_file_offsets(path, &offsets)
        }));
        match read {
            Ok(frames) => {
                assert_eq!(frames.len(), offsets.len(), "{}", describe());
                for symbols in frames {
                    if symbols[0].function.starts_with('[') {
                        outcomes.symbolized_unnamed += 1;
                    } else {
                        outcomes.symbolized_named += 1;
                    }
                }
            }
            Err(panic) => outcomes.panics.push(format!(
                "{}: symbolization panicked: {}",
                describe(),
                message(&panic)
            )),
        }
    }
    current.store(u64::MAX, Ordering::SeqCst);
    let _ = std::fs::remove_dir_all(&scratch);

    eprintln!(
        "fuzz: seed {fuzz_seed:#x}, {} mutated files from {} seeds, {} executions in {:.1} s: \
         {} tables ({} rows), compile errors {:?}, frames named {} / unnamed {}, {} failures",
        iterations,
        seeds.len(),
        outcomes.executions,
        began.elapsed().as_secs_f64(),
        outcomes.compiled,
        outcomes.rows,
        outcomes.compile_errors,
        outcomes.symbolized_named,
        outcomes.symbolized_unnamed,
        outcomes.panics.len(),
    );
    assert!(
        outcomes.panics.is_empty(),
        "{} of {} inputs broke a parser; the first ones:\n{}",
        outcomes.panics.len(),
        iterations,
        outcomes.panics[..outcomes.panics.len().min(10)].join("\n")
    );
    // The mutations must reach both sides of the parsers, or the run proves
    // nothing: most files still compile and name functions, some do not.
    if iterations >= 200 {
        assert!(outcomes.compiled > iterations / 4, "{outcomes:?}");
        assert!(!outcomes.compile_errors.is_empty(), "{outcomes:?}");
        assert!(outcomes.symbolized_named > 0, "{outcomes:?}");
        assert!(outcomes.symbolized_unnamed > 0, "{outcomes:?}");
    }
}

/// The debug cache's writer reads the same kind of files (split debug files
/// with compressed sections) and writes a new ELF file from them: mutated
/// ones must give an error or a copy `object` reads, never a panic, a
/// loop, or a partial file left in the cache.
#[test]
fn fuzz_the_debug_copy_writer_with_mutated_compressed_debug_files() {
    let binary = build_workload("chain.c");
    let build_id = ddprof::files::read_build_id(binary.to_str().unwrap()).unwrap();
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let relative = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    let scratch = std::env::temp_dir().join(format!("ddprof-fuzz-copy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let debug_dir = scratch.join("debug");
    let installed = debug_dir.join(&relative);
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    let seeds: Vec<Seed> = ["zlib", "zstd"]
        .iter()
        .map(|format| {
            let path = scratch.join(format!("chain.{format}.debug"));
            let status = std::process::Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(format!("--compress-debug-sections={format}"))
                .arg(&binary)
                .arg(&path)
                .status()
                .unwrap();
            assert!(status.success(), "objcopy {format}");
            seed(&path).unwrap()
        })
        .collect();
    let iterations = env_number("DDPROF_FUZZ_ITERATIONS", 4000) / 8;
    let fuzz_seed = env_number("DDPROF_FUZZ_SEED", 0x00dd_f00d_5eed);
    let mut rng = Rng(fuzz_seed | 1);
    let _quiet = QuietPanics::on_this_thread();
    let (mut copies, mut uncompressed) = (0, 0);
    let (mut errors, mut failures) = (BTreeMap::<String, u64>::new(), Vec::new());
    for iteration in 0..iterations {
        let seed = &seeds[rng.below(seeds.len())];
        let (bytes, mutation) = mutate(seed, &mut rng);
        std::fs::write(&installed, &bytes).unwrap();
        let cache_dir = scratch.join(format!("cache-{iteration}"));
        let cache = ddprof::symbolize::DebugCache::new(cache_dir.clone());
        let describe = || format!("iteration {iteration} ({}: {mutation})", seed.name);
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            cache.copy_for(
                binary.to_str().unwrap(),
                &build_id,
                std::slice::from_ref(&debug_dir),
            )
        }));
        if started.elapsed() > Duration::from_secs(5) {
            failures.push(format!("{}: took {:?}", describe(), started.elapsed()));
        }
        match outcome {
            Ok(Ok(Some(copy))) => {
                copies += 1;
                let written = std::fs::read(&copy.path).unwrap();
                if let Err(error) = object::File::parse(&*written) {
                    failures.push(format!("{}: the copy does not parse: {error}", describe()));
                }
            }
            Ok(Ok(None)) => uncompressed += 1,
            // A damaged original must not be taken for a cache directory
            // that cannot be written (that turns the cache off for the run).
            Ok(Err(ddprof::symbolize::DebugCacheError::Io { path, source }))
                if path.starts_with(&cache_dir) =>
            {
                failures.push(format!(
                    "{}: blamed the cache: {path:?}: {source}",
                    describe()
                ));
            }
            Ok(Err(error)) => {
                let kind = error.to_string();
                let kind = kind.rsplit(": ").next().unwrap_or_default();
                let kind: String = kind.split(' ').take(4).collect::<Vec<_>>().join(" ");
                let kind = kind.replace(|c: char| c.is_ascii_digit(), "");
                *errors.entry(kind).or_default() += 1;
            }
            Err(panic) => failures.push(format!("{}: panicked: {}", describe(), message(&panic))),
        }
        let partial: Vec<_> = std::fs::read_dir(cache_dir.join(&relative).parent().unwrap())
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.to_string_lossy().ends_with(".partial"))
                    .collect()
            })
            .unwrap_or_default();
        if !partial.is_empty() {
            failures.push(format!("{}: left {partial:?}", describe()));
        }
        let _ = std::fs::remove_dir_all(&cache_dir);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "fuzz: seed {fuzz_seed:#x}, {iterations} mutated debug files: {copies} copies, \
         {uncompressed} with nothing compressed, errors {errors:?}, {} failures",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {iterations} inputs broke the copy writer; the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    // Both sides reached: some mutated files still get a copy (a fifth of
    // them with the default seed), most do not.
    assert!(copies > iterations / 10, "{copies} copies, {errors:?}");
    assert!(!errors.is_empty(), "{copies} copies, no error");
}

fn message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-text panic)".into())
}

/// A copy of the chain workload whose `.eh_frame` (and its index) is
/// overwritten with random bytes: a file whose CFI is garbage.
fn chain_with_garbage_cfi(dir: &Path) -> PathBuf {
    let chain = build_workload("chain.c");
    let mut bytes = std::fs::read(&chain).unwrap();
    let ranges: Vec<(u64, u64)> = {
        let file = object::File::parse(&*bytes).unwrap();
        [".eh_frame", ".eh_frame_hdr"]
            .iter()
            .filter_map(|name| file.section_by_name(name)?.file_range())
            .collect()
    };
    assert_eq!(ranges.len(), 2, "chain has .eh_frame and .eh_frame_hdr");
    let mut rng = Rng(0x6a7b_a6e5);
    for (offset, size) in ranges {
        for byte in &mut bytes[offset as usize..(offset + size) as usize] {
            *byte = rng.next() as u8;
        }
    }
    let path = dir.join("chain-garbage-cfi");
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[test]
fn the_bpf_engine_profiles_a_binary_whose_eh_frame_is_garbage() {
    profiles_a_binary_whose_eh_frame_is_garbage("bpf");
}

#[test]
fn the_perf_engine_profiles_a_binary_whose_eh_frame_is_garbage() {
    profiles_a_binary_whose_eh_frame_is_garbage("perf");
}

fn profiles_a_binary_whose_eh_frame_is_garbage(engine: &str) {
    let dir = std::env::temp_dir().join(format!(
        "ddprof-garbage-cfi-{engine}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let program = chain_with_garbage_cfi(&dir);
    let out = dir.join("out");
    // The copy keeps chain's build id: its garbage tables must not reach
    // the shared cache, where the real chain of every later test (and run
    // of this build) would find them under that build id.
    let cache = dir.join("cache");
    let output = ddprof_tests::ddprof_command()
        .args([
            "-l",
            "notice",
            "--engine",
            engine,
            "-e",
            "sCPU freq=999",
            "--output",
        ])
        .arg(&out)
        .arg("--debug-cache")
        .arg(&cache)
        .arg("--")
        .arg(&program)
        .arg("1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    // The command ran to its end, with its own status, and the profiler
    // neither crashed nor lost the run's samples.
    assert!(
        output.status.success(),
        "{engine}: {:?}\n{stderr}",
        output.status
    );
    assert!(!stderr.contains("panicked"), "{engine}:\n{stderr}");
    let summary = ddprof_tests::outputs::summary_fields(&stderr);
    // The samples due are those of the CPU time the command got (1 s of
    // wall time: ~1,000 on a quiet machine, fewer on a busy one).
    let due = summary["target_cpu_ms"] * 999 / 1000;
    assert!(
        due >= 300 && summary["samples"] * 100 >= due * 90,
        "{engine}: {due} samples due at 999 Hz, {summary:?}:\n{stderr}"
    );
    // Samples lost to a full ring buffer (a busy machine) are counted, not
    // hidden; the garbage must not add to them.
    assert!(
        summary["lost"] * 20 <= summary["samples"],
        "{engine}: {summary:?}"
    );
    // Every sample is in the profile, its leaf named from the intact
    // symbol table; how far each stack goes depends on what the garbage
    // happens to say (frame pointers are absent: -fomit-frame-pointer).
    let folded = std::fs::read_to_string(out.join("stacks.folded")).unwrap();
    let mut total = 0;
    let mut in_chain = 0;
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        total += count;
        let leaf = stack.rsplit(';').next().unwrap();
        if leaf.starts_with("chain_leaf_") {
            in_chain += count;
        }
    }
    assert_eq!(total, summary["samples"], "{engine}:\n{folded}");
    assert!(
        in_chain * 10 >= total * 9,
        "{engine}: {in_chain} of {total}:\n{folded}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
