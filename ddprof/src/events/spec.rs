//! What an event is: `-e` specs (`sCPU freq=999`), parsed and checked
//! against this machine's sampling-rate limit.

/// Default sampling frequency of `sCPU` in Hz (what Datadog's ddprof uses).
pub const DEFAULT_CPU_FREQUENCY: u64 = 99;

/// How often an event samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleRate {
    /// Samples per second (the kernel adjusts the period).
    Frequency(u64),
    /// One sample every N units of the event (nanoseconds for CPU time).
    Period(u64),
}

impl SampleRate {
    /// Samples per second of a busy task (a period counts nanoseconds).
    pub fn per_second(self) -> u64 {
        match self {
            SampleRate::Frequency(hz) => hz,
            SampleRate::Period(nanos) => 1_000_000_000 / nanos.max(1),
        }
    }
}

/// The kinds of event ddprof samples on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `sCPU`: CPU time of the profiled tasks (the task-clock software event).
    CpuTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSpec {
    pub kind: EventKind,
    pub rate: SampleRate,
}

/// Events of Datadog's C++ ddprof that this ddprof does not sample yet,
/// with what they are. Asked for, each is left out with a warning rather
/// than refusing the whole list: `DD_PROFILING_NATIVE_EVENTS='sCPU;sALLOC'`,
/// the C++ wrapper's own default, must still profile CPU time.
pub const NOT_YET_AVAILABLE: &[(&str, &str)] = &[
    ("sALLOC", "allocations"),
    ("hCPU", "a hardware counter"),
    ("hREF", "a hardware counter"),
    ("hINST", "a hardware counter"),
    ("hCREF", "a hardware counter"),
    ("hCMISS", "a hardware counter"),
    ("hBRANCH", "a hardware counter"),
    ("hBMISS", "a hardware counter"),
    ("hBUS", "a hardware counter"),
    ("hBSTF", "a hardware counter"),
    ("hBSTB", "a hardware counter"),
    ("sPF", "page faults"),
    ("sPFMAJ", "page faults"),
    ("sPFMIN", "page faults"),
    ("sCS", "context switches"),
    ("sMig", "CPU migrations"),
    ("sALGN", "alignment faults"),
    ("sEMU", "emulation faults"),
    ("sDUM", "a dummy event"),
];

/// What a known event this ddprof does not sample yet is (`group:name` is a
/// kernel tracepoint), `None` for an event it samples or does not know.
fn not_yet_available(name: &str) -> Option<&'static str> {
    if name.contains(':') {
        return Some("a tracepoint");
    }
    NOT_YET_AVAILABLE
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, what)| *what)
}

/// The events of `text` this ddprof knows but does not sample yet, as
/// `name (what)`: they are left out of [`parse_events`]'s result.
pub fn unavailable_events(text: &str) -> Vec<String> {
    text.split(';')
        .filter_map(|part| part.split_whitespace().next())
        .filter_map(|name| Some(format!("{name} ({})", not_yet_available(name)?)))
        .collect()
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
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventSpecError {
    #[error("unknown event `{0}` (expected sCPU)")]
    UnknownEvent(String),
    #[error("malformed event option `{0}` (expected freq=HZ or period=N)")]
    BadOption(String),
    #[error("no event given (expected e.g. `sCPU` or `sCPU freq=999`)")]
    Empty,
    #[error("no event this ddprof samples: {0} not available yet (sCPU is)")]
    NoneAvailable(String),
    #[error(
        "freq={hz} is above kernel.perf_event_max_sample_rate ({max} on this machine): \
         lower it, or raise the limit with `sysctl kernel.perf_event_max_sample_rate={hz}`"
    )]
    AboveMaxRate { hz: u64, max: u64 },
}

/// Parses `-e` values: `sCPU`, `sCPU freq=999`, `sCPU period=1000000`,
/// several separated by `;`. Known events not sampled yet
/// ([`unavailable_events`]) are left out; none left is an error.
pub fn parse_events(text: &str) -> Result<Vec<EventSpec>, EventSpecError> {
    let mut specs = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let mut words = part.split_whitespace();
        let name = words.next().ok_or(EventSpecError::Empty)?;
        if not_yet_available(name).is_some() {
            continue;
        }
        let kind = match name {
            "sCPU" => EventKind::CpuTime,
            other => return Err(EventSpecError::UnknownEvent(other.to_string())),
        };
        let mut rate = SampleRate::Frequency(DEFAULT_CPU_FREQUENCY);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| EventSpecError::BadOption(word.to_string()))?;
            let number: u64 = value
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| EventSpecError::BadOption(word.to_string()))?;
            rate = match key {
                "freq" | "f" => SampleRate::Frequency(number),
                "period" | "p" => SampleRate::Period(number),
                _ => return Err(EventSpecError::BadOption(word.to_string())),
            };
        }
        specs.push(EventSpec { kind, rate });
    }
    if specs.is_empty() {
        let unavailable = unavailable_events(text);
        return Err(if unavailable.is_empty() {
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

    #[test]
    fn parses_event_specs() {
        assert_eq!(
            parse_events("sCPU").unwrap(),
            vec![EventSpec {
                kind: EventKind::CpuTime,
                rate: SampleRate::Frequency(99)
            }]
        );
        assert_eq!(
            parse_events("sCPU freq=999").unwrap()[0].rate,
            SampleRate::Frequency(999)
        );
        assert_eq!(
            parse_events(" sCPU period=1000000 ;").unwrap()[0].rate,
            SampleRate::Period(1_000_000)
        );
        assert_eq!(
            parse_events("sFOO"),
            Err(EventSpecError::UnknownEvent("sFOO".into()))
        );
        assert_eq!(
            parse_events("sCPU freq=0"),
            Err(EventSpecError::BadOption("freq=0".into()))
        );
        assert_eq!(
            parse_events("sCPU hz"),
            Err(EventSpecError::BadOption("hz".into()))
        );
        assert_eq!(parse_events(" ; "), Err(EventSpecError::Empty));
    }

    #[test]
    fn the_cpp_ddprofs_other_events_are_left_out_not_refused() {
        // The C++ wrapper's default, and a tracepoint.
        let specs = parse_events("sCPU;sALLOC").unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].kind, EventKind::CpuTime);
        assert_eq!(unavailable_events("sCPU;sALLOC"), ["sALLOC (allocations)"]);
        assert_eq!(
            unavailable_events("sCPU freq=999; sched:sched_switch ;hCPU p=1"),
            [
                "sched:sched_switch (a tracepoint)",
                "hCPU (a hardware counter)"
            ]
        );
        assert_eq!(parse_events("sched:sched_switch;sCPU").unwrap().len(), 1);
        // Nothing left to sample.
        assert_eq!(
            parse_events("sALLOC; sPF"),
            Err(EventSpecError::NoneAvailable(
                "sALLOC (allocations), sPF (page faults)".into()
            ))
        );
        // Still unknown: a typo is no C++ event.
        assert_eq!(
            parse_events("sCPU;sALOC"),
            Err(EventSpecError::UnknownEvent("sALOC".into()))
        );
        assert_eq!(unavailable_events("sCPU"), Vec::<String>::new());
    }

    #[test]
    fn presets_are_the_cpp_ddprofs() {
        assert_eq!(Preset::CpuOnly.events(false), "sCPU");
        assert_eq!(Preset::Default.events(false), "sCPU;sALLOC");
        assert_eq!(Preset::Default.events(true), "sCPU");
        assert_eq!(
            parse_events(Preset::CpuLiveHeap.events(false))
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            parse_events(Preset::AllocOnly.events(false)),
            Err(EventSpecError::NoneAvailable(_))
        ));
    }

    #[test]
    fn frequencies_above_the_kernel_limit_are_refused() {
        let specs = parse_events("sCPU freq=1000;sCPU period=1").unwrap();
        assert_eq!(check_frequencies(&specs, 1000), Ok(()));
        let error = check_frequencies(&specs, 999).unwrap_err();
        assert_eq!(error, EventSpecError::AboveMaxRate { hz: 1000, max: 999 });
        assert!(error
            .to_string()
            .contains("kernel.perf_event_max_sample_rate (999 on this machine)"));
    }
}
