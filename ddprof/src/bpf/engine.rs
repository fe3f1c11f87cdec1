//! The BPF engine: the program attached to every event, its ring buffer read
//! into [`Sample`]s, the maps sized for the workload at start (the maps'
//! upkeep is in `sync`).
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use ddprof_common::sample::BpfCounter;

use super::load::{BpfCounters, BpfError, BpfProgram, MapMemory, MapSizes};
use super::record::{decode, Record};
use super::settings::ProgramSettings;
use super::sync::{MapMirror, TableStats};
use super::variant::BpfVariant;
use crate::events::EventFd;
use crate::process::ProcessTable;
use crate::sample::{LossCounters, Sample};
use crate::unwind::cache::TableCache;
use crate::unwind::TableStore;

/// Bytes of the BPF ring buffer when the sampling rate is not known: room
/// for ~800 samples of 80 frames, several polls' worth at 999 Hz on a few
/// CPUs.
pub const DEFAULT_RING_BUFFER_BYTES: usize = 4 << 20;

/// The BPF ring buffer for `samples_per_second` (every CPU's): what that
/// rate writes while the reader is away (250 ms), at a typical record's
/// 2 KiB a sample, rounded up to a power of two (as the kernel requires)
/// within 256 KiB..4 MiB. Its pages are mapped twice into the profiler (the
/// kernel maps the data area back to back), so every byte here is two
/// bytes of resident memory once the buffer has wrapped: sized from the
/// rate rather than for the worst case. A burst that overflows it is
/// counted as lost, and the loss says to raise `--ring-buffer-kib`.
pub fn ring_buffer_bytes_for_rate(samples_per_second: u64) -> usize {
    /// The longest the profiler loop leaves the buffer unread, with margin
    /// (it waits on the buffer and wakes at least every 250 ms; the daemon
    /// is niced and pinned, so a busy CPU can delay it).
    const READER_AWAY_MILLIS: u64 = 250;
    /// A record of ~250 frames: most stacks are far shallower.
    const TYPICAL_RECORD_BYTES: u64 = 2048;
    let bytes = samples_per_second.saturating_mul(READER_AWAY_MILLIS * TYPICAL_RECORD_BYTES) / 1000;
    (bytes.max(1) as usize)
        .checked_next_power_of_two()
        .unwrap_or(DEFAULT_RING_BUFFER_BYTES)
        .clamp(256 << 10, DEFAULT_RING_BUFFER_BYTES)
}
/// Default budget of kernel memory for the unwind tables in the maps
/// (`--bpf-table-mib`): spent per file as tables load, ~12 MiB per million
/// rows (libLLVM's 0.8-1.3 M, libc's 5 k).
pub const DEFAULT_MAX_TABLE_BYTES: usize = 256 << 20;

/// Options of the BPF engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfEngineOptions {
    pub ring_buffer_bytes: usize,
    /// Collect kernel stacks too.
    pub kernel_stacks: bool,
    /// Hand-off notices wake the reader at once (see
    /// [`super::wakes_on_handoff_at`]).
    pub wake_on_handoff: bool,
    /// Processes whose mappings size the maps (the target and its children,
    /// or every process for `--global`); read from `/proc`.
    pub workload_pids: Vec<u32>,
    /// The wrapped command, whose first hand-off wakes the reader at any
    /// rate (see [`super::wakes_on_handoff_at`]): it is the process the
    /// user asked about, and no short job a wake-up is spared for.
    pub wrapped_pid: Option<u32>,
    /// Processes the process map holds; `None`: from the workload.
    pub max_processes: Option<u32>,
    /// Kernel memory the unwind tables in the maps may take, in all.
    pub max_table_bytes: usize,
    /// The program variant; `None`: the one the kernel runs (or
    /// `DDPROF_BPF_VARIANT`), see [`choose_variant`].
    pub variant: Option<BpfVariant>,
    /// Where compiled unwind tables are kept for later runs, if anywhere.
    pub table_store: Option<TableStore>,
    /// `sWALL`: the `sched_switch` program too.
    pub wall: Option<crate::wall::WallSampling>,
}

impl Default for BpfEngineOptions {
    fn default() -> Self {
        BpfEngineOptions {
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            kernel_stacks: false,
            wake_on_handoff: true,
            workload_pids: Vec::new(),
            wrapped_pid: None,
            max_processes: None,
            max_table_bytes: DEFAULT_MAX_TABLE_BYTES,
            variant: None,
            table_store: None,
            wall: None,
        }
    }
}

/// The eBPF engine: the program attached to every event, its ring buffer
/// read into [`Sample`]s, its maps kept in step with the processes.
pub struct BpfEngine {
    pub(super) program: BpfProgram,
    /// Kept open: the program stays attached as long as they are.
    _events: Vec<EventFd>,
    workload_pids: Vec<u32>,
    pub(super) ring: RingBuf<MapData>,
    /// What the maps hold (edited by the sync only: `super::sync`).
    pub(super) mirror: MapMirror,
    malformed: u64,
    /// The program samples every CPU and keeps the profiled processes'
    /// samples (per-CPU events among the events): see
    /// [`BpfEngine::tree_only`].
    pub(super) tree_only: bool,
    /// The processes written to `NOT_PROFILED`, with when (a count of
    /// writes), so that a PID the records name later is taken out of it
    /// and the oldest go when it is full.
    pub(super) not_profiled: HashMap<u32, u64>,
    pub(super) not_profiled_writes: u64,
    /// Samples not kept, by cause (see [`BpfEngine::count_unkept`]).
    unkept: crate::merge::Unkept,
    /// Frame vectors of delivered samples, reused by the next ones: most
    /// samples of a deep stack are over 1 KiB of frames, beyond malloc's
    /// per-thread cache, and allocating and freeing them was ~10 % of the
    /// engine's work per sample.
    spare_frames: Vec<Vec<u64>>,
    /// The CPU-time event's index: the program's samples without a
    /// cookie are of it.
    cpu_time_event: u16,
    /// How each attached event's samples weigh.
    weighings: crate::events::Weighings,
    /// The links of the events attached with a cookie (the program stays
    /// attached to each as long as its link is open).
    _links: Vec<std::os::fd::OwnedFd>,
    /// `sWALL`'s event index, once its program is attached: its records'
    /// cookie is this plus one.
    wall_event: Option<u16>,
    /// The workload's threads that waited before `sWALL`'s program was
    /// attached, with their counts of switches then (see `super::parked`).
    pub(super) waiting_before_wall: crate::wall::seed::WaitingThreads,
}

impl BpfEngine {
    /// Loads the program with maps sized for the workload, attaches it to
    /// every event and maps its ring buffer and row map.
    pub fn new(events: Vec<EventFd>, options: BpfEngineOptions) -> Result<Self, BpfError> {
        if events.is_empty() {
            return Err(BpfError::NoEvents);
        }
        let compiler = TableCache::with_limit(64 << 20).with_store(options.table_store.clone());
        let (snapshot, processes, proc_time) = size_for_workload(&options);
        let loading = Instant::now();
        let sizes = MapSizes {
            ring_buffer_bytes: options.ring_buffer_bytes,
            processes,
        };
        let tree_only = events
            .iter()
            .any(|event| event.scope == crate::events::Scope::CpuForTree);
        let settings = ProgramSettings {
            kernel_stacks: options.kernel_stacks,
            wake_on_handoff: options.wake_on_handoff,
            tree_only,
            wall: options.wall,
            undescribed_may_be_profiled: tree_only
                || events
                    .iter()
                    .any(|event| event.scope == crate::events::Scope::Global),
            allocation: events
                .iter()
                .find(|event| event.spec.is_allocation())
                .map(|event| event.spec.index()),
        };
        let mut program = BpfProgram::load_with(sizes, settings, options.variant)?;
        if let Some(pid) = options.wrapped_pid.filter(|_| !options.wake_on_handoff) {
            // Named at boot: its first notice is a second one, which wakes
            // the reader (at 99 Hz its first ~140 ms took the perf path,
            // 25-33 samples with 32 KB stack copies, until a later notice
            // or the reader's next timed poll).
            program.mark_handed_off_long_ago(pid)?;
        }
        let ring = program.take_ring()?;
        let rows = program.table_maps(options.max_table_bytes as u64)?;
        let load_time = loading.elapsed();
        let stats = program.stats();
        log::info!(
            "BPF engine: {} verified ({} instructions, {} processed by the verifier, {:?}); {}",
            program.variant(),
            stats.instructions.unwrap_or(0),
            stats.verified_instructions.unwrap_or(0),
            stats.load_time,
            program.memory()
        );
        let mut engine = BpfEngine {
            program,
            _events: Vec::new(),
            workload_pids: options.workload_pids.clone(),
            ring,
            mirror: MapMirror::new(rows, compiler),
            malformed: 0,
            tree_only,
            not_profiled: HashMap::new(),
            not_profiled_writes: 0,
            unkept: crate::merge::Unkept::default(),
            spare_frames: Vec::new(),
            cpu_time_event: events
                .iter()
                .find(|event| event.spec.is_cpu_time())
                .map_or(0, |event| event.spec.index()),
            weighings: crate::events::Weighings::default(),
            _links: Vec::new(),
            wall_event: None,
            waiting_before_wall: Default::default(),
        };
        // The workload's tables are in the maps before its first sample.
        let filling = Instant::now();
        engine.sync_with_young(&snapshot, &HashSet::new());
        let fill_time = filling.elapsed();
        let attaching = Instant::now();
        // Per-CPU events (if any) sample from here on; then the per-task
        // events stop sampling (a few samples may be taken twice, none
        // missed).
        let (every_cpu, per_task): (Vec<&EventFd>, Vec<&EventFd>) = events
            .iter()
            .partition(|event| event.scope == crate::events::Scope::CpuForTree);
        for event in every_cpu {
            if engine.program.takes_event_cookies() {
                // With a cookie like every other event's: the program takes
                // a run without one for an inherited copy of another event.
                let cookie = u64::from(event.spec.index()) + 1;
                engine
                    ._links
                    .push(engine.program.attach_with_cookie(event, cookie)?);
            } else {
                engine.program.attach(event)?;
            }
            event.enable().map_err(BpfError::Attach)?;
        }
        let mut allocation_attached = false;
        for event in per_task {
            if event.spec.is_allocation() {
                // Once: the program goes with the uprobe, not with one
                // descriptor of it.
                if !allocation_attached {
                    allocation_attached = engine.attach_allocation(event);
                }
            } else if !event.spec.is_cpu_time() {
                // Faults, context switches, the other counters: through a
                // link whose cookie says which event a record is of; where
                // links take no cookie (before 5.15), for tracepoints, or
                // where the sample weighs a register or a raw field the
                // program does not read, through the perf buffers with
                // stack copies, unwound by the perf engine.
                engine.attach_other_event(event);
            } else if tree_only {
                engine.program.attach_ignoring(event)?;
                event.sample_rarely().map_err(BpfError::Attach)?;
            } else {
                engine.program.attach(event)?;
            }
            // Enabled already when a perf engine maps these events' buffers
            // first (the sampler): enabling again changes nothing.
            if event.enable_when_mapped {
                event.enable().map_err(BpfError::Attach)?;
            }
        }
        if let Some(wall) = options.wall {
            // Before the attach: a thread waiting now, and still in that
            // wait after it, switched out unseen (`crate::wall::seed`).
            engine.waiting_before_wall = crate::wall::seed::waiting_threads(&engine.workload_pids);
            match engine.program.start_wall() {
                Ok(()) => {
                    engine.wall_event = Some(wall.event);
                    log::info!(
                        "BPF engine: wall time sampled at context switches (at most {} stacks \
                         a second per CPU{})",
                        crate::wall::WALKS_PER_CPU_SECOND,
                        if wall.threshold_ns > 0 {
                            format!(", waits under {} ns left out", wall.threshold_ns)
                        } else {
                            String::new()
                        }
                    );
                }
                Err(why) => log::warn!("sWALL is not sampled: {why}; the other events are"),
            }
        }
        let ms = |time: Duration| time.as_secs_f64() * 1e3;
        let (tables, rows) = engine.mirror.tables_loaded();
        log::info!(
            "start-up: BPF engine: /proc snapshot {:.0} ms ({} processes), program load {:.0} ms, \
             maps filled {:.0} ms ({} files, {} rows), attached to {} events {:.0} ms",
            ms(proc_time),
            snapshot.pids().count(),
            ms(load_time),
            ms(fill_time),
            tables,
            rows,
            events.len(),
            ms(attaching.elapsed())
        );
        engine._events = events;
        Ok(engine)
    }

    /// Attaches the allocation program to `sALLOC`'s uprobe, so that its
    /// samples are unwound in the kernel (no stack copy); says in one line
    /// why not when it cannot be. False: not attached.
    fn attach_allocation(&mut self, event: &EventFd) -> bool {
        match self.program.attach_allocation(event) {
            Ok(()) => {
                self.weighings.add(event.spec.weighing);
                log::info!("BPF engine: allocation samples unwound in the kernel");
                true
            }
            Err(why) => {
                log::info!(
                    "BPF engine: allocation samples are unwound by the perf engine from \
                     stack copies: {why}"
                );
                false
            }
        }
    }

    /// Attaches the program to an event other than CPU time with its
    /// cookie, if the program can say its records apart and weigh them.
    fn attach_other_event(&mut self, event: &EventFd) {
        let weighing = event.spec.weighing;
        // A tracepoint takes tracepoint programs, not perf_event ones
        // (the link is refused, EINVAL).
        let tracepoint = matches!(event.spec.kind, crate::events::EventKind::Tracepoint(_));
        // A new thread's or process's copy of a per-task event gets the
        // program but not the link's cookie: unless every CPU is sampled
        // (the program then hands such copies' samples to the perf
        // engine), they would pass for CPU time.
        let inherited_copies_unknown = !self.tree_only && !event.scope.is_cpu_wide();
        if tracepoint
            || inherited_copies_unknown
            || !self.program.takes_event_cookies()
            || weighing.value != crate::events::EventValue::Period
        {
            return;
        }
        let cookie = u64::from(event.spec.index()) + 1;
        match self.program.attach_with_cookie(event, cookie) {
            Ok(link) => {
                self._links.push(link);
                self.weighings.add(weighing);
            }
            Err(error) => log::debug!(
                "event {} on CPU {}: not attached to the BPF program ({error}); sampled \
                 through the perf buffers",
                event.spec.label,
                event.cpu
            ),
        }
    }

    /// Whether the program samples every CPU and keeps only the profiled
    /// processes' samples: then a process that no record of the profiled
    /// processes names is not profiled (never read from `/proc`), and its
    /// samples are dropped.
    pub fn tree_only(&self) -> bool {
        self.tree_only
    }

    pub fn program(&self) -> &BpfProgram {
        &self.program
    }

    /// The maps' memory, with the rows in use now.
    pub fn memory(&self) -> MapMemory {
        MapMemory {
            table_bytes: self.mirror.table_bytes() as usize,
            ..self.program.memory()
        }
    }

    /// Its bounded caches, for the overhead report: the tables in the maps
    /// (kernel memory, within `--bpf-table-mib`) and the compiled tables
    /// they are filled from.
    pub fn cache_figures(&self) -> [crate::overhead::CacheFigures; 2] {
        self.mirror.cache_figures()
    }

    pub fn table_stats(&self) -> TableStats {
        self.mirror.table_stats()
    }

    /// The processes whose mappings are in the process map.
    pub fn tracked_processes(&self) -> HashSet<u32> {
        self.mirror.tracked_processes()
    }

    pub fn counters(&self) -> Result<BpfCounters, BpfError> {
        self.program.counters()
    }

    /// `sWALL`'s event index, when its program samples.
    pub fn wall_event(&self) -> Option<u16> {
        self.wall_event
    }

    /// Samples the kernel could not deliver (ring buffer full) and records
    /// that could not be read.
    pub fn losses(&self) -> LossCounters {
        LossCounters {
            lost: self
                .program
                .counter(BpfCounter::BufferFull)
                .unwrap_or_default(),
            throttled: 0,
            malformed: self.malformed,
            exiting: self.unkept.exiting,
            unattributed: 0,
        }
    }

    /// Waits up to `timeout` for samples and appends them to `samples` (the
    /// caller's vector, which keeps its capacity from poll to poll) in the
    /// order the program wrote them, without looking at any process table
    /// (for a loop that merges them with the perf records by time: the
    /// sampler merges them with the records, then calls
    /// [`BpfEngine::describe_read_from_proc`] and
    /// [`BpfEngine::sync_with_young`]).
    /// The flag says that every workload process had exited before.
    pub fn read_samples(
        &mut self,
        timeout: Duration,
        samples: &mut Vec<Sample>,
    ) -> Result<bool, BpfError> {
        let finished = self.workload_gone();
        if !finished && !timeout.is_zero() {
            self.wait(timeout)?;
        }
        while let Some(item) = self.ring.next() {
            match decode(&item, &mut self.spare_frames) {
                Some(Record::Sample(mut sample, context, arguments)) => {
                    identify(&mut sample, self.cpu_time_event, &self.weighings, arguments);
                    if let Some(context) = context {
                        sample.trace = self.mirror.trace.labels(sample.pid, &context);
                    }
                    if sample.off_cpu.is_none() && Some(sample.event) == self.wall_event {
                        // A switch-out's stack: its header's period is the
                        // probability it was drawn with.
                        sample.off_cpu = Some(crate::sample::OffCpu::SwitchedOut {
                            probability: sample.weight,
                        });
                        sample.weight = 0;
                    }
                    samples.push(sample)
                }
                // The next sync describes it.
                Some(Record::HandoffNotice { pid }) => {
                    self.mirror.note_handed_off(pid);
                }
                None => self.malformed += 1,
            }
        }
        Ok(finished)
    }

    /// Counts a sample the caller did not keep (every CPU sampled, its
    /// process unknown to the records): of a profiled process on its way
    /// out (`exited`: after its exit record), a loss; else of another
    /// process (its PID reused since the program's map named it).
    pub fn count_unkept(&mut self, exited: bool) {
        self.unkept.count(exited);
    }

    /// Samples of other processes not kept (see [`BpfEngine::count_unkept`]).
    pub fn not_profiled_samples(&self) -> u64 {
        self.unkept.not_profiled
    }

    /// Processes written to the program's `NOT_PROFILED` map so far.
    pub fn not_profiled_marked(&self) -> u64 {
        self.not_profiled_writes
    }

    /// Takes back a delivered sample's frame vectors for the next samples.
    pub fn recycle(&mut self, sample: Sample) {
        /// About what a poll delivers at 999 Hz on two CPUs: the spare
        /// vectors are the memory those samples took anyway.
        const MAX_SPARE: usize = 512;
        for frames in [sample.frames, sample.kernel_frames] {
            if self.spare_frames.len() < MAX_SPARE && frames.capacity() > 0 {
                self.spare_frames.push(frames);
            }
        }
    }

    /// Processes the record reader read from `/proc` for a sample of this
    /// engine (their records were missed, e.g. written before the perf
    /// buffers were mapped): described in the maps for their next samples.
    pub fn describe_read_from_proc(&mut self, processes: &ProcessTable, pids: &[u32]) {
        for &pid in pids {
            self.sync_process(pid, processes);
        }
    }

    /// The ring buffer's descriptor, for a caller that waits on it together
    /// with other descriptors (then calls [`BpfEngine::read_samples`] with
    /// a zero timeout).
    pub fn ring_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }

    /// poll(2) on the ring buffer. (A perf event without a mapped ring
    /// buffer always polls as hung up, so the events cannot be watched here.)
    fn wait(&mut self, timeout: Duration) -> Result<(), BpfError> {
        let mut fds = [libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(BpfError::Poll(error));
        }
        Ok(())
    }

    /// Every workload process has exited (none when there were none: a
    /// `--global` profile never finishes by itself).
    fn workload_gone(&self) -> bool {
        !self.workload_pids.is_empty() && self.workload_pids.iter().all(|&pid| !is_alive(pid))
    }
}

/// The process exists and is not a zombie.
pub(super) fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => crate::files::target::stat_field(&stat, 3)
            .and_then(|state| state.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// The workload's processes as `/proc` shows them now, the process map's
/// size for them, and how long reading `/proc` took. (The tables need no
/// sizing: each is a map of its own, created when its file is first
/// needed.)
fn size_for_workload(options: &BpfEngineOptions) -> (ProcessTable, u32, Duration) {
    let reading = Instant::now();
    let mut processes = ProcessTable::new();
    for &pid in &options.workload_pids {
        if let Err(error) = processes.load_from_proc(pid) {
            log::debug!("BPF engine: cannot read /proc/{pid}: {error}");
        }
    }
    let proc_time = reading.elapsed();
    let process_count = options.workload_pids.len() as u32;
    let max_processes = options
        .max_processes
        .unwrap_or_else(|| (process_count.saturating_mul(2) + 64).clamp(128, 16384));
    (processes, max_processes, proc_time)
}

/// Makes a record's cookie its event's index (0: the CPU-time event), and
/// weighs the sample as its event does (a fixed period's samples weigh
/// that period; an allocation's, its size by the marker's `arguments`).
fn identify(
    sample: &mut crate::sample::Sample,
    cpu_time_event: u16,
    weighings: &crate::events::Weighings,
    arguments: Option<[u64; 3]>,
) {
    sample.event = match sample.event {
        0 => cpu_time_event,
        cookie => cookie - 1,
    };
    if let Some(weighing) = weighings.of(sample.event) {
        let regs = arguments.map(crate::events::regs::with_arguments);
        weighing.weigh(sample, regs.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_cookie_names_its_event_and_a_fixed_period_weighs_it() {
        let specs = crate::events::parse_events("sPF p=16;sCPU").unwrap();
        let mut weighings = crate::events::Weighings::default();
        for spec in &specs {
            weighings.add(spec.weighing);
        }
        let sample = |event, weight| crate::sample::Sample {
            pid: 1,
            tid: 1,
            time: 0,
            cpu: 0,
            event,
            weight,
            scaled_count: crate::events::COUNT_UNIT,
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            heap: None,
            off_cpu: None,
            trace: None,
            end: crate::sample::StackEnd::Complete,
        };
        // Cookie 1: sPF, event 0, each sample 16 faults (the program's
        // sample_period is the event's; 16 anyway).
        let mut fault = sample(1, 16);
        identify(&mut fault, 1, &weighings, None);
        assert_eq!((fault.event, fault.weight), (0, 16));
        // No cookie: the CPU-time event (index 1), its period as it came.
        let mut cpu = sample(0, 10_101_010);
        identify(&mut cpu, 1, &weighings, None);
        assert_eq!((cpu.event, cpu.weight), (1, 10_101_010));

        // An allocation record: weighed by the marker's arguments as the
        // perf engine weighs them from a sample's registers, the library's
        // two frames (marker, hook) taken off.
        let specs = crate::events::parse_events("sALLOC mode=sl;sCPU").unwrap();
        let mut weighings = crate::events::Weighings::default();
        for spec in &specs {
            weighings.add(spec.weighing);
        }
        let size = 100_000;
        let mut allocation = sample(1, size);
        allocation.frames = vec![0x7000, 0x7100, 0x401000, 0x402000];
        identify(&mut allocation, 1, &weighings, Some([size, 0x5555_0000, 0]));
        let registers = crate::events::regs::with_arguments([size, 0x5555_0000, 0]);
        assert_eq!(allocation.event, 0);
        assert_eq!(
            allocation.weight,
            specs[0].weighing.weight(size, Some(&registers))
        );
        assert!(
            allocation.weight > size,
            "weighed by the sampling probability"
        );
        assert_eq!(allocation.frames, vec![0x401000, 0x402000]);
        assert_eq!(
            allocation.heap,
            Some(crate::sample::HeapEvent::Allocated {
                address: 0x5555_0000,
                size
            })
        );
        // A mapping (kind 1) keeps its hook, the `mmap` that mapped it.
        let mut mapping = sample(1, size);
        mapping.frames = vec![0x7000, 0x7100, 0x401000];
        identify(&mut mapping, 1, &weighings, Some([size, 0, 1]));
        assert_eq!(mapping.frames, vec![0x7100, 0x401000]);
        assert_eq!(mapping.heap, Some(crate::sample::HeapEvent::NotFollowed));
    }

    #[test]
    fn the_ring_buffer_follows_the_sampling_rate() {
        // 999 Hz on 2 CPUs: ~1 MB written in 250 ms of typical records.
        assert_eq!(ring_buffer_bytes_for_rate(2 * 999), 1 << 20);
        // The default 99 Hz: the 256 KiB floor.
        assert_eq!(ring_buffer_bytes_for_rate(2 * 99), 256 << 10);
        assert_eq!(ring_buffer_bytes_for_rate(0), 256 << 10);
        // Many CPUs at a high rate: capped.
        assert_eq!(
            ring_buffer_bytes_for_rate(64 * 999),
            DEFAULT_RING_BUFFER_BYTES
        );
        assert_eq!(
            ring_buffer_bytes_for_rate(u64::MAX),
            DEFAULT_RING_BUFFER_BYTES
        );
    }
}
