//! Unwinding one perf sample: its frames from the registers and the stack
//! copy the kernel wrote, with the table of its process as it was then.
use super::record;
use super::SampleCounters;
use crate::process::ProcessTable;
use crate::sample::{Sample, StackEnd};
use crate::unwind::{TableLoading, Unwinder};

/// What unwinding a sample takes of the engine (borrowed apart from the
/// buffers, which a sample may be read in place from).
pub(super) struct Unwinding<'a> {
    pub(super) unwinder: &'a mut Unwinder,
    pub(super) spare_frames: &'a mut Vec<Vec<u64>>,
    pub(super) counters: &'a mut SampleCounters,
    pub(super) max_frames: usize,
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
        Sample {
            pid: raw.pid,
            tid: raw.tid,
            time: raw.time,
            cpu: raw.cpu,
            weight: raw.period,
            frames,
            kernel_frames: raw.kernel_frames,
            end,
        }
    }
}
