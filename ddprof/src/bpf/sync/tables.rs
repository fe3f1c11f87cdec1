//! A mapped file's unwind table into a map of its own: found once per
//! file (loaded, not fitting, none, or to be compiled later in the sync),
//! freed when the budget needs room and no process maps it.
use std::collections::HashSet;
use std::sync::Arc;

use ddprof_common::unwind::ROW_SIZE;

use super::super::engine::BpfEngine;
use super::LoadedTable;
use crate::files::{ContentKey, MappedFile};

/// Files whose table state (none, or not fitting) is remembered; past this
/// many, the decisions are made again.
const DECIDED_FILES_KEPT: usize = 16384;
/// Files already warned about (their table did not fit).
const WARNED_FILES_KEPT: usize = 4096;

/// The table state of one mapped file.
#[derive(Clone)]
pub(super) enum FileState {
    Loaded(ContentKey),
    /// The file has a table but it did not fit the budget: samples that
    /// need it are handed to the perf engine (`TABLE_NOT_LOADED`). Decided
    /// once per file: not tried again while the file is known.
    NotLoaded,
    /// No table (no CFI, unreadable, not ELF): frame pointers, as the perf
    /// engine would use.
    Missing,
    /// Not loaded yet: its table is to be compiled (or its file hashed)
    /// later in the same sync. Never kept in `MapMirror::files`.
    Deferred,
}

/// One loaded table, as reported by [`BpfEngine::load_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedFileReport {
    pub rows: u32,
    pub bytes: usize,
    /// Its slot in `TABLES`.
    pub slot: u32,
}

impl BpfEngine {
    /// The state of `file`'s table, loading it into a map of its own on first
    /// use. `range` is a mapping of the file in `pid` (to reach deleted
    /// files).
    pub(super) fn table_for(
        &mut self,
        pid: u32,
        file: &Arc<MappedFile>,
        range: Option<(u64, u64)>,
    ) -> FileState {
        match self.mirror.files.get(file) {
            Some(FileState::Loaded(key)) if !self.mirror.tables.contains_key(key) => {}
            Some(state) => return state.clone(),
            None => {}
        }
        let state = self.load_table(pid, file, range);
        if !matches!(state, FileState::Deferred) {
            self.mirror.files.insert(file.clone(), state.clone());
        }
        state
    }

    fn load_table(&mut self, pid: u32, file: &MappedFile, range: Option<(u64, u64)>) -> FileState {
        let started = std::time::Instant::now();
        let loaded = if self.mirror.defer_compiling {
            self.mirror.compiler.load_if_ready(pid, file, range)
        } else {
            self.mirror.compiler.load(pid, file, range)
        };
        let table = match loaded {
            Ok(table) => table,
            Err(crate::unwind::cache::LoadError::NotStored(_)) if self.mirror.defer_compiling => {
                return FileState::Deferred;
            }
            Err(error) => {
                log::debug!("BPF engine: no unwind table: {error}");
                self.mirror.table_stats.files_without_table += 1;
                return FileState::Missing;
            }
        };
        if self.mirror.tables.contains_key(&table.key) {
            return FileState::Loaded(table.key);
        }
        let loaded_after = started.elapsed();
        let rows = &table.table.rows;
        let name = file.path.rsplit('/').next().unwrap_or_default();
        let slot = match self.mirror.rows.store(rows, name) {
            Ok(slot) => slot,
            Err(_) => {
                self.release_unused_tables();
                match self.mirror.rows.store(rows, name) {
                    Ok(slot) => slot,
                    Err(error) => {
                        self.mirror.table_stats.tables_not_fitting += 1;
                        self.warn_not_loaded(file, rows.len(), &error);
                        return FileState::NotLoaded;
                    }
                }
            }
        };
        log::debug!(
            "BPF engine: table of {} ({} rows) in slot {slot} after {:.1} ms ({:.1} ms to \
             compile or read it)",
            file.path,
            rows.len(),
            started.elapsed().as_secs_f64() * 1e3,
            loaded_after.as_secs_f64() * 1e3
        );
        self.mirror.tables.insert(
            table.key,
            LoadedTable {
                slot,
                row_count: rows.len() as u32,
                segments: table.table.segments.clone(),
                users: 0,
            },
        );
        FileState::Loaded(table.key)
    }

    /// Says, once per file, that its table is not in the kernel and what
    /// makes it fit.
    fn warn_not_loaded(
        &mut self,
        file: &MappedFile,
        rows: usize,
        error: &crate::bpf::rows::StoreError,
    ) {
        if self.mirror.warned_not_loaded.len() >= WARNED_FILES_KEPT {
            self.mirror.warned_not_loaded.clear();
        }
        if !self.mirror.warned_not_loaded.insert((file.dev, file.inode)) {
            return;
        }
        let mib = |bytes: u64| bytes.div_ceil(1 << 20);
        log::warn!(
            "BPF engine: the unwind table of {} ({rows} rows, {} MiB) is not in the kernel: \
             {error} ({} of {} MiB in use); its samples are unwound in userspace from a copy \
             of the stack (slower, and stacks deeper than --stack-sample-size end early). \
             Raise --bpf-table-mib (DD_PROFILING_BPF_TABLE_MIB) to unwind them in the kernel",
            file.path,
            mib(crate::bpf::rows::TableMaps::bytes_for(rows)),
            mib(self.mirror.rows.used_bytes()),
            mib(self.mirror.rows.budget_bytes()),
        );
    }

    /// Frees the rows of tables no tracked process uses any more.
    pub(super) fn release_unused_tables(&mut self) {
        let syncing: HashSet<&ContentKey> = self.mirror.syncing.iter().collect();
        let unused: Vec<ContentKey> = self
            .mirror
            .tables
            .iter()
            .filter(|(key, table)| table.users == 0 && !syncing.contains(key))
            .map(|(key, _)| *key)
            .collect();
        for key in unused {
            if let Some(table) = self.mirror.tables.remove(&key) {
                self.mirror.rows.release(table.slot);
                self.mirror.table_stats.tables_freed += 1;
            }
        }
        // Files found without a table, or whose table did not fit, keep
        // that state (decided once, see `FileState::NotLoaded`) unless the
        // list grew past its bound.
        let forget_decisions = self.mirror.files.len() > DECIDED_FILES_KEPT;
        self.mirror.files.retain(|_, state| match state {
            FileState::Loaded(key) => self.mirror.tables.contains_key(key),
            FileState::NotLoaded | FileState::Missing => !forget_decisions,
            FileState::Deferred => false,
        });
    }

    /// Waits for the changes of table slots still running on threads of
    /// this process (see [`crate::bpf::rows::TableMaps::flush`]): called before
    /// a worker is forked.
    pub fn settle_table_changes(&mut self) {
        self.mirror.rows.settle();
    }

    /// Closes this copy's unwind table maps (the parent's, once a worker
    /// was forked; see [`crate::bpf::rows::TableMaps::close_descriptors`]).
    pub fn release_table_maps(&mut self) {
        self.mirror.rows.close_descriptors();
        // And the tables read for them (pages of mapped store files).
        self.mirror.compiler.forget_all();
    }

    /// Loads the table of one file into a map now, as if a process
    /// mapped it (tests, and files known to be needed soon).
    pub fn load_file(&mut self, path: &str) -> Option<LoadedFileReport> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        let file = Arc::new(MappedFile {
            path: path.to_string(),
            dev: metadata.dev(),
            inode: metadata.ino(),
        });
        let report = self.stage_files(&[file]).pop().flatten();
        self.mirror.rows.flush();
        report
    }

    /// Loads the tables of `files` into maps now, as if a process mapped
    /// them (what is loaded now is not loaded again when a process maps
    /// it), without putting the maps in their slots: the next sync that
    /// writes an entry does (a slot set here, before a worker starts, must
    /// finish its RCU grace period before the fork; waited for, it delayed
    /// every launched command's worker by 15-25 ms, and a program
    /// allocating at 17,000 samples a second lost samples in the rings
    /// meanwhile).
    pub fn stage_files(&mut self, files: &[Arc<MappedFile>]) -> Vec<Option<LoadedFileReport>> {
        let states: Vec<FileState> = files
            .iter()
            .map(|file| self.table_for(std::process::id(), file, None))
            .collect();
        states
            .into_iter()
            .map(|state| {
                let FileState::Loaded(key) = state else {
                    return None;
                };
                let table = self.mirror.tables.get(&key)?;
                Some(LoadedFileReport {
                    rows: table.row_count,
                    bytes: table.row_count as usize * ROW_SIZE,
                    slot: table.slot,
                })
            })
            .collect()
    }

    /// The rows of the table in `slot`, as the kernel's map holds them.
    pub fn stored_rows(&self, slot: u32) -> Option<Vec<ddprof_common::unwind::UnwindRow>> {
        self.mirror.rows.rows(slot)
    }
}
