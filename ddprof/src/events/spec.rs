//! What an event is: `-e` specs (`sCPU freq=999`, `sPF p=64`,
//! `sched:sched_switch l=switches`), parsed once into typed specs with the
//! C++ ddprof's event table, keys and defaults, and checked against this
//! machine's sampling-rate limit.
use std::sync::Arc;

/// Default sampling frequency of `sCPU` in Hz (what Datadog's ddprof uses).
pub const DEFAULT_CPU_FREQUENCY: u64 = 99;

/// How often an event samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleRate {
    /// Samples per second (the kernel adjusts the period).
    Frequency(u64),
    /// One sample every N units of the event (nanoseconds for CPU time).
    Period(u64),
}

/// The perf event type an event is opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterType {
    Hardware,
    Software,
}

/// The kinds of event ddprof samples on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// `sCPU`: CPU time of the profiled tasks (the task-clock software event).
    CpuTime,
    /// A counter of the C++ ddprof's table other than `sCPU` (`sPF`,
    /// `hCPU`, …): its entry.
    Counter(&'static TableEntry),
    /// A kernel tracepoint, by `group:name` (its id read from tracefs when
    /// opened) or by id.
    Tracepoint(Tracepoint),
    /// `sALLOC`: allocations of the wrapped command, sampled by the
    /// preloaded library ([`super::allocation`]); `sum` (`mode=s`, the
    /// default): what was allocated (`alloc-*`); `live` (`mode=l`): what is
    /// still allocated (`inuse-*`).
    Allocation { sum: bool, live: bool },
    /// The frees of a live `sALLOC` event's sampled addresses: the probe on
    /// the library's free marker, opened beside the allocation probe
    /// ([`EventSpec::frees_of`]), never named by `-e`.
    AllocationFreed,
    /// `sWALL`: the time the profiled threads spend off a CPU, sampled by
    /// the BPF engine's program at each context switch ([`crate::wall`]),
    /// and with the CPU time samples, their `wall-time`. No perf event is
    /// opened for it. `max_probability`: the highest probability of
    /// sampling a switch-out, in `WALL_PROBABILITY_ONE`ths (`probability=`);
    /// `threshold_ns`: shorter waits are left out (`threshold=`).
    WallTime {
        max_probability: u64,
        threshold_ns: u64,
    },
}

/// The index of the frees of the live `sALLOC` event of index `event`
/// ([`EventSpec::frees_of`]): out of the range of the session's list (at
/// most [`super::MAX_EVENTS`] events).
pub const fn frees_index(event: u16) -> u16 {
    FREES_INDEX_BIT | event
}

/// The index of the live heap of the `sALLOC` event of index `event`: its
/// `inuse-*` columns in the profile.
pub const fn live_heap_index(event: u16) -> u16 {
    LIVE_HEAP_INDEX_BIT | event
}

/// The `sALLOC` event whose frees have index `index`, if it is one.
pub const fn allocation_of_frees(index: u16) -> Option<u16> {
    if index & FREES_INDEX_BIT != 0 {
        Some(index & !FREES_INDEX_BIT)
    } else {
        None
    }
}

/// The `sALLOC` event whose live heap has index `index`, if it is one.
pub const fn allocation_of_live_heap(index: u16) -> Option<u16> {
    if index & LIVE_HEAP_INDEX_BIT != 0 && index & FREES_INDEX_BIT == 0 {
        Some(index & !LIVE_HEAP_INDEX_BIT)
    } else {
        None
    }
}

const FREES_INDEX_BIT: u16 = 0x8000;
const LIVE_HEAP_INDEX_BIT: u16 = 0x4000;

/// Which tracepoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracepoint {
    Named { group: Arc<str>, name: Arc<str> },
    Id(u64),
}

/// What a sample of the event weighs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EventValue {
    /// The events the sample stands for (its period), times `scale`.
    Period,
    /// A user register at the sample (perf's x86 register number: `r=`, or
    /// the ABI register of argument `n=`), times `scale`.
    Register(u8),
    /// A field of the tracepoint's raw record (`o=` byte offset in it, as
    /// tracefs's `format` file gives it; `z=` bytes, 8 by default), read
    /// in this machine's byte order, times `scale`.
    Raw { offset: u32, size: u8 },
    /// `sALLOC`: the sampled allocation's size (the marker's first
    /// argument, `rdi`), divided by the probability that an allocation of
    /// that size is sampled at a mean of `mean` bytes
    /// ([`super::allocation::unbiased`]).
    AllocationSize { mean: u64 },
    /// The frees of sampled addresses: the freed address (the free marker's
    /// argument, `rdi`) is what the sample carries; it weighs nothing.
    FreedAddress,
}

/// What one sample stands for in thousandths of an occurrence of its event
/// ([`Weighing::scaled_count`]): 1 for every event but `sALLOC`.
pub const COUNT_UNIT: u64 = 1000;

/// perf's numbers of the first three argument registers (`rdi`, `rsi`,
/// `rdx`; on arm64 `x0`-`x2`): the allocation marker's arguments.
fn first_argument() -> u8 {
    super::regs::argument(1).unwrap_or(0)
}
fn second_argument() -> u8 {
    super::regs::argument(2).unwrap_or(0)
}
fn third_argument() -> u8 {
    super::regs::argument(3).unwrap_or(0)
}

pub use crate::sample::HeapEvent;

/// How a sample of one event is weighed, and which event it is: what the
/// engines keep of the spec for each sample (cheap to copy).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weighing {
    /// The event's position in the session's list (its columns in the profile).
    pub event: u16,
    pub value: EventValue,
    /// `s=`: the value is multiplied by it (1 when not given).
    pub scale: f64,
    /// The period of a counter or tracepoint sampled every N events: what
    /// each of its samples stands for. Such an event's samples do not carry
    /// their period ([`EventSpec::samples_period`]); at a frequency, or for
    /// CPU time, the sample's own period is right.
    pub fixed_period: Option<u64>,
}

impl Weighing {
    /// The weight of a sample with `period` and user registers `regs`
    /// (`None` without user context: a register-valued sample weighs 0).
    pub fn weight(&self, period: u64, regs: Option<&crate::unwind::UserRegs>) -> u64 {
        let value = match self.value {
            EventValue::Period => self.fixed_period.unwrap_or(period),
            EventValue::Register(register) => regs
                .and_then(|regs| super::regs::value(regs, register))
                .unwrap_or(0),
            // The parser puts the field's value in the period's place
            // (`events::SampleLayout`).
            EventValue::Raw { .. } => period,
            EventValue::AllocationSize { mean } => {
                let size = regs
                    .and_then(|regs| super::regs::value(regs, first_argument()))
                    .unwrap_or(0);
                super::allocation::unbiased(size, mean).1.round() as u64
            }
            EventValue::FreedAddress => 0,
        };
        if self.scale == 1.0 {
            value
        } else {
            // Saturating float-to-int: a negative scale weighs 0.
            (value as f64 * self.scale) as u64
        }
    }
}

impl Weighing {
    /// What a sample stands for, in [`COUNT_UNIT`]s: one occurrence of
    /// its event, or for `sALLOC` the 1/p allocations of its size.
    pub fn scaled_count(&self, regs: Option<&crate::unwind::UserRegs>) -> u64 {
        match self.value {
            EventValue::AllocationSize { mean } => {
                let size = regs
                    .and_then(|regs| super::regs::value(regs, first_argument()))
                    .unwrap_or(0);
                (super::allocation::unbiased(size, mean).0 * COUNT_UNIT as f64).round() as u64
            }
            EventValue::FreedAddress => 0,
            _ => COUNT_UNIT,
        }
    }

    /// What the sample says of the heap: the address an allocation sample
    /// was given (the marker's second argument, `rsi`: 0 when the library
    /// does not follow it) and its size (`rdi`), or the address a free
    /// released (`rdi`), the bytes of it still held (`rsi`) and its new
    /// name (`rdx`).
    pub fn heap_event(&self, regs: Option<&crate::unwind::UserRegs>) -> Option<HeapEvent> {
        let register = |number| regs.and_then(|regs| super::regs::value(regs, number));
        match self.value {
            EventValue::AllocationSize { .. } => {
                match (register(second_argument()), register(first_argument())) {
                    (Some(address), Some(size)) if address != 0 => {
                        Some(HeapEvent::Allocated { address, size })
                    }
                    _ => Some(HeapEvent::NotFollowed),
                }
            }
            EventValue::FreedAddress => {
                register(first_argument()).map(|address| HeapEvent::Freed {
                    address,
                    held: register(second_argument()).unwrap_or(0),
                    renamed: register(third_argument()).unwrap_or(0),
                })
            }
            _ => None,
        }
    }

    /// Weighs `sample` as this event does, from its period (the weight it
    /// came with) and user registers `regs`: its weight and count, what it
    /// says of the heap, and the sampler library's frames taken off its
    /// stack. Both engines' samples go through here.
    pub fn weigh(
        &self,
        sample: &mut crate::sample::Sample,
        regs: Option<&crate::unwind::UserRegs>,
    ) {
        sample.weight = self.weight(sample.weight, regs);
        sample.scaled_count = self.scaled_count(regs);
        let hidden = self.hidden_frames(regs);
        sample.frames.drain(..hidden.min(sample.frames.len()));
        sample.heap = self.heap_event(regs);
    }

    /// Innermost frames of the sample's stack that are not the program's:
    /// an allocation is sampled in the preloaded library's marker, called
    /// by its hook; a mapping's hook (`mmap`, `mmap64`: the marker's third
    /// argument, `rdx`, says so) stays, the leaf that says the memory was
    /// mapped.
    pub fn hidden_frames(&self, regs: Option<&crate::unwind::UserRegs>) -> usize {
        match self.value {
            EventValue::AllocationSize { .. } => {
                let mapped = regs
                    .and_then(|regs| super::regs::value(regs, third_argument()))
                    .is_some_and(|kind| kind == super::allocation::MAPPED);
                usize::from(super::allocation::LIBRARY_FRAMES) - usize::from(mapped)
            }
            _ => 0,
        }
    }
}

/// How each event of a session weighs its samples, by event index: what
/// both engines weigh their samples with.
#[derive(Debug, Clone, Default)]
pub struct Weighings(Vec<Weighing>);

impl Weighings {
    /// Adds an event's weighing (once per event).
    pub fn add(&mut self, weighing: Weighing) {
        if !self.0.iter().any(|known| known.event == weighing.event) {
            self.0.push(weighing);
        }
    }

    /// The weighing of `event`, if added.
    pub fn of(&self, event: u16) -> Option<&Weighing> {
        self.0.iter().find(|weighing| weighing.event == event)
    }
}

/// One event to sample, as `-e` gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSpec {
    pub kind: EventKind,
    pub rate: SampleRate,
    pub weighing: Weighing,
    /// `l=`, or what the C++ ddprof makes of the event's name
    /// (`sched:sched_switch`, `id:42`, `sPF`): the name of its column in
    /// the profile and its samples' `tracepoint_type` label.
    pub label: Arc<str>,
    /// `st=`: bytes of user stack copied for this event's samples (the
    /// session's `--stack-sample-size` when not given).
    pub stack_sample_size: Option<u32>,
}

impl EventSpec {
    /// `sCPU` at `rate`, first of its list.
    pub fn cpu_time(rate: SampleRate) -> Self {
        EventSpec {
            kind: EventKind::CpuTime,
            rate,
            weighing: Weighing {
                event: 0,
                value: EventValue::Period,
                scale: 1.0,
                fixed_period: None,
            },
            label: "sCPU".into(),
            stack_sample_size: None,
        }
    }

    /// Position in the session's event list.
    pub fn index(&self) -> u16 {
        self.weighing.event
    }

    /// Whether its samples carry their period (`PERF_SAMPLE_PERIOD`): not
    /// at a fixed period, where the kernel would then sample a software
    /// event or tracepoint at every occurrence, each with period 1
    /// (`perf_swevent_event`), and the fixed period is the weight.
    pub fn samples_period(&self) -> bool {
        self.weighing.fixed_period.is_none()
    }

    /// The frees of this event's sampled addresses, when it is a live
    /// `sALLOC`: a probe sampled at each call (rate 1), whose samples carry
    /// the freed address and 8 bytes of stack.
    pub fn frees_of(&self) -> Option<EventSpec> {
        let EventKind::Allocation { live: true, .. } = self.kind else {
            return None;
        };
        Some(EventSpec {
            kind: EventKind::AllocationFreed,
            rate: self.rate,
            weighing: Weighing {
                event: frees_index(self.index()),
                value: EventValue::FreedAddress,
                scale: 1.0,
                fixed_period: None,
            },
            label: format!("{} frees", self.label).into(),
            stack_sample_size: Some(8),
        })
    }

    /// Whether the event is `sALLOC`'s allocation probe (not its frees'),
    /// whose samples weigh the allocated size.
    pub fn is_allocation(&self) -> bool {
        matches!(self.kind, EventKind::Allocation { .. })
    }

    /// Whether the event is `sWALL`, sampled by the BPF program at context
    /// switches, not through a perf event.
    pub fn is_wall_time(&self) -> bool {
        matches!(self.kind, EventKind::WallTime { .. })
    }

    /// Whether the event samples CPU time (`sCPU`).
    pub fn is_cpu_time(&self) -> bool {
        self.kind == EventKind::CpuTime
    }

    /// Samples per second of a busy task at most, for sizing buffers: a
    /// CPU-time event's rate; a counter or tracepoint at a period fires as
    /// often as its events come, taken here as 1,000 a second divided by
    /// the period.
    pub fn per_second(&self) -> u64 {
        if let EventKind::WallTime { .. } = self.kind {
            // No perf buffer takes its samples.
            return 0;
        }
        if let EventKind::Allocation { .. } | EventKind::AllocationFreed = self.kind {
            // A program allocating 1 GB a second.
            return match self.rate {
                SampleRate::Period(mean) => (1_000_000_000 / mean.max(1)).max(1),
                SampleRate::Frequency(hz) => hz,
            };
        }
        match (self.is_cpu_time(), self.rate) {
            (_, SampleRate::Frequency(hz)) => hz,
            (true, SampleRate::Period(nanos)) => 1_000_000_000 / nanos.max(1),
            (false, SampleRate::Period(period)) => (1_000 / period.max(1)).max(1),
        }
    }

    /// The event's sampling needs the kernel's side of the event (context
    /// switches and faults fire in the kernel), as the C++ ddprof opens them.
    pub fn needs_kernel(&self) -> bool {
        match &self.kind {
            EventKind::CpuTime
            | EventKind::Allocation { .. }
            | EventKind::AllocationFreed
            | EventKind::WallTime { .. } => false,
            EventKind::Counter(entry) => entry.needs_kernel,
            EventKind::Tracepoint(_) => true,
        }
    }
}

/// One entry of the C++ ddprof's event table: its name, what it counts,
/// the perf counter and its default rate.
#[derive(Debug, PartialEq, Eq)]
pub struct TableEntry {
    pub name: &'static str,
    pub what: &'static str,
    pub counter: CounterType,
    /// The perf `config` of `counter`.
    pub config: u32,
    pub rate: SampleRate,
    /// Sampled only with the kernel's side (faults and context switches
    /// fire in the kernel), as the C++ ddprof opens it.
    pub needs_kernel: bool,
}

use perf_event_open_sys::bindings as perf;
use CounterType::{Hardware, Software};
use SampleRate::{Frequency, Period};

const fn entry(
    name: &'static str,
    what: &'static str,
    counter: CounterType,
    config: u32,
    rate: SampleRate,
    needs_kernel: bool,
) -> TableEntry {
    TableEntry {
        name,
        what,
        counter,
        config,
        rate,
        needs_kernel,
    }
}

/// The C++ ddprof's table (`sCPU` aside, which is [`EventKind::CpuTime`]),
/// with its default rates.
pub(super) const TABLE: &[TableEntry] = &[
    entry(
        "hCPU",
        "CPU cycles",
        Hardware,
        perf::PERF_COUNT_HW_CPU_CYCLES,
        Frequency(99),
        false,
    ),
    entry(
        "hREF",
        "reference CPU cycles",
        Hardware,
        perf::PERF_COUNT_HW_REF_CPU_CYCLES,
        Frequency(1000),
        false,
    ),
    entry(
        "hINST",
        "instructions",
        Hardware,
        perf::PERF_COUNT_HW_INSTRUCTIONS,
        Frequency(1000),
        false,
    ),
    entry(
        "hCREF",
        "cache references",
        Hardware,
        perf::PERF_COUNT_HW_CACHE_REFERENCES,
        Period(999),
        false,
    ),
    entry(
        "hCMISS",
        "cache misses",
        Hardware,
        perf::PERF_COUNT_HW_CACHE_MISSES,
        Period(999),
        false,
    ),
    entry(
        "hBRANCH",
        "branch instructions",
        Hardware,
        perf::PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
        Period(999),
        false,
    ),
    entry(
        "hBMISS",
        "branch misses",
        Hardware,
        perf::PERF_COUNT_HW_BRANCH_MISSES,
        Period(999),
        false,
    ),
    entry(
        "hBUS",
        "bus cycles",
        Hardware,
        perf::PERF_COUNT_HW_BUS_CYCLES,
        Frequency(1000),
        false,
    ),
    entry(
        "hBSTF",
        "front-end stalls",
        Hardware,
        perf::PERF_COUNT_HW_STALLED_CYCLES_FRONTEND,
        Frequency(1000),
        false,
    ),
    entry(
        "hBSTB",
        "back-end stalls",
        Hardware,
        perf::PERF_COUNT_HW_STALLED_CYCLES_BACKEND,
        Frequency(1000),
        false,
    ),
    entry(
        "sPF",
        "page faults",
        Software,
        perf::PERF_COUNT_SW_PAGE_FAULTS,
        Period(1),
        true,
    ),
    entry(
        "sCS",
        "context switches",
        Software,
        perf::PERF_COUNT_SW_CONTEXT_SWITCHES,
        Period(1),
        true,
    ),
    entry(
        "sMig",
        "CPU migrations",
        Software,
        perf::PERF_COUNT_SW_CPU_MIGRATIONS,
        Frequency(99),
        false,
    ),
    entry(
        "sPFMAJ",
        "major page faults",
        Software,
        perf::PERF_COUNT_SW_PAGE_FAULTS_MAJ,
        Period(99),
        true,
    ),
    entry(
        "sPFMIN",
        "minor page faults",
        Software,
        perf::PERF_COUNT_SW_PAGE_FAULTS_MIN,
        Period(99),
        true,
    ),
    entry(
        "sALGN",
        "alignment faults",
        Software,
        perf::PERF_COUNT_SW_ALIGNMENT_FAULTS,
        Frequency(99),
        false,
    ),
    entry(
        "sEMU",
        "emulation faults",
        Software,
        perf::PERF_COUNT_SW_EMULATION_FAULTS,
        Frequency(99),
        false,
    ),
    entry(
        "sDUM",
        "nothing (a dummy event)",
        Software,
        perf::PERF_COUNT_SW_DUMMY,
        Period(1),
        false,
    ),
];
