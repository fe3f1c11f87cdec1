//! The profiler's own CPU time and memory: of its process (every thread),
//! of the children it waited for, of one thread, as `getrusage`, the
//! kernel's clocks and `/proc` give them.
use std::fmt;
use std::time::Duration;

/// The profiler's own resource use at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnUsage {
    /// User + system CPU time of this process and its waited-for children.
    pub cpu: Duration,
    /// Resident set size now (`VmRSS`), in KiB.
    pub rss_kib: u64,
    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub peak_rss_kib: u64,
}

impl OwnUsage {
    pub fn now() -> Self {
        let (rss_kib, peak_rss_kib) = memory_kib("self");
        Self {
            cpu: own_cpu_time(),
            rss_kib,
            peak_rss_kib,
        }
    }

    /// What `accounting` covers, now.
    pub fn of(accounting: Accounting) -> Self {
        match accounting {
            Accounting::ThisProcess => Self::now(),
            Accounting::WorkerOf { parent, before } => {
                // The worker's own time (it has no children) plus the
                // parent's, which includes the workers it has reaped, plus
                // the launcher's.
                let own = cpu_time_of(nix::sys::resource::UsageWho::RUSAGE_SELF) + before;
                let (rss_kib, peak_rss_kib) = memory_kib("self");
                let (parent_rss_kib, parent_peak_kib) = memory_kib(&parent.to_string());
                let both_now = rss_kib + parent_rss_kib;
                Self {
                    cpu: own + parent_cpu_time(parent),
                    rss_kib: both_now,
                    // Each process's own peak, or both now if higher: a
                    // peak below the RSS beside it read as a mistake.
                    peak_rss_kib: peak_rss_kib.max(parent_peak_kib).max(both_now),
                }
            }
        }
    }
}

/// Which processes the profiler's figures cover: the profiler is a parent
/// (which keeps the descriptors, BPF maps and exporter) and a worker (which
/// unwinds, aggregates and symbolizes), and both count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounting {
    /// This process and the children it waited for (the parent, or a
    /// profiler without a worker).
    ThisProcess,
    /// A worker: itself plus its parent's own CPU time and its waited-for
    /// children's (the previous workers), and `before` (what the profiler
    /// spent in the launcher); RSS summed, peak RSS the larger.
    WorkerOf { parent: u32, before: Duration },
}

/// User + system CPU time of process `pid` and of the children it waited
/// for. Its own time is read from its CPU-time clock (nanoseconds, every
/// thread, exited ones too); `/proc/PID/stat` has it only in clock ticks,
/// whose truncation (up to 10 ms per field) would show in short runs. The
/// waited-for children's time (the reaped workers) is known only from
/// there (fields 16-17, cutime and cstime).
pub(super) fn parent_cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // utime, stime, cutime and cstime are fields 14-17.
    let ticks: Option<Vec<u64>> = (14..=17)
        .map(|number| {
            crate::files::target::stat_field(&stat, number)
                .map(|field| field.parse::<u64>().unwrap_or(0))
        })
        .collect();
    let Some(&[utime, stime, cutime, cstime]) = ticks.as_deref() else {
        return Duration::ZERO;
    };
    // SAFETY: sysconf has no memory effects; _SC_CLK_TCK is always valid.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let from_ticks =
        |ticks: u64| Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second);
    let own = process_cpu_clock(pid).unwrap_or_else(|| from_ticks(utime + stime));
    own + from_ticks(cutime + cstime)
}

/// The CPU time of process `pid` (all its threads) from its CPU-time clock.
pub(super) fn process_cpu_clock(pid: u32) -> Option<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes the clock id of `pid`'s CPU time into `clock`.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: reads that clock into `now`.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return None;
    }
    Some(Duration::new(
        now.tv_sec.max(0) as u64,
        now.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

pub(super) fn cpu_time_of(who: nix::sys::resource::UsageWho) -> Duration {
    let Ok(usage) = nix::sys::resource::getrusage(who) else {
        return Duration::ZERO;
    };
    let to_duration = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    to_duration(usage.user_time()) + to_duration(usage.system_time())
}

/// User plus system CPU time of this process (all threads) and of the
/// children it waited for.
pub fn own_cpu_time() -> Duration {
    use nix::sys::resource::UsageWho;
    cpu_time_of(UsageWho::RUSAGE_SELF) + cpu_time_of(UsageWho::RUSAGE_CHILDREN)
}

/// `VmRSS` and `VmHWM` of `/proc/PROCESS` (`self` or a PID), in KiB (0
/// where unreadable).
pub(super) fn memory_kib(process: &str) -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{process}/status")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Where the calling thread's time went, from `/proc/thread-self/schedstat`:
/// running, and runnable but waiting for a CPU. A stage that took long in
/// wall-clock time was busy (`on_cpu`), kept off a CPU (`waiting`), or
/// blocked (neither: a disk read, a lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    pub on_cpu: Duration,
    pub waiting: Duration,
}

impl ThreadTimes {
    /// The calling thread's times so far; zero where the kernel does not
    /// keep them (no `CONFIG_SCHED_INFO`).
    pub fn now() -> Self {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// `schedstat`'s first two fields, in nanoseconds.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_ascii_whitespace();
        let mut next = || fields.next()?.parse::<u64>().ok().map(Duration::from_nanos);
        Some(Self {
            on_cpu: next()?,
            waiting: next()?,
        })
    }

    /// The times since `earlier`, taken on the same thread.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            on_cpu: self.on_cpu.saturating_sub(earlier.on_cpu),
            waiting: self.waiting.saturating_sub(earlier.waiting),
        }
    }
}

impl fmt::Display for ThreadTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.0} ms on a CPU, {:.0} ms waiting for one",
            self.on_cpu.as_secs_f64() * 1e3,
            self.waiting.as_secs_f64() * 1e3
        )
    }
}

/// Peak resident set size of this process (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> u64 {
    memory_kib("self").1
}

/// `VmRSS` of this process, in KiB.
pub fn rss_kib() -> u64 {
    memory_kib("self").0
}
