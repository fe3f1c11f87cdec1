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

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventSpecError {
    #[error("unknown event `{0}` (expected sCPU)")]
    UnknownEvent(String),
    #[error("malformed event option `{0}` (expected freq=HZ or period=N)")]
    BadOption(String),
    #[error("no event given (expected e.g. `sCPU` or `sCPU freq=999`)")]
    Empty,
    #[error(
        "freq={hz} is above kernel.perf_event_max_sample_rate ({max} on this machine): \
         lower it, or raise the limit with `sysctl kernel.perf_event_max_sample_rate={hz}`"
    )]
    AboveMaxRate { hz: u64, max: u64 },
}

/// Parses `-e` values: `sCPU`, `sCPU freq=999`, `sCPU period=1000000`,
/// several separated by `;`.
pub fn parse_events(text: &str) -> Result<Vec<EventSpec>, EventSpecError> {
    let mut specs = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let mut words = part.split_whitespace();
        let name = words.next().ok_or(EventSpecError::Empty)?;
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
        return Err(EventSpecError::Empty);
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
