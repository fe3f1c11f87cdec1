//! Unwinding one perf sample: its frames from the registers and the stack
//! copy the kernel wrote, with the table of its process as it was then.
use std::time::Duration;

use super::record;
use super::source::ReadAhead;
use super::SampleCounters;
use crate::process::ProcessTable;
use crate::sample::{Sample, StackEnd};
use crate::unwind::{TableLoading, Unwinder};

/// The most that is copied out of the buffers while one sample's tables are
/// read: 64 MiB is ~1,000 samples with 64 KB stacks (half a second at
/// 999 Hz on two CPUs). Beyond it the buffers fill and the kernel counts
/// what it drops, as before.
pub(super) const READ_AHEAD_MAX_BYTES: usize = 64 << 20;

/// How often the buffers are read while a table is: a tenth of what the
/// smallest buffer of 64 KB stacks holds at 999 Hz (64 ms).
const READ_AHEAD_INTERVAL: Duration = Duration::from_millis(4);

/// What unwinding a sample takes of the engine (borrowed apart from the
/// buffers, which a sample may be read in place from).
pub(super) struct Unwinding<'a> {
    pub(super) unwinder: &'a mut Unwinder,
    pub(super) spare_frames: &'a mut Vec<Vec<u64>>,
    pub(super) counters: &'a mut SampleCounters,
    pub(super) max_frames: usize,
    /// How each event's samples weigh (by event index; an event not listed
    /// weighs its period).
    pub(super) weighings: &'a crate::events::Weighings,
}

impl Unwinding<'_> {
    /// Unwinds one sample with the table as it is (the caller made sure it
    /// is the table of the sample's time for its process).
    pub(super) fn unwind(
        &mut self,
        processes: &ProcessTable,
        raw: record::SampleView<'_>,
    ) -> Sample {
        // With loading allowed there is always an answer.
        let (frames, end) = self
            .frames_of(processes, &raw, TableLoading::Allowed)
            .unwrap_or((Vec::new(), StackEnd::NoUnwindInfo));
        self.sample(raw, frames, end)
    }

    /// As [`Unwinding::unwind`]; but a sample that needs a table not looked
    /// for yet is unwound on a helper thread, which reads (maybe compiles)
    /// the table, while this one copies what the buffers receive meanwhile
    /// into the queue (`read_ahead`), up to [`READ_AHEAD_MAX_BYTES`]:
    /// compiling a big file's table takes a second or more (a 2.4 M-row
    /// static binary), and the buffers hold ~64 ms of 64 KB stack copies at
    /// 999 Hz. Before, 395 of 5,785 samples of that binary were lost so.
    pub(super) fn unwind_reading_ahead(
        &mut self,
        processes: &ProcessTable,
        raw: record::SampleView<'_>,
        read_ahead: &mut ReadAhead<'_>,
    ) -> Sample {
        if let Some((frames, end)) = self.frames_of(processes, &raw, TableLoading::KnownOnly) {
            return self.sample(raw, frames, end);
        }
        let kept = raw.clone();
        let unwound = std::thread::scope(|scope| {
            let helper = std::thread::Builder::new()
                .name("ddprof-tables".into())
                .spawn_scoped(scope, || self.unwind(processes, raw));
            let helper = match helper {
                Ok(helper) => helper,
                Err(error) => {
                    log::debug!("no thread to read unwind tables on: {error}");
                    return None;
                }
            };
            let mut copied = 0;
            while !helper.is_finished() {
                if copied < READ_AHEAD_MAX_BYTES {
                    copied += read_ahead.read();
                }
                std::thread::sleep(READ_AHEAD_INTERVAL);
            }
            Some(
                helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            )
        });
        // Without a helper thread, here (the buffers wait).
        unwound.unwrap_or_else(|| self.unwind(processes, kept))
    }

    /// `raw`'s frames and how its walk ended; with
    /// [`TableLoading::KnownOnly`], `None` when a frame is in a file whose
    /// table was not looked for yet (reading, maybe compiling it, is for
    /// the sample's turn).
    pub(super) fn frames_of(
        &mut self,
        processes: &ProcessTable,
        raw: &record::SampleView<'_>,
        loading: TableLoading,
    ) -> Option<(Vec<u64>, StackEnd)> {
        let mut frames = self.spare_frames.pop().unwrap_or_default();
        frames.clear();
        let Some(regs) = &raw.regs else {
            return Some((frames, StackEnd::NoUserContext));
        };
        // A free of a sampled address (told by its event's index, without a
        // lookup on every sample): its address is all that counts.
        if crate::events::allocation_of_frees(raw.event).is_some() {
            return Some((frames, StackEnd::StackExhausted));
        }
        let end = self.unwinder.unwind_with(
            processes,
            raw.pid,
            regs,
            raw.stack,
            self.max_frames,
            &mut frames,
            loading,
        );
        match end {
            Some(end) => Some((frames, end)),
            None => {
                self.spare_frames.push(frames);
                None
            }
        }
    }

    pub(super) fn sample(
        &mut self,
        raw: record::SampleView<'_>,
        frames: Vec<u64>,
        end: StackEnd,
    ) -> Sample {
        self.counters.samples += 1;
        if end.is_complete() {
            self.counters.complete += 1;
        }
        let mut sample = Sample {
            pid: raw.pid,
            tid: raw.tid,
            time: raw.time,
            cpu: raw.cpu,
            event: raw.event,
            weight: raw.period,
            scaled_count: crate::events::COUNT_UNIT,
            frames,
            kernel_frames: raw.kernel_frames,
            end,
            heap: None,
            off_cpu: None,
            trace: None,
        };
        if let Some(weighing) = self.weighings.of(raw.event) {
            weighing.weigh(&mut sample, raw.regs.as_ref());
        }
        sample
    }
}
