//! One event's buffer as the engine reads it ([`Source`]), and what a
//! read of it yields besides records: losses, by cause, and corruption.
use super::record::{self, Record, TimedRecord};
use super::ring::{self, RingBuffer};
use super::tracking::Reorder;
#[cfg(doc)]
use super::PerfEngine;
use crate::events::EventFd;
use crate::sample::LossCounters;

pub(super) struct Source {
    pub(super) event: EventFd,
    pub(super) ring: RingBuffer,
    pub(super) hung_up: bool,
}

impl Source {
    /// A per-CPU event of the BPF engine's: the program hands it the
    /// samples of processes it does not know yet, which may be any
    /// process's, so its `PERF_RECORD_LOST` counts are not all ours.
    pub(super) fn shared_with_others(&self) -> bool {
        self.event.scope == crate::events::Scope::CpuForTree
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
            let (shared, event) = (source.shared_with_others(), &source.event.spec);
            let fill = source.ring.percent_full(source.ring.head());
            *self.fullest_percent = (*self.fullest_percent).max(fill);
            let (reorder, spare_stacks, losses) = (
                &mut *self.reorder,
                &mut *self.spare_stacks,
                &mut *self.losses,
            );
            let outcome = source.ring.drain(self.scratch, &mut |bytes| {
                bytes_read += bytes.len();
                queue_record(bytes, reorder, spare_stacks, losses, shared, event)
            });
            note_outcome(source, outcome, self.wrapped_records, self.losses);
        }
        bytes_read
    }
}

/// Parses one record into the queue (or the loss counters); `shared`: the
/// buffer holds samples of processes that may not be profiled (see
/// [`Source::shared_with_others`]); `event`: the buffer's event (what its
/// samples hold, and which they are).
pub(super) fn queue_record(
    bytes: &[u8],
    reorder: &mut Reorder,
    spare_stacks: &mut Vec<Vec<u8>>,
    losses: &mut LossCounters,
    shared: bool,
    event: &crate::events::EventSpec,
) {
    match record::parse_reusing(bytes, spare_stacks, crate::events::SampleLayout::of(event)) {
        Ok(TimedRecord {
            time,
            record: Record::Sample(mut sample),
        }) => {
            sample.event = event.index();
            reorder.push(time, Record::Sample(sample));
        }
        Ok(TimedRecord { time, record }) => match record {
            Record::Lost(count) if shared => losses.unattributed += count,
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
