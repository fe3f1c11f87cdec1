//! Parsing `-e` values as the C++ ddprof does, into [`EventSpec`]s.
use std::sync::Arc;

use super::spec::{
    EventKind, EventSpec, EventValue, SampleRate, Tracepoint, Weighing, DEFAULT_CPU_FREQUENCY,
    TABLE,
};

/// Events of Datadog's C++ ddprof that this ddprof does not sample yet,
/// with what they are. Asked for, each is left out with a warning rather
/// than refusing the whole list: `DD_PROFILING_NATIVE_EVENTS='sCPU;sALLOC'`,
/// the C++ wrapper's own default, must still profile CPU time.
#[cfg(not(ddprof_alloc))]
pub const NOT_YET_AVAILABLE: &[(&str, &str)] = &[("sALLOC", "allocations")];
#[cfg(ddprof_alloc)]
pub const NOT_YET_AVAILABLE: &[(&str, &str)] = &[];

/// The events of `text` this ddprof knows but does not sample yet, as
/// `name (what)`: they are left out of [`parse_events`]'s result.
pub fn unavailable_events(text: &str) -> Vec<String> {
    text.split(';')
        .filter_map(|part| event_name_of(part))
        .filter_map(|name| {
            let (_, what) = NOT_YET_AVAILABLE.iter().find(|(known, _)| *known == name)?;
            Some(format!("{name} ({what})"))
        })
        .collect()
}

/// The event name one `;`-separated part gives (a bare word or `e=`).
fn event_name_of(part: &str) -> Option<&str> {
    let mut name = None;
    for word in words(part) {
        match word.split_once('=') {
            None => name = Some(word),
            Some((key, value)) if key_of(key) == Some(Key::Event) => name = Some(value),
            Some(_) => {}
        }
    }
    name
}

/// Presets of Datadog's C++ ddprof (`--preset`), for when no `--event` is
/// given.
#[derive(clap::ValueEnum, serde::Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// CPU time and allocations (CPU time only with `-p`).
    #[value(name = "default")]
    #[serde(rename = "default")]
    Default,
    #[value(name = "cpu_only")]
    #[serde(rename = "cpu_only")]
    CpuOnly,
    #[value(name = "alloc_only")]
    #[serde(rename = "alloc_only")]
    AllocOnly,
    #[value(name = "alloc_live_heap")]
    #[serde(rename = "alloc_live_heap")]
    AllocLiveHeap,
    #[value(name = "cpu_live_heap")]
    #[serde(rename = "cpu_live_heap")]
    CpuLiveHeap,
    /// CPU time and wall time (`sWALL`), where threads run and where they
    /// wait (not one of the C++ ddprof's).
    #[value(name = "cpu_wall")]
    #[serde(rename = "cpu_wall")]
    CpuWall,
}

impl Preset {
    /// The preset's events, as `-e` would give them; `attached`: for
    /// `-p` and `--global`, where the C++ default samples CPU time only.
    pub fn events(self, attached: bool) -> &'static str {
        match self {
            Preset::Default if attached => "sCPU",
            Preset::Default => "sCPU;sALLOC",
            Preset::CpuOnly => "sCPU",
            Preset::AllocOnly => "sALLOC",
            Preset::AllocLiveHeap => "sALLOC mode=l",
            Preset::CpuLiveHeap => "sCPU;sALLOC mode=l",
            Preset::CpuWall => "sCPU;sWALL",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventSpecError {
    #[error(
        "unknown event `{0}` (expected sCPU, sALLOC, sWALL, an event of the C++ ddprof such \
         as sPF, sCS or hCPU, or a kernel tracepoint as group:name)"
    )]
    UnknownEvent(String),
    #[error("malformed event option `{0}` (expected KEY=VALUE, e.g. freq=999 or period=1000)")]
    BadOption(String),
    #[error("event option `{option}`: {why}")]
    BadValue { option: String, why: &'static str },
    #[error("no event given (expected e.g. `sCPU` or `sCPU freq=999`)")]
    Empty,
    #[error("no event this ddprof samples: {0} not available yet (sCPU is)")]
    NoneAvailable(String),
    #[error(
        "event `{0}` is listed twice: give the second one another label (l=NAME); \
         CPU time (sCPU) is sampled once"
    )]
    Duplicate(String),
    #[error(
        "freq={hz} is above kernel.perf_event_max_sample_rate ({max} on this machine): \
         lower it, or raise the limit with `sysctl kernel.perf_event_max_sample_rate={hz}`"
    )]
    AboveMaxRate { hz: u64, max: u64 },
}

/// The keys of an event's options, with the C++ ddprof's spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Scale,
    Frequency,
    Event,
    Group,
    Id,
    Label,
    Mode,
    ArgNum,
    RawOffset,
    Period,
    StackSampleSize,
    Register,
    RawSize,
    Threshold,
    Probability,
}

fn key_of(text: &str) -> Option<Key> {
    Some(match text {
        "s" | "value_scale" | "scale" => Key::Scale,
        "f" | "frequency" | "freq" => Key::Frequency,
        "e" | "event" | "eventname" | "ev" => Key::Event,
        "g" | "group" | "groupname" | "gr" => Key::Group,
        "i" | "id" => Key::Id,
        "l" | "label" => Key::Label,
        "m" | "mode" => Key::Mode,
        "n" | "arg_num" | "argno" => Key::ArgNum,
        "o" | "raw_offset" | "rawoff" => Key::RawOffset,
        "p" | "period" | "per" => Key::Period,
        "st" | "stack_sample_size" | "stcksz" => Key::StackSampleSize,
        "r" | "register" | "regno" => Key::Register,
        "z" | "raw_size" | "rawsz" => Key::RawSize,
        "threshold" | "th" => Key::Threshold,
        "probability" | "prob" => Key::Probability,
        _ => return None,
    })
}

/// An event's options separated by spaces, tabs or commas.
fn words(part: &str) -> impl Iterator<Item = &str> {
    part.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|word| !word.is_empty())
}

/// A C++ ddprof word: a name of tracefs's (letters, digits, `_`).
fn is_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !text.as_bytes()[0].is_ascii_digit()
}

/// A number as the C++ ddprof reads it: decimal or `0x` hexadecimal.
fn number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The perf register (x86 `PERF_REG_X86_*`) of System V argument `n`
/// (1-6), as the C++ ddprof maps `n=`.
/// One event's options as typed, before they make a spec.
#[derive(Default)]
struct Options<'a> {
    name: Option<&'a str>,
    group: Option<&'a str>,
    id: Option<u64>,
    label: Option<&'a str>,
    rate: Option<SampleRate>,
    value: Option<EventValue>,
    raw_size: Option<u8>,
    scale: Option<f64>,
    stack_sample_size: Option<u32>,
    /// `m=`: (sum, live); `None` when not given.
    mode: Option<(bool, bool)>,
    /// `sWALL`'s `threshold=` (nanoseconds) and `probability=`.
    threshold: Option<u64>,
    probability: Option<f64>,
}

fn bad(option: &str, why: &'static str) -> EventSpecError {
    EventSpecError::BadValue {
        option: option.to_string(),
        why,
    }
}

impl<'a> Options<'a> {
    fn read(part: &'a str) -> Result<Self, EventSpecError> {
        let mut options = Options::default();
        for word in words(part) {
            let Some((key, value)) = word.split_once('=') else {
                options.name = Some(word);
                continue;
            };
            let key = key_of(key).ok_or_else(|| EventSpecError::BadOption(word.to_string()))?;
            let positive = || {
                number(value)
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(word, "expected a number above 0"))
            };
            match key {
                Key::Event => match value.split_once(':') {
                    Some((group, name)) => {
                        options.group = Some(group);
                        options.name = Some(name);
                    }
                    None => options.name = Some(value),
                },
                Key::Group => options.group = Some(value),
                Key::Label if is_word(value) => options.label = Some(value),
                Key::Label => return Err(bad(word, "expected letters, digits and _")),
                Key::Id => options.id = Some(positive()?),
                Key::Frequency | Key::Period if options.rate.is_some() => {
                    return Err(bad(word, "give one of freq= and period="))
                }
                Key::Frequency => options.rate = Some(SampleRate::Frequency(positive()?)),
                Key::Period => options.rate = Some(SampleRate::Period(positive()?)),
                Key::ArgNum | Key::Register | Key::RawOffset if options.value.is_some() => {
                    return Err(bad(word, "give one of arg_num=, register= and raw_offset="))
                }
                Key::ArgNum => {
                    let register = number(value)
                        .and_then(super::regs::argument)
                        .ok_or_else(|| bad(word, "expected an argument number from 1 to 6"))?;
                    options.value = Some(EventValue::Register(register));
                }
                Key::Register => {
                    let register = number(value)
                        .and_then(|n| u8::try_from(n).ok())
                        .filter(|&n| super::regs::is_sampled(n))
                        .ok_or_else(|| bad(word, super::regs::REGISTER_EXPECTED))?;
                    options.value = Some(EventValue::Register(register));
                }
                Key::RawOffset => {
                    let offset = number(value)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| bad(word, "expected a byte offset"))?;
                    options.value = Some(EventValue::Raw { offset, size: 8 });
                }
                Key::RawSize => {
                    let size = number(value)
                        .filter(|n| matches!(n, 1 | 2 | 4 | 8))
                        .ok_or_else(|| bad(word, "expected 1, 2, 4 or 8 bytes"))?;
                    options.raw_size = Some(size as u8);
                }
                Key::Scale => {
                    let scale: f64 = value
                        .trim_end_matches(['f', 'F', 'd', 'D'])
                        .parse()
                        .ok()
                        .filter(|scale: &f64| scale.is_finite())
                        .ok_or_else(|| bad(word, "expected a number"))?;
                    options.scale = Some(scale);
                }
                Key::StackSampleSize => {
                    let size = number(value)
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| (8..=65528).contains(n) && n % 8 == 0)
                        .ok_or_else(|| {
                            bad(word, "expected a multiple of 8 bytes from 8 to 65528")
                        })?;
                    options.stack_sample_size = Some(size);
                }
                Key::Threshold => {
                    options.threshold =
                        Some(number(value).ok_or_else(|| bad(word, "expected nanoseconds"))?)
                }
                Key::Probability => {
                    let probability: f64 = value
                        .parse()
                        .ok()
                        .filter(|p: &f64| *p > 0.0 && *p <= 1.0)
                        .ok_or_else(|| bad(word, "expected a probability above 0, at most 1"))?;
                    options.probability = Some(probability);
                }
                Key::Mode => {
                    options.mode = Some(match value {
                        "s" | "S" => (true, false),
                        "l" | "L" => (false, true),
                        "sl" | "ls" | "SL" | "LS" | "a" | "A" => (true, true),
                        _ => return Err(bad(word, "expected s (sum), l (live) or sl")),
                    })
                }
            }
        }
        if let (Some(EventValue::Raw { offset, .. }), Some(size)) =
            (options.value, options.raw_size)
        {
            options.value = Some(EventValue::Raw { offset, size });
        }
        Ok(options)
    }

    /// The spec, as event `index` of the list; `None` for an event not
    /// sampled yet ([`NOT_YET_AVAILABLE`]).
    fn into_spec(self, part: &str, index: u16) -> Result<Option<EventSpec>, EventSpecError> {
        let (kind, default_rate, default_label): (EventKind, SampleRate, String) =
            match (self.group, self.name, self.id) {
                (None, Some(name), _) if NOT_YET_AVAILABLE.iter().any(|(n, _)| *n == name) => {
                    return Ok(None)
                }
                (None, Some("sALLOC"), _) => return self.allocation(index).map(Some),
                (None, Some("sWALL"), _) => return self.wall_time(index).map(Some),
                (None, Some("sCPU"), _) => (
                    EventKind::CpuTime,
                    SampleRate::Frequency(DEFAULT_CPU_FREQUENCY),
                    "sCPU".into(),
                ),
                (None, Some(name), _) => {
                    let (group, tracepoint) = match name.split_once(':') {
                        Some(split) => split,
                        None => match TABLE.iter().find(|entry| entry.name == name) {
                            Some(entry) => {
                                let kind = EventKind::Counter(entry);
                                return self.finish(kind, entry.rate, entry.name.into(), index);
                            }
                            None => return Err(EventSpecError::UnknownEvent(name.to_string())),
                        },
                    };
                    tracepoint_kind(part, group, tracepoint)?
                }
                (Some(group), Some(name), _) => tracepoint_kind(part, group, name)?,
                (None, None, Some(id)) => (
                    EventKind::Tracepoint(Tracepoint::Id(id)),
                    SampleRate::Period(1),
                    format!("id:{id}"),
                ),
                (Some(_), None, _) => {
                    return Err(bad(
                        part,
                        "a group= needs an event=, as group=sched event=sched_switch",
                    ))
                }
                (None, None, None) => return Err(EventSpecError::Empty),
            };
        self.finish(kind, default_rate, default_label, index)
    }

    /// `sALLOC`: `p=` is the mean bytes between samples, `m=l` adds the
    /// live heap; it weighs the allocation's size, unbiased.
    fn allocation(self, index: u16) -> Result<EventSpec, EventSpecError> {
        let name = "sALLOC";
        let mean =
            match self.rate {
                None => super::allocation::DEFAULT_MEAN_BYTES,
                Some(SampleRate::Period(mean)) => mean,
                Some(SampleRate::Frequency(_)) => return Err(bad(
                    name,
                    "sALLOC samples by bytes: give period= (mean bytes between samples), not freq=",
                )),
            };
        if self.value.is_some()
            || self.scale.is_some()
            || self.threshold.is_some()
            || self.probability.is_some()
        {
            return Err(bad(
                name,
                "sALLOC weighs the allocations' sizes: arg_num=, register=, raw_offset=, \
                 scale=, threshold= and probability= are for other events",
            ));
        }
        Ok(EventSpec {
            kind: {
                let (sum, live) = self.mode.unwrap_or((true, false));
                EventKind::Allocation { sum, live }
            },
            rate: SampleRate::Period(mean),
            weighing: Weighing {
                event: index,
                value: EventValue::AllocationSize { mean },
                scale: 1.0,
                fixed_period: None,
            },
            label: self.label.map_or_else(|| name.into(), Arc::from),
            stack_sample_size: self.stack_sample_size,
        })
    }

    /// `sWALL`: `threshold=` (nanoseconds: shorter waits are left out) and
    /// `probability=` (the most with which a switch-out is sampled; the
    /// program lowers it when switches come faster than its budget).
    fn wall_time(self, index: u16) -> Result<EventSpec, EventSpecError> {
        let name = "sWALL";
        if self.rate.is_some() || self.value.is_some() || self.scale.is_some() {
            return Err(bad(
                name,
                "sWALL weighs the time threads spend off a CPU: give threshold= (nanoseconds) \
                 or probability= (0 to 1), not freq=, period=, arg_num=, register=, raw_offset= \
                 or scale=",
            ));
        }
        if self.mode.is_some_and(|(_, live)| live) {
            return Err(bad(name, "mode=l: only sALLOC has a live mode"));
        }
        let one = ddprof_common::sample::WALL_PROBABILITY_ONE;
        let max_probability = self
            .probability
            .map_or(one, |p| ((p * one as f64) as u64).clamp(1, one));
        Ok(EventSpec {
            kind: EventKind::WallTime {
                max_probability,
                threshold_ns: self.threshold.unwrap_or(0),
            },
            rate: SampleRate::Period(1),
            weighing: Weighing {
                event: index,
                value: EventValue::Period,
                scale: 1.0,
                fixed_period: None,
            },
            label: self.label.map_or_else(|| name.into(), Arc::from),
            stack_sample_size: None,
        })
    }

    fn finish(
        self,
        kind: EventKind,
        default_rate: SampleRate,
        default_label: String,
        index: u16,
    ) -> Result<Option<EventSpec>, EventSpecError> {
        let name = default_label.clone();
        if self.threshold.is_some() || self.probability.is_some() {
            return Err(bad(&name, "threshold= and probability= are sWALL's"));
        }
        if self.mode.is_some_and(|(_, live)| live) {
            return Err(bad(&name, "mode=l: only sALLOC has a live mode"));
        }
        if kind == EventKind::CpuTime && self.value.is_some() {
            return Err(bad(
                &name,
                "sCPU weighs CPU time: arg_num=, register= and raw_offset= are for other events",
            ));
        }
        if matches!(self.value, Some(EventValue::Raw { .. }))
            && !matches!(kind, EventKind::Tracepoint(_))
        {
            return Err(bad(&name, "raw_offset= reads a tracepoint's record"));
        }
        let rate = self.rate.unwrap_or(default_rate);
        let fixed_period = match (&kind, rate) {
            (EventKind::CpuTime, _) | (_, SampleRate::Frequency(_)) => None,
            (_, SampleRate::Period(period)) => Some(period),
        };
        Ok(Some(EventSpec {
            kind,
            rate,
            weighing: Weighing {
                event: index,
                value: self.value.unwrap_or(EventValue::Period),
                scale: self.scale.unwrap_or(1.0),
                fixed_period,
            },
            label: self.label.map_or_else(|| name.into(), Arc::from),
            stack_sample_size: self.stack_sample_size,
        }))
    }
}

fn tracepoint_kind(
    part: &str,
    group: &str,
    name: &str,
) -> Result<(EventKind, SampleRate, String), EventSpecError> {
    // Both become a path under tracefs: only tracefs's own names.
    if !is_word(group) || !is_word(name) {
        return Err(bad(
            part,
            "a tracepoint is group:name, each letters, digits and _ (as in sched:sched_switch)",
        ));
    }
    Ok((
        EventKind::Tracepoint(Tracepoint::Named {
            group: group.into(),
            name: name.into(),
        }),
        SampleRate::Period(1),
        format!("{group}:{name}"),
    ))
}

/// Parses `-e` values as the C++ ddprof does: events separated by `;`,
/// each a name (`sCPU`, `sPF`, `hCPU`, `group:name`) and `key=value`
/// options separated by spaces or commas (`sCPU freq=999`, `sPF p=64`,
/// `e=sched_switch g=sched l=switches`, `i=317`). Events not sampled yet
/// ([`unavailable_events`]) are left out; none left is an error.
pub fn parse_events(text: &str) -> Result<Vec<EventSpec>, EventSpecError> {
    let mut specs: Vec<EventSpec> = Vec::new();
    let mut skipped = 0;
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let index = u16::try_from(specs.len())
            .ok()
            .filter(|index| *index < super::MAX_EVENTS)
            .ok_or_else(|| bad(part, "too many events (at most 256)"))?;
        match Options::read(part)?.into_spec(part, index)? {
            Some(spec)
                if specs.iter().any(|other| {
                    other.label == spec.label || (other.is_cpu_time() && spec.is_cpu_time())
                }) =>
            {
                return Err(EventSpecError::Duplicate(spec.label.to_string()))
            }
            Some(spec) => specs.push(spec),
            None => skipped += 1,
        }
    }
    if specs.is_empty() {
        let unavailable = unavailable_events(text);
        return Err(if unavailable.is_empty() || skipped == 0 {
            EventSpecError::Empty
        } else {
            EventSpecError::NoneAvailable(unavailable.join(", "))
        });
    }
    Ok(specs)
}

/// The kernel refuses (EINVAL) a sampling frequency above
/// `kernel.perf_event_max_sample_rate`: say so before anything runs.
pub fn check_frequencies(specs: &[EventSpec], max: u64) -> Result<(), EventSpecError> {
    for spec in specs {
        if let SampleRate::Frequency(hz) = spec.rate {
            if hz > max {
                return Err(EventSpecError::AboveMaxRate { hz, max });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::CounterType;
    use crate::sample::HeapEvent;
    use perf_event_open_sys::bindings as perf;

    fn one(text: &str) -> EventSpec {
        let mut specs = parse_events(text).unwrap();
        assert_eq!(specs.len(), 1, "{text}");
        specs.remove(0)
    }

    #[test]
    fn parses_cpu_time_specs() {
        let spec = one("sCPU");
        assert_eq!(spec.kind, EventKind::CpuTime);
        assert_eq!(spec.rate, SampleRate::Frequency(99));
        assert_eq!((spec.index(), &*spec.label), (0, "sCPU"));
        assert_eq!(one("sCPU freq=999").rate, SampleRate::Frequency(999));
        assert_eq!(
            one(" sCPU period=1000000 ;").rate,
            SampleRate::Period(1_000_000)
        );
        assert_eq!(one("sCPU,f=0x10").rate, SampleRate::Frequency(16));
        assert_eq!(
            parse_events("sFOO"),
            Err(EventSpecError::UnknownEvent("sFOO".into()))
        );
        assert!(matches!(
            parse_events("sCPU freq=0"),
            Err(EventSpecError::BadValue { option, .. }) if option == "freq=0"
        ));
        assert_eq!(
            parse_events("sCPU hz=3"),
            Err(EventSpecError::BadOption("hz=3".into()))
        );
        assert!(matches!(
            parse_events("sCPU f=99 p=100"),
            Err(EventSpecError::BadValue { .. })
        ));
        assert_eq!(parse_events(" ; "), Err(EventSpecError::Empty));
    }

    #[test]
    fn the_cpp_table_gives_each_counter_its_default_rate() {
        let specs = parse_events("sCPU;sPF;sCS;hCPU;sMig;sPFMAJ;hCREF").unwrap();
        let rates: Vec<_> = specs.iter().map(|spec| spec.rate).collect();
        assert_eq!(
            rates,
            [
                SampleRate::Frequency(99),
                SampleRate::Period(1),
                SampleRate::Period(1),
                SampleRate::Frequency(99),
                SampleRate::Frequency(99),
                SampleRate::Period(99),
                SampleRate::Period(999),
            ]
        );
        let indexes: Vec<u16> = specs.iter().map(EventSpec::index).collect();
        assert_eq!(indexes, [0, 1, 2, 3, 4, 5, 6]);
        assert!(matches!(
            specs[1].kind,
            EventKind::Counter(entry) if entry.name == "sPF"
                && entry.counter == CounterType::Software
                && entry.config == perf::PERF_COUNT_SW_PAGE_FAULTS
        ));
        assert!(matches!(
            specs[3].kind,
            EventKind::Counter(entry) if entry.counter == CounterType::Hardware
        ));
        assert!(specs[1].needs_kernel() && specs[2].needs_kernel() && !specs[0].needs_kernel());
        assert_eq!(one("sPF p=64").rate, SampleRate::Period(64));
    }

    #[test]
    fn tracepoints_in_every_cpp_spelling() {
        for text in [
            "sched:sched_switch",
            "e=sched:sched_switch",
            "event=sched_switch group=sched",
            "g=sched,e=sched_switch",
        ] {
            let spec = one(text);
            assert_eq!(
                spec.kind,
                EventKind::Tracepoint(Tracepoint::Named {
                    group: "sched".into(),
                    name: "sched_switch".into()
                }),
                "{text}"
            );
            assert_eq!(&*spec.label, "sched:sched_switch");
            assert_eq!(spec.rate, SampleRate::Period(1));
        }
        let spec = one("i=317 l=opens p=2");
        assert_eq!(spec.kind, EventKind::Tracepoint(Tracepoint::Id(317)));
        assert_eq!((&*spec.label, spec.rate), ("opens", SampleRate::Period(2)));
        assert_eq!(&*one("id=0x13d").label, "id:317");
        // A path under tracefs is made of these: nothing else gets in.
        for hostile in ["../../x:y", "sched:../x", "e=a/b g=c"] {
            assert!(parse_events(hostile).is_err(), "{hostile}");
        }
    }

    #[test]
    fn weights_from_the_period_a_register_or_an_argument_scaled() {
        let spec = one("sched:sched_switch n=2 s=0.5");
        assert_eq!(spec.weighing.value, EventValue::Register(4));
        assert_eq!(spec.weighing.scale, 0.5);
        let mut regs = crate::unwind::UserRegs::new(0, 0, 0);
        regs.others[4] = 1000; // RSI, DWARF 4
        assert_eq!(spec.weighing.weight(7, Some(&regs)), 500);
        assert_eq!(spec.weighing.weight(7, None), 0);
        let by_register = one("sPF r=8");
        let mut regs = crate::unwind::UserRegs::new(0x1234, 0, 0);
        regs.known = crate::unwind::UserRegs::ALL_KNOWN;
        assert_eq!(by_register.weighing.weight(1, Some(&regs)), 0x1234);
        // The kernel says 1 for a software event's sample whatever its period.
        assert_eq!(one("sPF p=64").weighing.weight(1, None), 64);
        assert_eq!(one("sPF f=99").weighing.weight(7, None), 7);
        assert_eq!(one("sCPU p=1000").weighing.weight(1013, None), 1013);
        assert!(parse_events("sPF r=9").is_err(), "FLAGS is not sampled");
        assert!(parse_events("sPF n=7").is_err());
        assert!(parse_events("sPF n=1 r=5").is_err());
        assert!(parse_events("sCPU n=1").is_err());
        let raw = one("sched:sched_switch o=24 z=4");
        assert_eq!(
            raw.weighing.value,
            EventValue::Raw {
                offset: 24,
                size: 4
            }
        );
        assert_eq!(raw.weighing.weight(1234, None), 1234);
        assert!(parse_events("sched:sched_switch o=8 z=3").is_err());
        assert!(parse_events("sPF o=8").is_err());
    }

    #[test]
    fn labels_modes_and_stack_sizes() {
        let spec = one("sCS l=switches st=8192 m=s");
        assert_eq!(&*spec.label, "switches");
        assert_eq!(spec.stack_sample_size, Some(8192));
        assert!(parse_events("sCS st=100").is_err());
        assert!(
            parse_events("sCS m=l").is_err(),
            "only sALLOC has a live mode"
        );
        assert_eq!(
            parse_events("sCS;sCS"),
            Err(EventSpecError::Duplicate("sCS".into()))
        );
        assert_eq!(parse_events("sCS;sCS l=other").unwrap().len(), 2);
        assert!(parse_events("sCPU;sCPU l=fast f=999").is_err());
    }

    #[test]
    #[cfg(not(ddprof_alloc))]
    fn the_cpp_ddprofs_allocation_event_is_left_out_not_refused() {
        // The C++ wrapper's default.
        let specs = parse_events("sCPU;sALLOC").unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].kind, EventKind::CpuTime);
        assert_eq!(unavailable_events("sCPU;sALLOC"), ["sALLOC (allocations)"]);
        assert_eq!(
            unavailable_events("sCPU; e=sALLOC m=l"),
            ["sALLOC (allocations)"]
        );
        // Events after it keep their place in the list as sampled.
        assert_eq!(parse_events("sALLOC;sPF").unwrap()[0].index(), 0);
        assert_eq!(
            parse_events("sALLOC mode=l"),
            Err(EventSpecError::NoneAvailable("sALLOC (allocations)".into()))
        );
        // Still unknown: a typo is no C++ event.
        assert_eq!(
            parse_events("sCPU;sALOC"),
            Err(EventSpecError::UnknownEvent("sALOC".into()))
        );
        assert_eq!(unavailable_events("sCPU"), Vec::<String>::new());
    }

    #[test]
    fn wall_time_takes_a_threshold_and_a_probability() {
        let one_in = ddprof_common::sample::WALL_PROBABILITY_ONE;
        let specs = parse_events("sCPU;sWALL").unwrap();
        assert_eq!(
            specs[1].kind,
            EventKind::WallTime {
                max_probability: one_in,
                threshold_ns: 0
            }
        );
        assert!(specs[1].is_wall_time() && !specs[1].is_cpu_time());
        assert_eq!(specs[1].per_second(), 0, "no perf buffer takes its samples");
        assert_eq!(
            one("sWALL threshold=1000000 probability=0.25 l=waits").kind,
            EventKind::WallTime {
                max_probability: one_in / 4,
                threshold_ns: 1_000_000
            }
        );
        assert_eq!(&*one("e=sWALL,th=5,prob=1").label, "sWALL");
        for refused in [
            "sWALL probability=0",
            "sWALL probability=1.5",
            "sWALL probability=x",
            "sWALL threshold=-1",
            "sWALL freq=99",
            "sWALL period=10",
            "sWALL n=1",
            "sWALL m=l",
            "sCPU threshold=10",
            "sPF probability=0.5",
            "sALLOC threshold=10",
        ] {
            assert!(parse_events(refused).is_err(), "{refused}");
        }
    }

    #[test]
    #[cfg(ddprof_alloc)]
    fn allocations_in_every_cpp_spelling() {
        let specs = parse_events("sCPU;sALLOC").unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(
            specs[1].kind,
            EventKind::Allocation {
                sum: true,
                live: false
            }
        );
        assert_eq!(specs[1].rate, SampleRate::Period(524_288));
        assert_eq!(
            specs[1].weighing.value,
            EventValue::AllocationSize { mean: 524_288 }
        );
        assert!(unavailable_events("sCPU;sALLOC").is_empty());
        let live = one("e=sALLOC m=l p=1048576");
        assert_eq!(
            live.kind,
            EventKind::Allocation {
                sum: false,
                live: true
            }
        );
        assert_eq!(
            one("sALLOC m=sl").kind,
            EventKind::Allocation {
                sum: true,
                live: true
            }
        );
        assert_eq!(
            live.weighing.value,
            EventValue::AllocationSize { mean: 1 << 20 }
        );
        assert!(parse_events("sALLOC f=99").is_err(), "by bytes, not a rate");
        assert!(parse_events("sALLOC n=2").is_err());
        assert!(parse_events("sALLOC s=2").is_err());
        // The size is in rdi (perf register 5, DWARF 5): 1 MiB at a mean of
        // 1 MiB stands for 1/(1 - 1/e) allocations.
        let mut regs = crate::unwind::UserRegs::new(0, 0, 0);
        regs.known = crate::unwind::UserRegs::ALL_KNOWN;
        regs.others[5] = 1 << 20;
        let inverse_p = 1.0 / (1.0 - (-1.0f64).exp());
        assert_eq!(
            live.weighing.weight(1, Some(&regs)),
            ((1 << 20) as f64 * inverse_p).round() as u64
        );
        assert_eq!(
            live.weighing.scaled_count(Some(&regs)),
            (1000.0 * inverse_p).round() as u64
        );
        assert_eq!(one("sCPU").weighing.scaled_count(None), 1000);
        // The address is in rsi (perf register 4), the kind in rdx (3): an
        // allocator's block drops the marker's and the hook's frames; a
        // mapping (rdx 1) keeps the hook's (`mmap`).
        regs.others[4] = 0x5555_0000_1010;
        regs.others[1] = 0;
        assert_eq!(live.weighing.hidden_frames(Some(&regs)), 2);
        assert_eq!(
            live.weighing.heap_event(Some(&regs)),
            Some(HeapEvent::Allocated {
                address: 0x5555_0000_1010,
                size: 1 << 20
            })
        );
        regs.others[4] = 0x7f00_0020_0000;
        regs.others[1] = 1;
        assert_eq!(live.weighing.hidden_frames(Some(&regs)), 1);
        assert_eq!(
            live.weighing.heap_event(Some(&regs)),
            Some(HeapEvent::Allocated {
                address: 0x7f00_0020_0000,
                size: 1 << 20
            })
        );
        regs.others[4] = 0;
        assert_eq!(
            live.weighing.heap_event(Some(&regs)),
            Some(HeapEvent::NotFollowed)
        );
        assert_eq!(one("sCPU").weighing.hidden_frames(Some(&regs)), 0);
        // A free says the address (rdi), the bytes still held (rsi: a
        // mapping partly unmapped) and its new name (rdx: 0 for none).
        let frees = live.frees_of().expect("a live event has frees");
        regs.others[5] = 0x7f00_0020_0000;
        regs.others[4] = 4096;
        regs.others[1] = 0x7f00_0030_0000;
        assert_eq!(
            frees.weighing.heap_event(Some(&regs)),
            Some(HeapEvent::Freed {
                address: 0x7f00_0020_0000,
                held: 4096,
                renamed: 0x7f00_0030_0000
            })
        );
    }

    #[test]
    fn presets_are_the_cpp_ddprofs() {
        assert_eq!(Preset::CpuOnly.events(false), "sCPU");
        assert_eq!(Preset::Default.events(false), "sCPU;sALLOC");
        assert_eq!(Preset::Default.events(true), "sCPU");
        let live = parse_events(Preset::CpuLiveHeap.events(false)).unwrap();
        let alloc_only = parse_events(Preset::AllocOnly.events(false));
        if cfg!(ddprof_alloc) {
            assert_eq!(live.len(), 2);
            assert!(matches!(
                live[1].kind,
                EventKind::Allocation { live: true, .. }
            ));
            assert_eq!(alloc_only.unwrap().len(), 1);
        } else {
            assert_eq!(live.len(), 1);
            assert!(matches!(alloc_only, Err(EventSpecError::NoneAvailable(_))));
        }
    }

    #[test]
    fn frequencies_above_the_kernel_limit_are_refused() {
        let specs = parse_events("sCPU freq=1000;sPF period=1").unwrap();
        assert_eq!(check_frequencies(&specs, 1000), Ok(()));
        let error = check_frequencies(&specs, 999).unwrap_err();
        assert_eq!(error, EventSpecError::AboveMaxRate { hz: 1000, max: 999 });
        assert!(error
            .to_string()
            .contains("kernel.perf_event_max_sample_rate (999 on this machine)"));
    }
}
