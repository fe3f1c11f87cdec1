//! UTC timestamps without a date crate: the compact form of file names and
//! the RFC 3339 form of the intake's JSON; sample times (CLOCK_MONOTONIC)
//! as wall-clock time.
use std::time::{SystemTime, UNIX_EPOCH};

/// Formats a time as a compact UTC timestamp: `20261122T031500Z`.
pub fn utc_timestamp(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01, computed per
/// 400-year era (146,097 days), whose years start on March 1st so that the
/// leap day is the era-year's last day.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `2026-11-24T16:03:53.123456789Z`.
pub fn rfc3339_nanos(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        since_epoch.subsec_nanos()
    )
}

/// Converts CLOCK_MONOTONIC sample times to wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// Wall-clock minus monotonic time, in nanoseconds.
    offset: i128,
}

impl WallClock {
    pub fn now() -> Self {
        use nix::time::{clock_gettime, ClockId};
        let nanos = |clock| {
            clock_gettime(clock)
                .map(|t| t.tv_sec() as i128 * 1_000_000_000 + t.tv_nsec() as i128)
                .unwrap_or(0)
        };
        let monotonic = nanos(ClockId::CLOCK_MONOTONIC);
        let realtime = nanos(ClockId::CLOCK_REALTIME);
        Self {
            offset: realtime - monotonic,
        }
    }

    pub fn wall_nanos(&self, monotonic: u64) -> u64 {
        (monotonic as i128 + self.offset).clamp(0, u64::MAX as i128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_timestamps() {
        let at = |secs| utc_timestamp(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "19700101T000000Z");
        // 2026-11-22 03:15:00 UTC
        assert_eq!(at(1_795_317_300), "20261122T031500Z");
        // 2024-02-29 23:59:59 UTC (leap day)
        assert_eq!(at(1_709_251_199), "20240229T235959Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_nanoseconds() {
        let time = UNIX_EPOCH + Duration::new(1_795_968_233, 7);
        assert_eq!(rfc3339_nanos(time), "2026-11-29T16:03:53.000000007Z");
        assert_eq!(rfc3339_nanos(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
    }
}
