//! The perf buffers' records as the merge reads them: a [`RecordStream`]
//! of the records queued up to a cutoff, in time order. Its reader, the
//! engine's process tracker, is the one writer of the process table.
use std::collections::VecDeque;
use std::time::Instant;

use super::record::Record;
use super::{PerfEngine, DELIVERY_READ_INTERVAL};
use crate::merge::{Item, OnSample, RecordStream};
use crate::process::ProcessTable;

/// The records of a [`PerfEngine`] ready for delivery (see
/// [`PerfEngine::ready`]).
pub struct ReadyRecords<'a> {
    engine: &'a mut PerfEngine,
    ready: VecDeque<(u64, Record)>,
    delivered: usize,
    last_read: Instant,
}

impl<'a> ReadyRecords<'a> {
    pub(super) fn new(engine: &'a mut PerfEngine, cutoff: Option<u64>) -> Self {
        let ready = engine.reorder.take_ready_timed(cutoff);
        Self {
            engine,
            ready,
            delivered: 0,
            last_read: Instant::now(),
        }
    }
}

impl RecordStream for ReadyRecords<'_> {
    fn next_time(&mut self) -> Option<u64> {
        self.ready.front().map(|(time, _)| *time)
    }

    fn deliver_next(&mut self, processes: &mut ProcessTable, on_sample: &mut OnSample<'_>) -> Item {
        let Some((_, record)) = self.ready.pop_front() else {
            return Item::Other;
        };
        let engine = &mut *self.engine;
        // A backlog (what was copied while a table was read, or while a
        // sync ran) can take longer to unwind than a buffer holds: the
        // buffers are read meanwhile (the clock every few records).
        self.delivered += 1;
        if self.delivered.is_multiple_of(8) && self.last_read.elapsed() >= DELIVERY_READ_INTERVAL {
            engine.parts().1.read();
            self.last_read = Instant::now();
        }
        match record {
            Record::Sample(raw) => {
                engine.tracker.before_sample(processes, raw.pid);
                let (mut unwinding, mut read_ahead, _) = engine.parts();
                let processes = &*processes;
                let (sample, stack) = (*raw).with_view(|view| {
                    unwinding.unwind_reading_ahead(processes, view, &mut read_ahead)
                });
                engine.recycle_stack(stack);
                on_sample(processes, &sample);
                engine.recycle_frames(sample.frames);
                Item::Sample
            }
            Record::Unwound(sample) => {
                on_sample(processes, &sample);
                engine.recycle_frames(sample.frames);
                Item::Sample
            }
            Record::Process(event) => {
                engine.tracker.apply(processes, &event);
                Item::Process
            }
            // Counted when read.
            Record::Lost(_) | Record::Throttle | Record::Unthrottle | Record::Ignored(_) => {
                Item::Other
            }
        }
    }

    fn next_sample_pid(&mut self) -> Option<u32> {
        match self.ready.front() {
            Some((_, Record::Sample(raw))) => Some(raw.pid),
            Some((_, Record::Unwound(sample))) => Some(sample.pid),
            _ => None,
        }
    }

    fn drop_next(&mut self, exited: bool) {
        let engine = &mut *self.engine;
        match self.ready.pop_front() {
            Some((_, Record::Sample(raw))) => {
                engine.unkept.count(exited);
                engine.recycle_stack(raw.stack);
            }
            Some((_, Record::Unwound(sample))) => {
                engine.unkept.count(exited);
                engine.recycle_frames(sample.frames);
            }
            // Not a sample: the merge drops only samples.
            Some(other) => self.ready.push_front(other),
            None => {}
        }
    }

    fn make_known(&mut self, processes: &mut ProcessTable, pid: u32) -> bool {
        self.engine.tracker.before_sample(processes, pid)
    }

    fn keeps_unknown_processes(&self) -> bool {
        !self.engine.known_only
    }
}
