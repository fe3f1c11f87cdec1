//! The worker process (comm `ddprof-worker`): the profiler loop — the
//! sampler's poll and aggregation on this thread and, at each upload
//! period, symbolization and pprof encoding on the publisher's
//! ([`super::publish`]) — with the encoded period sent to the parent
//! ([`super::parent`]) instead of written or uploaded.
//!
//! A worker is forked from the parent, so it starts with a copy of the
//! parent's state as it was when the engine was set up: the first worker
//! uses it as is; a later one makes its copy of the sampler the reader of
//! the shared buffers again and rebuilds the process table from `/proc`
//! ([`Sampler::resume_after_restart`]). Everything the parent gives a worker
//! beyond that is in the [`Handover`], read through the fork.
//!
//! Fork hazards: the parent has other threads (the exporter's), so only
//! the forking thread exists here at first, and locks another thread held
//! at the fork stay held forever. The worker never touches the exporter or
//! its runtime (not even to drop them: it ends with `_exit`, see
//! [`super::parent`]), and the logger writes each line with one `write(2)`,
//! without the standard library's stderr lock (see [`crate::logging`]).
//! glibc's `malloc` makes itself usable in the child of a fork.
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant, SystemTime};

use super::channel::{Retirement, ToParent, WorkerExit, STOP_REQUEST};
use super::publish::{Publisher, PublisherSetup};
use super::{ProfilerError, ProfilerOptions, Target, TargetWatch, MAX_POLL};
use crate::aggregate::{Aggregator, PeriodProfile};
use crate::carried::CarriedFile;
use crate::identity::{Identities, Services};
use crate::live_heap::{LiveHeap, Route};
use crate::overhead::{Accounting, CacheFigures, Overhead, OverheadMeter, RunTotals, ThreadTimes};
use crate::process::ProcessTable;
use crate::profile::Compressions;
use crate::sample::Sample;
use crate::sampler::Sampler;
use crate::symbolize::KallsymsSnapshot;
use crate::wall::WallTime;
use ddprof_common::sample::BpfCounter;

/// The comm of a worker process.
pub const WORKER_NAME: &std::ffi::CStr = c"ddprof-worker";

/// What the parent tells a new worker (through the fork: the worker reads
/// its copy).
#[derive(Debug, Clone, Copy)]
pub struct Handover {
    /// Where the next profile starts: the end of the last one the parent
    /// received (so a crashed worker's unfinished period is covered by the
    /// next worker's first profile).
    pub period_start: SystemTime,
    /// When the current period ends.
    pub period_deadline: Instant,
    /// Profiles the parent has received so far.
    pub profiles: u64,
    /// Workers that replaced an earlier one so far (0 for the first worker).
    pub restarts: u64,
    /// The profiler CPU time the periods so far reported.
    pub cpu_counted: Duration,
    /// The run's totals so far (samples, losses, the kernel's count of the
    /// tasks' CPU time): a worker's accounting goes on from them.
    pub totals: RunTotals,
    /// This worker replaces one that died (a crash, its watchdog).
    pub after_a_dead_worker: bool,
    /// CPU time the profiler spent before its parent process ran (the
    /// launcher's): part of the first period's.
    pub spent_before: Duration,
    /// The parent's PID.
    pub parent: u32,
}

/// The parts of the profiler a worker runs with.
pub struct WorkerSetup<'a> {
    pub options: &'a ProfilerOptions,
    pub target: Target,
    /// The table as the parent set it up (used by the first worker only).
    pub processes: &'a mut ProcessTable,
    pub sampler: &'a mut Sampler,
    pub kallsyms: Option<KallsymsSnapshot>,
    /// `sWALL`, when its program samples.
    pub wall: Option<super::WallSetup>,
    pub watch: Option<&'a TargetWatch>,
    pub handover: Handover,
    pub socket: UnixStream,
    /// Where the live heap goes from a worker to the next (with a live
    /// `sALLOC` event).
    pub live_heap: Option<&'a CarriedFile>,
    /// Where a retiring worker leaves `sWALL`'s waits under way for the
    /// next (with `sWALL`).
    pub waits: Option<&'a CarriedFile>,
}

/// Exit statuses of a worker.
pub const EXIT_OK: i32 = 0;
/// The worker's loop failed (the sampler's poll, encoding): said in a log line.
pub const EXIT_FAILED: i32 = 3;
/// The parent went away or the socket broke.
pub const EXIT_PARENT_GONE: i32 = 4;

/// Runs a worker to its end; returns its exit status. Runs in the child of
/// a fork: never returns to the caller's caller (see [`super::parent`]).
pub fn run(setup: WorkerSetup<'_>) -> i32 {
    become_worker(setup.handover.parent);
    if let Err(error) = confine(setup.options.require_sandbox) {
        log::error!("profiler worker: {error}");
        return EXIT_FAILED;
    }
    let WorkerSetup {
        options,
        target,
        processes,
        sampler,
        kallsyms,
        wall,
        watch,
        handover,
        socket,
        live_heap: live_heap_file,
        waits,
    } = setup;
    let mut rebuilt;
    let restarted = handover.restarts > 0;
    let processes = if restarted {
        // The parent's copy is the table at start: read the processes in
        // scope again.
        rebuilt = ProcessTable::new();
        for pid in super::target::processes_in_scope(target) {
            // A process that exited meanwhile needs no entry.
            let _ = rebuilt.load_from_proc(pid);
        }
        &mut rebuilt
    } else {
        processes
    };
    if let Err(error) = sampler.resume_after_fork(processes, restarted) {
        log::error!("profiler worker: {error}");
        return EXIT_FAILED;
    }
    let live_heap = resume_live_heap(options, live_heap_file, processes);
    if live_heap.is_some() {
        // What a process held at its exit is named with its mappings.
        processes.keep_ended(crate::live_heap::ENDED_PROCESSES_NAMED);
    }
    let ran = Worker::new(options, &handover, kallsyms, sampler.losses(), socket)
        .map(|worker| worker.with_live_heap(live_heap))
        .map(|worker| Worker {
            identities: (!matches!(target, Target::Launched { .. })).then(Identities::default),
            ..worker
        })
        .map(|worker| {
            let waits = waits.map(|file| (file, handover.after_a_dead_worker));
            worker.with_wall_time(wall, options.sampler.kernel_stacks, sampler, waits)
        })
        .map(|mut worker| {
            // The threads already off a CPU when the program started, for
            // the first worker (the next ones take them over).
            if !restarted {
                // Under the watchdog, as the loop is.
                // SAFETY: alarm only (re)arms this process's timer.
                unsafe { libc::alarm(watchdog_seconds(options.upload_period)) };
                worker.seed_waits(processes, sampler);
            }
            worker
        })
        .and_then(|worker| {
            worker.run(options, processes, sampler, watch, handover.period_deadline)
        });
    match ran {
        Ok(()) => EXIT_OK,
        Err(WorkerError::ParentGone) => EXIT_PARENT_GONE,
        Err(WorkerError::Profiler(error)) => {
            log::error!("profiler worker: {error}");
            EXIT_FAILED
        }
    }
}

/// The live heap the previous worker left (empty for the first), and the
/// file this worker leaves it in (none when the parent has none);
/// `None` without a live `sALLOC` event.
fn resume_live_heap(
    options: &ProfilerOptions,
    file: Option<&CarriedFile>,
    processes: &ProcessTable,
) -> Option<(LiveHeap, Option<CarriedFile>)> {
    let mut heap = LiveHeap::new(&options.events);
    if !heap.is_active() {
        return None;
    }
    let file = file.and_then(|file| {
        file.try_clone()
            .inspect_err(|error| {
                log::warn!(
                    "live heap: {error}; it starts empty in this worker and is not carried on"
                )
            })
            .ok()
    });
    if let Some(Err(error)) = file.as_ref().map(|file| heap.load(file, processes)) {
        log::warn!("live heap: {error}; this worker starts it empty");
    }
    Some((heap, file))
}

/// Names the process, makes it die with the parent, and leaves SIGINT and
/// SIGTERM to the parent (which asks the worker to flush over the socket).
fn become_worker(parent: u32) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes; PR_SET_PDEATHSIG takes a signal number; signal() sets this
    // process's disposition. None touches memory of ours otherwise.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, WORKER_NAME.as_ptr(), 0, 0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // A terminal's Ctrl-C reaches the whole process group: the parent
        // handles it.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    // The parent died before PR_SET_PDEATHSIG took effect.
    if std::os::unix::process::parent_id() != parent {
        // SAFETY: ends this process without running anything of the parent's.
        unsafe { libc::_exit(EXIT_PARENT_GONE) };
    }
}

/// Gives the worker what it reads the profiled processes with, then takes
/// from it every way to write, run a program or reach out (see
/// `confine::worker_sandbox`). Without the filter (a kernel that refuses
/// it), the worker stops, unless `--no-sandbox` says to go on.
fn confine(require_sandbox: bool) -> Result<(), String> {
    if let Err(error) = crate::confine::capabilities::raise_for_worker() {
        log::warn!("profiler worker: {error}");
    }
    match crate::confine::worker_sandbox::install() {
        Ok(()) => Ok(()),
        Err(error) if require_sandbox => Err(format!(
            "cannot install its seccomp filter ({error}): it does not run without it \
             (--no-sandbox: run it anyway)"
        )),
        Err(error) => {
            log::warn!(
                "profiler worker: running without its seccomp filter ({error}), as \
                 --no-sandbox allows"
            );
            Ok(())
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum WorkerError {
    #[error("the profiler parent is gone")]
    ParentGone,
    #[error(transparent)]
    Profiler(#[from] ProfilerError),
}

/// How long a retiring worker's loop polls at a time while it waits for
/// the publisher to send the previous period.
const PUBLISHER_WAIT_POLL: Duration = Duration::from_millis(10);

/// How often a busy worker loop looks at its watchdog, the target and the
/// parent's socket (an idle loop does at each turn: it waits up to
/// `MAX_POLL` for samples). A stop request or the target's exit waits at
/// most this much longer for the loop to notice.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// The longest a worker may go without finishing a loop turn before its
/// watchdog (`alarm`) ends it: the parent cannot signal it (its seccomp
/// filter forbids signalling other processes), so a hung worker ends itself.
fn watchdog_seconds(upload_period: Duration) -> u32 {
    (upload_period.as_secs() + 60).min(u64::from(u32::MAX)) as u32
}

struct Worker {
    aggregator: Aggregator,
    meter: OverheadMeter,
    /// The CPU-time events: their samples are what the meter weighs
    /// against the CPU time the kernel counted.
    cpu_time_events: Vec<u16>,
    show_samples: bool,
    period_start: SystemTime,
    /// Profiles of the run so far (the parent's and this worker's).
    profiles: u64,
    /// Symbolizes, encodes and sends what this loop closes and says.
    publisher: Publisher,
    /// Read only, for the parent's stop request (the publisher writes).
    socket: UnixStream,
    /// This (the loop's) thread's times when the current period's figures
    /// started.
    loop_times: ThreadTimes,
    /// The allocations held (`sALLOC mode=l`), and the file the next
    /// worker reads them from.
    live_heap: Option<(LiveHeap, Option<CarriedFile>)>,
    /// `sWALL`'s stacks held until their thread runs again, and the file
    /// where this worker leaves them to the next when it retires (their
    /// switch-ins are in the buffers it hands over).
    wall: Option<(WallTime, Option<CarriedFile>)>,
    /// Each process's service, with `-p` and `--global` (a launched
    /// command's processes all go out under the run's service).
    identities: Option<Identities>,
}

impl Worker {
    fn new(
        options: &ProfilerOptions,
        handover: &Handover,
        kallsyms: Option<KallsymsSnapshot>,
        losses_before: crate::sample::LossCounters,
        socket: UnixStream,
    ) -> Result<Self, WorkerError> {
        let publisher = Publisher::start(
            PublisherSetup {
                symbolizer: options.symbolizer.clone(),
                kallsyms,
                sampling_period_nanos: options.sampling_period_nanos,
                events: options.events.clone(),
                kernel_stacks: options.sampler.kernel_stacks,
                restarts: handover.restarts,
                compressions: Compressions {
                    gzip: options.output_dir.is_some(),
                    zstd: options.export.is_some(),
                },
            },
            socket.try_clone().map_err(ProfilerError::from)?,
        )
        .map_err(ProfilerError::from)?;
        Ok(Self {
            aggregator: Aggregator::new(options.aggregator),
            cpu_time_events: options
                .events
                .iter()
                .filter(|event| event.cpu_time)
                .map(|event| event.index)
                .collect(),
            meter: {
                let meter = OverheadMeter::resume(
                    options.sampling_period_nanos,
                    Accounting::WorkerOf {
                        parent: handover.parent,
                        before: handover.spent_before,
                    },
                    handover.cpu_counted,
                    handover.totals,
                    losses_before,
                );
                if handover.after_a_dead_worker {
                    meter.after_a_dead_worker()
                } else {
                    meter
                }
            },
            show_samples: options.show_samples,
            period_start: handover.period_start,
            profiles: handover.profiles,
            publisher,
            socket,
            loop_times: ThreadTimes::now(),
            live_heap: None,
            wall: None,
            identities: None,
        })
    }

    fn with_live_heap(self, live_heap: Option<(LiveHeap, Option<CarriedFile>)>) -> Self {
        Self { live_heap, ..self }
    }

    /// The wall-time stage, with the waits under way the previous worker
    /// left in `waits` (the file, and whether that worker died: then what
    /// the file holds is older than its switch-ins, which it read, and is
    /// dropped).
    fn with_wall_time(
        self,
        wall: Option<super::WallSetup>,
        all_kernel_frames: bool,
        sampler: &Sampler,
        waits: Option<(&CarriedFile, bool)>,
    ) -> Self {
        let wall = wall.map(|setup| {
            let mut wall = WallTime::new(
                setup.sampling,
                self.cpu_time_events.clone(),
                all_kernel_frames,
                setup.scheduler,
            );
            wall.count_program_from(wall_program_counters(sampler));
            let file = waits.and_then(|(file, after_a_dead_worker)| {
                let taken = if after_a_dead_worker {
                    file.clear().map(|()| 0)
                } else {
                    wall.load(file)
                };
                match taken {
                    Ok(0) => {}
                    Ok(parked) => log::info!(
                        "wall time: {parked} threads off a CPU taken over from the previous worker"
                    ),
                    Err(error) => log::warn!(
                        "wall time: the previous worker's waits under way: {error}; their \
                         switch-ins are counted without their stack"
                    ),
                }
                file.try_clone()
                    .inspect_err(|error| {
                        log::warn!(
                            "wall time: {error}; the waits under way when this worker retires \
                             are not carried on"
                        )
                    })
                    .ok()
            });
            (wall, file)
        });
        Self { wall, ..self }
    }

    /// Runs the loop until the run ends or this worker retires, then waits
    /// for the publisher to send everything.
    fn run(
        mut self,
        options: &ProfilerOptions,
        processes: &mut ProcessTable,
        sampler: &mut Sampler,
        watch: Option<&TargetWatch>,
        period_deadline: Instant,
    ) -> Result<(), WorkerError> {
        let sampled = self.sample(options, processes, sampler, watch, period_deadline);
        // What was handed over is sent even when the loop failed; the
        // publisher gets a watchdog interval of its own to finish.
        // SAFETY: alarm only (re)arms this process's timer.
        unsafe { libc::alarm(watchdog_seconds(options.upload_period)) };
        let published = self.publisher.finish();
        sampled.and(published)
    }

    fn sample(
        &mut self,
        options: &ProfilerOptions,
        processes: &mut ProcessTable,
        sampler: &mut Sampler,
        watch: Option<&TargetWatch>,
        mut period_deadline: Instant,
    ) -> Result<(), WorkerError> {
        let period = options.upload_period;
        let watchdog = watchdog_seconds(period);
        let mut periods = 0u32;
        // SAFETY: alarm only (re)arms this process's timer.
        unsafe { libc::alarm(watchdog) };
        let mut checked = Instant::now();
        loop {
            let timeout = period_deadline
                .saturating_duration_since(Instant::now())
                .min(MAX_POLL);
            let finished = sampler
                .poll(processes, timeout, &mut |table, sample| {
                    self.add(table, sample)
                })
                .map_err(ProfilerError::from)?;
            // The watchdog, the target and the parent's socket are looked
            // at once per `CHECK_INTERVAL`, not after every poll: each is a
            // system call, and at 999 Hz the loop turns ~120 times a second.
            let check = checked.elapsed() >= CHECK_INTERVAL;
            if check {
                checked = Instant::now();
                // SAFETY: alarm only (re)arms this process's timer.
                unsafe { libc::alarm(watchdog) };
                self.publisher.check()?;
            }
            let target_gone = check && watch.is_some_and(TargetWatch::has_exited);
            if finished || target_gone || (check && self.stop_requested()?) {
                sampler.flush(processes, &mut |table, sample| self.add(table, sample));
                let closed = self.close_period(true, sampler, processes);
                self.publisher.period(closed)?;
                return self
                    .publisher
                    .message(ToParent::Exiting(WorkerExit::Finished));
            }
            if Instant::now() < period_deadline {
                continue;
            }
            periods += 1;
            let rss_kib = crate::overhead::rss_kib();
            let exit = if periods >= options.worker.restart_every_periods {
                Some(WorkerExit::Periods(periods))
            } else if rss_kib > options.worker.max_rss_kib {
                Some(WorkerExit::Rss(rss_kib))
            } else {
                None
            };
            let Some(exit) = exit else {
                // Symbolized on the publisher's thread while this one
                // goes on draining the buffers.
                let closed = self.close_period(false, sampler, processes);
                self.publisher.period(closed)?;
                period_deadline += period;
                continue;
            };
            // The next worker resumes the buffers where this one stops, and
            // starts (the parent forks it on `Retiring`) while this one
            // symbolizes: the buffers need only hold the time a fork takes.
            // So `Retiring` waits behind nothing: the previous period is
            // sent first, the loop draining meanwhile (under the watchdog).
            while !self.publisher.idle() {
                self.publisher.check()?;
                sampler
                    .poll(processes, PUBLISHER_WAIT_POLL, &mut |table, sample| {
                        self.add(table, sample)
                    })
                    .map_err(ProfilerError::from)?;
            }
            sampler.drain(processes, &mut |table, sample| self.add(table, sample));
            let closed = self.close_period(false, sampler, processes);
            self.hand_over_waits();
            self.publisher.message(ToParent::Retiring(Retirement {
                exit,
                next_period_start: self.period_start,
                profile_follows: closed.overhead.is_some(),
                reported_cpu: closed.overhead.map_or(Duration::ZERO, |o| o.profiler_cpu),
                totals: self.meter.totals(),
            }))?;
            self.publisher.period(closed)?;
            return self.publisher.message(ToParent::Exiting(exit));
        }
    }

    /// Parks the threads that have waited since before the program
    /// started (`wall::seed`): their waits count from now.
    fn seed_waits(&mut self, processes: &mut ProcessTable, sampler: &mut Sampler) {
        let Some((wall, _)) = &mut self.wall else {
            return;
        };
        let seeded = sampler.seed_blocked_threads(processes);
        if seeded.is_empty() {
            return;
        }
        for sample in &seeded {
            wall.take(processes, sample, &mut self.aggregator);
        }
        let complete = seeded.iter().filter(|s| s.end.is_complete()).count();
        log::info!(
            "wall time: {} threads off a CPU at the start (in a system call), their waits \
             counted from now; {complete} of their stacks complete",
            seeded.len()
        );
    }

    /// Leaves the waits under way to the next worker (before `Retiring`:
    /// the parent forks it then), weighed up to the period just closed.
    fn hand_over_waits(&self) {
        if let Some((wall, Some(file))) = &self.wall {
            if let Err(error) = wall.save(file) {
                log::warn!(
                    "wall time: {error}; the next worker counts the switch-ins of the {} \
                     threads off a CPU now without their stack",
                    wall.parked()
                );
            }
        }
    }

    fn add(&mut self, processes: &ProcessTable, sample: &Sample) {
        if let Some((wall, _)) = &mut self.wall {
            wall.delivered(processes, sample, &mut self.aggregator);
        }
        if sample.off_cpu.is_some() {
            // A wait's end or its stack: the wall-time stage weighs it.
            if let Some((wall, _)) = &mut self.wall {
                wall.take(processes, sample, &mut self.aggregator);
            }
            return;
        }
        if let Some(heap) = sample.heap {
            self.meter
                .add_heap_sample(matches!(heap, crate::sample::HeapEvent::Freed { .. }));
        }
        if let Some((live_heap, _)) = &mut self.live_heap {
            if live_heap.take(processes, sample) == Route::LiveHeapOnly {
                return;
            }
        }
        if self.cpu_time_events.contains(&sample.event) {
            self.meter
                .add_sample(sample.weight, sample.end, sample.frames.len());
        }
        if let Some(identities) = &mut self.identities {
            identities.met(processes, sample.pid);
        }
        if self.show_samples {
            log::info!(
                "sample pid={} tid={} ({}) event={} cpu={} time={} weight={} end={:?} frames={:x?}",
                sample.pid,
                sample.tid,
                processes.thread_name(sample.pid, sample.tid).unwrap_or("?"),
                sample.event,
                sample.cpu,
                sample.time,
                sample.weight,
                sample.end,
                sample.frames
            );
        }
        self.aggregator.add(processes, sample);
    }

    /// Whether the parent asked for the last period (or is gone).
    fn stop_requested(&self) -> Result<bool, WorkerError> {
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into `byte`, without waiting.
        let read = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        };
        match read {
            1 => Ok(byte == STOP_REQUEST),
            0 => Err(WorkerError::ParentGone),
            _ => match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(false),
                _ => Err(WorkerError::ParentGone),
            },
        }
    }

    /// Closes the current period and takes its figures. An empty period
    /// gets no profile unless it is the run's only one (the next profile
    /// then covers it too). The sampler says what it lost so far and how
    /// full its caches are.
    fn close_period(
        &mut self,
        last: bool,
        sampler: &mut Sampler,
        processes: &mut ProcessTable,
    ) -> ClosedPeriod {
        let end = SystemTime::now();
        let start = self.period_start;
        // From the processes the table still holds (one that exited took
        // its mappings with it: its jitdump is looked for by the path
        // noted at its first anonymous sample).
        self.aggregator.note_jitdumps(processes);
        let services = match &mut self.identities {
            Some(identities) => identities.of_period(processes),
            None => HashMap::new(),
        };
        if let Some((live_heap, file)) = &mut self.live_heap {
            live_heap.add_to(processes, &mut self.aggregator);
            // Named once: a pid seen later is another process.
            processes.forget_ended();
            let counters = live_heap.counters();
            log::info!(
                "live heap: {} sampled allocations held; since the start, {} sampled allocations \
                 not followed (the library's table had no room), {} left out (over {} held), {} \
                 frees of addresses not held",
                live_heap.len(),
                counters.not_followed,
                counters.over_limit,
                crate::live_heap::MAX_LIVE_ALLOCATIONS,
                counters.unknown_frees
            );
            if let (false, Some(file)) = (last, file) {
                if let Err(error) = live_heap.save(file) {
                    log::warn!("live heap: {error}; the next worker would start it empty");
                }
            }
        }
        let wall = self.wall.as_mut().map(|(wall, _)| {
            wall.close_period(processes, &mut self.aggregator, sampler.delivered_until());
            let figures = wall.period_figures(wall_program_counters(sampler));
            log::info!("{figures}");
            figures
        });
        let period = self.aggregator.take_period(start, end);
        // A period with held allocations only has a profile too (a
        // program that leaks while idle).
        if period.stats.samples == 0 && period.samples.is_empty() && !(last && self.profiles == 0) {
            return ClosedPeriod {
                start,
                end,
                period,
                wall,
                overhead: None,
                last,
                caches: Vec::new(),
                keeping_up: None,
                services,
            };
        }
        self.period_start = end;
        self.profiles += 1;
        let loop_times = ThreadTimes::now();
        let keeping_up = KeepingUp {
            fullest_buffer_percent: sampler.take_fullest_buffer_percent(),
            loop_times: loop_times.since(std::mem::replace(&mut self.loop_times, loop_times)),
        };
        let mut overhead = self
            .meter
            .end_period(sampler.losses(), sampler.counted_task_nanos());
        if overhead.lost.ring_full > 0 {
            overhead.run = self.meter.add_losing_loop(keeping_up.loop_times);
        }
        ClosedPeriod {
            start,
            end,
            period,
            wall,
            overhead: Some(overhead),
            last,
            caches: sampler.cache_figures(),
            keeping_up: Some(keeping_up),
            services,
        }
    }
}

/// The `sWALL` program's counters since it was loaded, in the order
/// [`WallTime::period_figures`] takes them (zeros without the BPF engine).
fn wall_program_counters(sampler: &Sampler) -> [u64; 5] {
    sampler
        .bpf_engine()
        .and_then(|engine| engine.counters().ok())
        .map_or([0; 5], |counters| {
            [
                BpfCounter::WallSwitchOuts,
                BpfCounter::WallSampled,
                BpfCounter::WallBufferFull,
                BpfCounter::WallResumeLost,
                BpfCounter::WallUndescribed,
            ]
            .map(|counter| counters.get(counter))
        })
}

/// A period taken from the aggregator, not yet symbolized.
pub(super) struct ClosedPeriod {
    pub start: SystemTime,
    pub end: SystemTime,
    pub period: PeriodProfile,
    /// Its wall-time figures (with `sWALL`), said in its profile.
    pub wall: Option<crate::wall::WallPeriod>,
    /// Its figures; `None`: it gets no profile.
    pub overhead: Option<Overhead>,
    /// The run's last period.
    pub last: bool,
    /// The sampler's caches when the period was closed.
    pub caches: Vec<CacheFigures>,
    /// How the loop kept up with the buffers (with the figures).
    pub keeping_up: Option<KeepingUp>,
    /// The service of each process of the period that has one of its own.
    pub services: Services,
}

/// How the loop kept up with the perf buffers over a period: when samples
/// are lost in full buffers, whether it was busy or kept off a CPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeepingUp {
    /// The fullest a perf buffer was when read, in percent.
    pub fullest_buffer_percent: u32,
    /// The loop thread's time on a CPU and waiting for one.
    pub loop_times: ThreadTimes,
}

impl std::fmt::Display for KeepingUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "perf buffers up to {} % full when read; the loop {}",
            self.fullest_buffer_percent, self.loop_times
        )
    }
}
