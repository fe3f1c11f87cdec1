//! Unwind tables built once per file content and shared by every process
//! (and every mapping) of that file, within a bounded memory budget.
use super::compile::{compile_elf, CompileError, UnwindTable};
use super::store::TableStore;
use crate::files::elf_headers::ElfHeaders;
use crate::files::{debug_file, digest, Digest, TargetFileError};
use crate::files::{open_mapped, ContentKey, MappedFile, OpenedMapped};
use crate::process::Mapping;
use object::ReadCache;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Default memory budget for cached tables.
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

/// A cached table and when it was last used (for eviction).
#[derive(Debug)]
pub struct CachedTable {
    pub table: UnwindTable,
    pub key: ContentKey,
    /// Unique among the tables this process ever built (never reused, as
    /// an address would be): keys the unwinder's row cache.
    pub id: u64,
    last_used: AtomicU64,
}

/// The next [`CachedTable::id`].
static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// Every table compiled in this process that some cache still holds, by
/// content. The BPF engine (for its row map) and the perf engine (for the
/// samples the BPF engine hands over: a process's first, before its
/// mappings are in the maps) keep caches of their own; without this, both
/// compiled libc's table at each start, ~5 ms each.
static LIVE_TABLES: Mutex<Vec<(ContentKey, Weak<CachedTable>)>> = Mutex::new(Vec::new());

/// A table of `key` that another cache of this process compiled and still
/// holds.
fn live_table(key: &ContentKey) -> Option<Arc<CachedTable>> {
    let live = LIVE_TABLES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    live.iter()
        .find(|(live_key, _)| live_key == key)
        .and_then(|(_, table)| table.upgrade())
}

fn register_live_table(table: &Arc<CachedTable>) {
    let mut live = LIVE_TABLES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    live.retain(|(_, table)| table.strong_count() > 0);
    live.push((table.key, Arc::downgrade(table)));
}

/// Contents whose table a cache of this process is reading from the store
/// or compiling now. Another cache that needs the same table waits for it
/// rather than reading it a second time: at a rustc's start, the BPF
/// engine's sync thread and the perf engine's table thread (for the samples
/// handed over meanwhile) each read librustc_driver's and libLLVM's 2.3 M
/// rows from the store at once, ~24 ms of the profiler's CPU and ~12 MiB
/// more of its memory.
static IN_FLIGHT: Mutex<Vec<ContentKey>> = Mutex::new(Vec::new());
static LANDED: Condvar = Condvar::new();

/// The longest a cache waits for another's table (a big program's table
/// compiles in a few seconds); then it makes its own.
const MAX_FLIGHT_WAIT: Duration = Duration::from_secs(30);

/// This cache's claim on making `key`'s table; dropped, it wakes the
/// caches waiting for it.
struct Flight(ContentKey);

impl Drop for Flight {
    fn drop(&mut self) {
        let mut flying = IN_FLIGHT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        flying.retain(|key| *key != self.0);
        LANDED.notify_all();
    }
}

/// A claim on making `key`'s table, or `None` once another cache that had
/// it finished (its table, if it made one, is then a [`live_table`]) or
/// [`MAX_FLIGHT_WAIT`] passed.
fn board(key: &ContentKey) -> Option<Flight> {
    let mut flying = IN_FLIGHT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !flying.contains(key) {
        flying.push(*key);
        return Some(Flight(*key));
    }
    let deadline = Instant::now() + MAX_FLIGHT_WAIT;
    while flying.contains(key) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        flying = LANDED
            .wait_timeout(flying, left)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0;
    }
    None
}

/// Why a mapping has no table.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0} is not a file ddprof can open (anonymous or special mapping)")]
    NotAFile(String),
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: TargetFileError,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Compile { path: String, source: CompileError },
    #[error("{0}: code above 4 GiB or no executable segment for this mapping")]
    NoSegment(String),
    #[error("{0}: no stored table (this cache reads stored tables only)")]
    NotStored(String),
}

enum FileSlot {
    Table(Arc<CachedTable>),
    Failed,
}

/// Counters for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Tables compiled from the files' CFI.
    pub tables_built: u64,
    /// Tables read from the [`TableStore`] instead.
    pub tables_from_store: u64,
    pub tables_shared: u64,
    pub tables_evicted: u64,
    pub files_failed: u64,
}

/// Tables keyed by mapped file (cheap per-frame lookups) and by content.
pub struct TableCache {
    /// Looked up for every frame whose mapping differs from the previous
    /// frame's: hashed with ahash (SipHash of the path was ~2 % of the perf
    /// engine's CPU at 999 Hz).
    files: HashMap<Arc<MappedFile>, FileSlot, ahash::RandomState>,
    tables: HashMap<ContentKey, Arc<CachedTable>>,
    limit_bytes: usize,
    cached_bytes: usize,
    clock: u64,
    stats: CacheStats,
    /// Where compiled tables are kept for later runs, if anywhere.
    store: Option<TableStore>,
    /// Compiles the tables the store does not have (all but
    /// [`TableCache::stored_only`]).
    compiles: bool,
}

/// Failed files remembered at most (beyond it, they are retried).
const MAX_FAILED_FILES: usize = 1 << 16;

impl Default for TableCache {
    fn default() -> Self {
        Self::with_limit(DEFAULT_CACHE_BYTES)
    }
}

impl TableCache {
    pub fn with_limit(limit_bytes: usize) -> Self {
        TableCache {
            files: HashMap::default(),
            tables: HashMap::new(),
            limit_bytes,
            cached_bytes: 0,
            clock: 0,
            stats: CacheStats::default(),
            store: None,
            compiles: true,
        }
    }

    /// A cache that only reads tables from its store, never compiles one
    /// nor hashes a file whose digest is not remembered (a read ahead of
    /// need must stay cheap: it delays the worker's start).
    pub fn stored_only(mut self) -> Self {
        self.compiles = false;
        self
    }

    /// [`TableCache::load`] if that is cheap: the table held, or in the
    /// store under a remembered digest; else `LoadError::NotStored`,
    /// without hashing or compiling anything.
    pub fn load_if_ready(
        &mut self,
        pid: u32,
        mapped: &MappedFile,
        range: Option<(u64, u64)>,
    ) -> Result<Arc<CachedTable>, LoadError> {
        self.load_compiling(pid, mapped, range, false)
    }

    /// Drops every table it holds (a process that no longer unwinds).
    pub fn forget_all(&mut self) {
        self.files.clear();
        self.tables.clear();
        self.cached_bytes = 0;
    }

    /// Reads tables from `store` before compiling them, and writes there
    /// the ones it compiles (files with a build id).
    pub fn with_store(mut self, store: Option<TableStore>) -> Self {
        self.store = store;
        self
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Bytes of the tables held now.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Its figures for the overhead report, as `name`.
    pub fn figures(&self, name: &'static str) -> crate::overhead::CacheFigures {
        crate::overhead::CacheFigures {
            name,
            entries: self.tables.len() as u64,
            used: self.cached_bytes as u64,
            budget: Some(self.limit_bytes as u64),
            unit: "bytes",
            evicted: self.stats.tables_evicted,
        }
    }

    /// The table of `mapping`'s file (building it on first use) and the bias
    /// to subtract from a PC in the mapping to get the file's ELF virtual
    /// address. `pid` is used to reach the file through `/proc/PID/root`
    /// when the path does not name the mapped file in our namespace.
    pub fn table_for_mapping(
        &mut self,
        pid: u32,
        mapping: &Mapping,
    ) -> Option<(Arc<CachedTable>, u64)> {
        self.clock += 1;
        let table = match self.files.get(&mapping.file) {
            Some(FileSlot::Table(table)) => table.clone(),
            Some(FileSlot::Failed) => return None,
            None => match self.load(pid, &mapping.file, Some((mapping.start, mapping.end))) {
                Ok(table) => {
                    self.files
                        .insert(mapping.file.clone(), FileSlot::Table(table.clone()));
                    table
                }
                Err(error) => {
                    log::debug!("no unwind table: {error}");
                    self.stats.files_failed += 1;
                    if self.files.len() >= MAX_FAILED_FILES {
                        self.files
                            .retain(|_, slot| matches!(slot, FileSlot::Table(_)));
                    }
                    self.files.insert(mapping.file.clone(), FileSlot::Failed);
                    return None;
                }
            },
        };
        table.last_used.store(self.clock, Ordering::Relaxed);
        let bias = table
            .table
            .bias_for_mapping(mapping.start, mapping.file_offset)?;
        Some((table, bias))
    }

    /// Whether `file`'s table was looked for already (found, or not to be
    /// had): [`TableCache::table_for_mapping`] then reads nothing.
    pub fn knows(&self, file: &MappedFile) -> bool {
        self.files.contains_key(file)
    }

    /// Uses `table` for `file` instead of reading the file (tables built
    /// elsewhere, e.g. from bytes in memory, and tests).
    pub fn preload(&mut self, file: Arc<MappedFile>, key: ContentKey, table: UnwindTable) {
        self.stats.tables_built += 1;
        let cached = self.insert(key, table);
        self.files.insert(file, FileSlot::Table(cached));
    }

    /// Builds (or finds by content) the table of one mapped file.
    /// `range` is one mapping of the file in process `pid`: through
    /// `/proc/PID/map_files/` it reaches files deleted since they were
    /// mapped (upgraded packages).
    pub fn load(
        &mut self,
        pid: u32,
        mapped: &MappedFile,
        range: Option<(u64, u64)>,
    ) -> Result<Arc<CachedTable>, LoadError> {
        self.load_compiling(pid, mapped, range, self.compiles)
    }

    /// [`TableCache::load`], compiling (and hashing) only if `compiles`.
    fn load_compiling(
        &mut self,
        pid: u32,
        mapped: &MappedFile,
        range: Option<(u64, u64)>,
        compiles: bool,
    ) -> Result<Arc<CachedTable>, LoadError> {
        if mapped.path == "[vdso]" {
            return self.load_vdso();
        }
        if !mapped.path.starts_with('/') {
            return Err(LoadError::NotAFile(mapped.path.clone()));
        }
        let OpenedMapped { file, root } =
            open_mapped(pid, mapped, range).map_err(|source| LoadError::Open {
                path: mapped.path.clone(),
                source,
            })?;
        let read_error = |source| LoadError::Read {
            path: mapped.path.clone(),
            source,
        };
        // What the table is derived from: the file's bytes (never its build
        // id, which whoever built the file chose).
        let hashed = if compiles {
            digest::of_file(&file).map_err(read_error)?
        } else {
            digest::remembered(&file).ok_or_else(|| LoadError::NotStored(mapped.path.clone()))?
        };
        let checked = file.try_clone().map_err(read_error)?;
        let cache = ReadCache::new(file);
        let compile_error = |source| LoadError::Compile {
            path: mapped.path.clone(),
            source,
        };
        // The headers alone (a full parse reads the symbol table too).
        let ElfHeaders {
            build_id,
            debuglink,
            segments,
        } = ElfHeaders::parse(&cache).ok_or_else(|| compile_error(CompileError::NoElfHeaders))?;
        let segments = super::compile::executable_segments(&segments);
        // The split debug file, as the process sees it (a container's own),
        // and only with the process's root known.
        let candidates = debug_file::candidates(
            Path::new(debug_file::DEBUG_ROOT),
            &mapped.path,
            build_id.as_deref(),
            debuglink.as_deref(),
        );
        let debug = root
            .as_ref()
            .and_then(|root| debug_file::open(root, &candidates, mapped.identity()))
            .and_then(|file| Some((digest::of_file(&file).ok()?, file)));
        let key = ContentKey {
            file: hashed.digest,
            debug_file: debug.as_ref().map(|(hashed, _)| hashed.digest),
        };
        if let Some(table) = self.tables.get(&key) {
            self.stats.tables_shared += 1;
            return Ok(table.clone());
        }
        // Another cache's table, made already or (after the wait) now.
        let _flight = board(&key);
        if let Some(table) = live_table(&key) {
            self.stats.tables_shared += 1;
            return Ok(self.adopt(table));
        }
        // A tool that rewrites program headers keeps the bytes' digest
        // apart, but a table is checked against its file all the same.
        let stored = self
            .store
            .as_ref()
            .and_then(|store| store.load(&key))
            .filter(|table| table.segments == segments);
        if let Some(table) = stored {
            log::debug!("unwind table of {} read from the store", mapped.path);
            self.stats.tables_from_store += 1;
            return Ok(self.insert(key, table));
        }
        if !compiles {
            return Err(LoadError::NotStored(mapped.path.clone()));
        }
        // (The debug file is read through its own descriptor; the original
        // stays to check it is unchanged once compiled.)
        let debug_cache = debug
            .as_ref()
            .and_then(|(_, file)| file.try_clone().ok())
            .map(ReadCache::new);
        // The file is whatever the target mapped: a bug that its bytes
        // trigger in a parser must cost this file's table, not the profiler.
        let table = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compile_elf(&cache, debug_cache.as_ref())
        }))
        .unwrap_or(Err(CompileError::Corrupt))
        .map_err(compile_error)?;
        self.stats.tables_built += 1;
        // Kept for later runs only if the files are still the bytes hashed:
        // written meanwhile, the table is not theirs.
        let unchanged = hashed.still_matches(&checked)
            && debug
                .as_ref()
                .is_none_or(|(hashed, file)| hashed.still_matches(file));
        if let (Some(store), true) = (&self.store, unchanged) {
            if let Err(error) = store.save(&key, &table) {
                log::debug!(
                    "unwind table store: cannot keep the table of {} in {}: {error}",
                    mapped.path,
                    store.dir().display()
                );
            }
        }
        if !unchanged {
            // Nor shared under a digest its bytes no longer have.
            return Err(LoadError::Read {
                path: mapped.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "the file changed while its table was compiled",
                ),
            });
        }
        Ok(self.insert(key, table))
    }

    fn load_vdso(&mut self) -> Result<Arc<CachedTable>, LoadError> {
        let image = own_vdso_image().ok_or_else(|| LoadError::NotAFile("[vdso]".into()))?;
        let key = ContentKey {
            file: Digest::of_bytes(image),
            debug_file: None,
        };
        if let Some(table) = self.tables.get(&key) {
            return Ok(table.clone());
        }
        let table = compile_elf(image.as_slice(), None).map_err(|source| LoadError::Compile {
            path: "[vdso]".into(),
            source,
        })?;
        self.stats.tables_built += 1;
        Ok(self.insert(key, table))
    }

    fn insert(&mut self, key: ContentKey, table: UnwindTable) -> Arc<CachedTable> {
        let cached = Arc::new(CachedTable {
            table,
            key,
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            last_used: AtomicU64::new(self.clock),
        });
        register_live_table(&cached);
        self.adopt(cached)
    }

    /// Keeps `cached` within this cache's budget, evicting as needed.
    fn adopt(&mut self, cached: Arc<CachedTable>) -> Arc<CachedTable> {
        let size = cached.table.size_bytes();
        while self.cached_bytes + size > self.limit_bytes && !self.tables.is_empty() {
            self.evict_least_recently_used();
        }
        self.cached_bytes += size;
        self.tables.insert(cached.key, cached.clone());
        cached
    }

    fn evict_least_recently_used(&mut self) {
        let Some(oldest) = self
            .tables
            .values()
            .min_by_key(|t| t.last_used.load(Ordering::Relaxed))
            .cloned()
        else {
            return;
        };
        self.tables.remove(&oldest.key);
        self.files.retain(|_, slot| match slot {
            FileSlot::Table(table) => !Arc::ptr_eq(table, &oldest),
            FileSlot::Failed => true,
        });
        self.cached_bytes -= oldest.table.size_bytes();
        self.stats.tables_evicted += 1;
    }
}

/// The stored table of a file that a process is about to map, read in a
/// thread of its own while the profiler sets up ([`StoredTableRead::start`]):
/// a launched command's executable, whose table (2.4 M rows for a 246 MB
/// static binary) is most of what its first samples need.
pub struct StoredTableRead {
    reading: std::thread::JoinHandle<Option<(Arc<MappedFile>, Arc<CachedTable>)>>,
}

impl StoredTableRead {
    /// Starts reading the stored table of `path` (made absolute and free of
    /// links, as the process's mappings will name it); never compiles.
    pub fn start(path: &Path, store: TableStore) -> Option<Self> {
        let path = std::fs::canonicalize(path).ok()?;
        let reading = std::thread::Builder::new()
            .name("ddprof-preload".into())
            .spawn(move || {
                use std::os::unix::fs::MetadataExt;
                let metadata = std::fs::metadata(&path).ok()?;
                let file = Arc::new(MappedFile {
                    path: path.to_str()?.to_string(),
                    dev: metadata.dev(),
                    inode: metadata.ino(),
                });
                let mut cache = TableCache::with_limit(usize::MAX)
                    .with_store(Some(store))
                    .stored_only();
                match cache.load(std::process::id(), &file, None) {
                    Ok(table) => Some((file, table)),
                    Err(error) => {
                        log::debug!("start-up: no table read ahead: {error}");
                        None
                    }
                }
            })
            .ok()?;
        Some(Self { reading })
    }

    /// The file and its table, once read (the table stays shared with the
    /// other caches of this process while the caller holds it).
    pub fn finish(self) -> Option<(Arc<MappedFile>, Arc<CachedTable>)> {
        self.reading.join().ok().flatten()
    }
}

/// The vDSO image of this process: the kernel maps the same one into every
/// 64-bit process, so it stands for the profiled processes' `[vdso]`.
fn own_vdso_image() -> Option<&'static Vec<u8>> {
    static IMAGE: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
            let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
            let record = crate::process::parse_maps_line(0, line)?;
            let mut image = vec![0u8; usize::try_from(record.len).ok()?];
            let mem = File::open("/proc/self/mem").ok()?;
            std::os::unix::fs::FileExt::read_exact_at(&mem, &mut image, record.start).ok()?;
            Some(image)
        })
        .as_ref()
}
