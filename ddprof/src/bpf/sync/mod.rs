//! Keeping the BPF maps true: the process map mirrors the process table's
//! executable mappings, and `TABLES` holds the unwind tables of the files
//! they map, a map each (loaded on first use, freed when the budget needs
//! room and no process maps the file).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ddprof_common::bpf_maps::{
    names, MappingEntry, ProcessMappings, TraceContextSlots, MAX_PROCESS_MAPPINGS, TABLE_NOT_LOADED,
};

use super::engine::{is_alive, BpfEngine};
use super::load::{BpfError, MapProblem};
use super::rows::TableMaps;
use crate::files::{ContentKey, MappedFile};
use crate::process::{Process, ProcessTable};
use crate::unwind::cache::TableCache;
use crate::unwind::LoadSegment;

mod tables;
use tables::FileState;
pub use tables::LoadedFileReport;

/// Counters of the table loading, for reports and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableStats {
    /// Distinct files whose tables are in the maps now.
    pub files_loaded: u64,
    /// Files with no usable table (no CFI, unreadable, not ELF).
    pub files_without_table: u64,
    /// Files whose tables did not fit the budget (their samples are
    /// unwound in userspace).
    pub tables_not_fitting: u64,
    /// Processes not in the process map because it was full.
    pub processes_not_tracked: u64,
    /// Processes with more executable mappings than a map entry holds.
    pub processes_truncated: u64,
    /// Tables whose rows were freed for others (no process mapped them).
    pub tables_freed: u64,
    /// New or handed-off processes whose mappings were read from
    /// `/proc/PID/maps` (the records did not describe them yet).
    pub processes_read_from_proc: u64,
}

/// A table in the maps.
struct LoadedTable {
    /// Its slot in `TABLES`.
    slot: u32,
    row_count: u32,
    segments: Vec<LoadSegment>,
    /// Mappings of the process map's entries (as written) that use it:
    /// freed for another table only at 0.
    users: u32,
}

/// What the engine knows of its maps' contents, one record per process
/// and per table; only this module edits it (the sync writes the maps and
/// this mirror together).
pub(super) struct MapMirror {
    rows: TableMaps,
    compiler: TableCache,
    tables: HashMap<ContentKey, LoadedTable>,
    /// Files (device, inode) whose table did not fit, already warned about.
    warned_not_loaded: HashSet<(u64, u64)>,
    files: HashMap<Arc<MappedFile>, FileState>,
    /// Per process, its entry in the process map as last written.
    synced: HashMap<u32, SyncedProcess>,
    /// The tables of the entry being written by `sync_process` so far.
    syncing: Vec<ContentKey>,
    /// Processes the program handed to the perf engine and named in a
    /// `HANDOFF_NOTICE` record, not synced yet.
    handed_off: HashSet<u32>,
    dirty: HashSet<u32>,
    /// `ProcessTable::generation` at the last full sync.
    synced_generation: Option<u64>,
    /// The version of the last entry written (`ProcessMappings::version`).
    entry_version: u32,
    /// While set, a table that would have to be compiled (or its file
    /// hashed) is left out of the entry being written, and the process
    /// goes to `deferred` (see [`BpfEngine::sync_read_young`]).
    defer_compiling: bool,
    /// Processes whose entries were written without tables still to
    /// compile.
    deferred: Vec<u32>,
    table_stats: TableStats,
    /// The processes that publish thread contexts, as `TRACE_CONTEXTS`
    /// holds them.
    pub(super) trace: super::trace_contexts::Registry,
}

impl MapMirror {
    /// Nothing in the maps yet: `rows` are the table maps, filled from
    /// the tables `compiler` compiles (or reads back).
    pub(super) fn new(rows: TableMaps, compiler: TableCache) -> Self {
        MapMirror {
            rows,
            compiler,
            tables: HashMap::new(),
            warned_not_loaded: HashSet::new(),
            files: HashMap::new(),
            synced: HashMap::new(),
            syncing: Vec::new(),
            handed_off: HashSet::new(),
            dirty: HashSet::new(),
            synced_generation: None,
            entry_version: 0,
            defer_compiling: false,
            deferred: Vec::new(),
            table_stats: TableStats::default(),
            trace: super::trace_contexts::Registry::default(),
        }
    }

    /// `pid`'s entry as written now: its tables count it as a user, those
    /// of the entry it replaces no longer.
    fn record_synced(&mut self, pid: u32, synced: SyncedProcess) {
        self.count_users(&synced.tables, true);
        if let Some(replaced) = self.synced.insert(pid, synced) {
            self.count_users(&replaced.tables, false);
        }
    }

    /// Forgets `pid`'s entry (its tables lose a user); whether it had one.
    fn forget_synced(&mut self, pid: u32) -> bool {
        match self.synced.remove(&pid) {
            Some(forgotten) => {
                self.count_users(&forgotten.tables, false);
                true
            }
            None => false,
        }
    }

    fn count_users(&mut self, keys: &[ContentKey], add: bool) {
        for key in keys {
            if let Some(table) = self.tables.get_mut(key) {
                table.users = if add {
                    table.users.saturating_add(1)
                } else {
                    table.users.saturating_sub(1)
                };
            }
        }
    }

    /// The program named `pid` in a hand-off notice: the next sync
    /// describes it.
    pub(super) fn note_handed_off(&mut self, pid: u32) {
        self.handed_off.insert(pid);
    }

    pub(super) fn table_stats(&self) -> TableStats {
        TableStats {
            files_loaded: self.tables.len() as u64,
            ..self.table_stats
        }
    }

    /// The processes whose mappings are in the process map.
    pub(super) fn tracked_processes(&self) -> HashSet<u32> {
        self.synced.keys().copied().collect()
    }

    /// Bytes of rows in the table maps now.
    pub(super) fn table_bytes(&self) -> u64 {
        self.rows.used_bytes()
    }

    /// Tables in the maps and their rows.
    pub(super) fn tables_loaded(&self) -> (usize, u64) {
        (self.tables.len(), self.rows.used_rows())
    }

    /// The tables in the maps (kernel memory, within `--bpf-table-mib`) and
    /// the compiled tables they are filled from, for the overhead report.
    pub(super) fn cache_figures(&self) -> [crate::overhead::CacheFigures; 2] {
        let stats = self.table_stats();
        let rows = crate::overhead::CacheFigures {
            name: "bpf_rows",
            entries: stats.files_loaded,
            used: self.rows.used_bytes(),
            budget: Some(self.rows.budget_bytes()),
            unit: "bytes",
            evicted: stats.tables_freed + stats.tables_not_fitting,
        };
        [rows, self.compiler.figures("bpf_compiled_tables")]
    }
}

/// Processes read for a sync ([`BpfEngine::read_young`]).
pub struct YoungProcesses {
    pids: HashSet<u32>,
    /// Those still alive, as read.
    table: ProcessTable,
}

impl BpfEngine {
    /// Makes the process map match `processes`: writes the entry of every
    /// process whose executable mappings (or their tables) changed or that
    /// is new, and removes the processes that have exited. (A process the
    /// table does not know yet keeps the entry of the engine's initial
    /// snapshot while it lives.) Only changed entries reach the kernel, so
    /// calling this after every poll is cheap.
    ///
    /// The `young` processes are the exception: those whose
    /// fork, exec or executable mmap has been read but not yet applied to
    /// `processes` (the perf engine holds records back to order them), so
    /// that the table's view of them is behind. They are read from `/proc`
    /// now, which shortens by the hold-back the time a new program runs
    /// with maps that do not describe it.
    pub fn sync_with_young(&mut self, processes: &ProcessTable, young: &HashSet<u32>) {
        if !self.sync_due(processes, young) {
            return;
        }
        let young = self.read_young(processes, young, |_| ProcessTable::new());
        self.sync_read_young(processes, young);
    }

    /// The first half of [`BpfEngine::sync_with_young`], after
    /// [`BpfEngine::sync_due`]: the processes the program named in hand-off
    /// notices and the young processes.
    /// `preview` gives the young processes as the records read so far
    /// describe them (those it can: it leaves the others out); the others,
    /// and the handed-off processes no queued record describes (the table
    /// may be missing what the program looked for), are read from `/proc`.
    ///
    /// A handed-off process that `processes` describes otherwise than its
    /// entry in the map (records applied since its last sync: a process
    /// that just exec'd) is not read: the sync writes it from `processes`,
    /// which says what the program was missing. Reading `/proc/PID/maps`
    /// (the kernel formats it anew) cost ~5 % of the loop's work on a
    /// workload that starts a process every 30 ms.
    pub fn read_young(
        &mut self,
        processes: &ProcessTable,
        young: &HashSet<u32>,
        preview: impl FnOnce(&HashSet<u32>) -> ProcessTable,
    ) -> YoungProcesses {
        let mut table = preview(young);
        let mut pids = young.clone();
        let handed_off: Vec<u32> = self.mirror.handed_off.drain().collect();
        for pid in handed_off {
            // Sampling every CPU: another process of the host, whose
            // samples the program drops from now on.
            if self.is_not_profiled(pid, processes, young) {
                self.mark_not_profiled(pid);
                continue;
            }
            // Gone by the records applied since its hand-off (a short-lived
            // process at a low rate, where a hand-off does not wake the
            // reader): nothing left to describe.
            if processes.exited(pid) && !young.contains(&pid) {
                continue;
            }
            let newer_in_table = processes.get(pid).is_some_and(|process| {
                self.mirror
                    .synced
                    .get(&pid)
                    .map(|synced| synced.fingerprint)
                    != Some(mappings_fingerprint(process))
            });
            if !newer_in_table || young.contains(&pid) {
                pids.insert(pid);
            }
        }
        for &pid in &pids {
            // A young process whose exit the records already hold (a
            // `/bin/true`, gone before its first sync) has nothing to read:
            // opening its `/proc/PID/maps`, for a zombie or nothing, cost
            // ~40 us, a fifth of the children of a process-spawning workload.
            if table.get(pid).is_none() && !table.exited(pid) {
                self.mirror.table_stats.processes_read_from_proc += 1;
                // Gone already, or unreadable: nothing to describe.
                let _ = table.load_mappings_from_proc(pid);
            }
        }
        YoungProcesses { pids, table }
    }

    /// Whether the second half of the sync may compile unwind tables (cc1's
    /// take 0.1 s), rather than only write entries that use loaded ones: a
    /// file that the engine has not loaded yet, of a process whose entry
    /// the sync will write (young, or changed since its last sync: the
    /// others keep their entries, see [`BpfEngine::sync_process`]). Not
    /// looking at the unchanged ones keeps this check's cost to the
    /// processes that changed, not every mapping of every process at each
    /// poll (`--global`).
    pub fn sync_may_compile(&self, processes: &ProcessTable, young: &YoungProcesses) -> bool {
        let needs_load = |file: &Arc<MappedFile>| match self.mirror.files.get(file) {
            Some(FileState::Loaded(key)) => !self.mirror.tables.contains_key(key),
            Some(FileState::NotLoaded | FileState::Missing) => false,
            Some(FileState::Deferred) | None => true,
        };
        let loads = |process: &Process| process.mappings.iter().any(|m| needs_load(&m.file));
        young.table.iter().any(|(_, process)| loads(process))
            || processes
                .iter()
                .any(|(pid, process)| !self.is_synced_as(pid, process) && loads(process))
    }

    /// Whether `process`'s entry was last written from these mappings.
    fn is_synced_as(&self, pid: u32, process: &Process) -> bool {
        self.mirror
            .synced
            .get(&pid)
            .is_some_and(|synced| synced.fingerprint == mappings_fingerprint(process))
    }

    /// The second half of [`BpfEngine::sync_with_young`]: writes the
    /// entries of `young` as read, and of every other changed process as
    /// `processes` has it.
    pub fn sync_read_young(&mut self, processes: &ProcessTable, young: YoungProcesses) {
        self.mirror.synced_generation = Some(processes.generation());
        // First the entries, with the tables at hand (loaded, or stored
        // from an earlier run under a remembered digest); then the tables
        // that must be compiled, and the entries again with them. A cold
        // clang process's entry waited ~230 ms for libz3's table (127 ms)
        // and the hashing of the 30 MB libicudata (50 ms), while its
        // samples went to the perf engine, mostly in libLLVM, whose table
        // was stored.
        self.mirror.defer_compiling = true;
        let read: Vec<u32> = young.table.pids().collect();
        for pid in read {
            self.sync_process(pid, &young.table);
        }
        // Gone: what the records said exited; else what `/proc` says is gone
        // (an entry read from `/proc`, or from the snapshot at start), a path
        // lookup that costs more than the rest of a new process's sync.
        let gone: Vec<u32> = self
            .mirror
            .synced
            .keys()
            .copied()
            .filter(|&pid| {
                processes.get(pid).is_none()
                    && !young.pids.contains(&pid)
                    && (processes.exited(pid) || !is_alive(pid))
            })
            .collect();
        for pid in gone {
            self.forget_process(pid);
        }
        self.mirror
            .dirty
            .extend(processes.pids().filter(|pid| !young.pids.contains(pid)));
        self.sync_dirty(processes);
        self.mirror.defer_compiling = false;
        let deferred = std::mem::take(&mut self.mirror.deferred);
        for pid in deferred {
            if young.table.get(pid).is_some() {
                self.sync_process(pid, &young.table);
            } else {
                self.sync_process(pid, processes);
            }
        }
        self.retry_trace_contexts(processes, &young.table);
        // Slots released by the syncs above and not reused yet.
        self.mirror.rows.flush();
    }

    /// Whether [`BpfEngine::sync_with_young`] has anything to do: young
    /// processes, processes the program named in hand-off notices since
    /// the last sync, or a table that changed. Cheap (no system call), so
    /// that a caller can skip setting up for a sync that may be slow.
    pub fn sync_due(&self, processes: &ProcessTable, young: &HashSet<u32>) -> bool {
        !young.is_empty()
            || !self.mirror.handed_off.is_empty()
            || self.mirror.synced_generation != Some(processes.generation())
            || self.mirror.trace.retry_due()
    }

    fn sync_dirty(&mut self, processes: &ProcessTable) {
        let mut dirty: Vec<u32> = self.mirror.dirty.drain().collect();
        dirty.sort_unstable();
        for pid in dirty {
            self.sync_process(pid, processes);
        }
    }

    fn forget_process(&mut self, pid: u32) {
        self.mirror.dirty.remove(&pid);
        self.forget_trace_context(pid);
        if self.mirror.forget_synced(pid) {
            if let Ok(mut map) = self.program.process_map() {
                let _ = map.remove(&pid);
            }
        }
    }

    /// Rewrites one process's entry from the table.
    pub(super) fn sync_process(&mut self, pid: u32, processes: &ProcessTable) {
        let Some(process) = processes.get(pid) else {
            self.forget_process(pid);
            return;
        };
        if self.is_synced_as(pid, process) {
            return;
        }
        self.unmark_not_profiled(pid);
        let fingerprint = mappings_fingerprint(process);
        if process.mappings.len() > MAX_PROCESS_MAPPINGS {
            self.mirror.table_stats.processes_truncated += 1;
        }
        let mut entries = Vec::with_capacity(process.mappings.len().min(MAX_PROCESS_MAPPINGS));
        // The tables this entry uses, as they are loaded: making room for a
        // later one must not free an earlier one (its rows would be handed
        // out again while this entry points at them).
        self.mirror.syncing.clear();
        let mut deferred = false;
        for mapping in process.mappings.iter().take(MAX_PROCESS_MAPPINGS) {
            let mut entry = MappingEntry {
                start: mapping.start,
                end: mapping.end,
                ..MappingEntry::default()
            };
            let state = self.table_for(pid, &mapping.file, Some((mapping.start, mapping.end)));
            if let FileState::NotLoaded | FileState::Deferred = state {
                // Its frames are handed to the perf engine.
                entry.table = TABLE_NOT_LOADED;
            }
            deferred |= matches!(state, FileState::Deferred);
            if let FileState::Loaded(key) = state {
                if let Some(table) = self.mirror.tables.get(&key) {
                    if let Some(bias) = LoadSegment::bias_for_mapping(
                        &table.segments,
                        mapping.start,
                        mapping.file_offset,
                    ) {
                        entry.bias = bias;
                        entry.table = table.slot;
                        entry.row_count = table.row_count;
                    }
                }
                self.mirror.syncing.push(key);
            }
            entries.push(entry);
        }
        if let Some(synced) = self
            .mirror
            .synced
            .get_mut(&pid)
            .filter(|synced| !deferred && synced.entries == entries)
        {
            synced.fingerprint = fingerprint;
            return;
        }
        // The new tables reach their slots before the entry that uses them.
        self.mirror.rows.flush();
        self.mirror.entry_version = self.mirror.entry_version.wrapping_add(1);
        let mut value = ProcessMappings {
            count: entries.len() as u32,
            version: self.mirror.entry_version,
            ..ProcessMappings::default()
        };
        value.entries[..entries.len()].copy_from_slice(&entries);
        match self.program.process_map() {
            Ok(mut map) => {
                if let Err(error) = map.insert(pid, value, 0) {
                    log::debug!("process {pid} not tracked by the BPF engine: {error}");
                    self.mirror.table_stats.processes_not_tracked += 1;
                    self.not_written(pid, fingerprint);
                    return;
                }
            }
            Err(error) => {
                log::warn!("{error}");
                self.not_written(pid, fingerprint);
                return;
            }
        }
        let tables = std::mem::take(&mut self.mirror.syncing);
        self.mirror.record_synced(
            pid,
            SyncedProcess {
                // Not synced as its mappings are until its deferred tables
                // are in (a fingerprint no mappings give).
                fingerprint: if deferred { !fingerprint } else { fingerprint },
                entries,
                tables,
            },
        );
        if deferred {
            self.mirror.deferred.push(pid);
        }
        self.sync_trace_context(pid, process);
    }

    /// Writes (or removes) `pid`'s `TRACE_CONTEXTS` entry: where its
    /// threads keep the context they publish, if they do.
    fn sync_trace_context(&mut self, pid: u32, process: &Process) {
        let before = self.mirror.trace.slots(pid);
        let now = self.mirror.trace.discover(pid, process);
        if now == before {
            return;
        }
        let map = self
            .program
            .hash_map::<u32, TraceContextSlots>(names::TRACE_CONTEXTS);
        match (map, now) {
            (Ok(mut map), Some(slots)) => {
                if let Err(error) = map.insert(pid, slots, 0) {
                    log::info!(
                        "trace context: process {pid}'s contexts are not read (the map is full: \
                         {error})"
                    );
                    // Not written: tried again at its next sync.
                    self.mirror.trace.forget(pid);
                }
            }
            (Ok(mut map), None) => {
                let _ = map.remove(&pid);
            }
            (Err(error), _) => log::warn!("{error}"),
        }
    }

    /// Removes `pid`'s `TRACE_CONTEXTS` entry, if it has one, and forgets it.
    fn forget_trace_context(&mut self, pid: u32) {
        if self.mirror.trace.slots(pid).is_some() {
            if let Ok(mut map) = self
                .program
                .hash_map::<u32, TraceContextSlots>(names::TRACE_CONTEXTS)
            {
                let _ = map.remove(&pid);
            }
        }
        self.mirror.trace.forget(pid);
    }

    /// Looks again at the processes due another look (a library's
    /// variable not relocated yet, a key map not read yet), as `young` (read
    /// from `/proc` this sync) or else `processes` has them.
    fn retry_trace_contexts(&mut self, processes: &ProcessTable, young: &ProcessTable) {
        for pid in self.mirror.trace.take_due() {
            match young.get(pid).or_else(|| processes.get(pid)) {
                Some(process) => self.sync_trace_context(pid, process),
                None => self.forget_trace_context(pid),
            }
        }
    }

    /// An entry that could not be written (the map is full): the one
    /// written before, if any, stays, and is not tried again until the
    /// process's mappings change.
    fn not_written(&mut self, pid: u32, fingerprint: u64) {
        if let Some(synced) = self.mirror.synced.get_mut(&pid) {
            synced.fingerprint = fingerprint;
        }
    }

    /// Makes this copy of the engine true again in a profiler worker that
    /// replaces another: the copy was forked from the parent as the engine
    /// was at start, while the maps and the ring buffer are shared and
    /// were moved on by the earlier workers since.
    ///
    /// - The ring buffer is opened again, so that reading resumes at the
    ///   shared consumer position (aya's reader caches it).
    /// - Every process map entry is deleted (listed from the kernel's map,
    ///   not from the stale bookkeeping): until its process is synced
    ///   again, the program hands its samples to the perf engine, which
    ///   unwinds them exactly, so none is unwound with a table slot given
    ///   to another file. (A sample that looked its entry up just before
    ///   the deletion, on another CPU, may still read such a slot: a
    ///   window of one sample per CPU, whose stack may then end early.)
    /// - Every table slot is emptied (the copy only knows the tables of the
    ///   start; earlier workers filled others) and the tables and entries
    ///   of every process of `processes` are written again.
    pub fn resync_after_restart(&mut self, processes: &ProcessTable) -> Result<(), BpfError> {
        let map_error = |error: aya::maps::MapError| BpfError::Map {
            map: ddprof_common::bpf_maps::names::SAMPLES,
            problem: MapProblem::Aya(error),
        };
        let fd = std::os::fd::AsFd::as_fd(&self.ring)
            .try_clone_to_owned()
            .map_err(|io_error| {
                map_error(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "fcntl(F_DUPFD_CLOEXEC)",
                    io_error,
                }))
            })?;
        let data = aya::maps::MapData::from_fd(fd).map_err(map_error)?;
        let map = aya::maps::Map::from_map_data(data).map_err(map_error)?;
        self.ring = aya::maps::RingBuf::try_from(map).map_err(map_error)?;
        self.clear_not_profiled();
        {
            let mut map = self.program.process_map()?;
            let pids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
            for pid in pids {
                let _ = map.remove(&pid);
            }
        }
        {
            let mut map = self
                .program
                .hash_map::<u32, TraceContextSlots>(names::TRACE_CONTEXTS)?;
            let pids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
            for pid in pids {
                let _ = map.remove(&pid);
            }
        }
        self.mirror.trace.clear();
        self.mirror.tables.clear();
        self.mirror.rows.clear_all();
        self.mirror.files.clear();
        self.mirror.synced.clear();
        self.mirror.dirty.clear();
        self.mirror.handed_off.clear();
        self.mirror.synced_generation = None;
        self.sync_with_young(processes, &HashSet::new());
        Ok(())
    }
}

/// A process's entry in the process map, as the engine last wrote it.
struct SyncedProcess {
    /// [`mappings_fingerprint`] of the mappings it was last synced from (so
    /// that a sync of unchanged processes costs no table lookups).
    fingerprint: u64,
    /// The entries written.
    entries: Vec<MappingEntry>,
    /// The tables they use, kept loaded while they do.
    tables: Vec<ContentKey>,
}

/// A hash of a process's mappings: equal when its entry would be written
/// the same (so that a sync of unchanged processes costs no table lookups).
fn mappings_fingerprint(process: &Process) -> u64 {
    process
        .mappings
        .iter()
        .fold(process.mappings.len() as u64, |hash, m| {
            (hash ^ m.start ^ m.end.rotate_left(17) ^ m.file_offset.rotate_left(31))
                .wrapping_mul(0x100_0000_01b3)
        })
}
