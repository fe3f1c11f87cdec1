//! The one merge of the sample sources: every source is a stream of items in
//! time order up to a cutoff taken before any buffer was read, and the merge
//! takes the oldest item of any stream next. One stream carries the process
//! records (the perf buffers' mmap, comm, fork and exit records, with the
//! samples those buffers carry); its reader alone writes the process table.
//! The others carry samples only (the BPF program's ring buffer, and the
//! sources to come): each of their samples is handed on after the records
//! up to its time, so it sees its process as it was when it was taken, and
//! a process that has exited since is still known.
//!
//! Both engines deliver through [`deliver_in_time_order`]: the perf engine
//! with its record stream alone, the sampler with the BPF engine's samples
//! beside it.
use crate::process::ProcessTable;
use crate::sample::Sample;

/// Where delivered samples go, with the table as it was at their time.
pub type OnSample<'a> = dyn FnMut(&ProcessTable, &Sample) + 'a;

/// The process records in time order, up to the cutoff it was taken for,
/// with the samples that came in the same buffers.
pub trait RecordStream {
    /// The time (CLOCK_MONOTONIC ns) of the next item, `None` when none is
    /// left up to the cutoff.
    fn next_time(&mut self) -> Option<u64>;
    /// The process of its next item, when that item is a sample.
    fn next_sample_pid(&mut self) -> Option<u32>;
    /// Applies the next item to `processes` (a process record) or hands it
    /// to `on_sample` (a sample).
    fn deliver_next(&mut self, processes: &mut ProcessTable, on_sample: &mut OnSample<'_>) -> Item;
    /// Drops its next item, a sample the merge does not keep, counting it
    /// by its cause ([`Unkept::count`]).
    fn drop_next(&mut self, exited: bool);
    /// Makes sure the table knows `pid` before a sample of another stream
    /// is delivered (a process no record named yet is read from `/proc`,
    /// once); returns whether it was read now.
    fn make_known(&mut self, processes: &mut ProcessTable, pid: u32) -> bool;
    /// Whether the samples of a process the records do not name are kept
    /// (read from `/proc`): `false` when every CPU is sampled, where such
    /// a process is not profiled.
    fn keeps_unknown_processes(&self) -> bool;
}

/// Samples of another source, in time order up to the same cutoff.
pub trait SampleStream {
    /// The time of its next sample, `None` when none is left up to the
    /// cutoff.
    fn next_time(&mut self) -> Option<u64>;
    /// The process of its next sample.
    fn next_pid(&mut self) -> Option<u32>;
    /// Hands its next sample to `on_sample`.
    fn deliver_next(&mut self, processes: &ProcessTable, on_sample: &mut OnSample<'_>);
    /// Drops its next sample, of a process the table does not know while
    /// unknown processes are not kept, counting it by its cause
    /// ([`Unkept::count`]).
    fn drop_next(&mut self, exited: bool);
}

/// Samples not kept: of a process the table does not know while unknown
/// processes are not kept (every CPU sampled), by cause.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unkept {
    /// Of a profiled process on its way out (taken after its exit record:
    /// no address space left to unwind): a loss, `lost_exiting`.
    pub exiting: u64,
    /// Of a process that is not profiled (its PID reused since the BPF
    /// program's map named it, or handed over before the program knew it).
    pub not_profiled: u64,
}

impl Unkept {
    /// Counts one sample not kept; `exited`: the records saw its process
    /// exit.
    pub fn count(&mut self, exited: bool) {
        if exited {
            self.exiting += 1;
        } else {
            self.not_profiled += 1;
        }
    }
}

impl std::ops::AddAssign for Unkept {
    fn add_assign(&mut self, other: Unkept) {
        self.exiting += other.exiting;
        self.not_profiled += other.not_profiled;
    }
}

/// `Some(exited)` when a sample of `pid` is not kept: unknown processes are
/// not kept and the table does not know it.
pub fn unkept(keeps_unknown: bool, processes: &ProcessTable, pid: u32) -> Option<bool> {
    (!keeps_unknown && processes.get(pid).is_none()).then(|| processes.exited(pid))
}

/// What one item of the record stream was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// A sample, handed on.
    Sample,
    /// A process record, applied to the table.
    Process,
    /// Anything else (losses and throttling, counted when read).
    Other,
}

/// What one merge delivered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Samples handed to `on_sample`, from every stream.
    pub samples: u64,
    /// Process records applied to the table.
    pub process_events: u64,
    /// Processes read from `/proc` for a sample of another stream (no
    /// record had named them): the engine behind that stream may want to
    /// describe them (the BPF maps).
    pub read_from_proc: Vec<u32>,
}

/// Delivers every item of `records` and of `others` in time order: on equal
/// times a record goes first (it was written before a sample that names
/// what it did), then the streams in their order.
pub fn deliver_in_time_order(
    records: &mut dyn RecordStream,
    others: &mut [&mut dyn SampleStream],
    processes: &mut ProcessTable,
    on_sample: &mut OnSample<'_>,
) -> Merged {
    let mut merged = Merged::default();
    loop {
        let mut oldest: Option<(u64, Option<usize>)> = records.next_time().map(|time| (time, None));
        for (index, stream) in others.iter_mut().enumerate() {
            if let Some(time) = stream.next_time() {
                if oldest.is_none_or(|(oldest_time, _)| time < oldest_time) {
                    oldest = Some((time, Some(index)));
                }
            }
        }
        match oldest {
            None => return merged,
            Some((_, None)) => {
                let keeps_unknown = records.keeps_unknown_processes();
                let pid = records.next_sample_pid();
                if let Some(exited) = pid.and_then(|pid| unkept(keeps_unknown, processes, pid)) {
                    records.drop_next(exited);
                    continue;
                }
                match records.deliver_next(processes, on_sample) {
                    Item::Sample => merged.samples += 1,
                    Item::Process => merged.process_events += 1,
                    Item::Other => {}
                }
            }
            Some((_, Some(index))) => {
                let stream = &mut *others[index];
                let Some(pid) = stream.next_pid() else {
                    continue;
                };
                if records.make_known(processes, pid) {
                    merged.read_from_proc.push(pid);
                }
                let keeps_unknown = records.keeps_unknown_processes();
                if let Some(exited) = unkept(keeps_unknown, processes, pid) {
                    stream.drop_next(exited);
                    continue;
                }
                stream.deliver_next(processes, on_sample);
                merged.samples += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ProcessEvent;
    use std::collections::VecDeque;

    /// An item of the test's record stream.
    enum RecordItem {
        Event(ProcessEvent),
        SampleOf(u32),
    }

    /// A record stream of exits and samples.
    struct Records {
        items: VecDeque<(u64, RecordItem)>,
        keep_unknown: bool,
        made_known: Vec<u32>,
        dropped: Vec<(u32, bool)>,
    }

    impl Records {
        fn new(items: impl IntoIterator<Item = (u64, RecordItem)>, keep_unknown: bool) -> Self {
            Records {
                items: items.into_iter().collect(),
                keep_unknown,
                made_known: Vec::new(),
                dropped: Vec::new(),
            }
        }
    }

    impl RecordStream for Records {
        fn next_time(&mut self) -> Option<u64> {
            self.items.front().map(|(time, _)| *time)
        }
        fn next_sample_pid(&mut self) -> Option<u32> {
            match self.items.front() {
                Some((_, RecordItem::SampleOf(pid))) => Some(*pid),
                _ => None,
            }
        }
        fn deliver_next(
            &mut self,
            processes: &mut ProcessTable,
            on_sample: &mut OnSample<'_>,
        ) -> Item {
            match self.items.pop_front() {
                Some((_, RecordItem::Event(event))) => {
                    processes.apply(&event);
                    Item::Process
                }
                Some((time, RecordItem::SampleOf(pid))) => {
                    on_sample(processes, &sample(pid, time));
                    Item::Sample
                }
                None => Item::Other,
            }
        }
        fn drop_next(&mut self, exited: bool) {
            if let Some((_, RecordItem::SampleOf(pid))) = self.items.pop_front() {
                self.dropped.push((pid, exited));
            }
        }
        fn make_known(&mut self, _: &mut ProcessTable, pid: u32) -> bool {
            self.made_known.push(pid);
            false
        }
        fn keeps_unknown_processes(&self) -> bool {
            self.keep_unknown
        }
    }

    struct Samples {
        samples: VecDeque<Sample>,
        dropped: Vec<(u32, bool)>,
    }

    impl SampleStream for Samples {
        fn next_time(&mut self) -> Option<u64> {
            self.samples.front().map(|sample| sample.time)
        }
        fn next_pid(&mut self) -> Option<u32> {
            self.samples.front().map(|sample| sample.pid)
        }
        fn deliver_next(&mut self, processes: &ProcessTable, on_sample: &mut OnSample<'_>) {
            if let Some(sample) = self.samples.pop_front() {
                on_sample(processes, &sample);
            }
        }
        fn drop_next(&mut self, exited: bool) {
            if let Some(sample) = self.samples.pop_front() {
                self.dropped.push((sample.pid, exited));
            }
        }
    }

    fn sample(pid: u32, time: u64) -> Sample {
        Sample {
            pid,
            tid: pid,
            time,
            cpu: 0,
            event: 0,
            weight: 1,
            scaled_count: crate::events::COUNT_UNIT,
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            end: crate::sample::StackEnd::Complete,
            heap: None,
            off_cpu: None,
            trace: None,
        }
    }

    /// Pids far above pid_max: never a live process.
    const PID: u32 = 1 << 30;

    fn table_with(pid: u32) -> ProcessTable {
        let mut table = ProcessTable::new();
        table.apply(&ProcessEvent::Comm {
            pid,
            tid: pid,
            name: "worker".into(),
            exec: true,
        });
        table
    }

    #[test]
    fn samples_of_every_stream_come_in_time_order_each_after_the_records_before_it() {
        let mut records = Records::new(
            [
                (10, RecordItem::SampleOf(PID)),
                (
                    30,
                    RecordItem::Event(ProcessEvent::Exit { pid: PID, tid: PID }),
                ),
                (50, RecordItem::SampleOf(PID)),
            ],
            true,
        );
        let mut first = Samples {
            samples: VecDeque::from([sample(PID, 20), sample(PID, 30), sample(PID, 40)]),
            dropped: Vec::new(),
        };
        let mut second = Samples {
            samples: VecDeque::from([sample(PID, 5), sample(PID, 45)]),
            dropped: Vec::new(),
        };
        let mut table = table_with(PID);
        let mut seen = Vec::new();
        let merged = deliver_in_time_order(
            &mut records,
            &mut [&mut first, &mut second],
            &mut table,
            &mut |table, sample| seen.push((sample.time, table.exited(PID))),
        );
        // The exit at 30 is applied before the sample of the same time.
        assert_eq!(
            seen,
            [
                (5, false),
                (10, false),
                (20, false),
                (30, true),
                (40, true),
                (45, true),
                (50, true)
            ]
        );
        assert_eq!(merged.samples, 7);
        assert_eq!(merged.process_events, 1);
        // The record stream was asked for each other stream's sample.
        assert_eq!(records.made_known, [PID; 5]);
    }

    #[test]
    fn without_unknown_processes_a_sample_the_table_does_not_know_is_dropped_and_counted_in_every_stream(
    ) {
        let other = PID + 1;
        let mut records = Records::new(
            [
                (22, RecordItem::SampleOf(other)),
                (24, RecordItem::SampleOf(PID)),
                (
                    30,
                    RecordItem::Event(ProcessEvent::Exit { pid: PID, tid: PID }),
                ),
                (45, RecordItem::SampleOf(PID)),
            ],
            false,
        );
        let mut samples = Samples {
            samples: VecDeque::from([sample(PID, 20), sample(other, 25), sample(PID, 40)]),
            dropped: Vec::new(),
        };
        let mut table = table_with(PID);
        let mut seen = Vec::new();
        let merged = deliver_in_time_order(
            &mut records,
            &mut [&mut samples],
            &mut table,
            &mut |_, sample| seen.push(sample.time),
        );
        // From either stream, the known process's samples before its exit.
        assert_eq!(seen, [20, 24]);
        assert_eq!(merged.samples, 2);
        // Not profiled, then on its way out, in both streams.
        assert_eq!(samples.dropped, [(other, false), (PID, true)]);
        assert_eq!(records.dropped, [(other, false), (PID, true)]);
    }
}
