//! Decoding the BPF ring buffer's records (`ddprof_common::sample`'s
//! `RawSampleHeader`, kernel frames, user frames) into [`Sample`]s.
use ddprof_common::sample::{
    RawSampleHeader, RawTraceContext, StackEnd, HANDOFF_NOTICE, RAW_SAMPLE_HEADER_SIZE,
    RAW_TRACE_CONTEXT_SIZE, RECORD_HAS_ARGUMENTS, TRACE_CONTEXT_ATTR_BYTES, TRACE_CONTEXT_MARKER,
    WALL_RESUME,
};

use crate::sample::{OffCpu, Sample};
use crate::trace_context::RawContext;

/// A ring-buffer record. (Nearly every record is a sample, decoded and
/// consumed at once: boxing it would allocate for each.)
#[derive(Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub(super) enum Record {
    /// A sample, the context its thread published, if any (its labels
    /// are named by the engine, which knows the process's keys), and the
    /// probed function's first three arguments for a uprobe's sample
    /// (`sALLOC`'s marker), which the engine weighs it by.
    Sample(Sample, Option<RawContext>, Option<[u64; 3]>),
    /// The program handed a sample of process `pid` to the perf engine and
    /// woke the reader to describe the process (`HANDOFF_NOTICE`).
    HandoffNotice { pid: u32 },
}

/// Decodes one ring-buffer record, the frames into vectors from `spare`
/// (emptied ones of earlier samples) when it has any.
pub(super) fn decode(bytes: &[u8], spare: &mut Vec<Vec<u64>>) -> Option<Record> {
    // A record of a thread that published a context starts with it.
    let (context, bytes) = match bytes.get(..4) {
        Some(marker) if marker == TRACE_CONTEXT_MARKER.to_ne_bytes() => {
            let context_bytes = bytes.get(..RAW_TRACE_CONTEXT_SIZE)?;
            // SAFETY: RawTraceContext is repr(C) plain integers and byte
            // arrays; any bytes are a valid value and read_unaligned needs no
            // alignment.
            let raw: RawTraceContext =
                unsafe { std::ptr::read_unaligned(context_bytes.as_ptr().cast()) };
            let used = usize::from(raw.attrs_len).min(TRACE_CONTEXT_ATTR_BYTES);
            let context = RawContext {
                kind: raw.kind,
                span_id: raw.span_id,
                trace_id: raw.trace_id,
                attrs: raw.attrs[..used].to_vec(),
            };
            (Some(context), &bytes[RAW_TRACE_CONTEXT_SIZE..])
        }
        _ => (None, bytes),
    };
    let header_bytes = bytes.get(..RAW_SAMPLE_HEADER_SIZE)?;
    // SAFETY: RawSampleHeader is repr(C) plain integers; any bytes are a
    // valid value and read_unaligned needs no alignment.
    let header: RawSampleHeader = unsafe { std::ptr::read_unaligned(header_bytes.as_ptr().cast()) };
    if header.stack_end == HANDOFF_NOTICE {
        return Some(Record::HandoffNotice { pid: header.pid });
    }
    if header.stack_end == WALL_RESUME {
        // A parked thread ran again: no stack; its event is `sWALL`'s.
        return Some(Record::Sample(
            Sample {
                pid: header.pid,
                tid: header.tid,
                time: header.time_ns,
                cpu: header.cpu,
                event: header.event_cookie.min(u32::from(u16::MAX)) as u16,
                weight: 0,
                scaled_count: crate::events::COUNT_UNIT,
                kernel_frames: Vec::new(),
                heap: None,
                off_cpu: Some(OffCpu::Resumed {
                    switched_out: header.period,
                }),
                frames: Vec::new(),
                end: StackEnd::Complete,
                trace: None,
            },
            None,
            None,
        ));
    }
    let kernel = header.kernel_frames as usize;
    let user = header.user_frames as usize;
    let frames_bytes = bytes.get(RAW_SAMPLE_HEADER_SIZE..)?;
    if frames_bytes.len() < (kernel + user) * 8 {
        return None;
    }
    // One copy of the frames' bytes: converting them word by word was a
    // fifth of the engine's steady-state CPU on 300-frame stacks.
    let mut words = |bytes: &[u8]| -> Vec<u64> {
        let count = bytes.len() / 8;
        if count == 0 {
            return Vec::new();
        }
        let mut words = spare.pop().unwrap_or_default();
        words.clear();
        words.reserve(count);
        // SAFETY: `words` has room for `count` u64s and `bytes` holds at
        // least `count * 8` bytes; the regions cannot overlap (one is the
        // ring buffer's mapping, the other heap memory), and any bytes are a
        // valid u64. The program wrote them in this machine's byte order,
        // as the header read above assumes too.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr().cast::<u8>(),
                count * 8,
            );
            words.set_len(count);
        }
        words
    };
    Some(Record::Sample(
        Sample {
            pid: header.pid,
            tid: header.tid,
            time: header.time_ns,
            cpu: header.cpu,
            // The link's cookie (the event's index plus one, 0 for the
            // CPU-time events): the engine makes it the event's index.
            event: header.event_cookie.min(u32::from(u16::MAX)) as u16,
            weight: header.period,
            scaled_count: crate::events::COUNT_UNIT,
            kernel_frames: words(&frames_bytes[..kernel * 8]),
            heap: None,
            // The engine marks `sWALL`'s stacks (it knows the event's cookie).
            off_cpu: None,
            frames: words(&frames_bytes[kernel * 8..(kernel + user) * 8]),
            end: StackEnd::from_raw(header.stack_end),
            trace: None,
        },
        context,
        (header.flags & RECORD_HAS_ARGUMENTS != 0).then_some([
            header.period,
            header.arguments[0],
            header.arguments[1],
        ]),
    ))
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
            event_cookie: 3,
            flags: 0,
            arguments: [0; 2],
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
        let Some(Record::Sample(sample, None, None)) = decode(&bytes, &mut Vec::new()) else {
            panic!("not decoded as a sample");
        };
        assert_eq!(sample.kernel_frames, vec![0xffff_ffff_8100_0000]);
        assert_eq!(sample.frames, vec![0x401000, 0x402000]);
        assert_eq!((sample.pid, sample.tid, sample.weight), (7, 8, 10));
        // The cookie, which the engine makes the event's index.
        assert_eq!(sample.event, 3);
        assert!(!sample.truncated());
        // Spare vectors (an earlier sample's frames) are emptied and refilled.
        let mut spare = vec![vec![1, 2, 3, 4, 5], vec![6; 300]];
        let Some(Record::Sample(reused, None, None)) = decode(&bytes, &mut spare) else {
            panic!("not decoded as a sample");
        };
        assert_eq!(reused, sample);
        assert!(spare.is_empty(), "both frame lists took a spare vector");
        assert!(decode(&bytes[..bytes.len() - 1], &mut Vec::new()).is_none());

        // With a context before the header: the same sample, and the
        // context's used attribute bytes.
        let mut context = RawTraceContext {
            marker: TRACE_CONTEXT_MARKER,
            kind: ddprof_common::sample::TRACE_CONTEXT_OTEL,
            flags: 0,
            attrs_len: 3,
            trace_id: [1; 16],
            span_id: [2; 8],
            record_state: [1, 0, 3, 0],
            attrs: [9; TRACE_CONTEXT_ATTR_BYTES],
            reserved: 0,
        };
        // SAFETY: viewing a repr(C) value as its bytes.
        let mut with_context = unsafe {
            std::slice::from_raw_parts(
                (&context as *const RawTraceContext).cast::<u8>(),
                RAW_TRACE_CONTEXT_SIZE,
            )
        }
        .to_vec();
        with_context.extend_from_slice(&bytes);
        let Some(Record::Sample(same, Some(raw), None)) = decode(&with_context, &mut Vec::new())
        else {
            panic!("not decoded as a sample with a context");
        };
        assert_eq!(same, sample);
        assert_eq!(
            (raw.span_id, raw.attrs.as_slice()),
            ([2; 8], &[9, 9, 9][..])
        );
        assert!(decode(
            &with_context[..RAW_TRACE_CONTEXT_SIZE + 10],
            &mut Vec::new()
        )
        .is_none());
        // An attribute length past the array is cut to it.
        context.attrs_len = u16::MAX;
        // SAFETY: as above.
        let overlong = unsafe {
            std::slice::from_raw_parts(
                (&context as *const RawTraceContext).cast::<u8>(),
                RAW_TRACE_CONTEXT_SIZE,
            )
        };
        let mut overlong = overlong.to_vec();
        overlong.extend_from_slice(&bytes);
        let Some(Record::Sample(_, Some(raw), None)) = decode(&overlong, &mut Vec::new()) else {
            panic!("not decoded");
        };
        assert_eq!(raw.attrs.len(), TRACE_CONTEXT_ATTR_BYTES);
        assert!(decode(&bytes[..10], &mut Vec::new()).is_none());

        // A uprobe's record carries the marker's three arguments: its
        // period (the size) and `arguments`; without the flag, none.
        let allocation = RawSampleHeader {
            flags: RECORD_HAS_ARGUMENTS,
            arguments: [0x5555_0000, 1],
            ..header
        };
        let mut allocation_bytes = Vec::new();
        // SAFETY: viewing a repr(C) value as its bytes.
        allocation_bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&allocation as *const RawSampleHeader).cast::<u8>(),
                RAW_SAMPLE_HEADER_SIZE,
            )
        });
        allocation_bytes.extend_from_slice(&bytes[RAW_SAMPLE_HEADER_SIZE..]);
        let Some(Record::Sample(same, None, Some(arguments))) =
            decode(&allocation_bytes, &mut Vec::new())
        else {
            panic!("not decoded as a sample with arguments");
        };
        assert_eq!(same, sample);
        assert_eq!(arguments, [10, 0x5555_0000, 1]);

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
            Some(Record::HandoffNotice { pid: header.pid })
        );
    }
}
