//! What the BPF program is loaded with: the globals the loader sets
//! ([`ProgramSettings`]), and from which sampling rate the program's
//! hand-off notices wake the reader at once.

/// What the loader sets in the program's globals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramSettings {
    /// Collect kernel stacks too.
    pub kernel_stacks: bool,
    /// Wake the reader at once with each hand-off notice (a process the
    /// maps do not describe yet), rather than let the notice wait for the
    /// reader's next wake-up. See [`wakes_on_handoff_at`].
    pub wake_on_handoff: bool,
    /// The program samples every task of each CPU (per-CPU events) and
    /// keeps the profiled processes' samples (`TREE_ONLY`); the per-task
    /// events get the program that drops every sample.
    pub tree_only: bool,
    /// `sWALL`: the `sched_switch` program is loaded too (`bpf_loop`
    /// variant only), for [`BpfProgram::start_wall`].
    pub wall: Option<crate::wall::WallSampling>,
    /// A process the maps do not describe may be profiled (every CPU
    /// sampled, or `--global`): `sWALL`'s program draws its switch-outs too
    /// and asks the reader to describe it.
    pub undescribed_may_be_profiled: bool,
    /// `sALLOC`'s event index: the program on the allocation marker's
    /// uprobe can be loaded (`bpf_loop` variant only), by
    /// [`BpfProgram::attach_allocation`].
    pub allocation: Option<u16>,
}

impl ProgramSettings {
    /// Kernel stacks as asked, hand-off notices waking the reader.
    pub fn with_kernel_stacks(kernel_stacks: bool) -> Self {
        Self {
            kernel_stacks,
            wake_on_handoff: true,
            tree_only: false,
            wall: None,
            undescribed_may_be_profiled: false,
            allocation: None,
        }
    }
}

/// The sampling frequency (samples per second of a task's CPU time) from
/// which a process's first hand-off notice wakes the reader at once.
///
/// The wake-up and the sync it leads to cost ~90 µs of CPU per new
/// process on a VM; without it the process is described at the reader's
/// next wake-up (at most `sampler::BPF_MAX_POLL`, 250 ms), and until then
/// its samples take the perf engine's path (~5 µs more each, and a stack
/// copy that a stack deeper than `--stack-sample-size` outgrows). At 99 Hz
/// a process must run ~180 ms for the wake-up to pay, and the processes of
/// a build or a shell script mostly end sooner (forker's 30 ms children at
/// 99 Hz: 41.3 → 32.4 ms of profiler CPU without the wake-up); at 999 Hz it
/// pays from ~18 ms (forker: 47.7 → 49.6 ms without it). Below this rate a
/// process's next notice, `HANDOFF_NOTICE_INTERVAL_NS` (100 ms) after its
/// first, wakes the reader: a process still handed over then is no short
/// job, and the wait for its description drops from up to 250 ms to ~100.
pub const HANDOFF_WAKEUP_MIN_HZ: u64 = 250;

/// Whether hand-off notices should wake the reader when each task is
/// sampled `hz` times a second of its CPU time.
pub fn wakes_on_handoff_at(hz: u64) -> bool {
    hz >= HANDOFF_WAKEUP_MIN_HZ
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_off_notices_wake_the_reader_only_at_high_rates() {
        // The default frequency: the notices wait for the next wake-up.
        assert!(!wakes_on_handoff_at(crate::events::DEFAULT_CPU_FREQUENCY));
        assert!(!wakes_on_handoff_at(HANDOFF_WAKEUP_MIN_HZ - 1));
        assert!(wakes_on_handoff_at(HANDOFF_WAKEUP_MIN_HZ));
        assert!(wakes_on_handoff_at(999));
        // What the tests and `ddprof check` load keeps waking.
        assert!(ProgramSettings::with_kernel_stacks(false).wake_on_handoff);
    }
}
