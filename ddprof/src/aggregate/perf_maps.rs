//! The perf maps (or jitdumps) of the processes a period met running
//! anonymous code: opened while those processes run, since the symbolizer
//! reads them only after the period, when a process may be gone.
use std::collections::HashMap;
use std::sync::Arc;

use super::FastMap;
use crate::files::target::{JitSymbols, PerfMapRefused};
use crate::process::ProcessTable;

/// What a process's map lookup found: the map, why the one found was
/// refused, or nothing (`None`).
type Found = Option<Result<Arc<JitSymbols>, PerfMapRefused>>;

/// One period's perf-map lookups, by process.
#[derive(Debug, Default)]
pub(super) struct PerfMapsFound {
    opened: FastMap<u32, Found>,
    /// The jitdump each process had mapped when looked for (where to look
    /// again while it has no perf map).
    jitdumps: FastMap<u32, Option<String>>,
}

impl PerfMapsFound {
    /// Opens `pid`'s perf map the first time the period meets anonymous
    /// code of it.
    pub(super) fn look_for(&mut self, processes: &ProcessTable, pid: u32) {
        self.opened.entry(pid).or_insert_with(|| {
            let jitdump = jitdump_path(processes, pid);
            self.jitdumps.insert(pid, jitdump.clone());
            open_perf_map(pid, jitdump.as_deref())
        });
    }

    /// Notes the jitdump each process still without a perf map has mapped
    /// since the period first met its anonymous code: V8 may run code in
    /// anonymous memory before it maps its jitdump, and the path noted at
    /// that first sample (none) would leave the whole period unnamed.
    pub(super) fn note_jitdumps_mapped_since(&mut self, processes: &ProcessTable) {
        for (&pid, opened) in &self.opened {
            let noted = self.jitdumps.entry(pid).or_default();
            if opened.is_none() && noted.is_none() {
                *noted = jitdump_path(processes, pid);
            }
        }
    }

    /// Looks again, at the period's end, for the maps that were not there
    /// when the period first met a process's anonymous code (a runtime
    /// writes its map after its first code runs, or a sample landed in
    /// anonymous memory before the runtime started: the period's samples
    /// of that code would otherwise all stay unnamed), once per process a
    /// period; then the maps found, by process.
    pub(super) fn look_again_for_missing(
        self,
    ) -> HashMap<u32, Result<Arc<JitSymbols>, PerfMapRefused>> {
        let jitdumps = self.jitdumps;
        self.opened
            .into_iter()
            .filter_map(|(pid, opened)| {
                let opened = opened.or_else(|| {
                    let jitdump = jitdumps.get(&pid).cloned().flatten();
                    open_perf_map(pid, jitdump.as_deref())
                });
                Some((pid, opened?))
            })
            .collect()
    }
}

/// The path of the jitdump file `pid` mapped, if any.
fn jitdump_path(processes: &ProcessTable, pid: u32) -> Option<String> {
    processes
        .get(pid)?
        .mappings
        .iter()
        .find(|mapping| crate::files::target::is_jitdump_path(&mapping.file.path))
        .map(|mapping| mapping.file.path.clone())
}

/// `pid`'s perf map (or jitdump) opened (`None`: it has none, or it is gone).
fn open_perf_map(pid: u32, jitdump: Option<&str>) -> Found {
    match crate::files::target::open_perf_map(pid, jitdump) {
        Ok(opened) => opened.map(|opened| Ok(Arc::new(opened))),
        Err(refused) => Some(Err(refused)),
    }
}
