//! Symbolization of normalized addresses with blazesym.
//!
//! Frames arrive normalized to (file, file offset) by the aggregator, so the
//! processes that produced them need not exist anymore. Resolved addresses
//! stay cached here across periods (files unused for a while are evicted);
//! what blazesym parsed of a file is dropped as soon as its addresses are
//! resolved, so that one file at a time is mapped, and the names are kept
//! on disk by build id for later runs ([`SymbolStore`]). Failure is never
//! fatal: a frame that cannot be resolved is named after its mapping, or
//! `[unknown]`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use blazesym::symbolize::{Sym, Symbolized};

use crate::aggregate::{FileId, Frame, PeriodProfile};
use crate::files::digest::FileDigest;
use crate::files::{MappedFile, ObjectFile};

mod debug_cache;
mod elf;
mod functions;
mod jitdump;
mod kernel;
mod names;
mod perf_map;
mod plt;
mod store;
mod symbol_index;
pub use debug_cache::{DebugCache, DebugCacheError, DebugCopy};
use elf::TableFallback;
pub use kernel::KallsymsSnapshot;
pub use names::demangle;
use perf_map::{reload_perf_map, PerfMap};
use store::{KnownDebugFile, SymbolKey, SymbolStore};
use symbol_index::SymbolIndexes;

/// A perf map the aggregator opened for a period, or why it refused it.
type PeriodPerfMap =
    Result<Arc<crate::files::target::JitSymbols>, crate::files::target::PerfMapRefused>;

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
    /// Where decompressed copies of compressed split debug files are kept
    /// (see [`DebugCache`]); `None`: blazesym inflates them at every run.
    pub debug_cache: Option<PathBuf>,
    /// Where names resolved are kept for later runs (see [`SymbolStore`]);
    /// `None`: every run resolves them anew.
    pub symbol_store: Option<PathBuf>,
    /// Where the sorted symbol tables of files named from them alone are
    /// kept for later runs (see `symbol_index.rs`); `None`: sorted anew by
    /// every run that needs them.
    pub symbol_index: Option<PathBuf>,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        Self {
            inlined_functions: false,
            debug_dirs: vec!["/usr/lib/debug".into(), "/lib/debug".into()],
            debug_cache: None,
            symbol_store: None,
            symbol_index: None,
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
    /// The decompressed copy of the file's split debug file, read instead
    /// of the file (`None` inside until looked up, once).
    debug_copy: Option<Option<DebugCopy>>,
    last_period: u64,
    addresses: HashMap<u64, FrameSymbols>,
    /// Runs of consecutive offsets named alike, by first offset: the end
    /// and the names (functions named whole, see `functions.rs`).
    spans: BTreeMap<u64, (u64, FrameSymbols)>,
    /// The first offsets of the functions named whole.
    named_whole: HashSet<u64>,
    /// The file's key in the symbol store (`None` inside when it is not
    /// held, cannot be hashed, or there is no store), once looked for.
    store_key: Option<Option<SymbolKey>>,
    /// The file's digest in that key, and what it was taken for: names
    /// resolved once the file changed are not stored under it.
    hashed: Option<FileDigest>,
    /// The split debug files found for the file, with their digests, once
    /// looked for (for the store's key, and to evict what blazesym parsed
    /// of them).
    debug_files: Option<Vec<KnownDebugFile>>,
    /// Addresses blazesym named since the store was last written.
    unsaved: Vec<u64>,
    /// First offsets of the spans named since the store was last written.
    unsaved_spans: Vec<u64>,
    /// blazesym could not read the file's DWARF (or its debug file's), but
    /// its symbol tables named something: later periods go to them at once.
    dwarf_unreadable: bool,
}

impl FileCache {
    fn lookup(&self, offset: u64) -> Option<&FrameSymbols> {
        self.addresses.get(&offset).or_else(|| {
            let (_, (end, symbols)) = self.spans.range(..=offset).next_back()?;
            (offset < *end).then_some(symbols)
        })
    }

    /// Addresses and spans held.
    fn entries(&self) -> usize {
        self.addresses.len() + self.spans.len()
    }
}

/// Turns normalized frames into functions, files and lines.
///
/// Not `Send` (blazesym's caches use `Rc`): create it on the thread that
/// symbolizes, and keep it for the whole run so its caches pay off.
pub struct Symbolizer {
    blazesym: blazesym::symbolize::Symbolizer,
    /// `-I`: report inlined functions as frames of their own.
    inlined_functions: bool,
    debug_dirs: Vec<PathBuf>,
    debug_cache: Option<DebugCache>,
    store: Option<SymbolStore>,
    /// Files named from their symbol tables without blazesym.
    symbol_indexes: SymbolIndexes,
    files: HashMap<MappedFile, FileCache>,
    cached_addresses: usize,
    perf_maps: HashMap<u32, PerfMap>,
    kernel: HashMap<u64, FrameSymbols>,
    /// Where kernel names come from (see [`KallsymsSnapshot`]); the
    /// running kernel's `/proc/kallsyms` when `None`.
    kallsyms: Option<KallsymsSnapshot>,
    strings: HashSet<Arc<str>>,
    period_number: u64,
    /// Bytes of functions named whole this period (see `functions.rs`).
    whole_function_bytes: u64,
    /// Files dropped from the caches for being unused.
    files_evicted: u64,
    /// Resolved addresses dropped when the address caches were full.
    addresses_evicted: u64,
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
            // Files are read through `/proc/self/fd/N` (see
            // `ObjectFile::open_path`): a descriptor number reused for
            // another file must not find the first file's data.
            .enable_auto_reload(true)
            .set_debug_dirs(Some(&options.debug_dirs))
            .build();
        Self {
            blazesym,
            inlined_functions: options.inlined_functions,
            // Beside the other stores, in a directory of its own (each store
            // bounds the whole of its directory), laid out as debug
            // directories are.
            debug_cache: options
                .debug_cache
                .map(|dir| DebugCache::new(dir.join(".build-id"))),
            store: options.symbol_store.map(SymbolStore::new),
            symbol_indexes: SymbolIndexes::new(options.symbol_index),
            debug_dirs: options.debug_dirs,
            files: HashMap::new(),
            cached_addresses: 0,
            perf_maps: HashMap::new(),
            kernel: HashMap::new(),
            kallsyms: None,
            strings: HashSet::new(),
            period_number: 0,
            whole_function_bytes: 0,
            files_evicted: 0,
            addresses_evicted: 0,
        }
    }

    /// Names kernel frames from `snapshot` rather than from the running
    /// kernel's `/proc/kallsyms`.
    pub fn use_kallsyms(&mut self, snapshot: KallsymsSnapshot) {
        self.kallsyms = Some(snapshot);
        self.kernel.clear();
    }

    /// Symbolizes every frame of the period.
    pub fn symbolize(&mut self, period: PeriodProfile) -> SymbolizedProfile {
        self.period_number += 1;
        self.whole_function_bytes = 0;
        if self.cached_addresses > MAX_CACHED_ADDRESSES {
            self.addresses_evicted += self.cached_addresses as u64;
            for cache in self.files.values_mut() {
                cache.addresses.clear();
                cache.spans.clear();
                cache.named_whole.clear();
            }
            self.kernel.clear();
            self.cached_addresses = 0;
            // Names handed out stay valid; only the sharing of new ones restarts.
            self.strings.clear();
        }

        let mut frames: Vec<Option<FrameSymbols>> = vec![None; period.frames.len()];
        // The innermost user frame of each stack: the frames whose address
        // is any instruction of their function (the others are call sites).
        let mut leaves = vec![false; period.frames.len()];
        for stack in &period.stacks {
            let user_leaf = stack.iter().find(|&&frame| {
                !matches!(
                    period.frames.get(frame as usize),
                    Some(Frame::Kernel { .. })
                )
            });
            if let Some(&leaf) = user_leaf {
                if let Some(is_leaf) = leaves.get_mut(leaf as usize) {
                    *is_leaf = matches!(period.frames[leaf as usize], Frame::File { .. });
                }
            }
        }
        let mut by_file: HashMap<FileId, Vec<(usize, u64)>> = HashMap::new();
        let mut kernel: Vec<(usize, u64)> = Vec::new();
        for (index, frame) in period.frames.iter().enumerate() {
            match frame {
                Frame::File { file, offset } => {
                    by_file.entry(*file).or_default().push((index, *offset))
                }
                Frame::Kernel { addr } => kernel.push((index, *addr)),
                Frame::Anonymous { pid, addr, region } => {
                    let perf_map = period.perf_maps.get(pid);
                    frames[index] = Some(self.anonymous(*pid, *addr, region.as_deref(), perf_map))
                }
                Frame::Unknown => frames[index] = Some(self.named(UNKNOWN)),
                Frame::Truncated => frames[index] = Some(self.named(TRUNCATED)),
                Frame::StackTableFull => frames[index] = Some(self.named(STACK_TABLE_FULL)),
            }
        }
        for (file, offsets) in by_file {
            self.symbolize_file(period.file(file), &offsets, &leaves, &mut frames);
        }
        self.symbolize_kernel(&kernel, &mut frames);
        self.write_store();
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

    /// Names `offsets` ((frame index, file offset)) of `file` into `frames`;
    /// `leaves` says which frames are the innermost of a stack.
    fn symbolize_file(
        &mut self,
        file: &ObjectFile,
        offsets: &[(usize, u64)],
        leaves: &[bool],
        frames: &mut [Option<FrameSymbols>],
    ) {
        if file.open_path.is_empty() {
            // Not held open: its path may name another file by now (or one
            // of ddprof's namespace rather than the process's), so nothing
            // is read, and nothing is remembered for when it is held again.
            let unread = self.named(&format!("[{}]", file.file_name()));
            for &(index, _) in offsets {
                frames[index] = Some(unread.clone());
            }
            return;
        }
        let key = file.identity();
        let period_number = self.period_number;
        let cache = self.files.entry(key.clone()).or_default();
        cache.last_period = period_number;
        let store_unread = cache.store_key.is_none();
        if cache.open_path != file.open_path {
            // The file is read through a new descriptor (it was let go for
            // a period): blazesym's data under the old one is stale.
            let stale = std::mem::replace(&mut cache.open_path, file.open_path.clone());
            if !stale.is_empty() {
                self.evict_from_blazesym(&stale);
            }
        }
        if store_unread {
            self.read_store(&key, file);
        }
        let cache = self.files.get_mut(&key).expect("entry created above");
        let mut missing: Vec<u64> = Vec::new();
        for &(index, offset) in offsets {
            match cache.lookup(offset) {
                Some(symbols) => frames[index] = Some(symbols.clone()),
                None => missing.push(offset),
            }
        }
        if missing.is_empty() {
            return;
        }
        missing.sort_unstable();
        missing.dedup();

        if cache.debug_copy.is_none() {
            let copy = self.debug_copy_for(file);
            let cache = self.files.get_mut(&key).expect("entry created above");
            cache.debug_copy = Some(copy);
        }
        let cache = self.files.get(&key).expect("entry created above");
        let debug_copy = cache.debug_copy.clone().flatten();
        let dwarf_unreadable = cache.dwarf_unreadable;
        let fallback = TableFallback {
            debug_files: self
                .known_debug_files(&key, file)
                .into_iter()
                .map(|known| known.path)
                .collect(),
            build_id: file.build_id.clone(),
            dwarf_unreadable,
        };
        let resolved = self.resolve_elf_offsets(
            &file.open_path,
            &file.path,
            &missing,
            debug_copy.as_ref(),
            &fallback,
        );
        let dwarf_unreadable = resolved.dwarf_unreadable;
        if dwarf_unreadable && !fallback.dwarf_unreadable {
            log::warn!(
                "cannot read the debug information of {}; its frames are named from \
                 its symbol tables, without lines or inlined functions",
                file.path
            );
        }
        let cache = self.files.get_mut(&key).expect("entry created above");
        cache.dwarf_unreadable = dwarf_unreadable;
        let leaf_offsets: HashSet<u64> = offsets
            .iter()
            .filter(|&&(index, _)| leaves.get(index).copied().unwrap_or(false))
            .map(|&(_, offset)| offset)
            .collect();
        let functions = missing
            .iter()
            .zip(&resolved.functions)
            .filter_map(|(offset, function)| {
                Some((function.clone()?, leaf_offsets.contains(offset)))
            })
            .collect();
        self.name_whole_functions(
            &key,
            &file.open_path,
            &file.path,
            debug_copy.as_ref(),
            functions,
        );
        // What blazesym parsed and mapped of the file (and of its debug
        // file: libc's is 10 MB) goes at once: the names found stay cached
        // here, and holding every file of the period mapped together made
        // the peak RSS of a run (its last symbolization) the sum of them.
        // A later period with new addresses in the file parses it again.
        self.evict_from_blazesym(&file.open_path);
        if let Some(copy) = &debug_copy {
            self.evict_from_blazesym(&copy.path.to_string_lossy());
        }
        // blazesym follows `.gnu_debuglink` itself and caches the debug file
        // under its own path (also when a copy failed and the file was read
        // instead).
        for debug_file in &fallback.debug_files {
            self.evict_from_blazesym(&debug_file.to_string_lossy());
        }
        let fallback = self.named(&format!("[{}]", file.file_name()));
        let mut found: HashMap<u64, FrameSymbols> = HashMap::with_capacity(missing.len());
        let cache = self.files.get_mut(&key).expect("entry created above");
        // Names are kept under the digests of the files they came from only
        // while those files are still the bytes hashed.
        let unchanged = cache
            .hashed
            .zip(file.held())
            .is_some_and(|(hashed, held)| hashed.still_matches(held))
            && cache
                .debug_files
                .iter()
                .flatten()
                .all(KnownDebugFile::unchanged);
        if !unchanged && matches!(cache.store_key, Some(Some(_))) {
            log::debug!(
                "{} changed while it was symbolized: its names are not stored",
                file.path
            );
            cache.store_key = Some(None);
        }
        let stored = matches!(cache.store_key, Some(Some(_)));
        for (offset, lines) in missing.iter().zip(resolved.lines) {
            let symbols = match lines {
                Some(lines) if !lines.is_empty() => {
                    // Only names are kept for later runs: a file that could
                    // not be read this time may be readable the next.
                    if stored {
                        cache.unsaved.push(*offset);
                    }
                    FrameSymbols::from(lines)
                }
                _ => fallback.clone(),
            };
            found.insert(*offset, symbols);
        }
        self.cached_addresses += found.len();
        for &(index, offset) in offsets {
            if frames[index].is_none() {
                frames[index] = found.get(&offset).cloned();
            }
        }
        cache.addresses.extend(found);
    }

    /// The decompressed copy of `file`'s split debug file, if the debug
    /// cache is on and the file has one that is compressed. A copy that
    /// cannot be made is logged, and the file read as it is; a cache that
    /// cannot be written is not tried again in this run.
    fn debug_copy_for(&mut self, file: &ObjectFile) -> Option<DebugCopy> {
        let cache = self.debug_cache.as_ref()?;
        let build_id = file.build_id.as_deref()?;
        let debug_dirs = &self.debug_dirs;
        // Parsers of hostile input: a bug must cost the copy, not the run.
        let attempt =
            std::panic::catch_unwind(|| cache.copy_for(&file.open_path, build_id, debug_dirs));
        match attempt {
            Ok(Ok(copy)) => copy,
            Ok(Err(error @ DebugCacheError::Io { .. })) => {
                log::info!(
                    "debug cache: {error}; compressed debug files are inflated in memory \
                     for the rest of this run (--debug-cache DIR: another place)"
                );
                self.debug_cache = None;
                None
            }
            Ok(Err(error)) => {
                log::warn!(
                    "debug cache: no decompressed copy for {}: {error}; its debug file is read as it is",
                    file.path
                );
                None
            }
            Err(_) => {
                log::warn!(
                    "debug cache: reading the debug file of {} failed (corrupt file?); it is read as it is",
                    file.path
                );
                None
            }
        }
    }

    /// Names the code at `offsets` (file offsets) of the ELF file at `path`
    /// as profiles name it: its functions (innermost inlined function
    /// first), or `[file name]` where the file names nothing. For tools and
    /// tests that symbolize files outside a profile.
    pub fn symbolize_file_offsets(&mut self, path: &str, offsets: &[u64]) -> Vec<FrameSymbols> {
        let resolved =
            self.resolve_elf_offsets(path, path, offsets, None, &TableFallback::default());
        self.evict_from_blazesym(path);
        let file_name = path.rsplit('/').next().unwrap_or(path);
        let fallback = self.named(&format!("[{file_name}]"));
        resolved
            .lines
            .into_iter()
            .map(|lines| match lines {
                Some(lines) if !lines.is_empty() => FrameSymbols::from(lines),
                _ => fallback.clone(),
            })
            .collect()
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

    fn anonymous(
        &mut self,
        pid: u32,
        addr: u64,
        region: Option<&str>,
        perf_map: Option<&PeriodPerfMap>,
    ) -> FrameSymbols {
        if let Some(name) = self.perf_map_symbol(pid, addr, perf_map) {
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
    fn perf_map_symbol(
        &mut self,
        pid: u32,
        addr: u64,
        opened: Option<&PeriodPerfMap>,
    ) -> Option<Arc<str>> {
        let period_number = self.period_number;
        let map = self.perf_maps.entry(pid).or_default();
        if map.last_period != period_number {
            map.last_period = period_number;
            if let Some(opened) = opened {
                reload_perf_map(map, pid, opened);
            }
        }
        map.lookup(addr).map(Arc::from)
    }

    /// Its caches, for the overhead report: the files it has parsed
    /// (dropped after EVICT_AFTER_PERIODS periods unused) and the addresses
    /// it has resolved (all dropped past MAX_CACHED_ADDRESSES).
    pub fn cache_figures(&self) -> [crate::overhead::CacheFigures; 2] {
        [
            crate::overhead::CacheFigures {
                name: "symbol_files",
                entries: self.files.len() as u64,
                used: self.files.len() as u64,
                budget: None,
                unit: "entries",
                evicted: self.files_evicted,
            },
            crate::overhead::CacheFigures {
                name: "symbol_addresses",
                entries: self.cached_addresses as u64,
                used: self.cached_addresses as u64,
                budget: Some(MAX_CACHED_ADDRESSES as u64),
                unit: "entries",
                evicted: self.addresses_evicted,
            },
        ]
    }

    fn evict_unused(&mut self) {
        let oldest = self.period_number.saturating_sub(EVICT_AFTER_PERIODS);
        let stale: Vec<MappedFile> = self
            .files
            .iter()
            .filter(|(_, cache)| cache.last_period < oldest)
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            let Some(cache) = self.files.remove(&key) else {
                continue;
            };
            self.cached_addresses = self.cached_addresses.saturating_sub(cache.entries());
            self.files_evicted += 1;
            self.evict_from_blazesym(&cache.open_path);
            if let Some(Some(copy)) = &cache.debug_copy {
                self.evict_from_blazesym(&copy.path.to_string_lossy());
            }
        }
        self.perf_maps.retain(|_, map| map.last_period >= oldest);
    }

    /// Drops what blazesym parsed from `open_path` (and the descriptor it
    /// holds on it).
    fn evict_from_blazesym(&mut self, open_path: &str) {
        let evict = blazesym::symbolize::evict::Evict::Elf(blazesym::symbolize::evict::Elf::new(
            PathBuf::from(open_path),
        ));
        if let Err(error) = self.blazesym.evict(&evict) {
            log::debug!("cannot evict {open_path}: {error}");
        }
    }
}

/// Builds the C `source` with `cc` and `flags` into `dir/name` (tests that
/// need a program with particular symbols or stubs).
#[cfg(test)]
fn build_c(dir: &std::path::Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source_path = dir.join(format!("{name}.c"));
    std::fs::write(&source_path, source).unwrap();
    let output = dir.join(name);
    let status = std::process::Command::new("cc")
        .arg("-o")
        .arg(&output)
        .arg(&source_path)
        .args(flags)
        .status()
        .expect("a C compiler `cc`");
    assert!(status.success(), "cc {flags:?} failed");
    output
}

/// A [`SymbolLine`] before its strings are interned.
#[derive(Debug, Clone, PartialEq, Eq)]
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

    #[test]
    fn demangles_rust_legacy_escapes_hashes_and_llvm_suffixes() {
        // Names as rustc 1.95 emits them (taken from this crate's binary).
        assert_eq!(
            demangle(
                "_ZN71_$LT$core..hash..sip..Hasher$LT$S$GT$$u20$as$u20$core..hash..Hasher$GT$\
                 5write17h4f7b0c5e9a1d2b3cE"
            ),
            "<core::hash::sip::Hasher<S> as core::hash::Hasher>::write"
        );
        assert_eq!(
            demangle(
                "_ZN102_$LT$core..iter..adapters..map..Map$LT$I$C$F$GT$$u20$as$u20$\
                 core..iter..traits..iterator..Iterator$GT$4next17h35274fbfe399fcc4E\
                 .llvm.4573431548263953443"
            ),
            "<core::iter::adapters::map::Map<I,F> as core::iter::traits::iterator::Iterator>::next"
        );
        assert_eq!(
            demangle(
                "_ZN100_$LT$$RF$object..read..read_cache..ReadCache$LT$R$GT$$u20$as$u20$\
                 object..read..read_ref..ReadRef$GT$13read_bytes_at17hc82619d9945b8d46E"
            ),
            "<&object::read::read_cache::ReadCache<R> as object::read::read_ref::ReadRef>\
             ::read_bytes_at"
        );
        // A closure and a name with a `.` component.
        assert_eq!(
            demangle("_ZN5chain4main28_$u7b$$u7b$closure$u7d$$u7d$17h0123456789abcdefE"),
            "chain::main::{{closure}}"
        );
    }

    #[test]
    fn demangles_rust_v0() {
        assert_eq!(
            demangle(
                "_RINvMs_NtCs8NGFtPOz2WJ_5regex8buildersNtB5_7Builder3newARej1_BS_EB7_\
                 .llvm.10105073780950452105"
            ),
            "<regex::builders::Builder>::new::<[&str; 1], &str>"
        );
        assert_eq!(
            demangle("_RNvNtCs1234_7mycrate3foo3bar"),
            "mycrate::foo::bar"
        );
    }

    #[test]
    fn demangles_cpp() {
        assert_eq!(
            demangle("_ZN9__gnu_cxx13new_allocatorIcE8allocateEmPKv"),
            "__gnu_cxx::new_allocator<char>::allocate(unsigned long, void const*)"
        );
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(
            demangle("_ZN5chain3fooEv.cold"),
            "chain::foo() [clone .cold]"
        );
        // A C++ name that is also a well-formed Rust path without a hash
        // demangles to the same text either way.
        assert_eq!(demangle("_ZN3foo3barE"), "foo::bar");
    }

    #[test]
    fn demangles_non_ascii_rust_identifiers() {
        // `fn café` and `mod 日本 { fn 東京<T> }` as rustc 1.95 mangles
        // them, legacy (escaped code points) and v0 (Punycode).
        assert_eq!(
            demangle("_ZN3uni8caf$ue9$17he3c018b6b14604ffE"),
            "uni::café"
        );
        assert_eq!(
            demangle("_ZN3uni15_$u65e5$$u672c$15_$u6771$$u4eac$17h4bd40f00674f8998E"),
            "uni::日本::東京"
        );
        assert_eq!(demangle("_RNvCs4eYjyvNHrqb_3uniu7caf_dma"), "uni::café");
        assert_eq!(
            demangle("_RINvNtCs4eYjyvNHrqb_3uniu6wgv71au7_1lqs71dhEB4_"),
            "uni::日本::東京::<u8>"
        );
    }

    #[test]
    fn demangling_is_safe_on_any_text() {
        let samples = [
            "café",
            "日本",
            "🦀🔥",
            "_ZN日本語テキストE",
            "_ZN4café17h0123456789abcdefE",
            "_ZN5caf\u{e9}17h0123456789abcdefE",
            "_ZN2日本17h0123456789abcdéfE",
            "_R🦀",
            "_RNvCs1234_7mycrate6日本",
            "_Z日本",
            "_ZN3foo日本Ev",
            "_Z",
            "_R",
            "_ZN",
            "_ZNE",
            "_ZN17h0123456789abcdefE",
            "_ZN3fooE.llvm.日本",
            "",
            "$LT$",
            "_ZN3foo🔥E",
        ];
        for name in samples {
            // Every split point of every sample, so that multi-byte
            // characters land on every position a parser might slice at.
            for (index, _) in name.char_indices().chain([(name.len(), ' ')]) {
                for text in [&name[..index], &name[index..]] {
                    let demangled = demangle(text);
                    assert!(!demangled.is_empty() || text.is_empty(), "{text:?}");
                }
            }
        }
        // What no demangler accepts comes back unchanged.
        assert_eq!(demangle("_ZN日本語テキストE"), "_ZN日本語テキストE");
        assert_eq!(demangle("🦀🔥"), "🦀🔥");
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
                event: 0,
                weight: 1,
                scaled_count: crate::events::COUNT_UNIT,
                frames: vec![function],
                kernel_frames: vec![],
                heap: None,
                off_cpu: None,
                trace: None,
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
        assert!(line.file.ends_with("symbolize/mod.rs"), "{}", line.file);
        assert!(line.line > 0);
    }

    #[test]
    fn parses_and_looks_up_perf_maps() {
        let map = PerfMap::parsed("1000 100 jitted_a\n0x2000 20 LazyCompile:*b x.js:1\nbad line\n");
        assert_eq!(map.lookup(0x1050), Some("jitted_a"));
        assert_eq!(map.lookup(0x2010), Some("LazyCompile:*b x.js:1"));
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
            perf_maps: Default::default(),
            files: vec![Arc::new(ObjectFile::by_path(
                "/nonexistent/libgone.so",
                0,
                0,
            ))],
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
                event: 0,
                pid: 1,
                tid: 1,
                process_name: None,
                thread_name: None,
                container_id: None,
                trace: None,
                stack: 0,
                count: 1,
                scaled_count: crate::events::COUNT_UNIT,
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
