//! With the program on per-CPU events (`TREE_ONLY`), which processes of
//! the host it drops the samples of: those userspace found not profiled
//! (the `NOT_PROFILED` map), written from the processes it handed over,
//! taken out again when the records of the profiled processes name them.
use ddprof_common::bpf_maps::MAX_NOT_PROFILED;

use super::engine::BpfEngine;
use crate::process::ProcessTable;

impl BpfEngine {
    /// Whether process `pid`, which the program handed over, is not
    /// profiled: sampling every CPU, it meets every process of the host,
    /// and a profiled one is in the table (its fork or exec applied), among
    /// the processes whose records are queued (`young`), or gone.
    pub(super) fn is_not_profiled(
        &self,
        pid: u32,
        processes: &ProcessTable,
        young: &std::collections::HashSet<u32>,
    ) -> bool {
        self.tree_only
            && processes.get(pid).is_none()
            && !young.contains(&pid)
            && !processes.exited(pid)
    }

    /// Has the program drop the samples of `pid` from now on (one map
    /// update per process: its first samples were handed over).
    pub(super) fn mark_not_profiled(&mut self, pid: u32) {
        if self.not_profiled.contains_key(&pid) {
            return;
        }
        if self.not_profiled.len() >= MAX_NOT_PROFILED as usize {
            self.forget_oldest_not_profiled();
        }
        let Ok(mut map) = self.program.not_profiled_map() else {
            return;
        };
        if map.insert(pid, 1, 0).is_ok() {
            self.not_profiled_writes += 1;
            self.not_profiled.insert(pid, self.not_profiled_writes);
        }
    }

    /// A process the records name (its entry is being written): if its PID
    /// was another, not profiled, process's, the program must keep its
    /// samples again.
    pub(super) fn unmark_not_profiled(&mut self, pid: u32) {
        if self.not_profiled.remove(&pid).is_some() {
            if let Ok(mut map) = self.program.not_profiled_map() {
                let _ = map.remove(&pid);
            }
        }
    }

    /// Empties the map (a restarted worker does not know what an earlier
    /// one wrote).
    pub(super) fn clear_not_profiled(&mut self) {
        self.not_profiled.clear();
        if let Ok(mut map) = self.program.not_profiled_map() {
            let pids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
            for pid in pids {
                let _ = map.remove(&pid);
            }
        }
    }

    /// The older half of what was written: those processes are likely
    /// gone (the kernel's LRU has evicted them, or will), and the mirror
    /// stays bounded.
    fn forget_oldest_not_profiled(&mut self) {
        let mut by_age: Vec<(u64, u32)> = self
            .not_profiled
            .iter()
            .map(|(&pid, &written)| (written, pid))
            .collect();
        by_age.sort_unstable();
        let oldest: Vec<u32> = by_age[..by_age.len() / 2]
            .iter()
            .map(|&(_, pid)| pid)
            .collect();
        for pid in oldest {
            self.unmark_not_profiled(pid);
        }
    }
}
