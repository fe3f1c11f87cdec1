//! Decoding of the records the kernel writes into a perf ring buffer, for the
//! attributes `events.rs` sets (`sample_type`, `sample_regs_user`,
//! `sample_id_all`). Pure byte parsing: every bound is checked and a short or
//! inconsistent record is an error, never a panic.
use perf_event_open_sys::bindings as sys;

use crate::events::{self, regs as sampled_regs, SampleLayout};
use crate::process::{MappingRecord, ProcessEvent};
use crate::sample::Sample;
use crate::unwind::UserRegs;

/// The sample layout this parser decodes. If `events.rs` asks the kernel for
/// other fields, this stops compiling instead of misreading every record.
const EXPECTED_SAMPLE_TYPE: u64 = sys::PERF_SAMPLE_IP as u64
    | sys::PERF_SAMPLE_TID as u64
    | sys::PERF_SAMPLE_TIME as u64
    | sys::PERF_SAMPLE_CPU as u64
    | sys::PERF_SAMPLE_PERIOD as u64
    | sys::PERF_SAMPLE_CALLCHAIN as u64
    | sys::PERF_SAMPLE_REGS_USER as u64
    | sys::PERF_SAMPLE_STACK_USER as u64;
const _: () = assert!(events::SAMPLE_TYPE == EXPECTED_SAMPLE_TYPE);
const _: () = assert!(sampled_regs::MASK.count_ones() as usize == sampled_regs::COUNT);
const _: () = {
    // The kernel writes the registers in ascending bit order.
    let mut i = 1;
    while i < sampled_regs::COUNT {
        assert!(sampled_regs::SAMPLED[i - 1].0 < sampled_regs::SAMPLED[i].0);
        i += 1;
    }
};

/// Size of the record header (`struct perf_event_header`).
pub const HEADER_SIZE: usize = 8;
/// Size of the `sample_id` trailer of non-sample records: with `sample_id_all`
/// and this `sample_type` it holds { pid, tid }, time and { cpu, reserved }.
const SAMPLE_ID_SIZE: usize = 24;
/// Offset of the time inside the `sample_id` trailer.
const SAMPLE_ID_TIME_OFFSET: usize = 8;

/// A sample as the kernel wrote it, before unwinding, its stack held as
/// `S`: a copy ([`RawSample`]) or the record's own bytes ([`SampleView`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRecord<S> {
    pub ip: u64,
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub cpu: u32,
    /// The sample's period; for an event weighed by a field of its raw
    /// record, that field's value (see [`SampleLayout`]).
    pub period: u64,
    /// The event whose buffer it was read from (its index in the session's
    /// list; the parser leaves 0 for the reader to set).
    pub event: u16,
    /// `None` when the kernel had no user context (`PERF_SAMPLE_REGS_ABI_NONE`).
    pub regs: Option<UserRegs>,
    /// The valid part (`dyn_size` bytes) of the user stack copy, from `regs.sp` up.
    pub stack: S,
    /// Kernel program counters, innermost first (only with kernel stacks
    /// asked for, and for samples taken in the kernel).
    pub kernel_frames: Vec<u64>,
}

/// A sample with its stack copied out of the ring buffer.
pub type RawSample = SampleRecord<Vec<u8>>;

/// A sample record read in place: its stack is the record's own bytes (in
/// the ring buffer, or in the scratch copy of a record that wrapped).
pub type SampleView<'a> = SampleRecord<&'a [u8]>;

impl<S> SampleRecord<S> {
    /// The same sample with its stack as `stack`.
    fn with_stack<T>(self, stack: T) -> (SampleRecord<T>, S) {
        let SampleRecord {
            ip,
            pid,
            tid,
            time,
            cpu,
            period,
            event,
            regs,
            stack: old,
            kernel_frames,
        } = self;
        let record = SampleRecord {
            ip,
            pid,
            tid,
            time,
            cpu,
            period,
            event,
            regs,
            stack,
            kernel_frames,
        };
        (record, old)
    }
}

impl SampleView<'_> {
    /// The sample with its stack copied into one of `spare_stacks` (the
    /// buffers of samples already unwound) rather than a new allocation.
    pub fn into_owned_reusing(self, spare_stacks: &mut Vec<Vec<u8>>) -> RawSample {
        let stack = if self.stack.is_empty() {
            Vec::new()
        } else {
            let mut stack = spare_stacks.pop().unwrap_or_default();
            stack.clear();
            stack.extend_from_slice(self.stack);
            stack
        };
        self.with_stack(stack).0
    }
}

impl RawSample {
    /// Calls `f` with the sample as a view of its own stack, and gives the
    /// stack's buffer back for reuse.
    pub fn with_view<T>(self, f: impl FnOnce(SampleView<'_>) -> T) -> (T, Vec<u8>) {
        let (record, stack) = self.with_stack(());
        let (view, ()) = record.with_stack(stack.as_slice());
        let result = f(view);
        (result, stack)
    }
}

/// Whether `bytes` (a whole record) is a sample, from its header alone.
pub fn is_sample(bytes: &[u8]) -> bool {
    bytes.get(..4).is_some_and(|kind| {
        u32::from_ne_bytes([kind[0], kind[1], kind[2], kind[3]]) == sys::PERF_RECORD_SAMPLE
    })
}

/// What one record means to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A sample with its stack copied (boxed: 248 bytes, where the other
    /// records are at most 80, and the queue sorts its records by value).
    Sample(Box<RawSample>),
    /// A sample unwound as soon as it was read, from its stack in place in
    /// the ring buffer (see `PerfEngine::drain_buffers`): it waits in the
    /// queue for its turn without its stack.
    Unwound(Sample),
    Process(ProcessEvent),
    /// Samples the kernel could not write (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`).
    Lost(u64),
    Throttle,
    Unthrottle,
    /// A record type the engine does not use.
    Ignored(u32),
}

/// A decoded record and its CLOCK_MONOTONIC time (for ordering across buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedRecord {
    pub time: u64,
    pub record: Record,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MalformedRecord {
    #[error("record shorter than its fields ({kind} record of {size} bytes)")]
    Short { kind: u32, size: usize },
    #[error("record header says {declared} bytes but {available} are there")]
    BadSize { declared: usize, available: usize },
}

/// Bounds-checked little cursor over one record.
struct Cursor<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], position: usize) -> Self {
        Self { bytes, position }
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.position.checked_add(len)?;
        let slice = self.bytes.get(self.position..end)?;
        self.position = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    }
}

/// Decodes one whole record (header included).
#[cfg(test)]
pub fn parse(bytes: &[u8]) -> Result<TimedRecord, MalformedRecord> {
    parse_reusing(bytes, &mut Vec::new(), SampleLayout::DEFAULT)
}

/// [`parse`], copying a sample's stack into one of `spare_stacks` (the
/// buffers of samples already unwound) rather than a new allocation.
/// `layout`: what the samples of the record's event hold (see
/// [`events::sample_type`]).
pub fn parse_reusing(
    bytes: &[u8],
    spare_stacks: &mut Vec<Vec<u8>>,
    layout: SampleLayout,
) -> Result<TimedRecord, MalformedRecord> {
    let mut cursor = Cursor::new(bytes, 0);
    let short = |kind| MalformedRecord::Short {
        kind,
        size: bytes.len(),
    };
    let kind = cursor.u32().ok_or(short(0))?;
    let misc = cursor.take(2).ok_or(short(kind))?;
    let misc = u16::from_ne_bytes([misc[0], misc[1]]) as u32;
    let size = cursor.take(2).ok_or(short(kind))?;
    let size = u16::from_ne_bytes([size[0], size[1]]) as usize;
    if size != bytes.len() || size < HEADER_SIZE {
        return Err(MalformedRecord::BadSize {
            declared: size,
            available: bytes.len(),
        });
    }
    if kind == sys::PERF_RECORD_SAMPLE {
        let sample = parse_sample(&mut cursor, layout)
            .ok_or(short(kind))?
            .into_owned_reusing(spare_stacks);
        return Ok(TimedRecord {
            time: sample.time,
            record: Record::Sample(Box::new(sample)),
        });
    }
    // Every other record ends with the sample_id trailer.
    let body_end = bytes
        .len()
        .checked_sub(SAMPLE_ID_SIZE)
        .filter(|&end| end >= HEADER_SIZE)
        .ok_or(short(kind))?;
    let mut trailer = Cursor::new(bytes, body_end + SAMPLE_ID_TIME_OFFSET);
    let time = trailer.u64().ok_or(short(kind))?;
    let mut body = Cursor::new(&bytes[..body_end], HEADER_SIZE);
    let record = match kind {
        sys::PERF_RECORD_MMAP2 => parse_mmap2(&mut body, misc).map(ProcessEvent::Map),
        sys::PERF_RECORD_COMM => {
            let pid = body.u32();
            let tid = body.u32();
            match (pid, tid) {
                (Some(pid), Some(tid)) => Some(ProcessEvent::Comm {
                    pid,
                    tid,
                    name: c_string(&bytes[body.position..body_end]),
                    exec: misc & sys::PERF_RECORD_MISC_COMM_EXEC != 0,
                }),
                _ => None,
            }
        }
        sys::PERF_RECORD_FORK | sys::PERF_RECORD_EXIT => (|| {
            let pid = body.u32()?;
            let ppid = body.u32()?;
            let tid = body.u32()?;
            let ptid = body.u32()?;
            let _time = body.u64()?;
            Some(if kind == sys::PERF_RECORD_FORK {
                ProcessEvent::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                }
            } else {
                ProcessEvent::Exit { pid, tid }
            })
        })(),
        sys::PERF_RECORD_LOST => {
            let _id = body.u64().ok_or(short(kind))?;
            let lost = body.u64().ok_or(short(kind))?;
            return Ok(TimedRecord {
                time,
                record: Record::Lost(lost),
            });
        }
        sys::PERF_RECORD_LOST_SAMPLES => {
            let lost = body.u64().ok_or(short(kind))?;
            return Ok(TimedRecord {
                time,
                record: Record::Lost(lost),
            });
        }
        sys::PERF_RECORD_THROTTLE | sys::PERF_RECORD_UNTHROTTLE => {
            return Ok(TimedRecord {
                time,
                record: if kind == sys::PERF_RECORD_THROTTLE {
                    Record::Throttle
                } else {
                    Record::Unthrottle
                },
            });
        }
        other => {
            return Ok(TimedRecord {
                time,
                record: Record::Ignored(other),
            })
        }
    };
    let event = record.ok_or(short(kind))?;
    Ok(TimedRecord {
        time,
        record: Record::Process(event),
    })
}

/// Decodes one whole sample record (header included) without copying its
/// stack.
pub fn parse_sample_view(
    bytes: &[u8],
    layout: SampleLayout,
) -> Result<SampleView<'_>, MalformedRecord> {
    let short = MalformedRecord::Short {
        kind: sys::PERF_RECORD_SAMPLE,
        size: bytes.len(),
    };
    let declared = bytes
        .get(6..8)
        .map(|size| u16::from_ne_bytes([size[0], size[1]]) as usize)
        .ok_or(short)?;
    if declared != bytes.len() || declared < HEADER_SIZE || !is_sample(bytes) {
        return Err(MalformedRecord::BadSize {
            declared,
            available: bytes.len(),
        });
    }
    parse_sample(&mut Cursor::new(bytes, HEADER_SIZE), layout).ok_or(short)
}

fn parse_sample<'a>(cursor: &mut Cursor<'a>, layout: SampleLayout) -> Option<SampleView<'a>> {
    let ip = cursor.u64()?;
    let pid = cursor.u32()?;
    let tid = cursor.u32()?;
    let time = cursor.u64()?;
    let cpu = cursor.u32()?;
    let _reserved = cursor.u32()?;
    // Without it, the event's own fixed period weighs the sample.
    let mut period = if layout.period { cursor.u64()? } else { 1 };
    let kernel_frames = parse_callchain(cursor)?;
    if let Some((offset, size)) = layout.raw_field {
        // `PERF_SAMPLE_RAW`: its size (which pads the field to 8 bytes),
        // then the tracepoint's record; the field asked for weighs the
        // sample (0 when the record is shorter than it says).
        let raw_size = cursor.u32()? as usize;
        let raw = cursor.take(raw_size)?;
        period = raw_field(raw, offset as usize, size as usize).unwrap_or(0);
    }
    let abi = cursor.u64()?;
    let regs = if abi == sys::PERF_SAMPLE_REGS_ABI_NONE as u64 {
        None
    } else {
        let mut regs = UserRegs::new(0, 0, 0);
        for (_, slot) in sampled_regs::SAMPLED {
            sampled_regs::store(&mut regs, slot, cursor.u64()?)?;
        }
        regs.known = UserRegs::ALL_KNOWN;
        Some(regs)
    };
    let stack_size = usize::try_from(cursor.u64()?).ok()?;
    let stack = if stack_size == 0 {
        &[][..]
    } else {
        let data = cursor.take(stack_size)?;
        // Only the first dyn_size bytes were copied from the thread's stack.
        let valid = usize::try_from(cursor.u64()?).ok()?.min(stack_size);
        &data[..valid]
    };
    Some(SampleView {
        ip,
        pid,
        tid,
        time,
        cpu,
        period,
        event: 0,
        regs,
        stack,
        kernel_frames,
    })
}

/// The `size`-byte field at `offset` of a raw record, as a number in this
/// machine's byte order.
fn raw_field(raw: &[u8], offset: usize, size: usize) -> Option<u64> {
    let bytes = raw.get(offset..offset.checked_add(size)?)?;
    Some(match size {
        1 => u64::from(bytes[0]),
        2 => u64::from(u16::from_ne_bytes(bytes.try_into().ok()?)),
        4 => u64::from(u32::from_ne_bytes(bytes.try_into().ok()?)),
        8 => u64::from_ne_bytes(bytes.try_into().ok()?),
        _ => return None,
    })
}

/// `PERF_SAMPLE_CALLCHAIN`: `nr` addresses, with context markers
/// (`PERF_CONTEXT_KERNEL`, …: the top 4095 values) between the kernel and
/// user parts. The user part is never asked for
/// (`exclude_callchain_user`): the kernel addresses are what is kept.
fn parse_callchain(cursor: &mut Cursor<'_>) -> Option<Vec<u64>> {
    /// `PERF_CONTEXT_MAX` (-4095): values from it up are markers.
    const FIRST_CONTEXT_MARKER: u64 = (-4095i64) as u64;
    let count = usize::try_from(cursor.u64()?).ok()?;
    let bytes = cursor.take(count.checked_mul(8)?)?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|word| u64::from_ne_bytes(word.try_into().unwrap_or_default()))
            .filter(|&address| address < FIRST_CONTEXT_MARKER)
            .collect(),
    )
}

fn parse_mmap2(body: &mut Cursor<'_>, misc: u32) -> Option<MappingRecord> {
    let pid = body.u32()?;
    let _tid = body.u32()?;
    let start = body.u64()?;
    let len = body.u64()?;
    let file_offset = body.u64()?;
    // Either { maj, min, ino, ino_generation } or, with
    // PERF_RECORD_MISC_MMAP_BUILD_ID (5.12+), a build id of the same size.
    let major = body.u32()?;
    let minor = body.u32()?;
    let inode = body.u64()?;
    let _generation = body.u64()?;
    let (dev, inode) = if misc & sys::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
        (0, 0)
    } else {
        (libc::makedev(major, minor), inode)
    };
    let prot = body.u32()?;
    let _flags = body.u32()?;
    let path = c_string(&body.bytes[body.position..]);
    Some(MappingRecord {
        pid,
        start,
        len,
        file_offset,
        dev,
        inode,
        prot,
        path,
    })
}

/// The NUL-terminated (and NUL-padded) string at the start of `bytes`.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds records the way the kernel lays them out, for parser tests.
    pub(crate) struct RecordBuilder {
        bytes: Vec<u8>,
    }

    impl RecordBuilder {
        pub(crate) fn new(kind: u32, misc: u16) -> Self {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&kind.to_ne_bytes());
            bytes.extend_from_slice(&misc.to_ne_bytes());
            bytes.extend_from_slice(&0u16.to_ne_bytes());
            Self { bytes }
        }
        pub(crate) fn u32(mut self, value: u32) -> Self {
            self.bytes.extend_from_slice(&value.to_ne_bytes());
            self
        }
        pub(crate) fn u64(mut self, value: u64) -> Self {
            self.bytes.extend_from_slice(&value.to_ne_bytes());
            self
        }
        pub(crate) fn bytes(mut self, value: &[u8]) -> Self {
            self.bytes.extend_from_slice(value);
            self
        }
        /// A NUL-terminated string padded to 8 bytes.
        pub(crate) fn string(mut self, value: &str) -> Self {
            self.bytes.extend_from_slice(value.as_bytes());
            self.bytes.push(0);
            while !self.bytes.len().is_multiple_of(8) {
                self.bytes.push(0);
            }
            self
        }
        pub(crate) fn sample_id(self, pid: u32, tid: u32, time: u64, cpu: u32) -> Self {
            self.u32(pid).u32(tid).u64(time).u32(cpu).u32(0)
        }
        pub(crate) fn finish(mut self) -> Vec<u8> {
            let size = self.bytes.len() as u16;
            self.bytes[6..8].copy_from_slice(&size.to_ne_bytes());
            self.bytes
        }
    }

    pub(crate) fn sample_record(pid: u32, time: u64, stack: &[u8], dyn_size: u64) -> Vec<u8> {
        let builder = RecordBuilder::new(sys::PERF_RECORD_SAMPLE, 2)
            .u64(0x401000)
            .u32(pid)
            .u32(pid + 1)
            .u64(time)
            .u32(1)
            .u32(0)
            .u64(1_001_000)
            .u64(0)
            .u64(sys::PERF_SAMPLE_REGS_ABI_64 as u64);
        let builder = sampled_regs::SAMPLED
            .iter()
            .fold(builder, |builder, (_, slot)| {
                builder.u64(match slot {
                    sampled_regs::Slot::Ip => 0x401000,
                    sampled_regs::Slot::Sp => 0x7ff0_0000_0000,
                    sampled_regs::Slot::Bp => 0x7ff0_0000_0100,
                    sampled_regs::Slot::Lr => 0x401234,
                    sampled_regs::Slot::Other(register) => 0xa000 + u64::from(*register),
                })
            })
            .u64(stack.len() as u64)
            .bytes(stack);
        let builder = if stack.is_empty() {
            builder
        } else {
            builder.u64(dyn_size)
        };
        builder.finish()
    }

    #[test]
    fn a_raw_field_weighs_the_sample_and_the_period_may_be_absent() {
        // A tracepoint's sample without its period, with a 12-byte raw
        // record (size 12: 4 + 12 = 16, aligned) whose bytes 4..8 are 777.
        let mut raw = vec![0u8; 12];
        raw[4..8].copy_from_slice(&777u32.to_ne_bytes());
        let builder = RecordBuilder::new(sys::PERF_RECORD_SAMPLE, 2)
            .u64(0x401000)
            .u32(7)
            .u32(8)
            .u64(99)
            .u32(1)
            .u32(0)
            .u64(0) // an empty call chain
            .u32(raw.len() as u32)
            .bytes(&raw)
            .u64(sys::PERF_SAMPLE_REGS_ABI_NONE as u64)
            .u64(0); // no stack
        let record = builder.finish();
        let layout = |raw_field| SampleLayout {
            period: false,
            raw_field,
        };
        let sample = parse_sample_view(&record, layout(Some((4, 4)))).unwrap();
        assert_eq!((sample.pid, sample.tid, sample.period), (7, 8, 777));
        assert!(sample.regs.is_none());
        // A field past the record's end weighs 0; the record still parses.
        let sample = parse_sample_view(&record, layout(Some((10, 4)))).unwrap();
        assert_eq!(sample.period, 0);
        // Read as the default layout, the same bytes are malformed, not misread.
        assert!(parse_sample_view(&record, SampleLayout::DEFAULT).is_err());
        assert_eq!(raw_field(&raw, 4, 2), Some(777));
        assert_eq!(raw_field(&raw, usize::MAX, 8), None);
    }

    #[test]
    fn parses_samples_and_keeps_only_the_valid_stack_bytes() {
        let stack: Vec<u8> = (0..64).collect();
        let parsed = parse(&sample_record(42, 1234, &stack, 40)).unwrap();
        assert_eq!(parsed.time, 1234);
        let Record::Sample(sample) = parsed.record else {
            panic!("not a sample: {parsed:?}")
        };
        assert_eq!((sample.pid, sample.tid, sample.cpu), (42, 43, 1));
        assert_eq!(sample.period, 1_001_000);
        let regs = sample.regs.unwrap();
        assert_eq!(
            (regs.ip, regs.sp, regs.bp),
            (0x401000, 0x7ff0_0000_0000, 0x7ff0_0000_0100)
        );
        // The others by DWARF number (0 RAX, 1 RDX, 2 RCX, 3 RBX, ...).
        for register in (0..6).chain(8..16) {
            assert_eq!(regs.register(register), Some(0xa000 + u64::from(register)));
        }
        assert_eq!(sample.stack, stack[..40]);
    }

    /// A spare buffer from an earlier, deeper sample holds only this
    /// sample's valid bytes afterwards.
    #[test]
    fn a_reused_stack_buffer_holds_only_the_new_samples_bytes() {
        let mut spare = vec![vec![0xaa_u8; 100]];
        let reused = spare[0].as_ptr();
        let stack: Vec<u8> = (0..64).collect();
        let record = sample_record(42, 1234, &stack, 40);
        let Record::Sample(sample) = parse_reusing(&record, &mut spare, SampleLayout::DEFAULT)
            .unwrap()
            .record
        else {
            panic!("not a sample")
        };
        assert_eq!(sample.stack, stack[..40]);
        assert_eq!(sample.stack.as_ptr(), reused);
        assert!(spare.is_empty());
    }

    #[test]
    fn samples_without_user_registers_have_no_regs_and_no_stack() {
        let record = RecordBuilder::new(sys::PERF_RECORD_SAMPLE, 1)
            .u64(0xffff_ffff_8100_0000)
            .u32(5)
            .u32(5)
            .u64(99)
            .u32(0)
            .u32(0)
            .u64(1000)
            // The kernel part of the call chain, behind its marker.
            .u64(3)
            .u64((-128i64) as u64)
            .u64(0xffff_ffff_8100_0010)
            .u64(0xffff_ffff_8100_0020)
            .u64(sys::PERF_SAMPLE_REGS_ABI_NONE as u64)
            .u64(0)
            .finish();
        let Record::Sample(sample) = parse(&record).unwrap().record else {
            panic!("not a sample")
        };
        assert_eq!(sample.regs, None);
        assert!(sample.stack.is_empty());
        assert_eq!(
            sample.kernel_frames,
            [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020]
        );
    }

    #[test]
    fn parses_mmap2_comm_fork_exit_and_losses() {
        let mmap = RecordBuilder::new(sys::PERF_RECORD_MMAP2, 2)
            .u32(10)
            .u32(11)
            .u64(0x5000)
            .u64(0x2000)
            .u64(0x1000)
            .u32(0xfe)
            .u32(1)
            .u64(777)
            .u64(0)
            .u32((libc::PROT_READ | libc::PROT_EXEC) as u32)
            .u32(libc::MAP_PRIVATE as u32)
            .string("/usr/lib/libfoo.so")
            .sample_id(10, 11, 50, 0)
            .finish();
        let parsed = parse(&mmap).unwrap();
        assert_eq!(parsed.time, 50);
        assert_eq!(
            parsed.record,
            Record::Process(ProcessEvent::Map(MappingRecord {
                pid: 10,
                start: 0x5000,
                len: 0x2000,
                file_offset: 0x1000,
                dev: libc::makedev(0xfe, 1),
                inode: 777,
                prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
                path: "/usr/lib/libfoo.so".into(),
            }))
        );

        let comm = RecordBuilder::new(
            sys::PERF_RECORD_COMM,
            sys::PERF_RECORD_MISC_COMM_EXEC as u16,
        )
        .u32(10)
        .u32(10)
        .string("forker_child")
        .sample_id(10, 10, 60, 0)
        .finish();
        assert_eq!(
            parse(&comm).unwrap().record,
            Record::Process(ProcessEvent::Comm {
                pid: 10,
                tid: 10,
                name: "forker_child".into(),
                exec: true
            })
        );

        let fork = RecordBuilder::new(sys::PERF_RECORD_FORK, 0)
            .u32(12)
            .u32(10)
            .u32(12)
            .u32(10)
            .u64(70)
            .sample_id(12, 12, 70, 1)
            .finish();
        assert_eq!(
            parse(&fork).unwrap().record,
            Record::Process(ProcessEvent::Fork {
                pid: 12,
                ppid: 10,
                tid: 12,
                ptid: 10
            })
        );
        let exit = RecordBuilder::new(sys::PERF_RECORD_EXIT, 0)
            .u32(12)
            .u32(10)
            .u32(13)
            .u32(10)
            .u64(80)
            .sample_id(12, 13, 80, 1)
            .finish();
        assert_eq!(
            parse(&exit).unwrap().record,
            Record::Process(ProcessEvent::Exit { pid: 12, tid: 13 })
        );

        let lost = RecordBuilder::new(sys::PERF_RECORD_LOST, 0)
            .u64(1)
            .u64(17)
            .sample_id(0, 0, 90, 0)
            .finish();
        assert_eq!(parse(&lost).unwrap().record, Record::Lost(17));
        let lost_samples = RecordBuilder::new(sys::PERF_RECORD_LOST_SAMPLES, 0)
            .u64(5)
            .sample_id(0, 0, 91, 0)
            .finish();
        assert_eq!(parse(&lost_samples).unwrap().record, Record::Lost(5));
        let throttle = RecordBuilder::new(sys::PERF_RECORD_THROTTLE, 0)
            .u64(92)
            .u64(1)
            .u64(1)
            .sample_id(0, 0, 92, 0)
            .finish();
        assert_eq!(parse(&throttle).unwrap().record, Record::Throttle);
    }

    #[test]
    fn short_and_inconsistent_records_are_errors() {
        let stack = [0u8; 32];
        let full = sample_record(1, 2, &stack, 32);
        // Every truncation of a valid record (with its size field fixed up) fails cleanly.
        for len in 0..full.len() {
            let mut cut = full[..len].to_vec();
            if cut.len() >= 8 {
                cut[6..8].copy_from_slice(&(len as u16).to_ne_bytes());
            }
            assert!(parse(&cut).is_err(), "a {len}-byte cut parsed");
        }
        // A size field that disagrees with the bytes.
        let mut lying = full.clone();
        lying[6..8].copy_from_slice(&4u16.to_ne_bytes());
        assert!(parse(&lying).is_err());
        // A stack size larger than the record.
        let mut huge = full;
        // header, ip, pid+tid, time, cpu, period, callchain nr, abi, registers
        let stack_size_at = 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 * sampled_regs::COUNT;
        huge[stack_size_at..stack_size_at + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert!(parse(&huge).is_err());
        // A comm record too short for its trailer.
        let comm = RecordBuilder::new(sys::PERF_RECORD_COMM, 0).u32(1).finish();
        assert!(parse(&comm).is_err());
    }
}
