//! pprof encoding of aggregated, symbolized profiles.
//!
//! The profile follows what Datadog's own profilers send for CPU profiles:
//! sample types `cpu-samples`/`count` and `cpu-time`/`nanoseconds`, labels
//! `process_id`, `process_name`, `thread id`, `thread_name`,
//! `container_id` (as the C++ ddprof, when the process runs in one) and, for the
//! timeline, `end_timestamp_ns`. Each mapped file gets its own address range
//! in the profile (files from many processes share one profile), so a
//! location's address is `memory_start + file offset`.
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The mapping of kernel frames, as perf names it.
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

use prost::Message;

use crate::aggregate::Frame;
use crate::symbolize::SymbolizedProfile;
use crate::trace_context::LabelValue;

/// The messages of pprof's `profile.proto`, written by hand so the build
/// needs no protoc.
pub mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// (name, system name, file) of a pprof function.
type FunctionKey = (Arc<str>, Arc<str>, Arc<str>);

/// Where kernel frames are reported: the kernel's half of the address space.
/// Compression level of the uploaded pprof: what libdatadog uses.
pub const UPLOAD_ZSTD_LEVEL: i32 = 1;

const KERNEL_START: u64 = 0xffff_8000_0000_0000;
/// File ranges start above the null page.
const FIRST_FILE_BASE: u64 = 0x1_0000;

/// One sampled event's place in the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfiledEvent {
    /// Its index in the session's list (its samples' `event`).
    pub index: u16,
    /// `sCPU`: its samples are `cpu-samples`/`count` and
    /// `cpu-time`/`nanoseconds`, as Datadog's profilers name them.
    pub cpu_time: bool,
    /// `sALLOC`: its samples are `alloc-samples`/`count` and
    /// `alloc-space`/`bytes`, as Datadog's profilers name them, each sample
    /// scaled by the inverse of its probability of being sampled.
    pub allocation: bool,
    /// The live heap of a `sALLOC mode=l` event (its index is
    /// [`crate::events::live_heap_index`] of the event's): its samples are
    /// `inuse-objects`/`count` and `inuse-space`/`bytes`, the sampled
    /// allocations not freed at the end of the period, scaled as above.
    pub live_heap: bool,
    /// `sWALL`: its samples are `wall-time`/`nanoseconds`, as Datadog's
    /// profilers name it: the time off a CPU of its waits, and the CPU-time
    /// event's samples fill the column too (a thread's wall time is its
    /// time on a CPU and off it).
    pub wall_time: bool,
    /// The event's label (`sPF`, `sched:sched_switch`, `l=`): any other
    /// event's samples are `LABEL`/`events`, and carry the label as
    /// `tracepoint_type`, as the C++ ddprof labels them.
    pub label: std::sync::Arc<str>,
}

impl ProfiledEvent {
    /// The profile's events for `spec`: one, but for `sALLOC`, whose
    /// allocations (`mode=s`) and live heap (`mode=l`) are one each, two
    /// with `mode=sl`.
    pub fn of(spec: &crate::events::EventSpec) -> Vec<Self> {
        let event = Self {
            index: spec.index(),
            cpu_time: spec.is_cpu_time(),
            allocation: false,
            live_heap: false,
            wall_time: spec.is_wall_time(),
            label: spec.label.clone(),
        };
        match spec.kind {
            crate::events::EventKind::Allocation { sum, live } => {
                let mut events = Vec::new();
                if sum {
                    events.push(Self {
                        allocation: true,
                        ..event.clone()
                    });
                }
                if live {
                    events.push(Self {
                        index: crate::events::live_heap_index(spec.index()),
                        live_heap: true,
                        ..event
                    });
                }
                events
            }
            _ => vec![event],
        }
    }

    /// `sCPU` alone, the default.
    pub fn cpu_time_only() -> Vec<Self> {
        vec![Self {
            index: 0,
            cpu_time: true,
            allocation: false,
            live_heap: false,
            wall_time: false,
            label: "sCPU".into(),
        }]
    }

    /// The profile's sample types (`type`, `unit`) for this event.
    fn columns(&self) -> Vec<(&str, &'static str)> {
        if self.cpu_time {
            vec![("cpu-samples", "count"), ("cpu-time", "nanoseconds")]
        } else if self.allocation {
            vec![("alloc-samples", "count"), ("alloc-space", "bytes")]
        } else if self.live_heap {
            vec![("inuse-objects", "count"), ("inuse-space", "bytes")]
        } else if self.wall_time {
            vec![("wall-time", "nanoseconds")]
        } else {
            vec![(&*self.label, "events")]
        }
    }
}

/// What the profile says beyond its samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileMetadata {
    /// The sampled events, in the order of their columns in the profile
    /// (none: `sCPU`'s).
    pub events: Vec<ProfiledEvent>,
    /// Nominal CPU time between two samples (1e9 / frequency), pprof's `period`.
    pub sampling_period_nanos: u64,
    /// pprof's free-form comments: the period's overhead figures
    /// (`ddprof.overhead.NAME=VALUE`, see [`crate::overhead`]).
    pub comments: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot compress the pprof profile: {0}")]
    Compress(#[from] std::io::Error),
}

/// Encodes the profile as gzip-compressed pprof, as Datadog's intake and
/// `go tool pprof` read it.
pub fn encode_pprof(
    profile: &SymbolizedProfile,
    metadata: &ProfileMetadata,
) -> Result<Vec<u8>, ProfileError> {
    let encoded = encode_pprof_compressed(
        profile,
        metadata,
        Compressions {
            gzip: true,
            zstd: false,
        },
    )?;
    Ok(encoded.gzip.unwrap_or_default())
}

/// Which compressed forms to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressions {
    /// For local files and `go tool pprof`.
    pub gzip: bool,
    /// For the upload (level [`UPLOAD_ZSTD_LEVEL`], as libdatadog).
    pub zstd: bool,
}

/// The pprof in each asked-for compression.
#[derive(Debug, Default)]
pub struct CompressedPprof {
    pub gzip: Option<Vec<u8>>,
    pub zstd: Option<Vec<u8>>,
}

/// Encodes the profile once, streaming the protobuf into every asked-for
/// compressor at the same time.
pub fn encode_pprof_compressed(
    profile: &SymbolizedProfile,
    metadata: &ProfileMetadata,
    compressions: Compressions,
) -> Result<CompressedPprof, ProfileError> {
    let mut compressors = ChunkedCompressors::new(compressions)?;
    // Samples first, each encoded as it is built (field 2, `sample`), then
    // every other field: protobuf readers accept fields in any order, and
    // repeated ones keep theirs.
    let mut group = SampleGroupEncoder::default();
    let mut failed = None;
    let rest = build_pprof_streaming_samples(profile, metadata, |part| {
        if let Err(error) = group.write(part, &mut |bytes| compressors.write_all(bytes)) {
            failed.get_or_insert(error);
        }
    });
    if let Some(error) = failed {
        return Err(error.into());
    }
    compressors.write_all(&rest.encode_to_vec())?;
    Ok(compressors.finish()?)
}

/// The asked-for compressors, fed in chunks of [`ChunkedCompressors::CHUNK`]
/// bytes. A sample is a few dozen bytes, written in three parts, and each
/// write into a compressor is a call into deflate (or zstd) whatever its
/// size: fed part by part, gzip cost ~1 µs a sample, as much as the rest of
/// the encoding.
struct ChunkedCompressors {
    pending: Vec<u8>,
    gzip: Option<flate2::write::GzEncoder<Vec<u8>>>,
    zstd: Option<zstd::stream::write::Encoder<'static, Vec<u8>>>,
}

impl ChunkedCompressors {
    const CHUNK: usize = 64 * 1024;

    fn new(compressions: Compressions) -> std::io::Result<Self> {
        // The fastest gzip level: with the timeline every sample is a pprof
        // sample of its whole stack (~800 bytes raw on the 300-frame
        // recursion), and the default level took ~3x longer for files only
        // ~15 % smaller.
        let gzip = compressions
            .gzip
            .then(|| flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        let zstd = match compressions.zstd {
            true => Some(zstd::stream::write::Encoder::new(
                Vec::new(),
                UPLOAD_ZSTD_LEVEL,
            )?),
            false => None,
        };
        Ok(Self {
            pending: Vec::with_capacity(Self::CHUNK),
            gzip,
            zstd,
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= Self::CHUNK {
            self.feed()?;
        }
        Ok(())
    }

    fn feed(&mut self) -> std::io::Result<()> {
        if let Some(encoder) = &mut self.gzip {
            encoder.write_all(&self.pending)?;
        }
        if let Some(encoder) = &mut self.zstd {
            encoder.write_all(&self.pending)?;
        }
        self.pending.clear();
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<CompressedPprof> {
        self.feed()?;
        Ok(CompressedPprof {
            gzip: self.gzip.map(|encoder| encoder.finish()).transpose()?,
            zstd: self.zstd.map(|encoder| encoder.finish()).transpose()?,
        })
    }
}

#[derive(Default)]
struct StringTable {
    strings: Vec<String>,
    ids: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> Self {
        let mut table = Self::default();
        // pprof requires the empty string first.
        table.id("");
        table
    }

    fn id(&mut self, text: &str) -> i64 {
        if let Some(id) = self.ids.get(text) {
            return *id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.ids.insert(text.to_string(), id);
        id
    }
}

fn unix_nanos(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// What [`build_pprof_streaming_samples`] hands out, in order: the stack and
/// labels that a group of samples shares, then each sample of that group.
/// With the timeline a group is every sample of one stack in one thread
/// (hundreds at 999 Hz), each its own pprof sample with its timestamp.
enum SamplePart<'a> {
    /// `location_id` and the labels every sample of the group has; no value.
    Group(&'a pb::Sample),
    /// One sample of the last group: its values and, on the timeline, its
    /// `end_timestamp_ns` label (after the group's labels).
    Sample {
        values: &'a [i64],
        timestamp: Option<pb::Label>,
    },
}

/// Encodes the samples of a group as `Profile.sample` fields, with the
/// group's part (the stack's location ids, ~450 bytes on a 300-frame stack,
/// and the shared labels) encoded once rather than once per sample: on the
/// 300-deep recursion at 999 Hz that encoding was 1.1 µs of each sample.
/// A sample's fields come as location ids and shared labels, values, then
/// the timestamp label: readers accept fields in any order and keep the
/// order of a repeated field's elements, so it decodes to the same sample.
#[derive(Default)]
struct SampleGroupEncoder {
    shared: Vec<u8>,
    own: Vec<u8>,
    header: Vec<u8>,
}

impl SampleGroupEncoder {
    fn write(
        &mut self,
        part: SamplePart<'_>,
        write_all: &mut impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        use prost::encoding::{encode_key, encode_varint, int64, message, uint64, WireType};
        match part {
            SamplePart::Group(shared) => {
                self.shared.clear();
                uint64::encode_packed(1, &shared.location_id, &mut self.shared);
                for label in &shared.label {
                    message::encode(3, label, &mut self.shared);
                }
                Ok(())
            }
            SamplePart::Sample { values, timestamp } => {
                self.own.clear();
                int64::encode_packed(2, values, &mut self.own);
                if let Some(label) = &timestamp {
                    message::encode(3, label, &mut self.own);
                }
                self.header.clear();
                encode_key(2, WireType::LengthDelimited, &mut self.header);
                encode_varint(
                    (self.shared.len() + self.own.len()) as u64,
                    &mut self.header,
                );
                write_all(&self.header)?;
                write_all(&self.shared)?;
                write_all(&self.own)
            }
        }
    }
}

/// Builds the profile but hands each sample to `emit` instead of keeping
/// it: the returned profile has no samples. A minute at 999 Hz with the
/// timeline is 60,000 samples, about 25 MB as `pb::Sample`s; streamed, the
/// profiler's peak memory does not grow with the period.
fn build_pprof_streaming_samples(
    profile: &SymbolizedProfile,
    metadata: &ProfileMetadata,
    mut emit: impl FnMut(SamplePart<'_>),
) -> pb::Profile {
    let period = &profile.period;
    let mut strings = StringTable::new();
    let value_type = |strings: &mut StringTable, kind: &str, unit: &str| pb::ValueType {
        r#type: strings.id(kind),
        unit: strings.id(unit),
    };
    let default_events;
    let events = if metadata.events.is_empty() {
        default_events = ProfiledEvent::cpu_time_only();
        &default_events
    } else {
        &metadata.events
    };
    // Each event's first column, by event index.
    let mut first_column: HashMap<u16, (usize, bool)> = HashMap::new();
    let mut sample_type = Vec::new();
    for event in events {
        first_column.insert(
            event.index,
            (
                sample_type.len(),
                event.cpu_time || event.allocation || event.live_heap,
            ),
        );
        for (kind, unit) in event.columns() {
            sample_type.push(value_type(&mut strings, kind, unit));
        }
    }
    // The wall-time column, which the CPU-time samples fill too.
    let wall_column = events
        .iter()
        .find(|event| event.wall_time)
        .and_then(|event| first_column.get(&event.index))
        .map(|&(column, _)| column);
    let cpu_time_events: Vec<u16> = events
        .iter()
        .filter(|event| event.cpu_time)
        .map(|event| event.index)
        .collect();
    // The CPU time a sample stands for when CPU time is sampled; else the
    // first event's unit.
    let period_type = if events.iter().any(|event| event.cpu_time) {
        value_type(&mut strings, "cpu-time", "nanoseconds")
    } else {
        sample_type[0]
    };

    // One mapping per file referenced, each with its own address range.
    let mut file_span: HashMap<u32, u64> = HashMap::new();
    let mut has_kernel = false;
    for frame in &period.frames {
        match frame {
            Frame::File { file, offset } => {
                let span = file_span.entry(file.0).or_default();
                *span = (*span).max(offset + 1);
            }
            Frame::Kernel { .. } => has_kernel = true,
            _ => {}
        }
    }
    let mut files: Vec<u32> = file_span.keys().copied().collect();
    files.sort_unstable();
    let mut mappings = Vec::with_capacity(files.len() + 1);
    let mut file_mapping: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut base = FIRST_FILE_BASE;
    for file in files {
        let object = period.file(crate::aggregate::FileId(file));
        let limit = base + file_span[&file].next_multiple_of(0x1000);
        let id = mappings.len() as u64 + 1;
        mappings.push(pb::Mapping {
            id,
            memory_start: base,
            memory_limit: limit,
            file_offset: 0,
            filename: strings.id(&object.path),
            build_id: strings.id(&object.build_id_hex()),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        file_mapping.insert(file, (id, base));
        base = limit;
    }
    let kernel_mapping = has_kernel.then(|| {
        let id = mappings.len() as u64 + 1;
        mappings.push(pb::Mapping {
            id,
            memory_start: KERNEL_START,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename: strings.id(KERNEL_MAPPING_NAME),
            build_id: 0,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        id
    });

    // One location per distinct frame, one function per distinct
    // (name, system name, file).
    let mut functions: Vec<pb::Function> = Vec::new();
    let mut function_ids: HashMap<FunctionKey, u64> = HashMap::new();
    let mut locations = Vec::with_capacity(period.frames.len());
    for (index, (frame, symbols)) in period.frames.iter().zip(&profile.frames).enumerate() {
        let (mapping_id, address) = match frame {
            Frame::File { file, offset } => {
                let (id, base) = file_mapping[&file.0];
                (id, base + offset)
            }
            Frame::Kernel { addr } => (kernel_mapping.unwrap_or(0), *addr),
            Frame::Anonymous { addr, .. } => (0, *addr),
            Frame::Unknown | Frame::Truncated | Frame::StackTableFull => (0, 0),
        };
        let line = symbols
            .iter()
            .map(|symbol| {
                let key = (
                    symbol.function.clone(),
                    symbol.system_name.clone(),
                    symbol.file.clone(),
                );
                let function_id = *function_ids.entry(key).or_insert_with(|| {
                    let id = functions.len() as u64 + 1;
                    functions.push(pb::Function {
                        id,
                        name: strings.id(&symbol.function),
                        system_name: strings.id(&symbol.system_name),
                        filename: strings.id(&symbol.file),
                        start_line: 0,
                    });
                    id
                });
                pb::Line {
                    function_id,
                    line: i64::from(symbol.line),
                    column: 0,
                }
            })
            .collect();
        locations.push(pb::Location {
            id: index as u64 + 1,
            mapping_id,
            address,
            line,
            is_folded: false,
        });
    }

    let key_process_id = strings.id("process_id");
    let key_process_name = strings.id("process_name");
    let key_thread_id = strings.id("thread id");
    let key_thread_name = strings.id("thread_name");
    let key_container_id = strings.id("container_id");
    let key_timestamp = strings.id("end_timestamp_ns");
    // One sample buffer, refilled for each sample.
    let mut sample = pb::Sample::default();
    let num = |key, value: u64| pb::Label {
        key,
        num: value.min(i64::MAX as u64) as i64,
        ..pb::Label::default()
    };
    let key_tracepoint_type = strings.id("tracepoint_type");
    let mut values = vec![0i64; sample_type.len()];
    // Fills the columns of `event` (zero elsewhere) with what the samples
    // stand for in thousandths (`scaled_count`) and their weight; false
    // for an event the profile has no column for.
    let fill = |values: &mut [i64], event: u16, scaled_count: u64, weight: u64| {
        values.fill(0);
        let clamp = |value: u64| value.min(i64::MAX as u64) as i64;
        let unit = crate::events::COUNT_UNIT;
        match first_column.get(&event) {
            Some(&(column, true)) => {
                values[column] = clamp(scaled_count.saturating_add(unit / 2) / unit);
                values[column + 1] = clamp(weight);
                if let Some(wall) = wall_column.filter(|_| cpu_time_events.contains(&event)) {
                    values[wall] = clamp(weight);
                }
                true
            }
            Some(&(column, false)) => {
                values[column] = clamp(weight);
                true
            }
            None => false,
        }
    };
    let labels: HashMap<u16, i64> = events
        .iter()
        .filter(|event| {
            !event.cpu_time && !event.allocation && !event.live_heap && !event.wall_time
        })
        .map(|event| (event.index, strings.id(&event.label)))
        .collect();
    for stack_sample in &period.samples {
        sample.location_id.clear();
        sample.location_id.extend(
            period.stacks[stack_sample.stack as usize]
                .iter()
                .map(|&frame| u64::from(frame) + 1),
        );
        sample.label.clear();
        sample.label.extend([
            num(key_process_id, u64::from(stack_sample.pid)),
            num(key_thread_id, u64::from(stack_sample.tid)),
        ]);
        for (key, value) in [
            (key_process_name, &stack_sample.process_name),
            (key_thread_name, &stack_sample.thread_name),
            (key_container_id, &stack_sample.container_id),
        ] {
            if let Some(value) = value {
                let str = strings.id(value);
                sample.label.push(pb::Label {
                    key,
                    str,
                    ..pb::Label::default()
                });
            }
        }
        for (key, value) in stack_sample.trace.iter().flat_map(|trace| trace.labels()) {
            let (key, (num, str)) = match value {
                LabelValue::Num(num) => (strings.id(key), (num, 0)),
                LabelValue::Str(text) => (strings.id(key), (0, strings.id(text))),
            };
            sample.label.push(pb::Label {
                key,
                num,
                str,
                ..pb::Label::default()
            });
        }
        if let Some(&label) = labels.get(&stack_sample.event) {
            sample.label.push(pb::Label {
                key: key_tracepoint_type,
                str: label,
                ..pb::Label::default()
            });
        }
        emit(SamplePart::Group(&sample));
        let mut timed_nanos = 0u64;
        let mut timed_count = 0u64;
        for timed in &stack_sample.timeline {
            timed_nanos = timed_nanos.saturating_add(timed.cpu_nanos);
            timed_count = timed_count.saturating_add(timed.scaled_count);
            if fill(
                &mut values,
                stack_sample.event,
                timed.scaled_count,
                timed.cpu_nanos,
            ) {
                emit(SamplePart::Sample {
                    values: &values,
                    timestamp: Some(num(key_timestamp, timed.end_timestamp_ns)),
                });
            }
        }
        let rest_count = stack_sample.count - stack_sample.timeline.len() as u64;
        let rest_scaled_count = stack_sample.scaled_count.saturating_sub(timed_count);
        let rest_weight = stack_sample.cpu_nanos.saturating_sub(timed_nanos);
        if rest_count > 0
            && fill(
                &mut values,
                stack_sample.event,
                rest_scaled_count,
                rest_weight,
            )
        {
            emit(SamplePart::Sample {
                values: &values,
                timestamp: None,
            });
        }
    }

    let comments = metadata
        .comments
        .iter()
        .map(|comment| strings.id(comment))
        .collect();
    pb::Profile {
        sample_type,
        sample: Vec::new(),
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: strings.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: unix_nanos(period.start),
        duration_nanos: unix_nanos(period.end).saturating_sub(unix_nanos(period.start)),
        period_type: Some(period_type),
        period: metadata.sampling_period_nanos.min(i64::MAX as u64) as i64,
        comment: comments,
        default_sample_type: 0,
    }
}
