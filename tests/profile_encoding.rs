//! The pprof encoder, read back as any pprof reader would: with the
//! harness's own declaration of profile.proto (`ddprof_tests::pprof`), not
//! with the encoder's types, and checked against what the period held
//! rather than against another encoding of the encoder's.
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ddprof::aggregate::{FileId, Frame, PeriodProfile, PeriodStats, StackSample, TimedSample};
use ddprof::files::ObjectFile;
use ddprof::profile::{encode_pprof, encode_pprof_compressed, Compressions, ProfileMetadata};
use ddprof::symbolize::{SymbolLine, SymbolizedProfile};
use ddprof_tests::pprof::{gunzip, Profile};

fn line(function: &str, file: &str, line: u32) -> SymbolLine {
    SymbolLine {
        function: function.into(),
        system_name: function.into(),
        file: file.into(),
        line,
    }
}

fn start() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A period of `/bin/app` with `frames` file offsets `0x1000 + i`.
fn period_of_app(frames: u64, stacks: Vec<Box<[u32]>>, samples: Vec<StackSample>) -> PeriodProfile {
    PeriodProfile {
        start: start(),
        end: start() + Duration::from_secs(60),
        perf_maps: Default::default(),
        files: vec![Arc::new(ObjectFile::by_path("/bin/app", 1, 2))],
        frames: (0..frames)
            .map(|i| Frame::File {
                file: FileId(0),
                offset: 0x1000 + i,
            })
            .collect(),
        stacks,
        samples,
        stats: PeriodStats::default(),
    }
}

fn group(stack: u32, tid: u32, count: u64, timeline: Vec<TimedSample>) -> StackSample {
    StackSample {
        event: 0,
        pid: 7,
        tid,
        process_name: Some("app".into()),
        thread_name: None,
        container_id: None,
        trace: None,
        stack,
        count,
        scaled_count: count * ddprof::events::COUNT_UNIT,
        cpu_nanos: 10 * count,
        timeline,
    }
}

fn timed(end_timestamp_ns: u64) -> TimedSample {
    TimedSample {
        end_timestamp_ns,
        cpu_nanos: 10,
        scaled_count: ddprof::events::COUNT_UNIT,
    }
}

/// Each sample as (file offsets of its stack, innermost first; values;
/// its `end_timestamp_ns`), the offsets read from the locations' addresses
/// and their mapping.
fn samples_by_offset(profile: &Profile) -> Vec<(Vec<u64>, Vec<i64>, Option<i64>)> {
    let timestamp_key = profile
        .string_table
        .iter()
        .position(|s| s == "end_timestamp_ns")
        .map(|index| index as i64);
    let offset = |location_id: u64| {
        let location = profile
            .location
            .iter()
            .find(|location| location.id == location_id)
            .expect("every location id of a sample is declared");
        let mapping = profile
            .mapping
            .iter()
            .find(|mapping| mapping.id == location.mapping_id)
            .expect("every mapping id of a location is declared");
        assert!(
            (mapping.memory_start..mapping.memory_limit).contains(&location.address),
            "location {location:?} outside its mapping {mapping:?}"
        );
        location.address - mapping.memory_start + mapping.file_offset
    };
    profile
        .sample
        .iter()
        .map(|sample| {
            let timestamp = sample
                .label
                .iter()
                .find(|label| Some(label.key) == timestamp_key)
                .map(|label| label.num);
            (
                sample.location_id.iter().map(|&id| offset(id)).collect(),
                sample.value.clone(),
                timestamp,
            )
        })
        .collect()
}

/// The compressors are fed in chunks (64 KiB): a profile several chunks
/// long decodes whole, and the same, from either compression.
#[test]
fn a_profile_larger_than_a_compression_chunk_decodes_whole_in_both_compressions() {
    // 300-frame stacks, each sample with its own timestamp.
    let frames = 300u32;
    let stacks = (0..8u32)
        .map(|s| (s..frames).collect::<Box<[u32]>>())
        .collect();
    let samples = (0..8u32)
        .map(|stack| {
            let timeline = (0..200)
                .map(|i| timed(1_000 * u64::from(stack) + i))
                .collect();
            group(stack, 8 + stack, 200, timeline)
        })
        .collect();
    let symbolized = SymbolizedProfile {
        period: period_of_app(u64::from(frames), stacks, samples),
        frames: (0..frames)
            .map(|_| Arc::from([line("f", "a.c", 1)]))
            .collect(),
    };
    let metadata = ProfileMetadata {
        events: Vec::new(),
        sampling_period_nanos: 1,
        comments: vec!["ddprof.test=1".into()],
    };
    let encoded = encode_pprof_compressed(
        &symbolized,
        &metadata,
        Compressions {
            gzip: true,
            zstd: true,
        },
    )
    .unwrap();
    let from_gzip = gunzip(&encoded.gzip.unwrap()).unwrap();
    let from_zstd = zstd::decode_all(encoded.zstd.unwrap().as_slice()).unwrap();
    assert!(from_gzip.len() > 4 * 64 * 1024, "{}", from_gzip.len());
    assert!(from_gzip == from_zstd, "the two compressions differ");
    let profile = Profile::decode(&from_gzip).unwrap();
    assert_eq!(profile.comments(), ["ddprof.test=1"]);
    let samples = samples_by_offset(&profile);
    assert_eq!(samples.len(), 8 * 200);
    for (index, (offsets, values, timestamp)) in samples.iter().enumerate() {
        let stack = (index / 200) as u64;
        let expected: Vec<u64> = (stack..u64::from(frames)).map(|i| 0x1000 + i).collect();
        assert_eq!(offsets, &expected, "sample {index}");
        assert_eq!(values, &[1, 10], "sample {index}");
        assert_eq!(
            *timestamp,
            Some((1_000 * stack + index as u64 % 200) as i64)
        );
    }
    assert_eq!(profile.function_names(), ["f".to_string()].into());
}

/// Each group's stack and labels are encoded once and shared by its
/// samples: every sample still decodes whole, with its own values and
/// timestamp, in order, and the next group's stack is its own.
#[test]
fn samples_of_a_group_share_its_encoded_stack_and_keep_their_own_timestamps() {
    let symbolized = SymbolizedProfile {
        period: period_of_app(
            3,
            vec![Box::new([0, 1, 2]), Box::new([2])],
            vec![
                group(0, 8, 3, vec![timed(101), timed(102), timed(103)]),
                group(1, 9, 3, vec![timed(201)]),
            ],
        ),
        frames: (0..3).map(|_| Arc::from([line("f", "a.c", 1)])).collect(),
    };
    let metadata = ProfileMetadata {
        events: Vec::new(),
        sampling_period_nanos: 1,
        comments: Vec::new(),
    };
    let profile = Profile::decode_gzipped(&encode_pprof(&symbolized, &metadata).unwrap()).unwrap();
    let whole = vec![0x1000, 0x1001, 0x1002];
    assert_eq!(
        samples_by_offset(&profile),
        [
            (whole.clone(), vec![1, 10], Some(101)),
            (whole.clone(), vec![1, 10], Some(102)),
            (whole, vec![1, 10], Some(103)),
            (vec![0x1002], vec![1, 10], Some(201)),
            // The group's samples beyond its timeline: one, without a time.
            (vec![0x1002], vec![2, 20], None),
        ]
    );
    // Every sample carries its group's labels, whichever part of the
    // encoding they came from.
    for (index, labels) in profile.labels().iter().enumerate() {
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let tid = if index < 3 { "8" } else { "9" };
        assert_eq!(
            (
                label("process_id"),
                label("process_name"),
                label("thread id")
            ),
            (Some("7"), Some("app"), Some(tid)),
            "sample {index}: {labels:?}"
        );
    }
}

#[test]
fn encodes_samples_labels_and_inlined_lines() {
    let mut app = ObjectFile::by_path("/bin/app", 1, 2);
    app.build_id = Some(vec![0xab, 0xcd]);
    let mut period = period_of_app(
        0,
        vec![Box::new([0, 1])],
        vec![StackSample {
            thread_name: Some("worker".into()),
            container_id: Some(
                "3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860".into(),
            ),
            ..group(0, 8, 3, vec![timed(99)])
        }],
    );
    period.files = vec![Arc::new(app)];
    period.frames = vec![
        Frame::File {
            file: FileId(0),
            offset: 0x1100,
        },
        Frame::File {
            file: FileId(0),
            offset: 0x1200,
        },
    ];
    let symbolized = SymbolizedProfile {
        period,
        frames: vec![
            Arc::new([line("inner", "a.c", 3), line("outer", "a.c", 10)]),
            Arc::new([line("main", "a.c", 20)]),
        ],
    };
    let metadata = ProfileMetadata {
        events: Vec::new(),
        sampling_period_nanos: 10_101_010,
        comments: vec!["ddprof.overhead.samples=10".into()],
    };
    let profile = Profile::decode_gzipped(&encode_pprof(&symbolized, &metadata).unwrap()).unwrap();
    let s = |id: i64| profile.string(id);
    assert_eq!(profile.string_table[0], "");
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [("cpu-samples", "count"), ("cpu-time", "nanoseconds")]
    );
    let period_type = profile.period_type.as_ref().expect("a period type");
    assert_eq!(
        (s(period_type.r#type), s(period_type.unit), profile.period),
        ("cpu-time", "nanoseconds", 10_101_010)
    );
    assert_eq!(
        profile.time_nanos,
        start().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
    );
    assert_eq!(profile.duration_nanos, 60_000_000_000);
    assert_eq!(profile.comments(), ["ddprof.overhead.samples=10"]);
    // One timeline sample and the rest of the group without a timestamp.
    assert_eq!(
        samples_by_offset(&profile),
        [
            (vec![0x1100, 0x1200], vec![1, 10], Some(99)),
            (vec![0x1100, 0x1200], vec![2, 20], None),
        ]
    );
    let labels = &profile.labels()[0];
    for expected in [
        ("end_timestamp_ns", "99"),
        ("thread id", "8"),
        ("thread_name", "worker"),
        ("process_id", "7"),
        ("process_name", "app"),
        (
            "container_id",
            "3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860",
        ),
    ] {
        assert!(
            labels.contains(&(expected.0.into(), expected.1.into())),
            "{expected:?} in {labels:?}"
        );
    }
    // The inlined function first, then its caller, in one location.
    let inlined = profile
        .location
        .iter()
        .find(|location| location.id == profile.sample[0].location_id[0])
        .unwrap();
    let lines: Vec<(&str, &str, &str, i64)> = inlined
        .line
        .iter()
        .map(|line| {
            let function = profile
                .function
                .iter()
                .find(|function| function.id == line.function_id)
                .unwrap();
            (
                s(function.name),
                s(function.system_name),
                s(function.filename),
                line.line,
            )
        })
        .collect();
    assert_eq!(
        lines,
        [("inner", "inner", "a.c", 3), ("outer", "outer", "a.c", 10)]
    );
    let mapping = profile
        .mapping
        .iter()
        .find(|mapping| mapping.id == inlined.mapping_id)
        .unwrap();
    assert_eq!(
        (s(mapping.filename), s(mapping.build_id)),
        ("/bin/app", "abcd")
    );
}
