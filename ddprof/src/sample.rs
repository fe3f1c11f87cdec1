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
    /// Which event took it: its position in the session's list
    /// ([`crate::events::EventSpec::index`]).
    pub event: u16,
    /// The sample's weight in the event's unit (CPU nanoseconds for sCPU,
    /// events for the others, or what their `n=`, `r=` and `s=` ask for).
    pub weight: u64,
    /// What the sample stands for in thousandths of an occurrence of its
    /// event ([`crate::events::COUNT_UNIT`] for one): for `sALLOC`, the 1/p
    /// allocations of its size that it stands for.
    pub scaled_count: u64,
    /// User-space program counters, innermost first. Every frame but the
    /// first is a return address (callers of `frames[0]`).
    pub frames: Vec<u64>,
    /// Kernel program counters, innermost first (empty when not collected).
    pub kernel_frames: Vec<u64>,
    /// How the user stack walk ended.
    pub end: StackEnd,
    /// For the allocation probes' samples, what they say of the heap: an
    /// allocation followed at an address, or a free of one (a free is not a
    /// sample of the profile: it takes an allocation out of the live heap).
    pub heap: Option<HeapEvent>,
    /// For `sWALL`'s records, which end of a wait they are (the wall-time
    /// stage pairs them: [`crate::wall`]); `None` for every other sample.
    pub off_cpu: Option<OffCpu>,
    /// What the thread published of the request it was serving (the BPF
    /// engine reads it: [`crate::trace_context`]).
    pub trace: Option<std::sync::Arc<crate::trace_context::TraceLabels>>,
}

/// An `sWALL` record: a stack taken as its thread left the CPU, or the
/// thread's return to a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffCpu {
    /// The thread's stacks as it switched out, drawn with `probability`
    /// (in `WALL_PROBABILITY_ONE`ths); its weight is known when it runs
    /// again.
    SwitchedOut { probability: u64 },
    /// The thread of the stack taken at `switched_out` ran again at the
    /// sample's time (no stack).
    Resumed { switched_out: u64 },
}

/// What an allocation probe's sample says of the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapEvent {
    /// A sampled allocation of `size` bytes the library follows, at
    /// `address`.
    Allocated { address: u64, size: u64 },
    /// A sampled allocation the library does not follow (sum mode, or its
    /// table had no room): not part of the live heap.
    NotFollowed,
    /// A followed allocation was freed (`held` 0), or a mapping lost a part
    /// of its pages (`held` the bytes left, in the unit of its `size`); it
    /// goes by `renamed` from now on when that is not 0 (a mapping moved,
    /// or whose first pages went).
    Freed {
        address: u64,
        held: u64,
        renamed: u64,
    },
}

impl Sample {
    pub fn truncated(&self) -> bool {
        !self.end.is_complete()
    }
}

/// Counters of what did not become a sample, reported at exit and per profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounters {
    /// Samples the kernel dropped because a ring buffer was full
    /// (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`, BPF ring buffer full).
    pub lost: u64,
    /// Times the kernel throttled an event for sampling too fast (it then
    /// takes no sample for the rest of the tick: the CPU time goes
    /// unsampled, see `overhead`).
    pub throttled: u64,
    /// Records that could not be parsed (each counts as a lost sample).
    pub malformed: u64,
    /// Samples of a profiled process taken after its exit record (every
    /// CPU sampled): its address space is gone, there is no stack to
    /// unwind, and the kernel's count of the tasks' CPU time stops there.
    pub exiting: u64,
    /// Samples handed to the perf engine and lost in a full per-CPU buffer
    /// (every CPU sampled, `--engine bpf`): the program hands over the
    /// samples of every process it does not know yet, so some of these may
    /// be other processes'. They count as lost only as far as the kernel's
    /// count of the profiled tasks' CPU time says samples of theirs are
    /// missing (see `overhead::OverheadMeter::end_period`).
    pub unattributed: u64,
}

impl std::ops::Add for LossCounters {
    type Output = LossCounters;

    fn add(self, other: LossCounters) -> LossCounters {
        LossCounters {
            lost: self.lost + other.lost,
            throttled: self.throttled + other.throttled,
            malformed: self.malformed + other.malformed,
            exiting: self.exiting + other.exiting,
            unattributed: self.unattributed + other.unattributed,
        }
    }
}
