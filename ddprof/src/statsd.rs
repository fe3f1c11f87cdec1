//! `--internal-stats` (`-b`): each period's figures as DogStatsD gauges, under
//! the C++ ddprof's names where it has the figure, ours where it does not,
//! sent without ever blocking the profiler.
use crate::overhead::{format_value, Overhead};

/// The period's DogStatsD gauges: the C++ ddprof's
/// (`datadog.profiling.native.NAME`, with its meanings) for what it
/// measures too, then ours (`datadog.profiling.ddprof.NAME`) for what it
/// has no gauge for: the losses by cause, throttles, the CPU share and
/// the peak RSS. Its gauges left out are those of allocation profiling
/// and of figures not measured here (docs/Commands.md lists them).
pub fn gauges(overhead: &Overhead, pprof_bytes: usize) -> Vec<(String, f64)> {
    let stacks = &overhead.stacks;
    // As the C++ ddprof: -1 for an average over no sample.
    let average_depth = if overhead.samples > 0 {
        stacks.frames as f64 / overhead.samples as f64
    } else {
        -1.0
    };
    let native: [(&str, f64); 12] = [
        ("sample.count", overhead.samples as f64),
        ("event.lost", overhead.lost.ring_full as f64),
        (
            "target_process.cpu_usage.millicores",
            overhead.millicores(overhead.target_cpu).round(),
        ),
        ("unwind.frames", stacks.frames as f64),
        ("unwind.errors", stacks.walk_failed as f64),
        (
            "unwind.stack.truncated_input",
            stacks.stack_exhausted as f64,
        ),
        ("unwind.stack.truncated_output", stacks.depth_limited as f64),
        ("unwind.stack.incomplete", overhead.truncated as f64),
        ("unwind.stack.avg_depth", average_depth.round()),
        ("profiler.rss", (overhead.rss_kib * 1024) as f64),
        (
            "profiler.cpu_usage.millicores",
            overhead.profiler_millicores().round(),
        ),
        (
            "profile.duration_ms",
            (overhead.duration.as_secs_f64() * 1000.0).round(),
        ),
    ];
    let mut gauges: Vec<(String, f64)> = native
        .iter()
        .map(|(name, value)| (format!("{CPP_STATSD_PREFIX}{name}"), *value))
        .collect();
    gauges.push((format!("{CPP_STATSD_PREFIX}pprof.size"), pprof_bytes as f64));
    // Ours: the figures of the log line and pprof comments that the C++
    // set has no gauge for.
    const OURS_ONLY: [&str; 8] = [
        "lost",
        "lost_malformed",
        "lost_unsampled",
        "lost_worker",
        "lost_exiting",
        "throttles",
        "peak_rss_kib",
        "profiler_cpu_share_percent",
    ];
    gauges.extend(
        overhead
            .fields()
            .into_iter()
            .filter(|(name, _)| OURS_ONLY.contains(name))
            .map(|(name, value)| (format!("{STATSD_PREFIX}{name}"), value)),
    );
    gauges
}

/// Where `--internal-stats` sends the overhead figures as DogStatsD gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsdAddress {
    /// `unix:///PATH` or `/PATH`: a Unix datagram socket (the agent's
    /// `dsd_socket`).
    Unix(std::path::PathBuf),
    /// `udp://HOST:PORT` or `HOST:PORT`.
    Udp(String),
}

impl std::fmt::Display for StatsdAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatsdAddress::Unix(path) => write!(f, "unix://{}", path.display()),
            StatsdAddress::Udp(address) => write!(f, "udp://{address}"),
        }
    }
}

impl std::str::FromStr for StatsdAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "`{text}`: a Unix socket path must be absolute (unix:///PATH)"
                ));
            }
            return Ok(StatsdAddress::Unix(path.into()));
        }
        if text.starts_with('/') {
            return Ok(StatsdAddress::Unix(text.into()));
        }
        let address = text.strip_prefix("udp://").unwrap_or(text);
        match address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(StatsdAddress::Udp(address.to_string()))
            }
            _ => Err(format!(
                "`{text}`: expected unix:///PATH, /PATH, udp://HOST:PORT or HOST:PORT"
            )),
        }
    }
}

/// Sends the overhead figures of each period as DogStatsD gauges (see
/// [`gauges`]), without ever blocking the profiler: a
/// datagram that cannot go out now is dropped, and one warning per failure
/// streak says so.
#[derive(Debug)]
pub struct StatsdSink {
    socket: StatsdSocket,
    tags: String,
    failing: bool,
}

#[derive(Debug)]
enum StatsdSocket {
    Unix(std::os::unix::net::UnixDatagram, std::path::PathBuf),
    Udp(std::net::UdpSocket),
}

/// The C++ ddprof's gauges start with this: the figures it sends are sent
/// under its names, for the dashboards and monitors built on them.
pub const CPP_STATSD_PREFIX: &str = "datadog.profiling.native.";
/// The figures the C++ ddprof has no gauge for start with this.
pub const STATSD_PREFIX: &str = "datadog.profiling.ddprof.";

impl StatsdSink {
    /// `tags`: `key:value` pairs added to every gauge.
    pub fn connect(address: &StatsdAddress, tags: &[(&str, &str)]) -> std::io::Result<Self> {
        let socket = match address {
            StatsdAddress::Unix(path) => {
                let socket = std::os::unix::net::UnixDatagram::unbound()?;
                socket.set_nonblocking(true)?;
                StatsdSocket::Unix(socket, path.clone())
            }
            StatsdAddress::Udp(address) => {
                use std::net::ToSocketAddrs;
                let target = address.to_socket_addrs()?.next().ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{address} resolves to no address"),
                    )
                })?;
                let local: std::net::SocketAddr = if target.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let socket = std::net::UdpSocket::bind(local)?;
                socket.connect(target)?;
                socket.set_nonblocking(true)?;
                StatsdSocket::Udp(socket)
            }
        };
        let tags = tags
            .iter()
            .map(|(key, value)| format!("{key}:{value}"))
            .collect::<Vec<_>>()
            .join(",");
        Ok(Self {
            socket,
            tags,
            failing: false,
        })
    }

    /// The datagram for one period: one gauge per line, `pprof_bytes` the
    /// size of its profile as uploaded.
    pub fn datagram(&self, overhead: &Overhead, pprof_bytes: usize) -> String {
        let mut datagram = String::new();
        for (name, value) in gauges(overhead, pprof_bytes) {
            datagram.push_str(&name);
            datagram.push(':');
            datagram.push_str(&format_value(value));
            datagram.push_str("|g");
            if !self.tags.is_empty() {
                datagram.push_str("|#");
                datagram.push_str(&self.tags);
            }
            datagram.push('\n');
        }
        datagram
    }

    pub fn send(&mut self, overhead: &Overhead, pprof_bytes: usize) {
        let datagram = self.datagram(overhead, pprof_bytes);
        let sent = match &self.socket {
            StatsdSocket::Unix(socket, path) => socket.send_to(datagram.as_bytes(), path),
            StatsdSocket::Udp(socket) => socket.send(datagram.as_bytes()),
        };
        match sent {
            Ok(_) => self.failing = false,
            Err(error) if !self.failing => {
                self.failing = true;
                log::warn!("cannot send the internal statistics: {error}");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overhead::{OverheadMeter, StackFigures};
    use crate::sample::{LossCounters, StackEnd};
    use std::collections::HashSet;
    use std::time::Duration;

    #[test]
    fn statsd_gauges_carry_the_cpp_ddprofs_names_and_meanings() {
        let ms = 1_000_000;
        let mut meter = OverheadMeter::start(10 * ms);
        meter.add_sample(10 * ms, StackEnd::Complete, 10);
        meter.add_sample(10 * ms, StackEnd::DepthLimit, 512);
        meter.add_sample(10 * ms, StackEnd::StackExhausted, 20);
        meter.add_sample(10 * ms, StackEnd::NoUnwindInfo, 4);
        meter.add_sample(10 * ms, StackEnd::NoUserContext, 0);
        let losses = LossCounters {
            lost: 3,
            ..LossCounters::default()
        };
        let period = meter.end_period(losses, Some(80 * ms));
        assert_eq!(
            period.stacks,
            StackFigures {
                frames: 546,
                depth_limited: 1,
                stack_exhausted: 1,
                walk_failed: 1,
            }
        );
        let overhead = Overhead {
            duration: Duration::from_secs(2),
            rss_kib: 2048,
            profiler_cpu: Duration::from_millis(30),
            ..period
        };
        let sent = gauges(&overhead, 1234);
        let names: HashSet<&str> = sent.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names.len(), sent.len(), "a gauge sent twice: {sent:?}");
        let gauge = |name: &str| {
            sent.iter()
                .find(|(gauge, _)| gauge == name)
                .unwrap_or_else(|| panic!("no {name} in {sent:?}"))
                .1
        };
        let native = |name: &str| gauge(&format!("datadog.profiling.native.{name}"));
        assert_eq!(native("sample.count"), 5.0);
        assert_eq!(native("event.lost"), 3.0);
        assert_eq!(native("unwind.frames"), 546.0);
        assert_eq!(native("unwind.errors"), 1.0);
        assert_eq!(native("unwind.stack.truncated_input"), 1.0);
        assert_eq!(native("unwind.stack.truncated_output"), 1.0);
        assert_eq!(native("unwind.stack.incomplete"), 4.0);
        // 546 / 5, as a whole number as the C++ ddprof sends it.
        assert_eq!(native("unwind.stack.avg_depth"), 109.0);
        assert_eq!(native("profiler.rss"), 2048.0 * 1024.0);
        assert_eq!(native("profiler.cpu_usage.millicores"), 15.0);
        // 80 ms of the tasks' CPU in 2 s.
        assert_eq!(native("target_process.cpu_usage.millicores"), 40.0);
        assert_eq!(native("profile.duration_ms"), 2000.0);
        assert_eq!(native("pprof.size"), 1234.0);
        // Ours only where the C++ set has no gauge.
        assert_eq!(gauge("datadog.profiling.ddprof.lost"), 3.0);
        assert!(!names.contains("datadog.profiling.ddprof.samples"));
        assert!(names
            .iter()
            .all(|name| name.starts_with(CPP_STATSD_PREFIX) || name.starts_with(STATSD_PREFIX)));
        let idle = Overhead {
            samples: 0,
            ..overhead
        };
        let idle = gauges(&idle, 0);
        assert!(idle.contains(&(
            "datadog.profiling.native.unwind.stack.avg_depth".to_string(),
            -1.0
        )));
    }
}
