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
    pub(super) event: EventFd,
    pub(super) ring: RingBuffer,
    pub(super) hung_up: bool,
    /// What its records are, taken once from its event.
    pub(super) origin: Origin,
}

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
            ring,
            hung_up: false,
            origin,
        }
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
