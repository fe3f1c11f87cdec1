//! The stream both sampling engines produce and the later stages consume.
pub use ddprof_common::sample::StackEnd;

/// One sample of one thread, with its user stack already unwound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    pub cpu: u32,
    /// The sample's weight in the event's unit (CPU nanoseconds for sCPU).
    pub weight: u64,
    /// User-space program counters, innermost first. Every frame but the
    /// first is a return address (callers of `frames[0]`).
    pub frames: Vec<u64>,
    /// Kernel program counters, innermost first (empty when not collected).
    pub kernel_frames: Vec<u64>,
    /// How the user stack walk ended.
    pub end: StackEnd,
}

impl Sample {
    pub fn truncated(&self) -> bool {
        !self.end.is_complete()
    }
}

/// Process life-cycle and mapping changes, in the order the kernel reported
/// them; the stages that need a process view (unwinding, normalization)
/// apply these before the samples that follow them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// A new executable mapping (perf `PERF_RECORD_MMAP2`).
    Map(crate::process::MappingRecord),
    /// A thread's name changed; `exec` is set when the process exec'd, which
    /// replaces every mapping it had.
    Comm {
        pid: u32,
        tid: u32,
        name: String,
        exec: bool,
    },
    /// A thread or process was created.
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    /// A thread or process exited.
    Exit { pid: u32, tid: u32 },
}

/// Counters of what did not become a sample, reported at exit and per profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounters {
    /// Samples the kernel dropped because a ring buffer was full
    /// (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`, BPF ring buffer full).
    pub lost: u64,
    /// Times the kernel throttled an event for sampling too fast.
    pub throttled: u64,
    /// Records that could not be parsed.
    pub malformed: u64,
}
