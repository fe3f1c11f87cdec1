//! perf_event_open and the attributes of the events ddprof samples on.
//!
//! Both engines sample on the same descriptors: the attributes always ask for
//! the user registers and a copy of the user stack (the perf engine needs
//! them), and the BPF engine, once attached, returns 0 from its program so
//! that the kernel never writes (or copies the stack of) those samples.
//! Non-sample records (mmap2, comm, fork, exit, lost) still reach the ring
//! buffer in both cases.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use perf_event_open_sys as sys;

/// The most events a session samples (`-e` with more is refused): their
/// indices leave room for the internal ones ([`frees_index`],
/// [`live_heap_index`]).
pub const MAX_EVENTS: u16 = 256;

pub mod allocation;
mod parse;
pub mod regs;
mod spec;
mod tracepoint;

pub use parse::{
    check_frequencies, parse_events, unavailable_events, EventSpecError, Preset, NOT_YET_AVAILABLE,
};
pub use spec::{
    allocation_of_frees, allocation_of_live_heap, frees_index, live_heap_index, CounterType,
    EventKind, EventSpec, EventValue, HeapEvent, SampleRate, TableEntry, Tracepoint, Weighing,
    Weighings, COUNT_UNIT, DEFAULT_CPU_FREQUENCY,
};
pub use tracepoint::TracepointError;

/// `sample_type` of every sampling event.
pub const SAMPLE_TYPE: u64 = sys::bindings::PERF_SAMPLE_IP as u64
    | sys::bindings::PERF_SAMPLE_TID as u64
    | sys::bindings::PERF_SAMPLE_TIME as u64
    | sys::bindings::PERF_SAMPLE_CPU as u64
    | sys::bindings::PERF_SAMPLE_PERIOD as u64
    | sys::bindings::PERF_SAMPLE_CALLCHAIN as u64
    | sys::bindings::PERF_SAMPLE_REGS_USER as u64
    | sys::bindings::PERF_SAMPLE_STACK_USER as u64;

/// Where an event's samples differ from [`SAMPLE_TYPE`]'s, for the record
/// parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleLayout {
    /// `PERF_SAMPLE_PERIOD` is in the record (not at a fixed period, see
    /// [`EventSpec::samples_period`]).
    pub period: bool,
    /// `PERF_SAMPLE_RAW` is, and the field of it (byte offset, size) that
    /// weighs the sample (`o=`, `z=`).
    pub raw_field: Option<(u32, u8)>,
}

impl SampleLayout {
    /// [`SAMPLE_TYPE`]'s: the period, no raw record.
    pub const DEFAULT: SampleLayout = SampleLayout {
        period: true,
        raw_field: None,
    };

    pub fn of(spec: &EventSpec) -> Self {
        SampleLayout {
            period: spec.samples_period(),
            raw_field: match spec.weighing.value {
                EventValue::Raw { offset, size } => Some((offset, size)),
                _ => None,
            },
        }
    }
}

/// `sample_type` of `spec`'s event: [`SAMPLE_TYPE`], without the period
/// where the event's own fixed period weighs its samples, with the raw
/// record where a field of it does ([`SampleLayout`]).
pub fn sample_type(spec: &EventSpec) -> u64 {
    let layout = SampleLayout::of(spec);
    let mut sample_type = SAMPLE_TYPE;
    if !layout.period {
        sample_type &= !(sys::bindings::PERF_SAMPLE_PERIOD as u64);
    }
    if layout.raw_field.is_some() {
        sample_type |= sys::bindings::PERF_SAMPLE_RAW as u64;
    }
    sample_type
}

/// What the events watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The calling process itself, from its next exec (the launcher): each
    /// event starts disabled and is enabled by the exec; children inherit.
    SelfOnExec,
    /// A child of the calling process, from its next exec (`--init`: the
    /// command runs as ddprof's child), as `SelfOnExec`.
    ChildOnExec(i32),
    /// A running process (and the threads and children it creates later).
    Process(i32),
    /// Every process on one CPU.
    Global,
    /// Every task on one CPU, for the samples only: the BPF program keeps
    /// those of the profiled processes (which per-task events follow for
    /// their counts and process records). No process records: the other
    /// processes' exec and mmap are none of the profiler's business.
    CpuForTree,
}

impl Scope {
    /// The event samples every task of its CPU.
    pub fn is_cpu_wide(self) -> bool {
        matches!(self, Scope::Global | Scope::CpuForTree)
    }
}

/// Options common to every event of one profiling session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventOptions {
    /// Bytes of user stack the kernel copies per sample.
    pub stack_sample_size: u32,
    /// Whether the events also count, and sample, the time threads spend
    /// in the kernel on their own behalf (system calls, page faults): such
    /// samples are attributed to the user stack that entered the kernel.
    /// Needs `perf_event_paranoid` <= 1 or CAP_PERFMON; refused, the events
    /// are opened user-only (and the time in the kernel goes unseen).
    pub include_kernel: bool,
    /// `--include-kernel`: each sample taken in the kernel also carries its
    /// kernel call chain. Both engines need it: the BPF program's
    /// `bpf_get_stack` returns the chain the event computed for the sample
    /// when the event samples one (and `PERF_SAMPLE_CALLCHAIN` is always in
    /// the layout). The user part of the chain is never asked for: the
    /// engines unwind user stacks themselves.
    pub kernel_stacks: bool,
}

/// An opened perf event and what it is.
#[derive(Debug)]
pub struct EventFd {
    pub fd: OwnedFd,
    /// The CPU it counts on (-1 for any).
    pub cpu: i32,
    pub spec: EventSpec,
    /// Opened disabled, for whoever maps its buffer to enable once it has
    /// ([`EventFd::enable`]): the kernel drops the records an event writes
    /// while it has no buffer, and a `-p` target that exec'd in that window
    /// kept its old image in the table for good (its exec and mmap records
    /// were gone). `Scope::Process` and `Scope::Global`; the launcher's
    /// events wait for the exec instead.
    pub enable_when_mapped: bool,
    /// What it watches: with a task scope, its count is the CPU time of the
    /// tasks it follows (see [`EventFd::count`]).
    pub scope: Scope,
}

impl EventFd {
    /// The event's count so far: for `sCPU` on a task scope (task-clock,
    /// inherited), the nanoseconds of CPU time of the task it was opened
    /// on and of every thread and process that inherited it, exited ones
    /// included. The kernel counts it whether a sample is taken or not:
    /// what the samples must add up to.
    pub fn count(&self) -> io::Result<u64> {
        let mut value = [0u8; 8];
        let read = nix::unistd::read(&self.fd, &mut value)?;
        if read != value.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short read of a perf event's count",
            ));
        }
        Ok(u64::from_ne_bytes(value))
    }

    /// Whether [`EventFd::count`] is CPU time of the profiled tasks (a
    /// CPU-wide event, `--global`, counts the CPU's time, idle included).
    pub fn counts_task_cpu_time(&self) -> bool {
        self.spec.kind == EventKind::CpuTime && !self.scope.is_cpu_wide()
    }

    /// Has the event sample at its lowest rate (`PERF_EVENT_IOC_PERIOD`),
    /// for an event kept for its count and process records while others
    /// sample.
    ///
    /// The kernel's clock events turn a frequency into a period when they
    /// are opened, and the ioctl then sets the period: 1 would be the
    /// 10 µs floor, 100,000 interrupts a second per task (a workload of
    /// quick forks ran 8 times slower). So the longest period first; a
    /// frequency event refuses it (above the highest rate), and gets 1 Hz.
    pub fn sample_rarely(&self) -> io::Result<()> {
        /// The kernel refuses a period with bit 63 set: 2^62 ns is 146
        /// years of CPU time.
        const LONGEST_PERIOD: u64 = 1 << 62;
        const LOWEST_FREQUENCY: u64 = 1;
        match self.set_period(LONGEST_PERIOD) {
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                self.set_period(LOWEST_FREQUENCY)
            }
            other => other,
        }
    }

    /// `PERF_EVENT_IOC_PERIOD`: the period, or the frequency of an event
    /// that samples at a frequency.
    fn set_period(&self, value: u64) -> io::Result<()> {
        // The kernel reads the value through a pointer (the binding types
        // the argument as the u64 the pointer is passed as).
        let pointer = &value as *const u64 as u64;
        // SAFETY: PERIOD reads one u64 at `pointer`, valid for the call;
        // the descriptor is open.
        let result = unsafe { sys::ioctls::PERIOD(self.fd.as_raw_fd(), pointer) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes the kernel write this event's records to `leader`'s buffer
    /// (`PERF_EVENT_IOC_SET_OUTPUT`): one buffer per CPU for the threads of
    /// a `-p` target instead of one each. The kernel refuses events on
    /// another CPU, and events that have a buffer of their own.
    pub fn redirect_output_to(&self, leader: &EventFd) -> io::Result<()> {
        // SAFETY: SET_OUTPUT takes the other descriptor as its argument, no
        // memory; both descriptors are open for the call.
        let result = unsafe { sys::ioctls::SET_OUTPUT(self.fd.as_raw_fd(), leader.fd.as_raw_fd()) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Starts the event counting (`PERF_EVENT_IOC_ENABLE`; its inherited
    /// copies in tasks created since follow).
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: ENABLE takes no argument memory; the descriptor is open.
        let result = unsafe { sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "perf_event_open was refused ({source}): kernel.perf_event_paranoid is {paranoid}; \
         run as root, grant CAP_PERFMON (or CAP_SYS_ADMIN), or lower it with `sysctl kernel.perf_event_paranoid=1`"
    )]
    Permission { source: io::Error, paranoid: String },
    #[error("this machine does not support the {event} event ({source})")]
    Unsupported { event: String, source: io::Error },
    #[error("{0}")]
    NotForThisCommand(String),
    #[error(transparent)]
    Tracepoint(TracepointError),
    #[error("no process {pid} ({source})")]
    NoSuchProcess { pid: i32, source: io::Error },
    #[error(
        "the kernel refused freq={hz} ({source}): kernel.perf_event_max_sample_rate is {max}; \
         lower the frequency or raise the limit with `sysctl kernel.perf_event_max_sample_rate={hz}`"
    )]
    FrequencyAboveMax {
        hz: u64,
        max: u64,
        source: io::Error,
    },
    #[error("perf_event_open failed: {0}")]
    Other(io::Error),
}

/// `kernel.perf_event_paranoid`, as text, for error messages.
pub fn paranoid_level() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// `kernel.perf_event_max_sample_rate`: the highest `freq=` the kernel
/// accepts (it lowers the limit by itself when sampling interrupts take too
/// long, so it is read again where it matters).
pub fn max_sample_rate() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The frequency of `spec` and the kernel's limit, when the first is above
/// the second.
fn frequency_above_max(spec: &EventSpec) -> Option<(u64, u64)> {
    let SampleRate::Frequency(hz) = spec.rate else {
        return None;
    };
    max_sample_rate()
        .filter(|max| hz > *max)
        .map(|max| (hz, max))
}

/// The perf event type and `config` of `spec` in `scope` (a tracepoint's
/// id is read from tracefs).
pub fn type_and_config(spec: &EventSpec, scope: Scope) -> Result<(u32, u64), OpenError> {
    Ok(match &spec.kind {
        // A CPU-wide event has no task to follow: count CPU time of the CPU.
        EventKind::CpuTime if scope.is_cpu_wide() => (
            sys::bindings::PERF_TYPE_SOFTWARE,
            sys::bindings::PERF_COUNT_SW_CPU_CLOCK as u64,
        ),
        EventKind::CpuTime => (
            sys::bindings::PERF_TYPE_SOFTWARE,
            sys::bindings::PERF_COUNT_SW_TASK_CLOCK as u64,
        ),
        EventKind::Counter(entry) => {
            let type_ = match entry.counter {
                CounterType::Software => sys::bindings::PERF_TYPE_SOFTWARE,
                CounterType::Hardware => sys::bindings::PERF_TYPE_HARDWARE,
            };
            (type_, u64::from(entry.config))
        }
        EventKind::Tracepoint(tracepoint) => (
            sys::bindings::PERF_TYPE_TRACEPOINT,
            tracepoint::id(tracepoint).map_err(OpenError::Tracepoint)?,
        ),
        // The probe defined in tracefs on the library's marker.
        EventKind::Allocation { .. } | EventKind::AllocationFreed => match allocation::prepared() {
            Some(sampler) if spec.kind == EventKind::AllocationFreed => {
                (sys::bindings::PERF_TYPE_TRACEPOINT, sampler.free_probe_id)
            }
            Some(sampler) => (sys::bindings::PERF_TYPE_TRACEPOINT, sampler.probe_id),
            None => {
                return Err(OpenError::NotForThisCommand(
                    allocation::not_prepared_reason(),
                ))
            }
        },
        // Sampled by the BPF program at context switches (`open_all`
        // leaves it out).
        EventKind::WallTime { .. } => {
            return Err(OpenError::NotForThisCommand(
                "sWALL is sampled by the BPF engine at context switches, not by a perf event"
                    .into(),
            ))
        }
    })
}

/// The attributes ddprof uses for `spec` in `scope`, for an event of perf
/// type `type_` and `config` ([`type_and_config`]); `records`: the event
/// also writes the process records (mmap, comm, fork, exit), which one
/// event per CPU or task is enough for.
pub fn attributes(
    spec: &EventSpec,
    (type_, config): (u32, u64),
    scope: Scope,
    options: &EventOptions,
    records: bool,
) -> sys::bindings::perf_event_attr {
    let mut attr = sys::bindings::perf_event_attr {
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        ..Default::default()
    };
    attr.type_ = type_;
    attr.config = config;
    match spec.rate {
        SampleRate::Frequency(hz) => {
            attr.set_freq(1);
            attr.__bindgen_anon_1.sample_freq = hz;
        }
        SampleRate::Period(period) => attr.__bindgen_anon_1.sample_period = period,
    }
    if let EventKind::Allocation { .. } | EventKind::AllocationFreed = spec.kind {
        // The library drew which allocations call the marker: each call is
        // a sample.
        attr.__bindgen_anon_1.sample_period = 1;
    }
    attr.sample_type = sample_type(spec);
    attr.sample_regs_user = regs::MASK;
    attr.sample_stack_user = spec.stack_sample_size.unwrap_or(options.stack_sample_size);
    attr.set_exclude_kernel(u64::from(!options.include_kernel));
    // The call chain is always in the record (fixed layout), empty unless
    // kernel stacks are asked for.
    attr.set_exclude_callchain_user(1);
    attr.set_exclude_callchain_kernel(u64::from(!options.kernel_stacks));
    attr.set_exclude_hv(1);
    // `mmap2` only selects the record format: the kernel emits executable
    // mapping records at all only when `mmap` is set too.
    if records && scope != Scope::CpuForTree {
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_task(1);
    }
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    // Wake the reader when half the buffer is written (the kernel's default
    // watermark, `wakeup_watermark` 0), not per record, and not also every N
    // samples: a sample count (16 was used) runs beside that watermark
    // rather than instead of it, the two drift apart, and the reader woke
    // twice per half buffer (119 wake-ups a second at 999 Hz on one CPU
    // where 62 do). The count is set out of reach; 0 would mean 1.
    // The watermark follows the buffer's real size, also when the engine
    // had to shrink it to fit the locked-memory limit.
    attr.__bindgen_anon_2.wakeup_events = i32::MAX as u32;
    match scope {
        Scope::SelfOnExec | Scope::ChildOnExec(_) => {
            attr.set_disabled(1);
            attr.set_enable_on_exec(1);
            attr.set_inherit(1);
        }
        Scope::Process(_) => {
            attr.set_disabled(1);
            attr.set_inherit(1);
        }
        Scope::Global => attr.set_disabled(1),
        Scope::CpuForTree => {
            attr.set_disabled(1);
            // The idle task is nobody's: its samples would only be dropped.
            attr.set_exclude_idle(1);
        }
    }
    attr
}

/// Opens one event. For `Scope::SelfOnExec` and `Scope::Process` the event
/// follows the task on `cpu`; for `Scope::Global`, every task on `cpu`.
/// It writes the process records too (see [`open_all`] for events that
/// share them).
pub fn open(
    spec: &EventSpec,
    scope: Scope,
    cpu: i32,
    options: &EventOptions,
) -> Result<EventFd, OpenError> {
    let type_and_config = type_and_config(spec, scope)?;
    open_with(spec, type_and_config, scope, cpu, options, true)
}

fn open_with(
    spec: &EventSpec,
    type_and_config: (u32, u64),
    scope: Scope,
    cpu: i32,
    options: &EventOptions,
    records: bool,
) -> Result<EventFd, OpenError> {
    let mut attr = attributes(spec, type_and_config, scope, options, records);
    let pid = match scope {
        Scope::SelfOnExec => 0,
        Scope::ChildOnExec(pid) => pid,
        Scope::Process(pid) => pid,
        Scope::Global | Scope::CpuForTree => -1,
    };
    // SAFETY: `attr` is a fully initialised perf_event_attr whose `size`
    // matches its type; the returned descriptor is owned below.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            sys::bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        let source = io::Error::last_os_error();
        return Err(match source.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => OpenError::Permission {
                source,
                paranoid: paranoid_level(),
            },
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => {
                OpenError::Unsupported {
                    event: event_name(spec),
                    source,
                }
            }
            Some(libc::ESRCH) => OpenError::NoSuchProcess { pid, source },
            Some(libc::EINVAL) => match frequency_above_max(spec) {
                Some((hz, max)) => OpenError::FrequencyAboveMax { hz, max, source },
                None => OpenError::Other(source),
            },
            _ => OpenError::Other(source),
        });
    }
    // SAFETY: perf_event_open returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(EventFd {
        fd,
        cpu,
        spec: spec.clone(),
        // Per-CPU events for a tree are enabled once the BPF program that
        // keeps the tree's samples is attached.
        enable_when_mapped: !matches!(
            scope,
            Scope::SelfOnExec | Scope::ChildOnExec(_) | Scope::CpuForTree
        ),
        scope,
    })
}

/// Set when events had to be opened user-only (see
/// [`warn_if_kernel_time_refused`]).
static KERNEL_TIME_REFUSED: AtomicBool = AtomicBool::new(false);

/// Says once, when profiling goes ahead, that time in the kernel is not
/// sampled because the events had to be opened user-only.
pub fn warn_if_kernel_time_refused() {
    if KERNEL_TIME_REFUSED.swap(false, Ordering::Relaxed) {
        log::warn!(
            "time spent in the kernel (system calls, page faults) is not sampled: \
             kernel.perf_event_paranoid is {} and ddprof lacks CAP_PERFMON; lower it with \
             `sysctl kernel.perf_event_paranoid=1` or grant CAP_PERFMON to include it",
            paranoid_level()
        );
    }
}

/// Opens every event of `specs` on every online CPU. When sampling the
/// kernel is refused, a CPU-time event is opened user-only (remembered for
/// [`warn_if_kernel_time_refused`]); the events that fire in the kernel
/// (faults, context switches, tracepoints) need it.
///
/// An event that cannot be opened here (a hardware counter on a VM, a
/// tracepoint this kernel lacks, tracefs not mountable) is left out with
/// one warning that names it and says why, and the others go on; with
/// none opened, the first event's error. The first event opened writes
/// the process records, once for all (not the allocation probe, which
/// watches every CPU: [`scope_of`]).
pub fn open_all(
    specs: &[EventSpec],
    scope: Scope,
    options: &EventOptions,
) -> Result<Vec<EventFd>, OpenError> {
    let cpus = online_cpus();
    let mut cpu_time_options = *options;
    let mut fds = Vec::with_capacity(specs.len() * cpus.len());
    let mut failed: Vec<(&EventSpec, OpenError)> = Vec::new();
    let mut records_written = false;
    for spec in specs {
        if spec.is_wall_time() {
            // No perf event: the BPF engine's program samples it.
            continue;
        }
        // The allocation probe writes none ([`scope_of`]).
        let records = !records_written && scope_of(spec, scope) == scope;
        let opened = open_on_every_cpu(spec, scope, &cpus, &mut cpu_time_options, records)
            .and_then(|mut opened| {
                // A live sALLOC's frees, beside it (without them there is
                // no live heap: the event is left out whole).
                if let Some(frees) = spec.frees_of() {
                    opened.extend(open_on_every_cpu(
                        &frees,
                        scope,
                        &cpus,
                        &mut cpu_time_options,
                        false,
                    )?);
                }
                Ok(opened)
            });
        match opened {
            Ok(opened) => {
                records_written |= records;
                fds.extend(opened);
            }
            Err(error) => failed.push((spec, error)),
        }
    }
    // With none opened, the caller says why once (no event left out is
    // said to leave the others running).
    if fds.is_empty() {
        if let Some((_, error)) = failed.into_iter().next() {
            return Err(error);
        }
        return Ok(fds);
    }
    for (spec, error) in &failed {
        warn_left_out(spec, error, specs.len());
    }
    Ok(fds)
}

/// The spec of the event of index `index` among `specs` (the session's
/// list): one of them, or the frees of a live `sALLOC` of theirs
/// ([`EventSpec::frees_of`]).
pub fn spec_of_index(specs: &[EventSpec], index: u16) -> Option<EventSpec> {
    match allocation_of_frees(index) {
        Some(allocation) => specs
            .iter()
            .find(|spec| spec.index() == allocation)?
            .frees_of(),
        None => specs.iter().find(|spec| spec.index() == index).cloned(),
    }
}

/// The scope `spec` is opened with where the session's events watch
/// `scope`: the allocation probe of a launched command watches every CPU
/// ([`Scope::Global`]). Only the command's processes map the anonymous file
/// it is placed in, so only they fire it, and no per-task filter is
/// involved: with per-task events inherited by the command's threads and
/// children, the probe stopped firing in the command part-way through 1 run
/// in 4 (the uprobe layer filters probes by the events' tasks), losing half
/// its allocations uncounted.
pub fn scope_of(spec: &EventSpec, scope: Scope) -> Scope {
    match (&spec.kind, scope) {
        (
            EventKind::Allocation { .. } | EventKind::AllocationFreed,
            Scope::SelfOnExec | Scope::ChildOnExec(_),
        ) => Scope::Global,
        _ => scope,
    }
}

/// `spec` on each of `cpus`, or the first refusal.
fn open_on_every_cpu(
    spec: &EventSpec,
    scope: Scope,
    cpus: &[i32],
    cpu_time_options: &mut EventOptions,
    records: bool,
) -> Result<Vec<EventFd>, OpenError> {
    let allocation_probe = scope_of(spec, scope) != scope;
    let scope = scope_of(spec, scope);
    // The probe's records would be every process's.
    let records = records && !allocation_probe;
    let type_and_config = type_and_config(spec, scope)?;
    let mut options = *cpu_time_options;
    options.include_kernel |= spec.needs_kernel();
    let mut fds = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let fd = match open_with(spec, type_and_config, scope, cpu, &options, records) {
            Err(OpenError::Permission { .. }) if options.include_kernel && !spec.needs_kernel() => {
                options.include_kernel = false;
                cpu_time_options.include_kernel = false;
                let fd = open_with(spec, type_and_config, scope, cpu, &options, records)?;
                KERNEL_TIME_REFUSED.store(true, Ordering::Relaxed);
                fd
            }
            other => other?,
        };
        fds.push(fd);
    }
    Ok(fds)
}

/// Says once per event and process that `spec` is left out, when other
/// events may still run.
fn warn_left_out(spec: &EventSpec, error: &OpenError, events: usize) {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if events < 2 {
        // The caller reports the error itself.
        return;
    }
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if warned.iter().any(|label| **label == *spec.label) {
        return;
    }
    warned.push(spec.label.to_string());
    log::warn!(
        "event {} is not sampled: {error}; the other events are",
        spec.label
    );
}

/// The event as messages name it: its label and what it counts.
pub fn event_name(spec: &EventSpec) -> String {
    match &spec.kind {
        EventKind::CpuTime => format!("{} (task-clock)", spec.label),
        EventKind::Counter(entry) if entry.name == &*spec.label => {
            format!("{} ({})", entry.name, entry.what)
        }
        EventKind::Counter(entry) => format!("{} ({}, {})", spec.label, entry.name, entry.what),
        EventKind::Tracepoint(_) => format!("{} (a tracepoint)", spec.label),
        EventKind::Allocation { .. } => format!("{} (allocations)", spec.label),
        EventKind::AllocationFreed => format!("{} (the frees of sampled allocations)", spec.label),
        EventKind::WallTime { .. } => format!("{} (wall time)", spec.label),
    }
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (e.g. `0-3,6`).
pub fn online_cpus() -> Vec<i32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| parse_cpu_list(text.trim()))
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            (0..n as i32).collect()
        })
}

fn parse_cpu_list(text: &str) -> Option<Vec<i32>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<i32>().ok()?..=b.parse::<i32>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn attributes_ask_for_regs_and_stack() {
        let spec = parse_events("sCPU freq=999").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 32000,
            include_kernel: false,
            kernel_stacks: false,
        };
        let attr = attributes(
            &spec,
            type_and_config(&spec, Scope::SelfOnExec).unwrap(),
            Scope::SelfOnExec,
            &options,
            true,
        );
        assert_eq!(attr.sample_type, SAMPLE_TYPE);
        assert_eq!(attr.sample_stack_user, 32000);
        assert_eq!(attr.enable_on_exec(), 1);
        assert_eq!(attr.inherit(), 1);
        assert_eq!(attr.freq(), 1);
        // SAFETY: freq mode was set, so the union holds sample_freq.
        assert_eq!(unsafe { attr.__bindgen_anon_1.sample_freq }, 999);
        assert_eq!(
            attributes(
                &spec,
                type_and_config(&spec, Scope::Global).unwrap(),
                Scope::Global,
                &options,
                true
            )
            .inherit(),
            0
        );
        // Enabled once their buffers are mapped (EventFd::enable_when_mapped).
        for scope in [Scope::Process(1), Scope::Global] {
            let attr = attributes(
                &spec,
                type_and_config(&spec, scope).unwrap(),
                scope,
                &options,
                true,
            );
            assert_eq!((attr.disabled(), attr.enable_on_exec()), (1, 0));
        }
    }

    #[test]
    fn opens_a_task_clock_event_on_this_process() {
        let spec = parse_events("sCPU").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let event = open(
            &spec,
            Scope::Process(std::process::id() as i32),
            -1,
            &options,
        )
        .expect("a process may always sample itself, user-space only");
        assert_eq!(event.cpu, -1);
    }

    #[test]
    fn names_the_sample_rate_limit_when_the_frequency_is_above_it() {
        let max = max_sample_rate().expect("kernel.perf_event_max_sample_rate is readable");
        let spec = parse_events(&format!("sCPU freq={}", max + 1)).unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let pid = std::process::id() as i32;
        let error = open(&spec, Scope::Process(pid), -1, &options).unwrap_err();
        assert!(
            matches!(error, OpenError::FrequencyAboveMax { hz, max: limit, .. } if hz == max + 1 && limit == max),
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("kernel.perf_event_max_sample_rate is {max}")),
            "{message}"
        );
        // At the limit the kernel accepts it.
        let spec = parse_events(&format!("sCPU freq={max}")).unwrap()[0].clone();
        open(&spec, Scope::Process(pid), -1, &options).expect("freq at the limit opens");
    }

    #[test]
    fn names_missing_processes() {
        let spec = parse_events("sCPU").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let error = open(&spec, Scope::Process(i32::MAX), -1, &options).unwrap_err();
        assert!(
            matches!(error, OpenError::NoSuchProcess { pid: i32::MAX, .. }),
            "{error}"
        );
    }
}
