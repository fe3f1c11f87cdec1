//! One event's buffer as the engine reads it ([`Source`]), and what a
//! read of it yields besides records: losses, by cause, and corruption.
use super::record::{self, Record, TimedRecord};
use super::ring::{self, RingBuffer};
use super::tracking::Reorder;
#[cfg(doc)]
use super::PerfEngine;
use crate::events::{EventFd, SampleLayout};
use crate::sample::LossCounters;

pub(super) struct Source {
    /// The event whose buffer is mapped.
    pub(super) event: EventFd,
    /// Events of the same kind on the same CPU whose records the kernel
    /// writes to this buffer too (`PERF_EVENT_IOC_SET_OUTPUT`): the other
    /// threads of a `-p` target.
    pub(super) followers: Vec<EventFd>,
    pub(super) ring: RingBuffer,
    /// Which of its events (`event`, then each of `followers`) hung up.
    pub(super) hung_up: Vec<bool>,
    /// What its records are, taken once from its event.
    pub(super) origin: Origin,
}

/// Most events whose records go to another's buffer, per buffer. The exit
/// of a thread wakes every event of its buffer, in the thread's exit path:
/// 1,000 threads on one buffer per CPU cost each exit ~0.3 ms (30 samples'
/// worth of CPU time for 1,000 threads ending); 64 to a buffer, 16 buffers
/// of a CPU's for 1,000 threads.
const MAX_FOLLOWERS: usize = 63;

/// What a buffer's records are, for reading them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Origin {
    /// A per-CPU event of the BPF engine's: the program hands it the
    /// samples of processes it does not know yet, which may be any
    /// process's, so its `PERF_RECORD_LOST` counts are not all ours.
    pub(super) shared: bool,
    /// Its event's index: its samples' `event`.
    pub(super) event: u16,
    /// What its samples hold.
    pub(super) layout: SampleLayout,
}

impl Source {
    pub(super) fn new(event: EventFd, ring: RingBuffer) -> Self {
        let origin = Origin {
            shared: event.scope == crate::events::Scope::CpuForTree,
            event: event.spec.index(),
            layout: SampleLayout::of(&event.spec),
        };
        Source {
            event,
            followers: Vec::new(),
            ring,
            hung_up: vec![false],
            origin,
        }
    }

    /// Its events: the mapped one, then its followers.
    pub(super) fn events(&self) -> impl Iterator<Item = &EventFd> {
        std::iter::once(&self.event).chain(&self.followers)
    }

    /// Whether `event`'s records can go to this buffer: both follow a task
    /// (`-p`), on the same CPU, for the same event of the list, so that the
    /// buffer's records stay one event's. (The kernel also requires the
    /// same CPU, and the same task for events on any CPU.)
    pub(super) fn takes_output_of(&self, event: &EventFd) -> bool {
        self.followers.len() < MAX_FOLLOWERS
            && matches!(self.event.scope, crate::events::Scope::Process(_))
            && matches!(event.scope, crate::events::Scope::Process(_))
            && self.event.cpu >= 0
            && event.cpu == self.event.cpu
            && event.spec.index() == self.event.spec.index()
    }

    /// Keeps `event`, whose records the kernel now writes to this buffer
    /// ([`EventFd::redirect_output_to`]).
    pub(super) fn add_follower(&mut self, event: EventFd) {
        self.followers.push(event);
        self.hung_up.push(false);
    }

    /// Every one of its events hung up: their tasks are gone. The mapped
    /// event's hang-up comes from the engine's epoll set; the followers,
    /// not in it, are polled (without waiting) once that one has hung up.
    pub(super) fn all_hung_up(&mut self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        if !self.hung_up[0] {
            return false;
        }
        let waiting: Vec<usize> = (1..self.hung_up.len())
            .filter(|&member| !self.hung_up[member])
            .collect();
        if waiting.is_empty() {
            return true;
        }
        let mut fds: Vec<PollFd> = waiting
            .iter()
            .map(|&member| {
                let fd = std::os::fd::AsFd::as_fd(&self.followers[member - 1].fd);
                PollFd::new(fd, PollFlags::empty())
            })
            .collect();
        if poll(&mut fds, PollTimeout::ZERO).is_err() {
            return false;
        }
        let hung: Vec<bool> = fds
            .iter()
            .map(|fd| {
                fd.revents().is_some_and(|events| {
                    events.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)
                })
            })
            .collect();
        for (&member, hung_up) in waiting.iter().zip(hung) {
            self.hung_up[member] = hung_up;
        }
        self.hung_up.iter().all(|&hung_up| hung_up)
    }
}

/// What reading the buffers ahead takes of the engine: every record is
/// copied into the queue as it is, nothing applied or unwound (while the
/// engine's other parts are busy: its table on a helper thread, the BPF
/// program's load).
pub(super) struct ReadAhead<'a> {
    pub(super) sources: &'a mut [Source],
    pub(super) reorder: &'a mut Reorder,
    pub(super) scratch: &'a mut Vec<u8>,
    pub(super) spare_stacks: &'a mut Vec<Vec<u8>>,
    pub(super) losses: &'a mut LossCounters,
    pub(super) wrapped_records: &'a mut u64,
    /// The fullest a buffer was when read (see [`PerfEngine::take_fullest_percent`]).
    pub(super) fullest_percent: &'a mut u32,
}

impl ReadAhead<'_> {
    /// Moves what every buffer holds into the queue; the bytes read.
    pub(super) fn read(&mut self) -> usize {
        let mut bytes_read = 0;
        for source in self.sources.iter_mut() {
            let origin = source.origin;
            let fill = source.ring.percent_full(source.ring.head());
            *self.fullest_percent = (*self.fullest_percent).max(fill);
            let (reorder, spare_stacks, losses) = (
                &mut *self.reorder,
                &mut *self.spare_stacks,
                &mut *self.losses,
            );
            let outcome = source.ring.drain(self.scratch, &mut |bytes| {
                bytes_read += bytes.len();
                queue_record(bytes, reorder, spare_stacks, losses, origin)
            });
            note_outcome(source, outcome, self.wrapped_records, self.losses);
        }
        bytes_read
    }
}

/// Parses one record of a buffer of `origin` into the queue (or the loss
/// counters).
pub(super) fn queue_record(
    bytes: &[u8],
    reorder: &mut Reorder,
    spare_stacks: &mut Vec<Vec<u8>>,
    losses: &mut LossCounters,
    origin: Origin,
) {
    match record::parse_reusing(bytes, spare_stacks, origin.layout) {
        Ok(TimedRecord {
            time,
            record: Record::Sample(mut sample),
        }) => {
            sample.event = origin.event;
            reorder.push(time, Record::Sample(sample));
        }
        Ok(TimedRecord { time, record }) => match record {
            Record::Lost(count) if origin.shared => losses.unattributed += count,
            Record::Lost(count) => losses.lost += count,
            Record::Throttle => losses.throttled += 1,
            Record::Unthrottle | Record::Ignored(_) => {}
            record => reorder.push(time, record),
        },
        Err(error) => {
            log::debug!("skipping a perf record: {error}");
            losses.malformed += 1;
        }
    }
}

/// Counts what a scan of `source`'s buffer found besides records.
pub(super) fn note_outcome(
    source: &Source,
    outcome: ring::DrainOutcome,
    wrapped_records: &mut u64,
    losses: &mut LossCounters,
) {
    *wrapped_records += outcome.wrapped;
    if outcome.corrupted {
        // Their samples count as lost: the kernel's count has them.
        log::warn!(
            "the perf ring buffer of the event on CPU {} held an invalid record; skipped its \
             {} unread bytes (the samples in them count as lost)",
            source.event.cpu,
            outcome.skipped_bytes
        );
        losses.malformed += 1;
    }
}
