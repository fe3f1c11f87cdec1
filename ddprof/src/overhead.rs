//! What profiling costs, told to the user: per period and for the run, the
//! samples taken, lost and truncated, the profiler's own CPU time and memory,
//! and that CPU time as a share of the CPU time the profiled tasks used.
//!
//! The profiler's CPU is `getrusage` of its own process (every thread) and
//! of the children it waited for, the same quantity the benchmark reads from
//! outside (`wait4` or the cgroup of the profiler's processes). The target's
//! CPU is what the samples stand for: with `sCPU` each sample carries the
//! task-clock nanoseconds since the previous one (its weight), so their sum
//! is the CPU time of the profiled tasks; a lost sample counts for the
//! nominal period.
use std::fmt;
use std::time::Duration;

use crate::sample::{LossCounters, StackEnd};

mod own_usage;
pub use own_usage::{own_cpu_time, peak_rss_kib, rss_kib, Accounting, OwnUsage, ThreadTimes};

/// One of the profiler's bounded caches at a period's end: what it holds,
/// its budget, and what it let go since the run (or the worker) started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFigures {
    /// `unwind_tables`, `bpf_rows`, `symbol_files`, …
    pub name: &'static str,
    /// Files, tables or addresses held.
    pub entries: u64,
    /// What the budget counts (`bytes` or `entries`) held now.
    pub used: u64,
    /// The bound on `used`, if the cache has one (files unused for a while
    /// are dropped instead).
    pub budget: Option<u64>,
    pub unit: &'static str,
    /// Entries evicted (or refused) to stay within the budget.
    pub evicted: u64,
}

impl CacheFigures {
    /// `ddprof.cache.NAME.FIGURE=VALUE` comments, for the pprof profile.
    pub fn comments(caches: &[CacheFigures]) -> Vec<String> {
        let mut comments = Vec::new();
        for cache in caches {
            let name = cache.name;
            comments.push(format!("ddprof.cache.{name}.entries={}", cache.entries));
            comments.push(format!("ddprof.cache.{name}.{}={}", cache.unit, cache.used));
            if let Some(budget) = cache.budget {
                comments.push(format!(
                    "ddprof.cache.{name}.budget_{}={budget}",
                    cache.unit
                ));
            }
            comments.push(format!("ddprof.cache.{name}.evicted={}", cache.evicted));
        }
        comments
    }

    /// One log line's worth: `perf_unwind_tables 3 (1.2 of 256.0 MiB, 0 evicted),
    /// symbol_files 2 (2 entries, 0 evicted), …`.
    pub fn describe(caches: &[CacheFigures]) -> String {
        let amount = |cache: &CacheFigures, value: u64| match cache.unit {
            "bytes" => format!("{:.1}", value as f64 / (1 << 20) as f64),
            _ => value.to_string(),
        };
        caches
            .iter()
            .map(|cache| {
                let unit = if cache.unit == "bytes" {
                    " MiB".to_string()
                } else {
                    format!(" {}", cache.unit)
                };
                let used = match cache.budget {
                    Some(budget) => format!(
                        "{} of {}{unit}",
                        amount(cache, cache.used),
                        amount(cache, budget)
                    ),
                    None => format!("{}{unit}", amount(cache, cache.used)),
                };
                format!(
                    "{} {} ({used}, {} evicted)",
                    cache.name, cache.entries, cache.evicted
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Samples that were due and were not delivered, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    /// The kernel's ring buffers were full (`PERF_RECORD_LOST`,
    /// `PERF_RECORD_LOST_SAMPLES`, the BPF ring buffer full).
    pub ring_full: u64,
    /// Records that could not be parsed.
    pub malformed: u64,
    /// CPU time the kernel counted for the profiled tasks that no sample
    /// and no loss above stands for, in samples of the nominal period:
    /// time a task ran after its last sample and before it ended (each
    /// thread and process counts towards its own next sample, so a
    /// short-lived one may never reach it), time the kernel throttled
    /// sampling, and samples a worker read but never delivered (it died).
    /// Known where the events count tasks (not `--global`).
    pub unsampled: u64,
    /// Of the same, what the first period of a worker that replaced a dead
    /// one found: samples the dead worker read and never delivered, and
    /// those the kernel dropped while it hung or was stopped.
    pub worker: u64,
    /// Samples of profiled processes taken on their way out, after their
    /// exit record (every CPU sampled): no address space left to unwind,
    /// and beyond the kernel's count of the tasks' CPU time (which stops
    /// when their events detach), so not in `unsampled` either.
    pub exiting: u64,
}

impl Lost {
    pub fn total(&self) -> u64 {
        self.ring_full + self.malformed + self.unsampled + self.worker + self.exiting
    }
}

impl std::ops::Add for Lost {
    type Output = Lost;

    fn add(self, other: Lost) -> Lost {
        Lost {
            ring_full: self.ring_full + other.ring_full,
            malformed: self.malformed + other.malformed,
            unsampled: self.unsampled + other.unsampled,
            worker: self.worker + other.worker,
            exiting: self.exiting + other.exiting,
        }
    }
}

/// The allocation probes' samples (`sALLOC`): not CPU samples, so apart
/// from [`Overhead::samples`] and its accounting of CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapSamples {
    /// Sampled allocations (and mappings).
    pub allocations: u64,
    /// Frees of sampled addresses (the live heap's).
    pub frees: u64,
}

impl std::ops::AddAssign for HeapSamples {
    fn add_assign(&mut self, other: HeapSamples) {
        self.allocations += other.allocations;
        self.frees += other.frees;
    }
}

/// What the periods of the run add up to so far: kept by whichever worker
/// runs and handed to the next one by the parent, so that the run's
/// accounting survives worker restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunTotals {
    pub samples: u64,
    pub heap: HeapSamples,
    /// Samples whose user stack did not reach its root.
    pub truncated: u64,
    /// The delivered samples' weights (task-clock nanoseconds for sCPU).
    pub weight_nanos: u64,
    pub lost: Lost,
    pub throttles: u64,
    /// The profiled tasks' CPU time as the kernel counted it at the end of
    /// the last period (see `Sampler::counted_task_nanos`), when it counts
    /// them.
    pub counted_nanos: Option<u64>,
    /// The sampling loop's time on a CPU and waiting for one, over the
    /// periods that lost samples in full buffers: whether it fell behind
    /// busy, or kept off a CPU by a saturated machine.
    pub losing_loop: ThreadTimes,
}

/// The figures of one period (or, from [`OverheadMeter::run`], of the run).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overhead {
    /// Wall-clock length of the period.
    pub duration: Duration,
    /// CPU samples (of the CPU-time events; the others' samples and the
    /// allocation probes' are not CPU time).
    pub samples: u64,
    pub heap: HeapSamples,
    /// Samples due and not delivered, by cause.
    pub lost: Lost,
    /// Times the kernel throttled sampling (the time it took no sample is
    /// in `lost.unsampled`).
    pub throttles: u64,
    /// Samples whose user stack did not reach its root.
    pub truncated: u64,
    /// How the user stacks came out.
    pub stacks: StackFigures,
    pub profiler_cpu: Duration,
    /// CPU time of the profiled tasks: the kernel's count where the events
    /// count tasks, else what the samples and the lost ones stand for.
    pub target_cpu: Duration,
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    /// The run's totals after this period.
    pub run: RunTotals,
}

impl Overhead {
    /// The profiler's CPU time as a share of the target's, in percent:
    /// `None` when the target used no CPU time.
    pub fn cpu_share_percent(&self) -> Option<f64> {
        (!self.target_cpu.is_zero())
            .then(|| 100.0 * self.profiler_cpu.as_secs_f64() / self.target_cpu.as_secs_f64())
    }

    /// The profiler's CPU time per second of wall-clock time, in millicores.
    pub fn profiler_millicores(&self) -> f64 {
        self.millicores(self.profiler_cpu)
    }

    /// `cpu` per second of the period's wall-clock time, in millicores.
    pub fn millicores(&self, cpu: Duration) -> f64 {
        if self.duration.is_zero() {
            return 0.0;
        }
        1000.0 * cpu.as_secs_f64() / self.duration.as_secs_f64()
    }

    /// `(name, value)` pairs, as the pprof comments, the log lines and the
    /// DogStatsD gauges name them.
    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        let mut fields = vec![
            ("samples", self.samples as f64),
            ("alloc_samples", self.heap.allocations as f64),
            ("freed_samples", self.heap.frees as f64),
            ("lost", self.lost.total() as f64),
            ("lost_ring_full", self.lost.ring_full as f64),
            ("lost_malformed", self.lost.malformed as f64),
            ("lost_unsampled", self.lost.unsampled as f64),
            ("lost_worker", self.lost.worker as f64),
            ("lost_exiting", self.lost.exiting as f64),
            ("throttles", self.throttles as f64),
            ("truncated", self.truncated as f64),
            ("profiler_cpu_ms", self.profiler_cpu.as_secs_f64() * 1e3),
            ("target_cpu_ms", self.target_cpu.as_secs_f64() * 1e3),
            ("profiler_millicores", self.profiler_millicores()),
            ("rss_kib", self.rss_kib as f64),
            ("peak_rss_kib", self.peak_rss_kib as f64),
        ];
        if let Some(share) = self.cpu_share_percent() {
            fields.push(("profiler_cpu_share_percent", share));
        }
        fields
    }

    /// One `ddprof.overhead.NAME=VALUE` comment per figure, for the pprof
    /// profile of the period.
    pub fn comments(&self) -> Vec<String> {
        self.fields()
            .into_iter()
            .map(|(name, value)| format!("ddprof.overhead.{name}={}", format_value(value)))
            .collect()
    }
}

pub(crate) fn format_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value:.2}")
    }
}

impl fmt::Display for Overhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} samples", self.samples)?;
        if self.heap != HeapSamples::default() {
            write!(
                f,
                " (and {} allocation samples, {} frees of sampled addresses)",
                self.heap.allocations, self.heap.frees
            )?;
        }
        write!(f, ", {} lost", self.lost.total())?;
        if self.lost.total() > 0 || self.throttles > 0 {
            write!(
                f,
                " ({} ring buffer full, {} malformed, {} unsampled, {} with a dead worker, {} \
                 exiting; {} throttles)",
                self.lost.ring_full,
                self.lost.malformed,
                self.lost.unsampled,
                self.lost.worker,
                self.lost.exiting,
                self.throttles
            )?;
        }
        write!(
            f,
            ", {} truncated; profiler CPU {:.0} ms",
            self.truncated,
            self.profiler_cpu.as_secs_f64() * 1e3,
        )?;
        match self.cpu_share_percent() {
            Some(share) => write!(
                f,
                " ({share:.2} % of the profiled tasks' {:.0} ms)",
                self.target_cpu.as_secs_f64() * 1e3
            )?,
            None => write!(f, " (the profiled tasks used no CPU time)")?,
        }
        write!(
            f,
            ", RSS {:.1} MiB (peak {:.1} MiB)",
            self.rss_kib as f64 / 1024.0,
            self.peak_rss_kib as f64 / 1024.0
        )
    }
}

/// Turns the running counters of the profiler loop into per-period and
/// whole-run [`Overhead`]s.
#[derive(Debug, Clone)]
pub struct OverheadMeter {
    /// Nominal CPU nanoseconds of one sample, what a lost sample counts for.
    sample_period_nanos: u64,
    run_start: std::time::Instant,
    period_start: std::time::Instant,
    /// Own CPU time at the end of the previous period: the first period
    /// counts from the process's start, so that start-up (loading the BPF
    /// program, compiling tables) is part of the cost reported.
    period_start_cpu: Duration,
    period: Counts,
    /// The run so far, earlier workers' periods included.
    run: RunTotals,
    /// The engine's loss counters when the previous period ended (a
    /// worker's engine counts from the fork it started at).
    losses_before: LossCounters,
    /// This worker replaced one that died, and its first period has not
    /// ended yet (what it finds unaccounted for is the dead worker's).
    after_a_dead_worker: bool,
    /// Handed-over samples lost in shared per-CPU buffers
    /// ([`LossCounters::unattributed`]) in this period and the last, not
    /// found to be the profiled tasks'.
    unattributed_pending: u64,
    accounting: Accounting,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    samples: u64,
    heap: HeapSamples,
    truncated: u64,
    weight_nanos: u64,
    stacks: StackFigures,
}

/// How a period's user stacks came out, by the C++ ddprof's `unwind.*`
/// gauges' meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackFigures {
    /// User frames of all the samples.
    pub frames: u64,
    /// Samples whose walk stopped at the frame limit (`truncated_output`).
    pub depth_limited: u64,
    /// Samples whose copied stack ran out before the root, perf engine
    /// (`truncated_input`).
    pub stack_exhausted: u64,
    /// Samples whose walk failed: no unwind row, an unreadable address, no
    /// progress (`unwind.errors`).
    pub walk_failed: u64,
}

impl StackFigures {
    fn add(&mut self, end: StackEnd, frames: usize) {
        self.frames = self.frames.saturating_add(frames as u64);
        match end {
            StackEnd::DepthLimit => self.depth_limited += 1,
            StackEnd::StackExhausted => self.stack_exhausted += 1,
            StackEnd::NoUnwindInfo | StackEnd::BadAddress | StackEnd::NoProgress => {
                self.walk_failed += 1
            }
            StackEnd::Complete | StackEnd::NoUserContext => {}
        }
    }
}

impl OverheadMeter {
    pub fn start(sample_period_nanos: u64) -> Self {
        let now = std::time::Instant::now();
        Self {
            sample_period_nanos,
            run_start: now,
            period_start: now,
            period_start_cpu: Duration::ZERO,
            period: Counts::default(),
            run: RunTotals::default(),
            losses_before: LossCounters::default(),
            after_a_dead_worker: false,
            unattributed_pending: 0,
            accounting: Accounting::ThisProcess,
        }
    }

    /// Says that this meter's worker replaced one that died: its first
    /// period's unaccounted samples are [`Lost::worker`].
    pub fn after_a_dead_worker(mut self) -> Self {
        self.after_a_dead_worker = true;
        self
    }

    /// A meter that takes over from earlier ones (a new worker): its first
    /// period counts the CPU time of `accounting` beyond `cpu_counted`
    /// (what earlier periods reported), the engine's losses beyond
    /// `losses_before`, and adds to `run`.
    pub fn resume(
        sample_period_nanos: u64,
        accounting: Accounting,
        cpu_counted: Duration,
        run: RunTotals,
        losses_before: LossCounters,
    ) -> Self {
        Self {
            period_start_cpu: cpu_counted,
            run,
            losses_before,
            accounting,
            ..Self::start(sample_period_nanos)
        }
    }

    /// Counts one sample of the current period: its weight, how its user
    /// stack walk ended and how many user frames it has.
    pub fn add_sample(&mut self, weight_nanos: u64, end: StackEnd, frames: usize) {
        let counts = &mut self.period;
        counts.samples += 1;
        counts.truncated += u64::from(!end.is_complete());
        counts.weight_nanos = counts.weight_nanos.saturating_add(weight_nanos);
        counts.stacks.add(end, frames);
    }

    /// Counts one sample of an allocation probe: a sampled allocation, or
    /// (`freed`) a free of a sampled address.
    pub fn add_heap_sample(&mut self, freed: bool) {
        let heap = &mut self.period.heap;
        if freed {
            heap.frees += 1;
        } else {
            heap.allocations += 1;
        }
    }

    /// Ends the period: its figures, given the engine's loss counters since
    /// it started (`losses`) and the profiled tasks' CPU time as the kernel
    /// counts it (`counted_nanos`, when it does).
    ///
    /// Every sample due is accounted for: what the kernel counted and no
    /// sample, ring-buffer loss or unreadable record stands for is
    /// `lost.unsampled`. Samples still in the buffers at the period's end
    /// make it a little high for that period; the run's figure is exact
    /// once the last period is flushed (see [`OverheadMeter::run`]).
    pub fn end_period(&mut self, losses: LossCounters, counted_nanos: Option<u64>) -> Overhead {
        let new = LossCounters {
            lost: losses.lost.saturating_sub(self.losses_before.lost),
            throttled: losses
                .throttled
                .saturating_sub(self.losses_before.throttled),
            malformed: losses
                .malformed
                .saturating_sub(self.losses_before.malformed),
            exiting: losses.exiting.saturating_sub(self.losses_before.exiting),
            unattributed: losses
                .unattributed
                .saturating_sub(self.losses_before.unattributed),
        };
        self.losses_before = losses;
        if new.unattributed > 0 {
            log::info!(
                "{} samples handed to the perf engine were lost in full per-CPU buffers; they \
                 count as lost as far as the kernel's count of the profiled tasks' CPU time \
                 says samples of theirs are missing (the others were other processes')",
                new.unattributed
            );
        }
        self.unattributed_pending += new.unattributed;
        let period = std::mem::take(&mut self.period);
        let run = &mut self.run;
        run.samples += period.samples;
        run.heap += period.heap;
        run.truncated += period.truncated;
        run.weight_nanos = run.weight_nanos.saturating_add(period.weight_nanos);
        run.lost.ring_full += new.lost;
        run.lost.malformed += new.malformed;
        run.lost.exiting += new.exiting;
        run.throttles += new.throttled;
        let mut lost = Lost {
            ring_full: new.lost,
            malformed: new.malformed,
            exiting: new.exiting,
            ..Lost::default()
        };
        let counted_before = run.counted_nanos;
        let target_nanos = match counted_nanos {
            Some(counted) => {
                let unaccounted = unsampled_samples(run, counted, self.sample_period_nanos);
                // Reported once: it only grows (see above).
                let mut found = unaccounted.saturating_sub(run.lost.unsampled + run.lost.worker);
                // Samples missing while shared buffers lost handed-over
                // samples: lost there.
                let in_shared_buffers = found.min(self.unattributed_pending);
                self.unattributed_pending -= in_shared_buffers;
                found -= in_shared_buffers;
                lost.ring_full += in_shared_buffers;
                run.lost.ring_full += in_shared_buffers;
                if std::mem::take(&mut self.after_a_dead_worker) {
                    lost.worker = found;
                    run.lost.worker += found;
                } else {
                    lost.unsampled = found;
                    run.lost.unsampled += found;
                }
                run.counted_nanos = Some(counted);
                counted.saturating_sub(counted_before.unwrap_or(0))
            }
            // No count of the tasks (`--global`): every CPU event is the
            // profiler's own, none shares its buffer with others.
            None => period.weight_nanos.saturating_add(
                (lost.ring_full + lost.malformed).saturating_mul(self.sample_period_nanos),
            ),
        };
        // A sample still in a buffer at a period's end is found missing
        // then and arrives in the next: a period's shared losses can stand
        // for the next period's deficit, no later one.
        self.unattributed_pending = self.unattributed_pending.min(new.unattributed);
        let usage = OwnUsage::of(self.accounting);
        let now = std::time::Instant::now();
        let overhead = Overhead {
            duration: now - self.period_start,
            samples: period.samples,
            heap: period.heap,
            lost,
            throttles: new.throttled,
            truncated: period.truncated,
            stacks: period.stacks,
            profiler_cpu: usage.cpu.saturating_sub(self.period_start_cpu),
            target_cpu: Duration::from_nanos(target_nanos),
            rss_kib: usage.rss_kib,
            peak_rss_kib: usage.peak_rss_kib,
            run: *run,
        };
        self.period_start = now;
        self.period_start_cpu = usage.cpu;
        overhead
    }

    /// Adds the sampling loop's times over a period that lost samples in
    /// full buffers to the run's; returns the run's totals.
    pub fn add_losing_loop(&mut self, times: ThreadTimes) -> RunTotals {
        self.run.losing_loop.on_cpu += times.on_cpu;
        self.run.losing_loop.waiting += times.waiting;
        self.run
    }

    /// The run's totals so far (as of the last [`end_period`]).
    ///
    /// [`end_period`]: OverheadMeter::end_period
    pub fn totals(&self) -> RunTotals {
        self.run
    }

    /// The whole run's figures so far (call after the last [`end_period`]).
    ///
    /// [`end_period`]: OverheadMeter::end_period
    pub fn run(&self) -> Overhead {
        let usage = OwnUsage::of(self.accounting);
        Overhead {
            duration: self.run_start.elapsed(),
            profiler_cpu: usage.cpu,
            rss_kib: usage.rss_kib,
            peak_rss_kib: usage.peak_rss_kib,
            ..Overhead::of_run(&self.run, self.sample_period_nanos)
        }
    }
}

impl Overhead {
    /// The run's sample figures from its totals: the losses as the last
    /// period's accounting found them (exact once every sample due was
    /// delivered), the target's CPU time as the kernel counted it.
    pub fn of_run(run: &RunTotals, sample_period_nanos: u64) -> Overhead {
        let mut lost = run.lost;
        let target_nanos = match run.counted_nanos {
            Some(counted) => {
                let unaccounted = unsampled_samples(run, counted, sample_period_nanos);
                // The dead workers' share as the periods found it, the rest
                // as it stands now.
                lost.worker = run.lost.worker.min(unaccounted);
                lost.unsampled = unaccounted - lost.worker;
                counted
            }
            None => run.weight_nanos.saturating_add(
                (lost.ring_full + lost.malformed).saturating_mul(sample_period_nanos),
            ),
        };
        Overhead {
            samples: run.samples,
            heap: run.heap,
            lost,
            throttles: run.throttles,
            truncated: run.truncated,
            target_cpu: Duration::from_nanos(target_nanos),
            run: *run,
            ..Overhead::default()
        }
    }
}

/// The samples' worth of `counted` CPU nanoseconds that no delivered sample
/// (their weights) and no counted loss stands for.
fn unsampled_samples(run: &RunTotals, counted: u64, sample_period_nanos: u64) -> u64 {
    let accounted = run.weight_nanos.saturating_add(
        (run.lost.ring_full + run.lost.malformed).saturating_mul(sample_period_nanos),
    );
    counted.saturating_sub(accounted) / sample_period_nanos.max(1)
}

#[cfg(test)]
mod tests {
    use super::own_usage::{cpu_time_of, parent_cpu_time, process_cpu_clock};
    use super::*;

    #[test]
    fn a_threads_times_count_its_own_cpu_and_not_another_threads() {
        let burn = |duration: Duration| {
            let mut x = 1u64;
            let until = std::time::Instant::now() + duration;
            while std::time::Instant::now() < until {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        };
        let before = ThreadTimes::now();
        std::thread::scope(|scope| {
            scope.spawn(|| burn(Duration::from_millis(200)));
        });
        burn(Duration::from_millis(50));
        let spent = ThreadTimes::now().since(before);
        // A busy loop is on a CPU or waiting for one all along: a busy
        // machine moves time from the first to the second (CI at 12a2a7f:
        // 37.6 ms on a CPU and 11.7 ms waiting for this 50 ms loop), and
        // the other thread's 200 ms must be in neither.
        let this_threads = spent.on_cpu + spent.waiting;
        assert!(
            this_threads >= Duration::from_millis(45)
                && this_threads < Duration::from_millis(150)
                && spent.on_cpu >= Duration::from_millis(5),
            "{spent:?}"
        );
        assert_eq!(
            ThreadTimes::parse("1500000 2500000 7\n"),
            Some(ThreadTimes {
                on_cpu: Duration::from_micros(1500),
                waiting: Duration::from_micros(2500)
            })
        );
        assert_eq!(ThreadTimes::parse("garbage"), None);
    }

    #[test]
    fn periods_split_the_counts_and_the_run_adds_them_up() {
        let mut meter = OverheadMeter::start(10_000_000);
        for _ in 0..90 {
            meter.add_sample(10_000_000, StackEnd::Complete, 3);
        }
        for _ in 0..10 {
            meter.add_sample(10_000_000, StackEnd::BadAddress, 3);
        }
        // Burn a little CPU so that the profiler's share is measurable:
        // 30 ms of this process's CPU time (not of wall time, which a busy
        // machine gives less of: 213 unit tests on 2 CPUs).
        let mut x = 1u64;
        let burn_until = own_cpu_time() + Duration::from_millis(30);
        while own_cpu_time() < burn_until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let losses = |lost, malformed| LossCounters {
            lost,
            throttled: 0,
            malformed,
            exiting: 0,
            unattributed: 0,
        };
        let first = meter.end_period(losses(5, 0), None);
        assert_eq!(
            (first.samples, first.lost.total(), first.truncated),
            (100, 5, 10)
        );
        // 100 samples of 10 ms and 5 lost ones of the nominal 10 ms.
        assert_eq!(first.target_cpu, Duration::from_millis(1050));
        assert!(first.profiler_cpu >= Duration::from_millis(20), "{first:?}");
        // At least the 30 ms burnt of the 1,050 ms; no upper bound: the
        // profiler's CPU here is the whole test process's, the tests beside
        // this one included (73.6 % once in a suite run beside a build).
        let share = first.cpu_share_percent().unwrap();
        assert!(share > 1.9, "{share}");
        assert!(first.peak_rss_kib >= first.rss_kib && first.rss_kib > 0);

        meter.add_sample(20_000_000, StackEnd::Complete, 3);
        let second = meter.end_period(losses(5, 0), None);
        assert_eq!(
            (second.samples, second.lost.total(), second.truncated),
            (1, 0, 0)
        );
        assert_eq!(second.target_cpu, Duration::from_millis(20));

        let run = meter.run();
        assert_eq!((run.samples, run.lost.total(), run.truncated), (101, 5, 10));
        assert_eq!(run.target_cpu, Duration::from_millis(1070));
        assert!(run.profiler_cpu >= first.profiler_cpu + second.profiler_cpu);
    }

    /// The allocation probes' samples are counted apart from the CPU
    /// samples (they stand for no CPU time), per period and for the run,
    /// and the log line says them only when there are some.
    #[test]
    fn allocation_samples_are_counted_apart() {
        let mut meter = OverheadMeter::start(10_000_000);
        meter.add_sample(10_000_000, StackEnd::Complete, 3);
        for _ in 0..4 {
            meter.add_heap_sample(false);
        }
        meter.add_heap_sample(true);
        let first = meter.end_period(LossCounters::default(), None);
        assert_eq!(first.samples, 1);
        assert_eq!(
            first.heap,
            HeapSamples {
                allocations: 4,
                frees: 1
            }
        );
        assert_eq!(first.target_cpu, Duration::from_millis(10));
        assert!(first.to_string().starts_with(
            "1 samples (and 4 allocation samples, 1 frees of sampled addresses), 0 lost"
        ));
        meter.add_heap_sample(false);
        let second = meter.end_period(LossCounters::default(), None);
        assert_eq!((second.samples, second.heap.allocations), (0, 1));
        assert!(second
            .to_string()
            .starts_with("0 samples (and 1 allocation"));
        assert_eq!(
            meter.run().heap,
            HeapSamples {
                allocations: 5,
                frees: 1
            }
        );
        meter.add_sample(10_000_000, StackEnd::Complete, 3);
        let third = meter.end_period(LossCounters::default(), None);
        assert!(
            third.to_string().starts_with("1 samples, 0 lost"),
            "{third}"
        );
    }

    /// Handed-over samples lost in buffers shared with other processes
    /// count as lost only as far as the kernel's count says samples of the
    /// profiled tasks are missing: other processes' losses (a fork storm
    /// beside a stopped worker) never make the figures exceed what was due.
    #[test]
    fn losses_in_shared_buffers_count_only_as_far_as_the_tasks_miss_samples() {
        let ms = 1_000_000;
        let mut meter = OverheadMeter::start(10 * ms);
        for _ in 0..50 {
            meter.add_sample(10 * ms, StackEnd::Complete, 3);
        }
        let shared = |unattributed| LossCounters {
            unattributed,
            ..LossCounters::default()
        };
        // 500 ms sampled of 530 ms counted, 400 lost in shared buffers:
        // 3 of them were the tasks'.
        let first = meter.end_period(shared(400), Some(530 * ms));
        assert_eq!((first.lost.ring_full, first.lost.unsampled), (3, 0));
        // All delivered next period: nothing more is theirs.
        for _ in 0..10 {
            meter.add_sample(10 * ms, StackEnd::Complete, 3);
        }
        let second = meter.end_period(shared(400), Some(630 * ms));
        assert_eq!(second.lost.total(), 0);
        // Missing samples beyond what the shared buffers lost are
        // unsampled.
        let third = meter.end_period(shared(402), Some(1_000 * ms));
        assert_eq!((third.lost.ring_full, third.lost.unsampled), (2, 35));
        let run = meter.run();
        assert_eq!(run.samples + run.lost.total(), 100);
    }

    /// With the kernel's count of the tasks' CPU time, what no sample or
    /// counted loss stands for is lost as unsampled: per period as it is
    /// found (never taken back), for the run exactly; and a new worker's
    /// meter goes on from the run's totals.
    #[test]
    fn what_the_kernel_counted_and_no_sample_stands_for_is_lost_unsampled() {
        let ms = 1_000_000;
        let mut meter = OverheadMeter::start(10 * ms);
        for _ in 0..50 {
            meter.add_sample(10 * ms, StackEnd::Complete, 3);
        }
        let losses = LossCounters {
            lost: 2,
            throttled: 1,
            malformed: 1,
            exiting: 0,
            unattributed: 0,
        };
        // 500 ms sampled, 30 ms lost in the buffers; the kernel counted
        // 600 ms: 70 ms (7 samples) not accounted for.
        let first = meter.end_period(losses, Some(600 * ms));
        assert_eq!(
            first.lost,
            Lost {
                ring_full: 2,
                malformed: 1,
                unsampled: 7,
                worker: 0,
                exiting: 0,
            }
        );
        assert_eq!((first.throttles, first.lost.total()), (1, 10));
        assert_eq!(first.target_cpu, Duration::from_millis(600));
        // Samples still in the buffers then arrive: the next period finds
        // less unsampled than reported, and reports none more.
        for _ in 0..10 {
            meter.add_sample(10 * ms, StackEnd::Complete, 3);
        }
        let second = meter.end_period(losses, Some(650 * ms));
        assert_eq!(second.lost.unsampled, 0);
        assert_eq!(second.target_cpu, Duration::from_millis(50));
        // The run's figure is the accounting as it stands: 650 ms counted,
        // 600 sampled, 30 lost: 2 unsampled.
        let run = meter.run();
        assert_eq!(run.lost.unsampled, 2);
        assert_eq!(run.samples + run.lost.total(), 65);
        assert_eq!(run.target_cpu, Duration::from_millis(650));
        // A worker that takes over adds to the run.
        let mut next = OverheadMeter::resume(
            10 * ms,
            Accounting::ThisProcess,
            Duration::ZERO,
            second.run,
            LossCounters::default(),
        );
        next.add_sample(10 * ms, StackEnd::Complete, 3);
        let third = next.end_period(LossCounters::default(), Some(700 * ms));
        assert_eq!(third.target_cpu, Duration::from_millis(50));
        assert_eq!(
            third.lost.unsampled, 0,
            "2 + 4 unsampled, 7 reported already"
        );
        let run = next.run();
        assert_eq!((run.samples, run.lost.unsampled), (61, 6));
        // One that replaced a dead worker finds the samples that worker
        // never sent missing: lost with it.
        let mut after_crash = OverheadMeter::resume(
            10 * ms,
            Accounting::ThisProcess,
            Duration::ZERO,
            third.run,
            LossCounters::default(),
        )
        .after_a_dead_worker();
        after_crash.add_sample(10 * ms, StackEnd::Complete, 3);
        let fourth = after_crash.end_period(LossCounters::default(), Some(1_000 * ms));
        // 1000 ms counted, 620 sampled, 30 lost in the buffers, 7 unsampled
        // reported: 28 more.
        assert_eq!((fourth.lost.worker, fourth.lost.unsampled), (28, 0));
        after_crash.add_sample(10 * ms, StackEnd::Complete, 3);
        let fifth = after_crash.end_period(LossCounters::default(), Some(1_100 * ms));
        assert_eq!((fifth.lost.worker, fifth.lost.unsampled), (0, 9));
        let run = after_crash.run();
        assert_eq!((run.lost.worker, run.lost.unsampled), (28, 16));
        assert_eq!(run.samples + run.lost.total(), 110);
    }

    #[test]
    fn a_parents_cpu_time_is_read_to_the_nanosecond() {
        // Burn some CPU, then read this process as a worker reads its parent.
        let mut x = 1u64;
        let burn_until = std::time::Instant::now() + Duration::from_millis(30);
        while std::time::Instant::now() < burn_until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let me = std::process::id();
        let clock = process_cpu_clock(me).unwrap();
        let own = cpu_time_of(nix::sys::resource::UsageWho::RUSAGE_SELF);
        assert!(clock >= Duration::from_millis(30), "{clock:?}");
        assert!(
            clock.abs_diff(own) < Duration::from_millis(20),
            "{clock:?} {own:?}"
        );
        assert!(parent_cpu_time(me) >= clock);
        assert_eq!(parent_cpu_time(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn a_period_without_target_cpu_has_no_share() {
        let mut meter = OverheadMeter::start(10_000_000);
        let period = meter.end_period(LossCounters::default(), None);
        assert_eq!(period.cpu_share_percent(), None);
        assert!(period.to_string().contains("used no CPU time"), "{period}");
        assert!(!period.comments().iter().any(|c| c.contains("cpu_share")));
    }

    #[test]
    fn comments_and_the_log_line_carry_every_figure() {
        let overhead = Overhead {
            duration: Duration::from_secs(10),
            samples: 990,
            heap: HeapSamples {
                allocations: 30,
                frees: 3,
            },
            lost: Lost {
                ring_full: 1,
                malformed: 0,
                unsampled: 2,
                worker: 0,
                exiting: 4,
            },
            throttles: 0,
            truncated: 7,
            stacks: StackFigures::default(),
            profiler_cpu: Duration::from_millis(25),
            target_cpu: Duration::from_millis(10_000),
            rss_kib: 20480,
            peak_rss_kib: 30720,
            run: RunTotals::default(),
        };
        assert_eq!(
            overhead.comments(),
            [
                "ddprof.overhead.samples=990",
                "ddprof.overhead.alloc_samples=30",
                "ddprof.overhead.freed_samples=3",
                "ddprof.overhead.lost=7",
                "ddprof.overhead.lost_ring_full=1",
                "ddprof.overhead.lost_malformed=0",
                "ddprof.overhead.lost_unsampled=2",
                "ddprof.overhead.lost_worker=0",
                "ddprof.overhead.lost_exiting=4",
                "ddprof.overhead.throttles=0",
                "ddprof.overhead.truncated=7",
                "ddprof.overhead.profiler_cpu_ms=25",
                "ddprof.overhead.target_cpu_ms=10000",
                "ddprof.overhead.profiler_millicores=2.50",
                "ddprof.overhead.rss_kib=20480",
                "ddprof.overhead.peak_rss_kib=30720",
                "ddprof.overhead.profiler_cpu_share_percent=0.25",
            ]
        );
        assert_eq!(
            overhead.to_string(),
            "990 samples (and 30 allocation samples, 3 frees of sampled addresses), 7 lost (1 \
             ring buffer full, 0 malformed, 2 unsampled, 0 with a dead \
             worker, 4 exiting; 0 throttles), 7 truncated; profiler CPU 25 ms (0.25 % of the profiled \
             tasks' 10000 ms), RSS 20.0 MiB (peak 30.0 MiB)"
        );
    }
}
