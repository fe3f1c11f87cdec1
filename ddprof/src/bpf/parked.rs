//! `sWALL`'s parked threads, as userspace adds them: the threads already
//! off a CPU when the program starts (`crate::wall::seed`), whose switch-in
//! the program reports as it does for those it parked itself.
use ddprof_common::bpf_maps::names;
use ddprof_common::sample::ParkedThread;

use super::engine::BpfEngine;

/// `BPF_NOEXIST`: insert only a key the map does not hold.
const NO_EXIST: u64 = 1;

impl BpfEngine {
    /// Whether the threads' ids this profiler reads in `/proc` are the
    /// program's keys (the root PID namespace's): only then can it park
    /// threads.
    pub fn parks_by_proc_ids(&self) -> bool {
        self.wall_event().is_some() && super::load::own_pid_namespace().is_none()
    }

    /// Parks thread `tid` of process `pid` as off a CPU since `since`
    /// (CLOCK_MONOTONIC nanoseconds); false if the program parked it
    /// already (its switch-out since the start was drawn: that stack is
    /// its) or the map refused.
    pub fn park_thread(&mut self, pid: u32, tid: u32, since: u64) -> bool {
        let Ok(mut parked) = self.program.hash_map::<u32, ParkedThread>(names::PARKED) else {
            return false;
        };
        let value = ParkedThread {
            pid,
            tid,
            switched_out: since,
        };
        parked.insert(tid, value, NO_EXIST).is_ok()
    }

    /// Takes thread `tid` out of the parked threads if it is still there
    /// as [`BpfEngine::park_thread`] parked it (since `since`: not an
    /// entry of the program's, for a wait that began since); false if not.
    pub fn unpark_thread(&mut self, tid: u32, since: u64) -> bool {
        let Ok(mut parked) = self.program.hash_map::<u32, ParkedThread>(names::PARKED) else {
            return false;
        };
        match parked.get(&tid, 0) {
            Ok(entry) if entry.switched_out == since => parked.remove(&tid).is_ok(),
            _ => false,
        }
    }

    /// The threads of the workload that waited before the program was
    /// attached, with their counts of switches then
    /// ([`crate::wall::seed::waiting_threads`]); taken once, by the
    /// seeding.
    pub fn take_waiting_before_wall(&mut self) -> crate::wall::seed::WaitingThreads {
        std::mem::take(&mut self.waiting_before_wall)
    }
}
