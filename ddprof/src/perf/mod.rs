//! The perf sampling engine: reads the ring buffers of the perf events,
//! keeps the process table current from the kernel's records, unwinds each
//! sample's copied user stack in user space and emits [`Sample`]s.
//!
//! Records from different buffers (one per CPU) are merged by timestamp
//! before they are applied, so that a fork seen on one CPU is applied before
//! the child's exec seen on another. Records newer than [`HOLD_BACK`] are kept
//! for the next poll, in case an older record is still being written to
//! another buffer; they are all applied once every event has hung up (the
//! profiled processes are gone).
mod buffers;
mod delivery;
mod record;
mod ring;
mod source;
mod tracking;
mod unwinding;
mod wait;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use crate::events::EventFd;
use crate::process::ProcessTable;
use crate::sample::{LossCounters, Sample};
use crate::unwind::{TableLoading, TableStore, Unwinder};

use buffers::MIN_RING_BUFFER_PAGES;
pub use buffers::{
    default_ring_buffer_bytes, AllocationBuffers, PerfEngineOptions, DEFAULT_RING_BUFFER_BYTES,
};
pub use ddprof_common::sample::MAX_USER_FRAMES;
pub use delivery::ReadyRecords;
use record::Record;
use ring::RingBuffer;
use source::{note_outcome, queue_record, ReadAhead, Source};
use tracking::{ProcessTracker, Reorder};
use unwinding::Unwinding;
use wait::Waiter;

/// How long records wait for older records from other buffers.
pub const HOLD_BACK: Duration = Duration::from_millis(10);
/// How long the reader sleeps at most while records are held back. Not
/// `HOLD_BACK` itself: at low rates the newest record is nearly always held
/// back, and waking every 10 ms to deliver one sample cost ~100 wake-ups a
/// second, a quarter of the engine's CPU in context switches alone (each
/// timed wake-up costs ~50 µs of CPU on a VM). Held records are delivered
/// within this time (or at the next wake-up, when a buffer is half full), as the BPF
/// engine's are (`sampler::BPF_MAX_POLL`); nothing else waits on them.
const HELD_BACK_WAIT: Duration = Duration::from_millis(250);
/// The most time a drain spends unwinding samples in place, while the
/// kernel cannot reuse their space: ~2 ms is a few hundred samples, and a
/// buffer woken at half full has ~16 ms left at 999 Hz with 32 KB stacks.
const IN_PLACE_BUDGET: Duration = Duration::from_millis(2);
/// How often the buffers are read while queued records are delivered: the
/// backlog read ahead during the worker's first sync (a thousand records
/// and more) took 9-15 ms to deliver, and a 4 MiB buffer of 32 KB
/// allocation samples at 20,000 a second on one CPU (one thread
/// allocating 9 GB/s) is full in ~6 ms.
const DELIVERY_READ_INTERVAL: Duration = Duration::from_millis(2);

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("the perf engine needs at least one perf event")]
    NoEvents,
    #[error(
        "could not map the perf ring buffer of the event on CPU {cpu} ({kib} KiB): {source}; \
         raise `sysctl kernel.perf_event_mlock_kb` or the locked-memory limit (ulimit -l), \
         or map less with --ring-buffer-kib"
    )]
    Map {
        cpu: i32,
        kib: usize,
        source: io::Error,
    },
    #[error("cannot enable the perf event on CPU {cpu}: {source}")]
    Enable { cpu: i32, source: io::Error },
    #[error("waiting on the perf events failed (epoll): {0}")]
    Poll(io::Error),
}

/// What one [`PerfEngine::poll`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollOutcome {
    /// Samples handed to `on_sample`.
    pub samples: u64,
    /// Process events applied to the table.
    pub process_events: u64,
    /// Every event has hung up: the profiled processes are all gone and
    /// every record has been delivered. Further polls return at once.
    pub finished: bool,
}

/// Running totals of the samples the engine produced.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SampleCounters {
    pub samples: u64,
    /// Samples whose unwind reached the thread's root (`StackEnd::Complete`).
    pub complete: u64,
    /// Samples unwound as they were read, from their stacks in place in
    /// the buffer (the others were copied out first: see
    /// `PerfEngine::drain_buffers`).
    pub unwound_in_place: u64,
}

pub struct PerfEngine {
    sources: Vec<Source>,
    options: PerfEngineOptions,
    unwinder: Unwinder,
    reorder: Reorder,
    /// Records reassembled from both ends of a buffer (for tests).
    wrapped_records: u64,
    scratch: Vec<u8>,
    /// Each buffer's head as [`PerfEngine::drain_buffers`] read it.
    heads: Vec<u64>,
    /// Frame vectors of delivered samples, reused by the next samples
    /// unwound (which may wait in the queue, frames and all).
    spare_frames: Vec<Vec<u64>>,
    /// Stack copies of unwound samples, reused by the next records read:
    /// a copy is up to `stack_sample_size` (32 KB), and allocating and
    /// freeing one per sample was ~6 % of the engine's CPU on chain at
    /// 999 Hz (`perf record` of the worker).
    spare_stacks: Vec<Vec<u8>>,
    tracker: ProcessTracker,
    losses: LossCounters,
    counters: SampleCounters,
    /// The epoll set [`PerfEngine::wait_with`] waits on, made at the first
    /// wait by the process that reads the buffers (not inherited by a
    /// worker: the parent's set is its own).
    waiter: Option<Waiter>,
    /// Samples of processes the records do not name are dropped (events
    /// sample every CPU and the BPF program hands over any process its map
    /// does not describe), rather than read from `/proc`.
    known_only: bool,
    /// Samples dropped so, by cause (see [`crate::merge::Unkept`]).
    unkept: crate::merge::Unkept,
    /// The fullest any buffer was when read, in percent, since
    /// [`PerfEngine::take_fullest_percent`].
    fullest_percent: u32,
    /// How each event's samples weigh, one per event.
    weighings: crate::events::Weighings,
}

impl PerfEngine {
    /// Maps the ring buffer of every event. The events keep counting; the
    /// engine owns them from here on.
    pub fn new(events: Vec<EventFd>, options: PerfEngineOptions) -> Result<Self, PerfError> {
        if events.is_empty() {
            return Err(PerfError::NoEvents);
        }
        let page = ring::page_size();
        let mut sources: Vec<Source> = Vec::new();
        // Once the locked-memory limit refused a size, no later buffer asks
        // for more (one warning per halving, not per event).
        let mut most_pages = usize::MAX;
        for event in events {
            let mut pages = options.data_pages_for(&event.spec.kind).min(most_pages);
            // The threads of a `-p` target share a buffer per CPU and
            // event (up to 64 events each), as with `perf record -p` and the
            // C++ ddprof: a buffer each pinned threads × CPUs × 256 KiB or
            // more (2,004 buffers of 1 MiB for 1,000 threads on 2 CPUs at
            // 99 Hz), and clearing their pages took 0.5-14 s of CPU before
            // the first sample.
            if let Some(source) = sources
                .iter_mut()
                .find(|source| source.takes_output_of(&event))
            {
                match event.redirect_output_to(&source.event) {
                    Ok(()) => {
                        source.add_follower(event);
                        continue;
                    }
                    Err(error) => log::debug!(
                        "perf engine: the event on CPU {} keeps a buffer of its own ({error})",
                        event.cpu
                    ),
                }
            }
            let ring = loop {
                match RingBuffer::map(std::os::fd::AsFd::as_fd(&event.fd), pages) {
                    Ok(ring) => break ring,
                    // Out of locked memory (perf_event_mlock_kb, RLIMIT_MEMLOCK).
                    Err(error)
                        if matches!(error.raw_os_error(), Some(libc::EPERM | libc::ENOMEM))
                            && pages > MIN_RING_BUFFER_PAGES =>
                    {
                        pages /= 2;
                        most_pages = pages;
                        log::warn!(
                            "perf ring buffer refused ({error}); retrying with {} KiB per event",
                            pages * page / 1024
                        );
                    }
                    Err(source) => {
                        return Err(PerfError::Map {
                            cpu: event.cpu,
                            kib: pages * page / 1024,
                            source,
                        })
                    }
                }
            };
            sources.push(Source::new(event, ring));
        }
        for event in sources.iter().flat_map(Source::events) {
            if event.enable_when_mapped {
                event.enable().map_err(|error| PerfError::Enable {
                    cpu: event.cpu,
                    source: error,
                })?;
            }
        }
        log::debug!(
            "perf engine: {} events, {} buffers of {} KiB in all (the first {} KiB)",
            sources
                .iter()
                .map(|source| 1 + source.followers.len())
                .sum::<usize>(),
            sources.len(),
            sources
                .iter()
                .map(|source| source.ring.data_size() / 1024)
                .sum::<usize>(),
            sources[0].ring.data_size() / 1024
        );
        let mut weighings = crate::events::Weighings::default();
        for source in &sources {
            weighings.add(source.event.spec.weighing);
        }
        Ok(Self {
            weighings,
            sources,
            options,
            unwinder: Unwinder::new(),
            reorder: Reorder::default(),
            wrapped_records: 0,
            scratch: Vec::new(),
            heads: Vec::new(),
            spare_stacks: Vec::new(),
            spare_frames: Vec::new(),
            tracker: ProcessTracker::default(),
            losses: LossCounters::default(),
            counters: SampleCounters::default(),
            waiter: None,
            known_only: false,
            unkept: crate::merge::Unkept::default(),
            fullest_percent: 0,
        })
    }

    /// Makes this copy of the engine, in a profiler worker forked from the
    /// parent that set it up, the reader of the buffers: each is mapped
    /// again (a fork does not copy perf buffer mappings) and read from its
    /// shared tail on. With `restarted` (an earlier worker read from the
    /// buffers), the records queued in this copy, which that worker
    /// delivered, are dropped, and the processes the records name are read
    /// from `/proc` unless the caller's table has them.
    pub fn resume_after_fork(&mut self, restarted: bool) -> Result<(), PerfError> {
        for source in &mut self.sources {
            source
                .ring
                .remap_after_fork(std::os::fd::AsFd::as_fd(&source.event.fd))
                .map_err(|source_error| PerfError::Map {
                    cpu: source.event.cpu,
                    kib: source.ring.data_size() / 1024,
                    source: source_error,
                })?;
            source.hung_up.fill(false);
        }
        self.waiter = None;
        if restarted {
            self.reorder = Reorder::default();
            self.tracker = ProcessTracker::default();
            self.tracker.load_sampled_from_proc(!self.known_only);
        }
        Ok(())
    }

    /// Samples of processes that the records do not name, dropped (every
    /// CPU sampled, see [`PerfEngine::keep_only_known_processes`]).
    pub fn not_profiled_samples(&self) -> u64 {
        self.unkept.not_profiled
    }

    /// Keeps only the samples of processes that the records name (or the
    /// caller's table has): the events sample every CPU, and the BPF
    /// program hands over the first samples of a process it does not know,
    /// profiled or not.
    pub fn keep_only_known_processes(&mut self) {
        self.known_only = true;
        self.tracker.load_sampled_from_proc(false);
    }

    /// Closes the events of `scope` (per-CPU events opened for a BPF
    /// engine that did not start).
    pub fn drop_cpu_wide_sources(&mut self, scope: crate::events::Scope) {
        self.sources.retain(|source| source.event.scope != scope);
        self.waiter = None;
    }

    /// Waits up to `timeout` for records; applies process events to
    /// `processes` in time order, unwinds samples and hands each finished
    /// [`Sample`] to `on_sample` together with the table as it was when the
    /// sample was taken.
    pub fn poll(
        &mut self,
        processes: &mut ProcessTable,
        timeout: Duration,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) -> Result<PollOutcome, PerfError> {
        if !self.all_hung_up() {
            // Held-back records must not wait a whole timeout.
            let wait = if self.reorder.is_empty() {
                timeout
            } else {
                timeout.min(HELD_BACK_WAIT)
            };
            self.wait(wait)?;
        }
        // Anything timestamped before this has been written by the time the
        // buffers are read below.
        let cutoff = settled_time();
        self.drain_buffers(Some(processes));
        let finished = self.all_hung_up();
        Ok(self.deliver(
            processes,
            (!finished).then_some(cutoff),
            finished,
            on_sample,
        ))
    }

    /// Delivers everything still in the buffers and held back, without
    /// waiting: for shutdown (`--global` stopped by a signal), where the
    /// events never hang up.
    pub fn flush(
        &mut self,
        processes: &mut ProcessTable,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) -> PollOutcome {
        self.drain_buffers(Some(processes));
        let finished = self.all_hung_up();
        self.deliver(processes, None, finished, on_sample)
    }

    /// Moves what the buffers hold into the engine's queue without applying
    /// or unwinding anything: keeps the buffers from filling while the
    /// caller is busy elsewhere with the table (the BPF program's load and
    /// verification, a sync that compiles tables); see [`PerfEngine::read`]
    /// for a reader that holds the table.
    /// Returns whether every event has hung up.
    pub fn read_ahead(&mut self) -> bool {
        self.drain_buffers(None);
        self.all_hung_up()
    }

    /// Moves what the buffers hold into the engine's queue, unwinding the
    /// samples that can be unwound now in place (see `drain_buffers`), and
    /// applying nothing: for a loop that merges these records with another
    /// engine's samples. Returns whether every event has hung up.
    pub fn read(&mut self, processes: &mut ProcessTable) -> bool {
        self.drain_buffers(Some(processes));
        self.all_hung_up()
    }

    /// Processes whose fork, exec or executable mmap has been read but is
    /// held back (not applied to the table yet).
    pub fn pids_with_new_code(&self) -> std::collections::HashSet<u32> {
        self.reorder.pids_with_new_code()
    }

    /// The processes in `pids` as `processes` will have them once the
    /// records read so far are applied, for those the records describe
    /// whole (see [`Reorder::preview`]); the others are left out.
    pub fn preview(
        &self,
        processes: &ProcessTable,
        pids: &std::collections::HashSet<u32>,
    ) -> ProcessTable {
        self.reorder.preview(processes, pids)
    }

    /// The queued records up to `cutoff` (all of them when `None`), in time
    /// order, as the merge reads them: the one stream of process records,
    /// with the samples that came in the same buffers.
    pub fn ready(&mut self, cutoff: Option<u64>) -> ReadyRecords<'_> {
        ReadyRecords::new(self, cutoff)
    }

    /// Applies and emits, in time order, the queued records up to `cutoff`
    /// (all of them when `None`).
    fn deliver(
        &mut self,
        processes: &mut ProcessTable,
        cutoff: Option<u64>,
        finished: bool,
        on_sample: &mut dyn FnMut(&ProcessTable, &Sample),
    ) -> PollOutcome {
        let merged = crate::merge::deliver_in_time_order(
            &mut self.ready(cutoff),
            &mut [],
            processes,
            on_sample,
        );
        PollOutcome {
            samples: merged.samples,
            process_events: merged.process_events,
            finished,
        }
    }

    /// Unwinds a stack this engine's buffers did not copy (`sWALL`'s
    /// threads already off a CPU at the start, read from `/proc`): process
    /// `pid`'s `stack`, copied from `regs.sp` up, as a sample's is.
    pub fn unwind_stack(
        &mut self,
        processes: &ProcessTable,
        pid: u32,
        regs: &crate::unwind::UserRegs,
        stack: &[u8],
    ) -> (Vec<u64>, crate::sample::StackEnd) {
        let mut frames = Vec::new();
        let end = self.unwinder.unwind(
            processes,
            pid,
            regs,
            stack,
            self.options.max_frames,
            &mut frames,
        );
        (frames, end)
    }

    /// Reads unwind tables from `store` before compiling them, and keeps
    /// the ones it compiles there for later runs.
    pub fn use_table_store(&mut self, store: Option<TableStore>) {
        let tables = std::mem::take(self.unwinder.tables());
        *self.unwinder.tables() = tables.with_store(store);
    }

    /// The fullest any buffer was found when read since the last call, in
    /// percent of its size (100: the kernel dropped samples meanwhile),
    /// and starts over: how late the reader came, for the period's line.
    pub fn take_fullest_percent(&mut self) -> u32 {
        std::mem::take(&mut self.fullest_percent)
    }

    /// Its bounded caches, for the overhead report.
    pub fn cache_figures(&self) -> crate::overhead::CacheFigures {
        self.unwinder.table_cache().figures("perf_unwind_tables")
    }

    /// Samples dropped by the kernel, throttling and unreadable records so far.
    pub fn losses(&self) -> LossCounters {
        self.losses
            + LossCounters {
                exiting: self.unkept.exiting,
                ..LossCounters::default()
            }
    }

    /// The profiled tasks' CPU time as the kernel counts it (the events'
    /// counts, see [`EventFd::count`]), in nanoseconds: `None` when they do
    /// not count tasks (`--global`) or cannot be read.
    pub fn counted_task_nanos(&self) -> Option<u64> {
        // Per-CPU events beside the task ones (the BPF engine's) count
        // their CPUs, not the tasks: left out.
        let counting = self
            .sources
            .iter()
            .flat_map(Source::events)
            .filter(|event| event.counts_task_cpu_time())
            .collect::<Vec<_>>();
        if counting.is_empty() {
            return None;
        }
        counting.into_iter().try_fold(0u64, |total, event| {
            Some(total.saturating_add(event.count().ok()?))
        })
    }

    /// Samples produced so far and how many reached the root.
    pub fn sample_counters(&self) -> SampleCounters {
        self.counters
    }

    /// Every event that follows tasks has hung up (their tasks are gone);
    /// per-CPU events for the BPF program never do.
    fn all_hung_up(&mut self) -> bool {
        self.sources
            .iter_mut()
            .filter(|source| source.event.scope != crate::events::Scope::CpuForTree)
            .all(Source::all_hung_up)
    }

    /// Waits on every event that has not hung up yet.
    fn wait(&mut self, timeout: Duration) -> Result<(), PerfError> {
        self.wait_with(None, timeout)
    }

    /// Waits on every event that has not hung up yet and on `other` (the
    /// BPF engine's ring buffer, whose samples are merged with these
    /// records): returns when either has something new (see [`wait`] for
    /// why edge-triggered), or after `timeout`. The perf buffers must be
    /// watched too when the BPF program hands samples (with their 32 KB
    /// stack copies) over to them: a handful fill a buffer.
    pub fn wait_with(&mut self, other: Option<RawFd>, timeout: Duration) -> Result<(), PerfError> {
        let waiter = match &mut self.waiter {
            Some(waiter) if waiter.other() == other => waiter,
            slot => {
                // The mapped events only: a follower's wake-ups are its
                // buffer's, and the exit of its task wakes every event of
                // the buffer (in the set, 1,000 threads of a `-p` target
                // ending together spent ~0.3 s of their CPU in the set's
                // callbacks). Followers are asked whether they hung up in
                // `all_hung_up`.
                let events = self
                    .sources
                    .iter()
                    .enumerate()
                    .filter(|(_, source)| !source.hung_up[0])
                    .map(|(index, source)| (index, source.event.fd.as_raw_fd()));
                slot.insert(Waiter::new(events, other).map_err(PerfError::Poll)?)
            }
        };
        let sources = &self.sources;
        let woken = waiter
            .wait(timeout, |index| {
                sources.get(index).map(|source| source.event.fd.as_raw_fd())
            })
            .map_err(PerfError::Poll)?;
        for index in woken.hung_up {
            if let Some(source) = self.sources.get_mut(index) {
                source.hung_up[0] = true;
            }
        }
        Ok(())
    }

    /// Moves every record in the ring buffers into the reorder queue, counting losses
    /// and malformed records on the way.
    ///
    /// With the table (`processes`), samples are unwound as they are read,
    /// from their stacks in place in the buffer, and wait in the queue as
    /// frames: copying each stack out (up to 32 KB) so that it could be
    /// unwound in its turn was a quarter of the engine's CPU at 999 Hz. A
    /// sample is unwound early only when the table as it is now is the
    /// table its turn would see for its process:
    ///
    /// - the process records of every buffer are read first, and only then
    ///   the samples: whatever mapped the code a sample ran (an mmap, an
    ///   exec, a fork, on any CPU) was written before the sample was taken,
    ///   so for a sample taken before the buffers' heads were read, it is in
    ///   the queue by then;
    /// - a sample of a process with such a record still queued (held back
    ///   for ordering) and older than the sample is copied and unwound in
    ///   its turn, after that record is applied, as before.
    ///
    /// The buffers' space stays the kernel's until the drain ends, so it
    /// copies the samples that would read (maybe compile: ~55 ms for cc1) a
    /// table not looked for yet, and all samples once it has unwound in
    /// place for [`IN_PLACE_BUDGET`].
    ///
    /// Without the table (reading ahead while another thread uses it), every
    /// sample is copied.
    fn drain_buffers(&mut self, processes: Option<&mut ProcessTable>) {
        let Some(processes) = processes else {
            self.parts().1.read();
            return;
        };
        // A sample written before this was written before the heads below.
        let heads_read = monotonic_now();
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(self.sources.iter().map(|source| source.ring.head()));
        // Often nothing: the BPF engine's loop reads here at each poll.
        let nothing_new = self
            .sources
            .iter()
            .zip(&heads)
            .all(|(source, &head)| source.ring.is_read_up_to(head));
        if nothing_new {
            self.heads = heads;
            return;
        }
        for (source, &head) in self.sources.iter().zip(&heads) {
            self.fullest_percent = self.fullest_percent.max(source.ring.percent_full(head));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let samples_read = std::cell::Cell::new(false);
        let not_sample = |header: &[u8; record::HEADER_SIZE]| {
            let sample = record::is_sample(header);
            samples_read.set(samples_read.get() | sample);
            !sample
        };
        for (source, &head) in self.sources.iter().zip(&heads) {
            let (reorder, spare_stacks, losses) =
                (&mut self.reorder, &mut self.spare_stacks, &mut self.losses);
            let origin = source.origin;
            let outcome = source
                .ring
                .scan(head, &mut scratch, &not_sample, &mut |bytes| {
                    queue_record(bytes, reorder, spare_stacks, losses, origin)
                });
            // Corruption is noted after the second pass, which meets it too.
            self.wrapped_records += outcome.wrapped;
        }
        let new_code = if samples_read.get() {
            self.reorder.new_code_times()
        } else {
            HashMap::new()
        };
        let keeps_unknown = !self.known_only;
        let mut unkept = crate::merge::Unkept::default();
        let (mut unwinding, read_ahead, tracker) = self.parts();
        let ReadAhead {
            sources,
            reorder,
            spare_stacks,
            losses,
            wrapped_records,
            ..
        } = read_ahead;
        let unwinding_started = Instant::now();
        // The clock is read every few samples, not for each (a vDSO call
        // was ~4 % of the perf engine's work per sample).
        let mut until_clock_read = 0u32;
        let mut in_budget = true;
        for (source, &head) in sources.iter_mut().zip(&heads) {
            let sample = |header: &[u8; record::HEADER_SIZE]| record::is_sample(header);
            let origin = source.origin;
            let outcome = source.ring.scan(head, &mut scratch, &sample, &mut |bytes| {
                let mut view = match record::parse_sample_view(bytes, origin.layout) {
                    Ok(view) => view,
                    Err(error) => {
                        log::debug!("skipping a perf record: {error}");
                        losses.malformed += 1;
                        return;
                    }
                };
                view.event = origin.event;
                let settled = view.time < heads_read
                    && new_code
                        .get(&view.pid)
                        .is_none_or(|&new_code_at| new_code_at > view.time);
                let time = view.time;
                // Unwinding holds this buffer's space (and that of the
                // buffers after it) from the kernel: past the budget the
                // rest are copied, as are samples that need a table read.
                if in_budget && until_clock_read == 0 {
                    in_budget = unwinding_started.elapsed() < IN_PLACE_BUDGET;
                    until_clock_read = 8;
                }
                // A process the table does not know while unknown processes
                // are not kept (every CPU sampled): its turn would drop it,
                // since the records that make a process known (a fork, an
                // exec, an executable mapping) leave its samples unsettled.
                // So it is dropped and counted now: unwound in place, it
                // was counted as unwound, then dropped; copied, it took
                // 32 KB. (One exception: a profiled process none of whose
                // records came, read from `/proc` when it renames a thread;
                // its samples before the rename count as another's.)
                if let Some(exited) = settled
                    .then(|| crate::merge::unkept(keeps_unknown, processes, view.pid))
                    .flatten()
                {
                    unkept.count(exited);
                    return;
                }
                if settled && in_budget {
                    until_clock_read -= 1;
                    tracker.before_sample(processes, view.pid);
                    if let Some((frames, end)) =
                        unwinding.frames_of(processes, &view, TableLoading::KnownOnly)
                    {
                        unwinding.counters.unwound_in_place += 1;
                        let sample = unwinding.sample(view, frames, end);
                        reorder.push(time, Record::Unwound(sample));
                        return;
                    }
                }
                let copied = view.into_owned_reusing(spare_stacks);
                reorder.push(time, Record::Sample(Box::new(copied)));
            });
            source.ring.release(head);
            note_outcome(source, outcome, wrapped_records, losses);
        }
        self.unkept += unkept;
        self.scratch = scratch;
        self.heads = heads;
    }

    /// The engine borrowed apart: what unwinds, what reads the buffers,
    /// and the process tracker.
    fn parts(&mut self) -> (Unwinding<'_>, ReadAhead<'_>, &mut ProcessTracker) {
        (
            Unwinding {
                unwinder: &mut self.unwinder,
                spare_frames: &mut self.spare_frames,
                counters: &mut self.counters,
                max_frames: self.options.max_frames,
                weighings: &self.weighings,
            },
            ReadAhead {
                sources: &mut self.sources,
                reorder: &mut self.reorder,
                scratch: &mut self.scratch,
                spare_stacks: &mut self.spare_stacks,
                losses: &mut self.losses,
                wrapped_records: &mut self.wrapped_records,
                fullest_percent: &mut self.fullest_percent,
            },
            &mut self.tracker,
        )
    }

    /// Keeps a copied stack's buffer for the next copies.
    fn recycle_stack(&mut self, stack: Vec<u8>) {
        /// About the samples one wake-up brings (half a buffer of 32
        /// copies): more would be memory held for nothing.
        const MAX_SPARE_STACKS: usize = 16;
        if self.spare_stacks.len() < MAX_SPARE_STACKS && stack.capacity() > 0 {
            self.spare_stacks.push(stack);
        }
    }

    /// Keeps a delivered sample's frame vector for the next samples.
    fn recycle_frames(&mut self, frames: Vec<u64>) {
        /// About what a wake-up delivers at 999 Hz on a few CPUs.
        const MAX_SPARE_FRAMES: usize = 256;
        if self.spare_frames.len() < MAX_SPARE_FRAMES && frames.capacity() > 0 {
            self.spare_frames.push(frames);
        }
    }
}

/// The time (CLOCK_MONOTONIC ns) before which every buffer's records have
/// been written: a record of another CPU may still be on its way for
/// [`HOLD_BACK`]. Taken before the buffers are read, it tells which queued
/// records (and another engine's samples) can be delivered in order.
pub fn settled_time() -> u64 {
    monotonic_now().saturating_sub(HOLD_BACK.as_nanos() as u64)
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of the records' timestamps.
pub fn monotonic_now() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{self, EventOptions, Scope};

    fn burn_cpu(duration: Duration) -> u64 {
        let start = std::time::Instant::now();
        let mut value = 1u64;
        while start.elapsed() < duration {
            for _ in 0..10_000 {
                value =
                    std::hint::black_box(value.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        value
    }

    #[test]
    fn samples_this_process_through_the_ring_buffers() {
        let spec = crate::events::parse_events("sCPU freq=999").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 4096,
            include_kernel: false,
            kernel_stacks: false,
        };
        let me = std::process::id();
        // A test runs on its own thread: follow that thread (a pid would mean the main thread).
        let thread = nix::unistd::gettid().as_raw();
        let events = events::open_all(&[spec], Scope::Process(thread), &options).unwrap();
        let mut engine = PerfEngine::new(
            events,
            PerfEngineOptions {
                // Small, so that records wrap around the end of the buffers.
                ring_buffer_bytes: 64 * 1024,
                ..PerfEngineOptions::default()
            },
        )
        .unwrap();
        let mut table = ProcessTable::new();
        let mut samples = Vec::new();
        for _ in 0..20 {
            burn_cpu(Duration::from_millis(50));
            engine
                .poll(&mut table, Duration::ZERO, &mut |_, sample| {
                    samples.push(sample.clone())
                })
                .unwrap();
        }
        std::thread::sleep(HOLD_BACK * 2);
        engine
            .poll(&mut table, Duration::ZERO, &mut |_, sample| {
                samples.push(sample.clone())
            })
            .unwrap();
        // The engine's helper thread, which reads the first sample's table,
        // inherits the event: its samples have its own thread id.
        let this_thread = samples.iter().filter(|s| s.tid == thread as u32).count();
        assert!(
            this_thread > 50,
            "only {this_thread} samples of this thread"
        );
        assert!(samples.iter().all(|s| s.pid == me && s.weight > 0));
        assert!(samples.windows(2).all(|w| w[0].time <= w[1].time));
        // The first sample loaded this process from /proc: its leaf is in our code.
        let here = table.find_mapping(me, samples[0].frames[0]).unwrap();
        assert!(here.file.path.contains("ddprof"), "{}", here.file.path);
        assert_eq!(engine.losses().malformed, 0);
        assert_eq!(engine.sample_counters().samples, samples.len() as u64);
        assert!(
            engine.wrapped_records > 0,
            "no record wrapped around a buffer's end"
        );
    }

    /// The events of a `-p` target's threads share one buffer per CPU: each
    /// thread's samples arrive through it, and the engine sees the end of
    /// the threads once every event, followers too, has hung up.
    #[test]
    fn threads_share_a_buffer_per_cpu_and_hang_up_together() {
        let spec = crate::events::parse_events("sCPU freq=999").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 4096,
            include_kernel: false,
            kernel_stacks: false,
        };
        // The thread whose events have the buffers ends first: the others'
        // events (the followers) must keep the engine going.
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let mapped = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let (tid_sender, tids) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (start, mapped) = (start.clone(), mapped.clone());
                let tid_sender = tid_sender.clone();
                std::thread::spawn(move || {
                    let tid = nix::unistd::gettid().as_raw();
                    tid_sender.send(tid).unwrap();
                    start.wait();
                    let mapped = mapped.load(std::sync::atomic::Ordering::SeqCst) == tid;
                    burn_cpu(Duration::from_millis(if mapped { 100 } else { 400 }));
                })
            })
            .collect();
        let tids: Vec<i32> = tids.iter().take(3).collect();
        mapped.store(tids[0], std::sync::atomic::Ordering::SeqCst);
        let events: Vec<EventFd> = tids
            .iter()
            .flat_map(|&tid| {
                events::open_all(std::slice::from_ref(&spec), Scope::Process(tid), &options)
                    .unwrap()
            })
            .collect();
        let cpus = events.len() / 3;
        let mut engine = PerfEngine::new(events, PerfEngineOptions::default()).unwrap();
        assert_eq!(engine.sources.len(), cpus, "one buffer per CPU");
        assert!(engine
            .sources
            .iter()
            .all(|source| source.followers.len() == 2));
        start.wait();
        let mut table = ProcessTable::new();
        let mut sampled_tids = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut finished = false;
        while !finished && Instant::now() < deadline {
            let outcome = engine
                .poll(&mut table, Duration::from_millis(50), &mut |_, sample| {
                    sampled_tids.insert(sample.tid as i32);
                })
                .unwrap();
            finished = outcome.finished;
        }
        assert!(
            threads.iter().all(std::thread::JoinHandle::is_finished),
            "finished while threads ran"
        );
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(
            finished,
            "the engine never saw every thread's event hang up"
        );
        for tid in &tids {
            assert!(sampled_tids.contains(tid), "no sample of thread {tid}");
        }
    }

    /// The kernel wakes the reader once per half buffer of samples: with a
    /// sample count (`wakeup_events`) beside its half-buffer watermark, the
    /// two drifted apart and it woke twice as often.
    #[test]
    fn the_reader_wakes_once_per_half_buffer_of_samples() {
        let spec = crate::events::parse_events("sCPU freq=999").unwrap()[0].clone();
        let stack_sample_size = 32000;
        let options = EventOptions {
            stack_sample_size,
            include_kernel: false,
            kernel_stacks: false,
        };
        let (tid_sender, tid) = std::sync::mpsc::channel();
        let burner = std::thread::spawn(move || {
            tid_sender.send(nix::unistd::gettid().as_raw()).unwrap();
            burn_cpu(Duration::from_millis(2500))
        });
        let thread = tid.recv().unwrap();
        let events = events::open_all(&[spec], Scope::Process(thread), &options).unwrap();
        let ring_buffer_bytes = default_ring_buffer_bytes(stack_sample_size, 999);
        let mut engine = PerfEngine::new(
            events,
            PerfEngineOptions {
                ring_buffer_bytes,
                ..PerfEngineOptions::default()
            },
        )
        .unwrap();
        let (mut wake_ups, mut samples) = (0u64, 0u64);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(2000) {
            // Long enough that a timeout is rare: the count is of wake-ups.
            engine.wait(Duration::from_secs(1)).unwrap();
            wake_ups += 1;
            engine.read_ahead();
            samples += engine
                .reorder
                .take_ready(None)
                .iter()
                .filter(|record| matches!(record, Record::Sample(_)))
                .count() as u64;
        }
        burner.join().unwrap();
        let per_half_buffer = (ring_buffer_bytes / 2 / (stack_sample_size as usize + 256)) as u64;
        assert!(samples > 500, "only {samples} samples");
        assert!(
            wake_ups * per_half_buffer <= samples * 5 / 4 + 2 * per_half_buffer,
            "{wake_ups} wake-ups for {samples} samples: more than one per \
             {per_half_buffer} samples"
        );
        assert!(
            wake_ups * per_half_buffer * 2 >= samples,
            "{wake_ups} wake-ups for {samples} samples: the buffers filled unread"
        );
    }

    /// Every exiting child of a profiled process kicks the event it
    /// inherited. With the BPF ring buffer in the same set, holding records
    /// nobody has read yet (as it nearly always does), poll(2) returned at
    /// each kick: a loop turn per exiting process. The edge-triggered set
    /// sleeps through them and returns for the hang-up.
    #[test]
    fn exits_of_profiled_children_do_not_wake_the_reader() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        const CHILDREN: usize = 40;
        let spec = crate::events::parse_events("sCPU freq=99").unwrap()[0].clone();
        let options = EventOptions {
            stack_sample_size: 8,
            include_kernel: false,
            kernel_stacks: false,
        };
        // Waits for a line, so that its children inherit the events.
        let mut shell = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "read go; i=0; while [ $i -lt {CHILDREN} ]; do /bin/true; i=$((i+1)); done"
                ),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let events =
            events::open_all(&[spec], Scope::Process(shell.id() as i32), &options).unwrap();
        let mut engine = PerfEngine::new(events, PerfEngineOptions::default()).unwrap();
        // Stands for the BPF ring buffer: readable, and nobody reads it.
        let (ring, mut ring_writer) = std::io::pipe().unwrap();
        ring_writer.write_all(b"record").unwrap();
        // The data that was there when the set was made counts as new once.
        engine
            .wait_with(Some(ring.as_raw_fd()), Duration::from_secs(1))
            .unwrap();
        shell.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut wake_ups = 0;
        let mut exits = 0;
        loop {
            engine
                .wait_with(Some(ring.as_raw_fd()), Duration::from_secs(5))
                .unwrap();
            wake_ups += 1;
            let hung_up = engine.read_ahead();
            exits += engine
                .reorder
                .take_ready(None)
                .iter()
                .filter(|record| {
                    matches!(record, Record::Process(crate::process::ProcessEvent::Exit { pid, tid }) if pid == tid)
                })
                .count();
            if hung_up || wake_ups > 4 * CHILDREN {
                break;
            }
        }
        assert!(shell.wait().unwrap().success());
        assert!(
            wake_ups <= 3,
            "{wake_ups} wake-ups for {exits} exiting processes"
        );
        assert!(
            exits >= CHILDREN,
            "{exits} exits recorded: the children did not inherit the events"
        );
    }

    #[test]
    fn sizes_default_buffers_for_the_stack_copy_and_the_rate() {
        // 32 samples at low rates...
        assert_eq!(default_ring_buffer_bytes(32000, 99), 1 << 20);
        assert_eq!(default_ring_buffer_bytes(8, 99), 256 * 1024);
        assert_eq!(default_ring_buffer_bytes(65528, 99), 4 << 20);
        // ... up to the rate at which half of that is 30 ms of samples...
        assert_eq!(default_ring_buffer_bytes(32000, 533), 1 << 20);
        // ... and 30 ms of samples in each half above it, up to 4 MiB.
        assert_eq!(default_ring_buffer_bytes(32000, 999), 2 << 20);
        assert_eq!(default_ring_buffer_bytes(32000, 4999), 4 << 20);
        assert_eq!(default_ring_buffer_bytes(8000, 999), 512 << 10);
        assert_eq!(default_ring_buffer_bytes(8000, 4999), 4 << 20);
        assert_eq!(default_ring_buffer_bytes(32000, u64::MAX), 4 << 20);
        let options = PerfEngineOptions {
            ring_buffer_bytes: 5000,
            ..PerfEngineOptions::default()
        };
        assert_eq!(options.data_pages() * ring::page_size(), 8192);
    }
}
