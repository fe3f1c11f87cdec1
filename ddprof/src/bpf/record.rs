//! Decoding the BPF ring buffer's records (`ddprof_common::sample`'s
//! `RawSampleHeader`, kernel frames, user frames) into [`Sample`]s.
use ddprof_common::sample::{RawSampleHeader, StackEnd, HANDOFF_NOTICE, RAW_SAMPLE_HEADER_SIZE};

use crate::sample::Sample;

/// A ring-buffer record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Record {
    Sample(Sample),
    /// The program handed a process's sample to the perf engine and woke
    /// the reader to describe the process (`HANDOFF_NOTICE`).
    HandoffNotice,
}

/// Decodes one ring-buffer record, the frames into vectors from `spare`
/// (emptied ones of earlier samples) when it has any.
pub(super) fn decode(bytes: &[u8], spare: &mut Vec<Vec<u64>>) -> Option<Record> {
    let header_bytes = bytes.get(..RAW_SAMPLE_HEADER_SIZE)?;
    // SAFETY: RawSampleHeader is repr(C) plain integers; any bytes are a
    // valid value and read_unaligned needs no alignment.
    let header: RawSampleHeader = unsafe { std::ptr::read_unaligned(header_bytes.as_ptr().cast()) };
    if header.stack_end == HANDOFF_NOTICE {
        return Some(Record::HandoffNotice);
    }
    let kernel = header.kernel_frames as usize;
    let user = header.user_frames as usize;
    let frames_bytes = bytes.get(RAW_SAMPLE_HEADER_SIZE..)?;
    if frames_bytes.len() < (kernel + user) * 8 {
        return None;
    }
    // Whole 8-byte chunks, which compile to a copy (indexing word by word
    // was a sixth of the profiler's steady-state CPU on 300-frame stacks).
    let mut words = |bytes: &[u8]| -> Vec<u64> {
        if bytes.is_empty() {
            return Vec::new();
        }
        let words = bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()));
        match spare.pop() {
            Some(mut reused) => {
                reused.clear();
                reused.extend(words);
                reused
            }
            None => words.collect(),
        }
    };
    Some(Record::Sample(Sample {
        pid: header.pid,
        tid: header.tid,
        time: header.time_ns,
        cpu: header.cpu,
        weight: header.period,
        kernel_frames: words(&frames_bytes[..kernel * 8]),
        frames: words(&frames_bytes[kernel * 8..(kernel + user) * 8]),
        end: StackEnd::from_raw(header.stack_end),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_records_and_rejects_short_ones() {
        let header = RawSampleHeader {
            pid: 7,
            tid: 8,
            time_ns: 9,
            period: 10,
            cpu: 1,
            stack_end: StackEnd::Complete as u32,
            user_frames: 2,
            kernel_frames: 1,
        };
        let mut bytes = Vec::new();
        // SAFETY: viewing a repr(C) value as its bytes.
        bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&header as *const RawSampleHeader).cast::<u8>(),
                RAW_SAMPLE_HEADER_SIZE,
            )
        });
        for frame in [0xffff_ffff_8100_0000u64, 0x401000, 0x402000] {
            bytes.extend_from_slice(&frame.to_le_bytes());
        }
        let Some(Record::Sample(sample)) = decode(&bytes, &mut Vec::new()) else {
            panic!("not decoded as a sample");
        };
        assert_eq!(sample.kernel_frames, vec![0xffff_ffff_8100_0000]);
        assert_eq!(sample.frames, vec![0x401000, 0x402000]);
        assert_eq!((sample.pid, sample.tid, sample.weight), (7, 8, 10));
        assert!(!sample.truncated());
        // Spare vectors (an earlier sample's frames) are emptied and refilled.
        let mut spare = vec![vec![1, 2, 3, 4, 5], vec![6; 300]];
        let Some(Record::Sample(reused)) = decode(&bytes, &mut spare) else {
            panic!("not decoded as a sample");
        };
        assert_eq!(reused, sample);
        assert!(spare.is_empty(), "both frame lists took a spare vector");
        assert!(decode(&bytes[..bytes.len() - 1], &mut Vec::new()).is_none());
        assert!(decode(&bytes[..10], &mut Vec::new()).is_none());

        // A hand-off notice is the header alone, whatever its frame counts.
        let notice = RawSampleHeader {
            stack_end: HANDOFF_NOTICE,
            ..header
        };
        // SAFETY: viewing a repr(C) value as its bytes.
        let notice_bytes = unsafe {
            std::slice::from_raw_parts(
                (&notice as *const RawSampleHeader).cast::<u8>(),
                RAW_SAMPLE_HEADER_SIZE,
            )
        };
        assert_eq!(
            decode(notice_bytes, &mut Vec::new()),
            Some(Record::HandoffNotice)
        );
    }
}
