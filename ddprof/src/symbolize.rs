//! Symbolization of normalized addresses with blazesym.
//!
//! Frames arrive normalized to (file, file offset) by the aggregator, so the
//! processes that produced them need not exist anymore. Parsed files stay
//! cached in blazesym and resolved addresses stay cached here across
//! periods; files unused for a while are evicted. Failure is never fatal: a
//! frame that cannot be resolved is named after its mapping, or `[unknown]`.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized};
use blazesym::MaybeDefault;

use crate::aggregate::{FileId, Frame, ObjectFile, PeriodProfile};

/// Files not referenced for this many periods are dropped from the caches.
const EVICT_AFTER_PERIODS: u64 = 10;
/// Resolved addresses kept across periods (all files together); the address
/// caches are cleared when they grow past this.
const MAX_CACHED_ADDRESSES: usize = 1_000_000;

/// Name of a frame outside every known mapping.
pub const UNKNOWN: &str = "[unknown]";
/// Name of the outermost frame of a stack that did not reach its root.
pub const TRUNCATED: &str = "[truncated]";
/// Name of the frame counted instead of a stack once the stack table is full.
pub const STACK_TABLE_FULL: &str = "[stack table full]";
/// Name of kernel frames that cannot be resolved.
pub const KERNEL: &str = "[kernel]";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolizerOptions {
    /// Report inlined functions as frames of their own (`-I`).
    pub inlined_functions: bool,
    /// Directories searched for split debug information, by build id
    /// (`DIR/.build-id/xx/rest.debug`) and by `.gnu_debuglink` name.
    pub debug_dirs: Vec<PathBuf>,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        Self {
            inlined_functions: false,
            debug_dirs: vec!["/usr/lib/debug".into(), "/lib/debug".into()],
        }
    }
}

/// One function of a frame: the frame's own function, or one inlined into it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymbolLine {
    /// Demangled name.
    pub function: Arc<str>,
    /// Name as found in the binary (mangled).
    pub system_name: Arc<str>,
    /// Source file ("" when unknown).
    pub file: Arc<str>,
    /// Source line (0 when unknown).
    pub line: u32,
}

/// The functions at one frame, innermost first (inlined functions before the
/// function they were inlined into); never empty.
pub type FrameSymbols = Arc<[SymbolLine]>;

/// A period with a symbol for each of its frames.
#[derive(Debug, Clone)]
pub struct SymbolizedProfile {
    pub period: PeriodProfile,
    /// Parallel to `period.frames`.
    pub frames: Vec<FrameSymbols>,
}

impl SymbolizedProfile {
    /// Function names of a stack, outermost first, inlined functions
    /// expanded (for folded stacks).
    pub fn stack_names(&self, stack: u32) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.period.stacks[stack as usize]
            .iter()
            .rev()
            .flat_map(|&frame| self.frames[frame as usize].iter().rev())
            .map(|line| &line.function)
    }
}

#[derive(Debug, Default)]
struct FileCache {
    /// The path blazesym opened (and caches the parsed file under).
    open_path: String,
    last_period: u64,
    addresses: HashMap<u64, FrameSymbols>,
}

/// Perf map of one process (`/tmp/perf-PID.map`), as last read.
#[derive(Debug, Default)]
struct PerfMap {
    /// Length and modification time of the file read, to notice updates.
    version: Option<(u64, std::time::SystemTime)>,
    /// (start, size, name), sorted by start.
    entries: Vec<(u64, u64, Arc<str>)>,
    last_period: u64,
}

impl PerfMap {
    fn lookup(&self, addr: u64) -> Option<&Arc<str>> {
        let index = self.entries.partition_point(|(start, _, _)| *start <= addr);
        // Entries can overlap when a JIT reuses memory: the latest start at or
        // below the address that still covers it wins.
        self.entries[..index]
            .iter()
            .rev()
            .take(8)
            .find(|(start, size, _)| addr < start.saturating_add(*size))
            .map(|(_, _, name)| name)
    }
}

/// Parses perf map text: `START SIZE NAME` per line, hexadecimal numbers.
fn parse_perf_map(text: &str) -> Vec<(u64, u64, Arc<str>)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut entries: Vec<(u64, u64, Arc<str>)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.trim().splitn(3, ' ');
            let start = hex(fields.next()?)?;
            let size = hex(fields.next()?)?;
            let name = fields.next()?.trim();
            (!name.is_empty()).then(|| (start, size, Arc::from(name)))
        })
        .collect();
    entries.sort_by_key(|(start, _, _)| *start);
    entries
}

/// Turns normalized frames into functions, files and lines.
///
/// Not `Send` (blazesym's caches use `Rc`): create it on the thread that
/// symbolizes, and keep it for the whole run so its caches pay off.
pub struct Symbolizer {
    blazesym: blazesym::symbolize::Symbolizer,
    /// `-I`: report inlined functions as frames of their own.
    inlined_functions: bool,
    files: HashMap<(String, u64, u64), FileCache>,
    cached_addresses: usize,
    perf_maps: HashMap<u32, PerfMap>,
    kernel: HashMap<u64, FrameSymbols>,
    strings: HashSet<Arc<str>>,
    period_number: u64,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("files", &self.files.len())
            .field("cached_addresses", &self.cached_addresses)
            .finish_non_exhaustive()
    }
}

impl Symbolizer {
    pub fn new(options: SymbolizerOptions) -> Self {
        let blazesym = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            // Always on: with inlined functions known, a frame's own
            // file:line is its call site in its own function, not a line of
            // whatever was inlined at that address (which `-I` shows as
            // frames of their own).
            .enable_inlined_fns(true)
            // Demangled here, to keep the mangled name as the system name.
            .enable_demangling(false)
            // Files are identified by (path, device, inode) here; a file
            // replaced on disk is a new file with its own cache entry.
            .enable_auto_reload(false)
            .set_debug_dirs(Some(&options.debug_dirs))
            .build();
        Self {
            blazesym,
            inlined_functions: options.inlined_functions,
            files: HashMap::new(),
            cached_addresses: 0,
            perf_maps: HashMap::new(),
            kernel: HashMap::new(),
            strings: HashSet::new(),
            period_number: 0,
        }
    }

    /// Symbolizes every frame of the period.
    pub fn symbolize(&mut self, period: PeriodProfile) -> SymbolizedProfile {
        self.period_number += 1;
        if self.cached_addresses > MAX_CACHED_ADDRESSES {
            for cache in self.files.values_mut() {
                cache.addresses.clear();
            }
            self.kernel.clear();
            self.cached_addresses = 0;
            // Names handed out stay valid; only the sharing of new ones restarts.
            self.strings.clear();
        }

        let mut frames: Vec<Option<FrameSymbols>> = vec![None; period.frames.len()];
        let mut by_file: HashMap<FileId, Vec<(usize, u64)>> = HashMap::new();
        let mut kernel: Vec<(usize, u64)> = Vec::new();
        for (index, frame) in period.frames.iter().enumerate() {
            match frame {
                Frame::File { file, offset } => {
                    by_file.entry(*file).or_default().push((index, *offset))
                }
                Frame::Kernel { addr } => kernel.push((index, *addr)),
                Frame::Anonymous { pid, addr, region } => {
                    frames[index] = Some(self.anonymous(*pid, *addr, region.as_deref()))
                }
                Frame::Unknown => frames[index] = Some(self.named(UNKNOWN)),
                Frame::Truncated => frames[index] = Some(self.named(TRUNCATED)),
                Frame::StackTableFull => frames[index] = Some(self.named(STACK_TABLE_FULL)),
            }
        }
        for (file, offsets) in by_file {
            self.symbolize_file(period.file(file), &offsets, &mut frames);
        }
        self.symbolize_kernel(&kernel, &mut frames);
        self.evict_unused();

        let frames = frames
            .into_iter()
            .map(|symbols| symbols.unwrap_or_else(|| self.named(UNKNOWN)))
            .collect();
        SymbolizedProfile { period, frames }
    }

    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(interned) = self.strings.get(text) {
            return interned.clone();
        }
        let interned: Arc<str> = Arc::from(text);
        self.strings.insert(interned.clone());
        interned
    }

    fn named(&mut self, name: &str) -> FrameSymbols {
        let name = self.intern(name);
        let empty = self.intern("");
        Arc::new([SymbolLine {
            function: name.clone(),
            system_name: name,
            file: empty,
            line: 0,
        }])
    }

    fn symbolize_file(
        &mut self,
        file: &ObjectFile,
        offsets: &[(usize, u64)],
        frames: &mut [Option<FrameSymbols>],
    ) {
        let key = (file.path.clone(), file.dev, file.inode);
        let period_number = self.period_number;
        let cache = self.files.entry(key.clone()).or_default();
        cache.last_period = period_number;
        if cache.open_path.is_empty() {
            cache.open_path = file.open_path.clone();
        }
        let mut missing: Vec<u64> = Vec::new();
        for &(index, offset) in offsets {
            match cache.addresses.get(&offset) {
                Some(symbols) => frames[index] = Some(symbols.clone()),
                None => missing.push(offset),
            }
        }
        if missing.is_empty() {
            return;
        }
        missing.sort_unstable();
        missing.dedup();

        let source = Source::Elf(Elf::new(&file.open_path));
        let resolved: Vec<Option<Vec<SymbolLine>>> = match self
            .blazesym
            .symbolize(&source, Input::FileOffset(&missing))
        {
            Ok(results) => {
                let mut lines: Vec<Option<Vec<OwnedLine>>> = results
                    .iter()
                    .map(|result| sym_lines(result, self.inlined_functions))
                    .collect();
                self.qualify_with_elf_symbols(&file.open_path, &missing, &mut lines);
                lines
                    .into_iter()
                    .map(|lines| lines.map(|lines| self.intern_lines(lines)))
                    .collect()
            }
            Err(error) => {
                log::debug!("cannot symbolize {}: {error}", file.path);
                vec![None; missing.len()]
            }
        };
        let fallback = self.named(&format!("[{}]", file.file_name()));
        let mut found: HashMap<u64, FrameSymbols> = HashMap::with_capacity(missing.len());
        for (offset, lines) in missing.iter().zip(resolved) {
            let symbols = match lines {
                Some(lines) if !lines.is_empty() => FrameSymbols::from(lines),
                _ => fallback.clone(),
            };
            found.insert(*offset, symbols);
        }
        self.cached_addresses += found.len();
        let cache = self.files.get_mut(&key).expect("entry created above");
        for &(index, offset) in offsets {
            if frames[index].is_none() {
                frames[index] = found.get(&offset).cloned();
            }
        }
        cache.addresses.extend(found);
    }

    /// Debug info built with line tables only (Rust's release default)
    /// names functions without their path (`parse` for
    /// `serde_json::de::parse`). Where DWARF gave such an unqualified name,
    /// the ELF symbol table's mangled name for the same address is used when
    /// it demangles to a path ending in that name.
    fn qualify_with_elf_symbols(
        &mut self,
        path: &str,
        offsets: &[u64],
        lines: &mut [Option<Vec<OwnedLine>>],
    ) {
        let unqualified: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter_map(|(index, lines)| {
                let outermost = lines.as_ref()?.last()?;
                (!is_mangled(&outermost.system_name) && !outermost.function.contains("::"))
                    .then_some(index)
            })
            .collect();
        if unqualified.is_empty() {
            return;
        }
        let wanted: Vec<u64> = unqualified.iter().map(|&index| offsets[index]).collect();
        let source = Source::Elf(Elf {
            debug_syms: false,
            ..Elf::new(path)
        });
        let Ok(results) = self.blazesym.symbolize(&source, Input::FileOffset(&wanted)) else {
            return;
        };
        for (index, result) in unqualified.into_iter().zip(results.iter()) {
            let Some(sym) = result.as_sym() else { continue };
            let Some(outermost) = lines[index].as_mut().and_then(|l| l.last_mut()) else {
                continue;
            };
            if !is_mangled(&sym.name) {
                continue;
            }
            let qualified = demangle(&sym.name);
            if qualified.ends_with(&format!("::{}", outermost.function)) {
                outermost.function = qualified;
                outermost.system_name = sym.name.to_string();
            }
        }
    }

    fn intern_lines(&mut self, lines: Vec<OwnedLine>) -> Vec<SymbolLine> {
        lines
            .into_iter()
            .map(|owned| SymbolLine {
                function: self.intern(&owned.function),
                system_name: self.intern(&owned.system_name),
                file: self.intern(&owned.file),
                line: owned.line,
            })
            .collect()
    }

    fn symbolize_kernel(&mut self, addrs: &[(usize, u64)], frames: &mut [Option<FrameSymbols>]) {
        let mut missing: Vec<u64> = addrs
            .iter()
            .filter(|(_, addr)| !self.kernel.contains_key(addr))
            .map(|(_, addr)| *addr)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let source = Source::Kernel(Kernel {
                // kallsyms only: searching for a vmlinux image costs seconds
                // of I/O and is rarely installed on production hosts.
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            });
            let resolved: Vec<Option<Vec<OwnedLine>>> =
                match self.blazesym.symbolize(&source, Input::AbsAddr(&missing)) {
                    Ok(results) => results.iter().map(|r| sym_lines(r, false)).collect(),
                    Err(error) => {
                        log::debug!("cannot symbolize kernel addresses: {error}");
                        vec![None; missing.len()]
                    }
                };
            let fallback = self.named(KERNEL);
            for (addr, lines) in missing.iter().zip(resolved) {
                let symbols = match lines {
                    Some(lines) if !lines.is_empty() => {
                        FrameSymbols::from(self.intern_lines(lines))
                    }
                    _ => fallback.clone(),
                };
                self.kernel.insert(*addr, symbols);
                self.cached_addresses += 1;
            }
        }
        for &(index, addr) in addrs {
            frames[index] = self.kernel.get(&addr).cloned();
        }
    }

    fn anonymous(&mut self, pid: u32, addr: u64, region: Option<&str>) -> FrameSymbols {
        if let Some(name) = self.perf_map_symbol(pid, addr) {
            let empty = self.intern("");
            return Arc::new([SymbolLine {
                function: name.clone(),
                system_name: name,
                file: empty,
                line: 0,
            }]);
        }
        match region {
            Some(region) if region.starts_with('[') => self.named(region),
            Some(region) => {
                let name = region.trim_end_matches(" (deleted)");
                let name = name.rsplit('/').next().unwrap_or(name);
                self.named(&format!("[{name}]"))
            }
            None => self.named(UNKNOWN),
        }
    }

    /// Looks `addr` up in the process's perf map, re-reading the file once
    /// per period at most, and only when it changed. The parsed map is kept
    /// after the process exits.
    fn perf_map_symbol(&mut self, pid: u32, addr: u64) -> Option<Arc<str>> {
        let period_number = self.period_number;
        let map = self.perf_maps.entry(pid).or_default();
        if map.last_period != period_number {
            map.last_period = period_number;
            let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
            reload_perf_map(map, &path);
        }
        map.lookup(addr).cloned()
    }

    fn evict_unused(&mut self) {
        let oldest = self.period_number.saturating_sub(EVICT_AFTER_PERIODS);
        let stale: Vec<(String, u64, u64)> = self
            .files
            .iter()
            .filter(|(_, cache)| cache.last_period < oldest)
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            let Some(cache) = self.files.remove(&key) else {
                continue;
            };
            self.cached_addresses = self.cached_addresses.saturating_sub(cache.addresses.len());
            let evict = blazesym::symbolize::evict::Evict::Elf(
                blazesym::symbolize::evict::Elf::new(PathBuf::from(&cache.open_path)),
            );
            if let Err(error) = self.blazesym.evict(&evict) {
                log::debug!("cannot evict {}: {error}", key.0);
            }
        }
        self.perf_maps.retain(|_, map| map.last_period >= oldest);
    }
}

fn reload_perf_map(map: &mut PerfMap, path: &Path) {
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    let version = Some((
        metadata.len(),
        metadata.modified().unwrap_or(std::time::UNIX_EPOCH),
    ));
    if version == map.version {
        return;
    }
    if let Ok(text) = std::fs::read_to_string(path) {
        map.entries = parse_perf_map(&text);
        map.version = version;
    }
}

/// A [`SymbolLine`] before its strings are interned.
#[derive(Clone)]
struct OwnedLine {
    function: String,
    system_name: String,
    file: String,
    line: u32,
}

/// Lines of one blazesym result, innermost first.
fn sym_lines(result: &Symbolized<'_>, with_inlined: bool) -> Option<Vec<OwnedLine>> {
    let sym: &Sym<'_> = result.as_sym()?;
    let location = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| {
        info.map(|info| {
            (
                info.to_path().to_string_lossy().into_owned(),
                info.line.unwrap_or(0),
            )
        })
        .unwrap_or_default()
    };
    let mut lines = Vec::with_capacity(sym.inlined.len() + 1);
    // blazesym lists inlined functions outermost first, each with the
    // location inside it; pprof wants the innermost first.
    let inlined: &[blazesym::symbolize::InlinedFn<'_>] =
        if with_inlined { &sym.inlined } else { &[] };
    for inlined in inlined.iter().rev() {
        let (file, line) = location(inlined.code_info.as_ref());
        lines.push(OwnedLine {
            function: demangle(&inlined.name),
            system_name: inlined.name.to_string(),
            file,
            line,
        });
    }
    let (file, line) = location(sym.code_info.as_deref());
    lines.push(OwnedLine {
        function: demangle(&sym.name),
        system_name: sym.name.to_string(),
        file,
        line,
    });
    Some(lines)
}

/// Whether `name` is a Rust (legacy or v0) or C++ mangled name.
fn is_mangled(name: &str) -> bool {
    name.starts_with("_ZN") || name.starts_with("_Z") || name.starts_with("_R")
}

/// Demangles Rust (legacy and v0) and C++ names; other names are returned as is.
pub fn demangle(name: &str) -> String {
    let rust_legacy = name.starts_with("_ZN") && looks_like_rust_hash(name);
    if name.starts_with("_R") || rust_legacy {
        if let Ok(demangled) = rustc_demangle::try_demangle(name) {
            return format!("{demangled:#}");
        }
    }
    if name.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(name) {
            if let Ok(demangled) = symbol.demangle() {
                return demangled;
            }
        }
    }
    name.to_string()
}

/// Rust's legacy mangling ends the path with a `17h<16 hex digits>E` hash.
fn looks_like_rust_hash(name: &str) -> bool {
    let name = name.split('.').next().unwrap_or(name);
    let Some(body) = name.strip_suffix('E') else {
        return false;
    };
    body.len() > 19
        && body[body.len() - 19..].starts_with("17h")
        && body[body.len() - 16..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        assert_eq!(demangle("plain_c"), "plain_c");
    }

    #[inline(never)]
    fn a_rust_function_to_find() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_and_demangles_this_test_binary() {
        use crate::aggregate::{Aggregator, AggregatorOptions};
        use crate::process::ProcessTable;
        let pid = std::process::id();
        let mut table = ProcessTable::new();
        table.load_from_proc(pid).unwrap();
        let function = a_rust_function_to_find as *const () as usize as u64;
        assert_eq!(a_rust_function_to_find(), 42);
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        aggregator.add(
            &table,
            &crate::sample::Sample {
                pid,
                tid: pid,
                time: 0,
                cpu: 0,
                weight: 1,
                frames: vec![function],
                kernel_frames: vec![],
                end: crate::sample::StackEnd::Complete,
            },
        );
        let now = std::time::SystemTime::now();
        let period = aggregator.take_period(now, now);
        let symbolized = Symbolizer::new(SymbolizerOptions::default()).symbolize(period);
        let line = &symbolized.frames[0][0];
        assert_eq!(
            &*line.function,
            "ddprof::symbolize::tests::a_rust_function_to_find"
        );
        assert!(
            line.system_name.starts_with("_ZN") || line.system_name.starts_with("_R"),
            "{}",
            line.system_name
        );
        assert!(line.file.ends_with("symbolize.rs"), "{}", line.file);
        assert!(line.line > 0);
    }

    #[test]
    fn parses_and_looks_up_perf_maps() {
        let map = PerfMap {
            entries: parse_perf_map(
                "1000 100 jitted_a\n0x2000 20 LazyCompile:*b x.js:1\nbad line\n",
            ),
            ..PerfMap::default()
        };
        assert_eq!(map.lookup(0x1050).map(|n| &**n), Some("jitted_a"));
        assert_eq!(
            map.lookup(0x2010).map(|n| &**n),
            Some("LazyCompile:*b x.js:1")
        );
        assert_eq!(map.lookup(0x1100), None);
        assert_eq!(map.lookup(0x10), None);
    }

    #[test]
    fn unreadable_files_get_the_mapping_name() {
        use crate::aggregate::{PeriodStats, StackSample};
        let now = std::time::SystemTime::now();
        let period = PeriodProfile {
            start: now,
            end: now,
            files: vec![Arc::new(ObjectFile {
                path: "/nonexistent/libgone.so".into(),
                dev: 0,
                inode: 0,
                build_id: None,
                open_path: "/nonexistent/libgone.so".into(),
            })],
            frames: vec![
                Frame::File {
                    file: FileId(0),
                    offset: 0x1234,
                },
                Frame::Anonymous {
                    pid: u32::MAX,
                    addr: 5,
                    region: Some("[vdso]".into()),
                },
                Frame::Truncated,
            ],
            stacks: vec![Box::new([0, 1, 2])],
            samples: vec![StackSample {
                pid: 1,
                tid: 1,
                process_name: None,
                thread_name: None,
                stack: 0,
                count: 1,
                cpu_nanos: 1,
                timeline: vec![],
            }],
            stats: PeriodStats::default(),
        };
        let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
        let symbolized = symbolizer.symbolize(period);
        let names: Vec<&str> = symbolized.stack_names(0).map(|n| &**n).collect();
        assert_eq!(names, [TRUNCATED, "[vdso]", "[libgone.so]"]);
    }
}
