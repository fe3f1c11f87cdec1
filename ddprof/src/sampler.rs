//! One sampler in front of both engines: the profiler loop asks it for
//! samples and never learns where they came from.
//!
//! With the perf engine, samples and process records come from the perf
//! ring buffers. With the BPF engine, the BPF program unwinds in the kernel
//! and writes samples to its own ring buffer, while a perf engine on
//! duplicates of the same descriptors reads the mmap/comm/task records (the
//! program keeps the samples out of the perf buffers, except those it hands
//! over) and keeps the [`ProcessTable`], which the BPF engine mirrors into
//! its maps. The two streams are merged here by time: each BPF sample is
//! delivered after the records up to its timestamp, so a process that has
//! exited since is still known.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ddprof_common::sample::BpfCounter;

use crate::bpf::{choose_engine_with, BpfEngine, BpfEngineOptions, BpfError, EngineChoice};
use crate::events::{EventFd, EventOptions, EventSpec, Scope};
use crate::files::MappedFile;
use crate::merge::{self, OnSample, SampleStream};
use crate::perf::{settled_time, PerfEngine, PerfEngineOptions, PerfError};
use crate::process::ProcessTable;
use crate::sample::Sample;
use crate::unwind::cache::StoredTableRead;
use crate::unwind::TableStore;

/// What the sampler needs to know from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerOptions {
    /// `--engine`: auto, bpf or perf.
    pub engine: EngineChoice,
    /// The perf engine's buffers (it always runs: it samples, or reads the
    /// process records beside the BPF engine).
    pub perf: PerfEngineOptions,
    /// Bytes of the BPF engine's sample ring buffer.
    pub bpf_ring_buffer_bytes: usize,
    /// Kernel memory the BPF engine's unwind tables may take
    /// (`--bpf-table-mib`).
    pub bpf_table_bytes: usize,
    /// The BPF program's hand-off notices wake the loop at once (from
    /// [`crate::bpf::HANDOFF_WAKEUP_MIN_HZ`] samples a second of a task).
    pub bpf_wake_on_handoff: bool,
    /// `--include-kernel`: the BPF program also takes the kernel stack of
    /// samples taken in the kernel (the perf engine's come with the
    /// records: [`crate::events::EventOptions::kernel_stacks`]).
    pub kernel_stacks: bool,
    /// With the BPF engine, sample every CPU (events opened with these
    /// options) and let the program keep the profiled processes' samples,
    /// rather than sample each profiled task (see [`open_every_cpu`]).
    /// `None` for `--global`, whose events sample every CPU already.
    pub sample_every_cpu: Option<EventOptions>,
    /// Where both engines keep the unwind tables they compile for later
    /// runs (`--debug-cache`), if anywhere.
    pub table_store: Option<TableStore>,
    /// The BPF program variant; `None`: the one the kernel runs (or
    /// `DDPROF_BPF_VARIANT`). Tests load each variant with it.
    pub bpf_variant: Option<crate::bpf::BpfVariant>,
    /// `sWALL`, sampled by the BPF engine only.
    pub wall: Option<crate::wall::WallSampling>,
}

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// `--engine bpf` was asked for and the BPF engine cannot start (it
    /// never falls back).
    #[error("--engine bpf: {0}")]
    BpfRequired(#[source] BpfError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Perf(#[from] PerfError),
    #[error("cannot duplicate a perf event descriptor: {0}")]
    Duplicate(#[source] std::io::Error),
}

/// How long the loop sleeps at most on the BPF engine's buffers. Nothing
/// waits on this timeout: the program wakes the loop when its ring buffer
/// is a quarter full (the buffer is sized for 250 ms of samples) and with
/// a hand-off notice when a process its maps do not describe yet samples
/// (an exec, a new mapping): at once from
/// [`crate::bpf::HANDOFF_WAKEUP_MIN_HZ`], below it from the process's
/// second notice; the perf buffers wake it when half
/// full and when the events hang up. It only bounds how late samples are
/// counted at low rates. Every timed wake-up costs ~50 µs of CPU on a VM,
/// whatever the loop then does (a bare poll loop on the bench machine):
/// 250 ms rather than 50 ms saves ~16 wake-ups a second, ~7 ms of a 4 s run.
/// (50 ms rather than 10 ms had cut the CPU per 1000 samples on the 300-deep
/// recursion from ~41 to ~33 ms, `cargo xtask bench`.)
const BPF_MAX_POLL: Duration = Duration::from_millis(250);

/// The samples of the profiled processes, from whichever engine was chosen.
pub struct Sampler {
    engine: Engine,
}

enum Engine {
    Perf(PerfEngine),
    Bpf {
        samples: Box<BpfEngine>,
        records: PerfEngine,
        /// BPF samples newer than the records read so far, waiting for them.
        pending: Vec<Sample>,
        /// Every sample and record up to this time (CLOCK_MONOTONIC) was
        /// delivered.
        delivered_until: u64,
    },
}

impl Sampler {
    /// Chooses the engine for `options.engine` (logging the choice and its
    /// reason) and starts it on `events`. `workload_pids` are the processes
    /// already running (`-p`, `--global`), whose tables the BPF engine loads
    /// before their first sample; `wrapped_pid` the command ddprof wraps;
    /// `processes` is the table as known so far.
    pub fn start(
        options: &SamplerOptions,
        mut events: Vec<EventFd>,
        workload_pids: Vec<u32>,
        wrapped_pid: Option<u32>,
        processes: &ProcessTable,
    ) -> Result<Self, SamplerError> {
        if let Some(event_options) = options
            .sample_every_cpu
            .filter(|_| options.engine != EngineChoice::Perf)
        {
            events.extend(open_every_cpu(&events, &event_options));
        }
        // Map the perf buffers before anything slow (the BPF load takes
        // ~0.1 s): exec and mmap records written while an event has no
        // buffer are lost. The perf engine works on duplicates of the
        // descriptors; it samples, or only reads the records when the BPF
        // program takes the samples.
        let duplicates = events
            .iter()
            .map(|event| {
                Ok(EventFd {
                    fd: event.fd.try_clone()?,
                    cpu: event.cpu,
                    spec: event.spec.clone(),
                    enable_when_mapped: event.enable_when_mapped,
                    scope: event.scope,
                })
            })
            .collect::<Result<Vec<EventFd>, std::io::Error>>()
            .map_err(SamplerError::Duplicate)?;
        let mut perf = PerfEngine::new(duplicates, options.perf)?;
        perf.use_table_store(options.table_store.clone());
        let bpf_options = BpfEngineOptions {
            kernel_stacks: options.kernel_stacks,
            wake_on_handoff: options.bpf_wake_on_handoff,
            ring_buffer_bytes: options.bpf_ring_buffer_bytes,
            max_table_bytes: options.bpf_table_bytes,
            table_store: options.table_store.clone(),
            workload_pids,
            wrapped_pid,
            variant: options.bpf_variant,
            wall: options.wall,
            ..BpfEngineOptions::default()
        };
        // Loads, verifies and attaches the program once; `auto` falls back
        // to the perf engine (with the reason) when that fails. That takes
        // 50-100 ms, while the command runs: meanwhile another thread keeps
        // the perf buffers from filling (at 32 KB a sample, they hold
        // ~60 ms at 999 Hz), so that nothing is lost at start.
        let (bpf, decision) = keep_reading_while(&mut perf, || {
            choose_engine_with(options.engine, || BpfEngine::new(events, bpf_options))
        })
        .map_err(SamplerError::BpfRequired)?;
        log::info!("engine: {}", decision.reason);
        let engine = match bpf {
            Some(mut samples) => {
                if samples.tree_only() {
                    perf.keep_only_known_processes();
                    log::info!(
                        "BPF engine: every CPU sampled, the program keeping the profiled \
                         processes' samples (threads and processes too short-lived for a \
                         per-task sample are sampled too)"
                    );
                }
                // A command that has exec'd already runs with the program
                // attached: give the maps its mappings now, not at the first
                // poll (the rest of the set-up takes a while). The records
                // read so far are not applied yet: the processes with new
                // code are read from /proc by the sync.
                perf.read_ahead();
                samples.sync_with_young(processes, &perf.pids_with_new_code());
                Engine::Bpf {
                    samples: Box::new(samples),
                    records: perf,
                    pending: Vec::new(),
                    delivered_until: 0,
                }
            }
            None => {
                if options.wall.is_some() {
                    // A stack copy at every switch is 8-32 KB: ~1.45 µs a
                    // switch before any unwinding (docs/Design.md, "Wall
                    // time").
                    log::warn!(
                        "sWALL is not sampled: wall time needs the eBPF engine (the perf \
                         engine samples: {}); the other events are",
                        decision.reason
                    );
                }
                // Reading a thread's context needs its thread pointer,
                // which no perf sample carries (x86-64 `fs_base` is not a
                // sampled register).
                log::info!(
                    "trace context: the perf engine reads no request context that threads \
                     publish (OTEP 4947, custom-labels, Go's pprof labels): samples carry no span ids"
                );
                // The perf engine samples each task: no per-CPU buffers.
                perf.drop_cpu_wide_sources(Scope::CpuForTree);
                Engine::Perf(perf)
            }
        };
        Ok(Self { engine })
    }

    /// Waits up to `timeout` for samples, applies the process records to
    /// `processes` in time order and hands each sample to `on_sample` with
    /// the table as it was when the sample was taken. Returns whether every
    /// profiled process is gone (the events hung up).
    pub fn poll(
        &mut self,
        processes: &mut ProcessTable,
        timeout: Duration,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) -> Result<bool, SamplerError> {
        match &mut self.engine {
            Engine::Perf(engine) => Ok(engine.poll(processes, timeout, on_sample)?.finished),
            Engine::Bpf {
                samples,
                records,
                pending,
                delivered_until,
            } => {
                // Wakes for the BPF ring buffer and for the perf buffers,
                // which receive the samples the program hands over.
                records.wait_with(Some(samples.ring_fd()), timeout.min(BPF_MAX_POLL))?;
                // Taken before either buffer is read: everything stamped
                // before it is written by then, so every sample and record
                // up to it is in hand below, however long the reads take.
                // Samples newer than it wait for the next poll. (Taken
                // after the BPF ring's read, a stall over the hold-back
                // between the two delivered samples after newer records.)
                let cutoff = settled_time();
                let workload_gone = samples.read_samples(Duration::ZERO, pending)?;
                let hung_up = records.read(processes);
                let finished = hung_up || workload_gone;
                // New mappings (exec, mmap) reach the BPF maps for the next
                // samples; processes whose new code is still held back are
                // described as those records will leave them (from /proc
                // when the records do not say enough). Before the samples
                // are delivered: those the program handed over since the
                // exec need the same big tables in the perf engine, and
                // delivering them first kept the kernel from unwinding
                // rustc's next samples ~10-30 ms longer.
                let young = records.pids_with_new_code();
                if samples.sync_due(processes, &young) {
                    let preview = |pids: &_| records.preview(processes, pids);
                    let young = samples.read_young(processes, &young, preview);
                    // A thread that keeps the perf buffers drained only for
                    // a sync that may compile tables: spawning it for every
                    // new process (a compiler driver's jobs) cost more than
                    // the sync itself.
                    if samples.sync_may_compile(processes, &young) {
                        keep_reading_while(records, || samples.sync_read_young(processes, young));
                    } else {
                        samples.sync_read_young(processes, young);
                    }
                }
                *delivered_until = cutoff;
                let cutoff = (!finished).then_some(cutoff);
                deliver_merged(samples, records, pending, processes, cutoff, on_sample);
                Ok(finished)
            }
        }
    }

    /// Delivers everything still buffered (the target is gone or a stop
    /// was requested).
    pub fn flush(
        &mut self,
        processes: &mut ProcessTable,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) {
        self.drain(processes, on_sample);
        if let Engine::Perf(engine) = &self.engine {
            let counters = engine.sample_counters();
            log::info!(
                "perf engine: {} samples, {} of them unwound in place in the ring buffer, \
                 {} from a copy of their stack (their process had new code waiting, a table \
                 was to be read, or the drain was over its time)",
                counters.samples,
                counters.unwound_in_place,
                counters.samples - counters.unwound_in_place
            );
        }
        if let Engine::Bpf {
            samples, records, ..
        } = &self.engine
        {
            if let Ok(counters) = samples.counters() {
                log::debug!("BPF program: {counters}");
                // What took the slow path, and why, for the user.
                log::info!(
                    "BPF engine: {} samples unwound in the kernel, {} handed to the perf \
                         engine ({} of them mid-stack: a table not in the row map or a mapping \
                         not yet described; {} more of events' copies that new threads \
                         inherited), {} unwound by the perf engine in all; {} processes read \
                         from /proc (no record described them yet)",
                    counters.get(BpfCounter::Emitted),
                    counters.get(BpfCounter::HandedToPerf),
                    counters.get(BpfCounter::HandedOffMidStack),
                    counters.get(BpfCounter::HandedOverInherited),
                    records.sample_counters().samples,
                    samples.table_stats().processes_read_from_proc
                );
                let allocations = counters.get(BpfCounter::AllocationsUnwound);
                let slot_busy = counters.get(BpfCounter::AllocationSlotBusy);
                if allocations + slot_busy > 0 {
                    log::info!(
                        "BPF engine: {allocations} allocation samples unwound in the kernel \
                         (of the samples above), {slot_busy} handed to the perf engine with \
                         their CPU's slot held by a preempted one"
                    );
                }
                let with_context = counters.get(BpfCounter::WithTraceContext);
                if with_context > 0 {
                    log::info!(
                        "BPF engine: {with_context} samples carried the request context \
                         their thread published (span ids)"
                    );
                }
                // With `kernel.bpf_stats_enabled`: what the program costs
                // the sampled tasks (it runs in their time).
                if let Some((time, runs)) =
                    samples.program().run_stats().filter(|(_, runs)| *runs > 0)
                {
                    log::info!(
                        "BPF program: {runs} runs, {} ns each on average",
                        time.as_nanos() / u128::from(runs)
                    );
                }
                if samples.tree_only() {
                    log::info!(
                        "BPF engine: every CPU sampled: {} samples of other processes dropped \
                         by the program, {} after they were handed over; {} processes marked \
                         not profiled",
                        counters.get(BpfCounter::NotProfiled),
                        records.not_profiled_samples() + samples.not_profiled_samples(),
                        samples.not_profiled_marked()
                    );
                }
            }
        }
    }

    /// Delivers everything buffered and held back, without waiting: before
    /// a profiler worker hands over to the next one, which resumes the
    /// buffers where this one stops.
    pub fn drain(
        &mut self,
        processes: &mut ProcessTable,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) {
        match &mut self.engine {
            Engine::Perf(engine) => {
                engine.flush(processes, on_sample);
            }
            Engine::Bpf {
                samples,
                records,
                pending,
                delivered_until,
            } => {
                *delivered_until = settled_time();
                if let Err(error) = samples.read_samples(Duration::ZERO, pending) {
                    log::warn!("{error}");
                }
                records.read(processes);
                deliver_merged(samples, records, pending, processes, None, on_sample);
            }
        }
    }

    /// Makes this copy of the sampler, in a profiler worker forked from the
    /// parent that started it, the reader of the buffers. With `restarted`
    /// (an earlier worker read them), also makes the engine's state true to
    /// `processes`, the table the worker rebuilt from `/proc`: samples an
    /// earlier worker read but had not delivered are gone with it.
    pub fn resume_after_fork(
        &mut self,
        processes: &ProcessTable,
        restarted: bool,
    ) -> Result<(), SamplerError> {
        match &mut self.engine {
            Engine::Perf(engine) => engine.resume_after_fork(restarted)?,
            Engine::Bpf {
                samples,
                records,
                pending,
                ..
            } => {
                records.resume_after_fork(restarted)?;
                if restarted {
                    pending.clear();
                    keep_reading_while(records, || samples.resync_after_restart(processes))?;
                }
            }
        }
        Ok(())
    }

    /// Called in the parent before it forks a worker: no thread of the
    /// engine's is left running (the worker would inherit its state, not
    /// the thread).
    pub fn settle_before_fork(&mut self) {
        if let Engine::Bpf { samples, .. } = &mut self.engine {
            samples.settle_table_changes();
        }
    }

    /// Called in the parent once a worker was forked: closes what only a
    /// worker uses and that would otherwise keep kernel memory alive beyond
    /// its worker (the BPF engine's start-up unwind tables, whose slots the
    /// next worker clears).
    pub fn release_worker_resources(&mut self) {
        if let Engine::Bpf { samples, .. } = &mut self.engine {
            samples.release_table_maps();
        }
    }

    /// Puts the table that `read` read from the store in the BPF engine's
    /// maps now, before the worker starts (the perf engine reads its
    /// tables where a sample needs them).
    pub fn preload_table(&mut self, read: StoredTableRead) {
        // Joined whatever the engine: the worker is forked next, and a
        // thread still running then could hold a lock the worker inherits
        // held. (Held while loaded: the engine's cache shares the table
        // rather than reading it again.)
        let read = read.finish();
        let (Engine::Bpf { samples, .. }, Some((file, _table))) = (&mut self.engine, read) else {
            return;
        };
        let started = std::time::Instant::now();
        // The vDSO's too, which every process maps. Their maps are filled
        // now and put in their slots by the worker's first sync, with the
        // other tables of the command's entry, in one grace period.
        let vdso = Arc::new(MappedFile {
            path: "[vdso]".into(),
            dev: 0,
            inode: 0,
        });
        let loaded = samples.stage_files(&[file.clone(), vdso]);
        if let Some(Some(loaded)) = loaded.first() {
            log::info!(
                "start-up: the table of {} ({} rows) read ahead into a BPF map in {:.0} ms",
                file.path,
                loaded.rows,
                started.elapsed().as_secs_f64() * 1e3
            );
        }
    }

    /// The time (CLOCK_MONOTONIC) up to which every sample and record was
    /// delivered (0 with the perf engine, which has no use for it).
    pub fn delivered_until(&self) -> u64 {
        match &self.engine {
            Engine::Bpf {
                delivered_until, ..
            } => *delivered_until,
            Engine::Perf(_) => 0,
        }
    }

    /// `sWALL`: the workload's threads that have waited in a system call
    /// since before the program started ([`crate::wall::seed`]), each
    /// parked in the program as off a CPU since now, so that its switch-in
    /// ends its wait; their stacks, as switch-out records for the
    /// wall-time stage. None with another engine, without `sWALL`, for a
    /// launched command (none of it ran before the program), or where the
    /// program numbers threads otherwise (the profiler in a PID namespace
    /// of its own).
    pub fn seed_blocked_threads(&mut self, processes: &mut ProcessTable) -> Vec<Sample> {
        use crate::wall::seed::{self, AnonymousMemory, BlockedThread};
        let Engine::Bpf {
            samples: engine,
            records,
            ..
        } = &mut self.engine
        else {
            return Vec::new();
        };
        let Some(event) = engine.wall_event().filter(|_| engine.parks_by_proc_ids()) else {
            return Vec::new();
        };
        let started = std::time::Instant::now();
        let mut reads = seed::MemoryReads::default();
        // The current process's anonymous memory, read once (the map is
        // in (process, thread) order; no process of `/proc` is 0).
        let mut memory = (0, AnonymousMemory::default());
        let mut seeded = Vec::new();
        for ((pid, tid), switches) in engine.take_waiting_before_wall() {
            if started.elapsed() > seed::SEEDING_BUDGET {
                break;
            }
            let Some(thread) = BlockedThread::still_from(pid, tid, switches) else {
                continue;
            };
            if memory.0 != pid {
                // Its mappings, to unwind with (with `--global`, a process
                // is read from `/proc` at its first record), and where its
                // stacks may be read.
                if processes.get(pid).is_none() {
                    let _ = processes.load_from_proc(pid);
                }
                let anonymous = reads
                    .read(pid, || AnonymousMemory::of(pid))
                    .unwrap_or_default();
                memory = (pid, anonymous);
            }
            let since = crate::perf::monotonic_now();
            if !engine.park_thread(pid, tid, since) {
                continue;
            }
            // Read after it was parked: if it ran since it was found, it is
            // taken out again (a switch-in that took it first is counted
            // as one without its stack).
            let stack = reads
                .read(pid, || thread.stack(&memory.1))
                .unwrap_or_default();
            if !thread.still_blocked() {
                engine.unpark_thread(tid, since);
                continue;
            }
            let regs = crate::unwind::UserRegs::new(thread.pc, thread.sp, 0);
            let (frames, end) = records.unwind_stack(processes, pid, &regs, &stack);
            seeded.push(Sample {
                pid,
                tid,
                time: since,
                cpu: 0,
                event,
                weight: 0,
                scaled_count: crate::events::COUNT_UNIT,
                frames,
                kernel_frames: Vec::new(),
                end,
                heap: None,
                off_cpu: Some(crate::sample::OffCpu::SwitchedOut {
                    probability: ddprof_common::sample::WALL_PROBABILITY_ONE,
                }),
                trace: None,
            });
        }
        seeded
    }

    /// `sWALL`'s event index, when it is sampled (by the BPF engine).
    pub fn wall_event(&self) -> Option<u16> {
        self.bpf_engine().and_then(BpfEngine::wall_event)
    }

    /// The BPF engine, when it samples (its program, maps and counters,
    /// for reports and tests).
    pub fn bpf_engine(&self) -> Option<&BpfEngine> {
        match &self.engine {
            Engine::Bpf { samples, .. } => Some(samples),
            Engine::Perf(_) => None,
        }
    }

    /// The engine in use (`bpf` or `perf`), as event.json `info` says it.
    pub fn engine_name(&self) -> &'static str {
        match &self.engine {
            Engine::Perf(_) => "perf",
            Engine::Bpf { .. } => "bpf",
        }
    }

    /// The fullest a perf buffer was when read since the last call, in
    /// percent (see [`PerfEngine::take_fullest_percent`]).
    pub fn take_fullest_buffer_percent(&mut self) -> u32 {
        match &mut self.engine {
            Engine::Perf(engine) => engine.take_fullest_percent(),
            Engine::Bpf { records, .. } => records.take_fullest_percent(),
        }
    }

    /// The engines' bounded caches, for the overhead report.
    pub fn cache_figures(&self) -> Vec<crate::overhead::CacheFigures> {
        match &self.engine {
            Engine::Perf(engine) => vec![engine.cache_figures()],
            Engine::Bpf {
                samples, records, ..
            } => {
                let mut figures = samples.cache_figures().to_vec();
                figures.push(records.cache_figures());
                figures
            }
        }
    }

    /// What did not become a sample so far, by cause, both engines'.
    pub fn losses(&self) -> crate::sample::LossCounters {
        match &self.engine {
            Engine::Perf(engine) => engine.losses(),
            Engine::Bpf {
                samples, records, ..
            } => samples.losses() + records.losses(),
        }
    }

    /// The profiled tasks' CPU time as the kernel counts it, in
    /// nanoseconds (see [`PerfEngine::counted_task_nanos`]).
    pub fn counted_task_nanos(&self) -> Option<u64> {
        match &self.engine {
            Engine::Perf(engine) => engine.counted_task_nanos(),
            Engine::Bpf { records, .. } => records.counted_task_nanos(),
        }
    }
}

/// Per-CPU copies of the sampling events of `events` (one per event kind
/// and rate, on every CPU), for the BPF program to keep the profiled
/// processes' samples: per-task events sample a task only once it has
/// used a whole period of CPU, so threads and processes that live shorter
/// (2,000 threads of 5 ms: 69 % of their CPU time × frequency sampled;
/// 5,000 processes of 1 ms: none) are never sampled, while a CPU's counter
/// goes on from task to task. Needs CAP_PERFMON (or `perf_event_paranoid`
/// ≤ 0); refused, the per-task events sample, as said in one line.
fn open_every_cpu(events: &[EventFd], options: &EventOptions) -> Vec<EventFd> {
    let mut specs: Vec<EventSpec> = Vec::new();
    for event in events {
        if event.spec.is_cpu_time() && event.scope.is_cpu_wide() {
            // `--global`, or already opened.
            return Vec::new();
        }
        // The program samples CPU time; other events sample per task,
        // through the perf buffers.
        if event.spec.is_cpu_time() && !specs.contains(&event.spec) {
            specs.push(event.spec.clone());
        }
    }
    match crate::events::open_all(&specs, Scope::CpuForTree, options) {
        Ok(opened) => opened,
        Err(error) => {
            log::info!(
                "sampling each profiled task rather than every CPU ({error}): threads and \
                 processes that use less than a sampling period of CPU are not sampled, and \
                 are counted as lost"
            );
            Vec::new()
        }
    }
}

/// Runs `work` (which may take a while: a sync compiles the unwind tables of
/// new programs, 0.1 s for cc1's 430 K rows) on another thread while this
/// one keeps the perf buffers drained. Meanwhile the program hands the
/// samples of those very programs to the perf buffers, 32 KB each: a 1 MiB
/// buffer is full after 30 ms at 999 Hz.
fn keep_reading_while<T: Send>(records: &mut PerfEngine, work: impl FnOnce() -> T + Send) -> T {
    let working = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let result = work();
            working.store(false, Ordering::Release);
            result
        });
        while working.load(Ordering::Acquire) {
            records.read_ahead();
            std::thread::sleep(Duration::from_millis(2));
        }
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Hands the BPF samples and the perf records (with the samples the
/// program handed over) read so far to `on_sample` in time order, up to
/// `cutoff` (everything when `None`): each sample after the records up to
/// its time have been applied to `processes`, so a sample of a process that
/// exits soon after still finds it. Newer BPF samples stay pending.
fn deliver_merged(
    samples: &mut BpfEngine,
    records: &mut PerfEngine,
    pending: &mut Vec<Sample>,
    processes: &mut ProcessTable,
    cutoff: Option<u64>,
    on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
) {
    pending.sort_by_key(|sample| sample.time);
    let ready = match cutoff {
        Some(cutoff) => pending.partition_point(|sample| sample.time <= cutoff),
        None => pending.len(),
    };
    let mut bpf_samples = BpfSamples {
        engine: samples,
        ready: pending.drain(..ready).peekable(),
    };
    let merged = merge::deliver_in_time_order(
        &mut records.ready(cutoff),
        &mut [&mut bpf_samples],
        processes,
        on_sample,
    );
    drop(bpf_samples);
    if !merged.read_from_proc.is_empty() {
        samples.describe_read_from_proc(processes, &merged.read_from_proc);
    }
}

/// The BPF program's samples up to the cutoff, as the merge reads them.
struct BpfSamples<'a> {
    engine: &'a mut BpfEngine,
    ready: std::iter::Peekable<std::vec::Drain<'a, Sample>>,
}

impl SampleStream for BpfSamples<'_> {
    fn next_time(&mut self) -> Option<u64> {
        self.ready.peek().map(|sample| sample.time)
    }

    fn next_pid(&mut self) -> Option<u32> {
        self.ready.peek().map(|sample| sample.pid)
    }

    fn deliver_next(&mut self, processes: &ProcessTable, on_sample: &mut OnSample<'_>) {
        if let Some(sample) = self.ready.next() {
            on_sample(processes, &sample);
            self.engine.recycle(sample);
        }
    }

    fn drop_next(&mut self, exited: bool) {
        if let Some(sample) = self.ready.next() {
            // `sWALL`'s records are no CPU samples: the losses counted
            // against the tasks' CPU time are not theirs.
            if sample.off_cpu.is_none() {
                self.engine.count_unkept(exited);
            }
            self.engine.recycle(sample);
        }
    }
}
