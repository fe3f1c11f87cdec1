//! The profiler's main loop: picks the engine, drives it, and feeds
//! aggregation, symbolization and outputs.
//!
//! One thread does everything, in this order per poll: the engine applies
//! process events to the [`ProcessTable`] and hands over samples, which the
//! [`Aggregator`] normalizes at once (so that processes that exit before the
//! flush are still symbolized). At the end of each upload period, and when
//! the target is gone, the period is symbolized, encoded as pprof and
//! written; the whole run's folded stacks become `flamegraph.svg` and
//! `stacks.folded` at exit.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::aggregate::{Aggregator, AggregatorOptions};
use crate::bpf::{choose_engine_with, BpfEngine, BpfEngineOptions, DEFAULT_RING_BUFFER_BYTES};
use crate::config::{Cli, SampleRate};
use crate::events::EventFd;
use crate::launch;
use crate::output::{FoldedStacks, OutputError, OutputWriter, Summary};
use crate::overhead::{OverheadMeter, StatsdAddress, StatsdSink};
use crate::perf::{monotonic_now, PerfEngine, PerfEngineOptions, PerfError, HOLD_BACK};
use crate::process::ProcessTable;
use crate::profile::{encode_pprof, ProfileError, ProfileMetadata};
use crate::sample::Sample;
use crate::symbolize::{Symbolizer, SymbolizerOptions};
use ddprof_common::sample::BpfCounter;

/// What is being profiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The command the launcher exec'd (it keeps this PID), and its children.
    Launched { pid: u32 },
    /// A running process (`-p`) and its children.
    Pid(u32),
    /// Every process (`--global`).
    Global,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Perf(#[from] PerfError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

/// The longest the loop sleeps in the engine before it looks at the clock,
/// the target and stop requests again.
const MAX_POLL: Duration = Duration::from_millis(250);

/// The sampling engine in use.
enum Engine {
    Perf(PerfEngine),
    /// The BPF engine produces the samples; a perf engine on duplicates of
    /// the same descriptors reads their mmap/comm/task records (the BPF
    /// program keeps the samples out of the perf buffers) and keeps the
    /// process table, which the BPF engine mirrors into its maps.
    Bpf {
        samples: Box<BpfEngine>,
        records: PerfEngine,
        /// BPF samples newer than the records read so far, waiting for them.
        pending: Vec<Sample>,
    },
}

/// The BPF engine's ring buffer wakes the loop only when a quarter full:
/// this bounds how late samples (and map updates after an exec or mmap) are.
/// A process the maps do not describe yet is not lost meanwhile: the program
/// hands its samples to the perf engine. 50 ms rather than 10 ms cut the
/// profiler's CPU per 1000 samples on the 300-deep recursion from ~41 to
/// ~33 ms (`cargo xtask bench`).
const BPF_MAX_POLL: Duration = Duration::from_millis(50);

impl Engine {
    /// Picks the engine for `cli.engine` and sets it up on `events`.
    fn start(cli: &Cli, target: Target, events: Vec<EventFd>) -> Result<Self, ProfilerError> {
        let options = PerfEngineOptions::from_cli(cli);
        // Map the perf buffers before anything slow (the BPF load takes
        // ~0.1 s): exec and mmap records written while an event has no
        // buffer are lost. The perf engine works on duplicates of the
        // descriptors; it samples, or only reads the records when the BPF
        // program takes the samples.
        let duplicates = events
            .iter()
            .map(|event| {
                Ok(EventFd {
                    fd: event.fd.try_clone()?,
                    cpu: event.cpu,
                    spec: event.spec,
                })
            })
            .collect::<Result<Vec<EventFd>, std::io::Error>>()?;
        let mut perf = PerfEngine::new(duplicates, options)?;
        let bpf_options = BpfEngineOptions {
            // Samples taken in the kernel carry the user stack; kernel
            // frames themselves are not reported yet.
            kernel_stacks: false,
            // --ring-buffer-kib sizes whichever buffer receives the samples.
            ring_buffer_bytes: cli
                .ring_buffer_kib
                .map_or(DEFAULT_RING_BUFFER_BYTES, |kib| kib as usize * 1024),
            // The running processes, to size the maps and load their tables
            // before their first sample. (A launched command has not exec'd
            // yet: its mappings come with its exec's records.)
            workload_pids: match target {
                Target::Launched { .. } => Vec::new(),
                Target::Pid(pid) => vec![pid],
                Target::Global => all_pids(),
            },
            ..BpfEngineOptions::default()
        };
        // Loads, verifies and attaches the program once; `auto` falls back
        // to the perf engine (with the reason) when that fails. That takes
        // 50-100 ms, while the command runs: meanwhile another thread keeps
        // the perf buffers from filling (at 32 KB a sample, a 1 MiB buffer
        // holds 30 ms at 999 Hz), so that nothing is lost at start.
        let (bpf, decision) = keep_reading_while(&mut perf, || {
            choose_engine_with(cli.engine, || BpfEngine::new(events, bpf_options))
        })
        .map_err(|error| ProfilerError::Setup(format!("--engine bpf: {error}")))?;
        log::info!("engine: {}", decision.reason);
        Ok(match bpf {
            Some(mut samples) => {
                // A command that has exec'd already runs with the program
                // attached: give the maps its mappings now, not at the first
                // poll (the rest of the set-up takes a while).
                // Reading the buffers up to time 0 applies no record, so the
                // table stays empty: the processes with new code are read
                // from /proc by the sync.
                let mut nothing_applied = ProcessTable::new();
                perf.deliver_until(&mut nothing_applied, 0, &mut |_, _| {});
                samples.sync_with_young(&nothing_applied, &perf.pids_with_new_code());
                Engine::Bpf {
                    samples: Box::new(samples),
                    records: perf,
                    pending: Vec::new(),
                }
            }
            None => Engine::Perf(perf),
        })
    }

    fn poll(
        &mut self,
        processes: &mut ProcessTable,
        timeout: Duration,
        on_sample: &mut dyn FnMut(&ProcessTable, Sample),
    ) -> Result<bool, ProfilerError> {
        match self {
            Engine::Perf(engine) => Ok(engine.poll(processes, timeout, on_sample)?.finished),
            Engine::Bpf {
                samples,
                records,
                pending,
            } => {
                // Wakes for the BPF ring buffer and for the perf buffers,
                // which receive the samples the program hands over.
                records.wait_with(Some(samples.ring_fd()), timeout.min(BPF_MAX_POLL))?;
                let (batch, workload_gone) = samples
                    .read_samples(Duration::ZERO)
                    .map_err(|error| ProfilerError::Setup(error.to_string()))?;
                pending.extend(batch);
                // Records of other CPUs may still be on their way for the
                // last HOLD_BACK: samples that recent wait for the next poll.
                let cutoff = monotonic_now().saturating_sub(HOLD_BACK.as_nanos() as u64);
                // Reads the perf buffers (applying nothing yet).
                let hung_up = records.deliver_until(processes, 0, on_sample).finished;
                let finished = hung_up || workload_gone;
                deliver_merged(
                    samples, records, pending, processes, !finished, cutoff, on_sample,
                );
                let until = if finished { u64::MAX } else { cutoff };
                records.deliver_until(processes, until, on_sample);
                // New mappings (exec, mmap) reach the BPF maps for the next
                // samples; processes whose new code is still held back are
                // read from /proc.
                let young = records.pids_with_new_code();
                if samples.sync_due(processes, &young) {
                    keep_reading_while(records, || samples.sync_with_young(processes, &young));
                }
                Ok(finished)
            }
        }
    }

    /// Delivers everything still buffered (the target is gone or a stop
    /// was requested).
    fn flush(
        &mut self,
        processes: &mut ProcessTable,
        on_sample: &mut dyn FnMut(&ProcessTable, Sample),
    ) {
        match self {
            Engine::Perf(engine) => {
                engine.flush(processes, on_sample);
            }
            Engine::Bpf {
                samples,
                records,
                pending,
            } => {
                match samples.read_samples(Duration::ZERO) {
                    Ok((batch, _)) => pending.extend(batch),
                    Err(error) => log::warn!("{error}"),
                }
                deliver_merged(samples, records, pending, processes, false, 0, on_sample);
                records.flush(processes, on_sample);
                if let Ok(counters) = samples.counters() {
                    log::debug!("BPF program: {counters}");
                    // What took the slow path, and why, for the user.
                    log::info!(
                        "BPF engine: {} samples unwound in the kernel, {} handed to the perf \
                         engine ({} of them mid-stack: a table not in the row map or a mapping \
                         not yet described), {} unwound by the perf engine in all",
                        counters.get(BpfCounter::Emitted),
                        counters.get(BpfCounter::HandedToPerf),
                        counters.get(BpfCounter::HandedOffMidStack),
                        records.sample_counters().samples
                    );
                }
            }
        }
    }

    /// Samples lost by the kernel (ring buffers full).
    fn lost(&self) -> u64 {
        match self {
            Engine::Perf(engine) => engine.losses().lost,
            Engine::Bpf {
                samples, records, ..
            } => samples.losses().lost + records.losses().lost,
        }
    }
}

/// Runs `work` (which may take a while: a sync compiles the unwind tables of
/// new programs, 0.1 s for cc1's 430 K rows) on another thread while this
/// one keeps the perf buffers drained. Meanwhile the program hands the
/// samples of those very programs to the perf buffers, 32 KB each: a 1 MiB
/// buffer is full after 30 ms at 999 Hz.
fn keep_reading_while<T: Send>(records: &mut PerfEngine, work: impl FnOnce() -> T + Send) -> T {
    let working = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let result = work();
            working.store(false, Ordering::Release);
            result
        });
        while working.load(Ordering::Acquire) {
            records.read_ahead();
            std::thread::sleep(Duration::from_millis(2));
        }
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Hands the BPF samples to `on_sample` in time order, each after the perf
/// records up to its time have been applied to `processes` (so a sample of
/// a process that exits soon after still finds it). With `hold`, samples
/// newer than `cutoff` stay pending.
fn deliver_merged(
    samples: &mut BpfEngine,
    records: &mut PerfEngine,
    pending: &mut Vec<Sample>,
    processes: &mut ProcessTable,
    hold: bool,
    cutoff: u64,
    on_sample: &mut dyn FnMut(&ProcessTable, Sample),
) {
    pending.sort_by_key(|sample| sample.time);
    let ready = if hold {
        pending.partition_point(|sample| sample.time <= cutoff)
    } else {
        pending.len()
    };
    for sample in pending.drain(..ready) {
        records.deliver_until(processes, sample.time, on_sample);
        samples.before_sample(processes, sample.pid);
        on_sample(processes, sample);
    }
}

/// Every process of the machine (`--global`), to size the BPF maps.
fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Everything downstream of the engine: aggregation and outputs.
struct Pipeline {
    aggregator: Aggregator,
    symbolizer: Symbolizer,
    folded: FoldedStacks,
    output: Option<OutputWriter>,
    metadata: ProfileMetadata,
    show_samples: bool,
    period_start: SystemTime,
    overhead: OverheadMeter,
    internal_stats: Option<StatsdSink>,
    profiles: u64,
}

impl Pipeline {
    fn new(cli: &Cli) -> Result<Self, ProfilerError> {
        let output = match cli.output_dir() {
            // Checks the directory now, not when the command has exited.
            Some(dir) => Some(OutputWriter::start(&dir, &cli.service_name())),
            None => {
                log::warn!(
                    "an agent is configured but uploading is not implemented yet: \
                     pass --output DIR to keep the profiles"
                );
                None
            }
        };
        Ok(Self {
            aggregator: Aggregator::new(AggregatorOptions::new(cli.timeline)),
            symbolizer: Symbolizer::new(SymbolizerOptions {
                inlined_functions: cli.inlined_functions,
                ..SymbolizerOptions::default()
            }),
            folded: FoldedStacks::default(),
            output,
            metadata: ProfileMetadata {
                sampling_period_nanos: nominal_period_nanos(cli),
                comments: Vec::new(),
            },
            show_samples: cli.show_samples,
            period_start: SystemTime::now(),
            overhead: OverheadMeter::start(nominal_period_nanos(cli)),
            internal_stats: internal_stats_sink(cli),
            profiles: 0,
        })
    }

    fn add(&mut self, processes: &ProcessTable, sample: Sample) {
        self.overhead
            .add_sample(sample.weight, sample.end.is_complete());
        if self.show_samples {
            log::info!(
                "sample pid={} tid={} ({}) cpu={} time={} weight={} end={:?} frames={:x?}",
                sample.pid,
                sample.tid,
                processes.thread_name(sample.pid, sample.tid).unwrap_or("?"),
                sample.cpu,
                sample.time,
                sample.weight,
                sample.end,
                sample.frames
            );
        }
        self.aggregator.add(processes, &sample);
    }

    /// Ends the current period: symbolizes it, writes its profile, and
    /// starts the next one. An empty period writes nothing unless it is the
    /// run's only one.
    /// `lost_total`: the samples the engine lost since the run started.
    fn flush_period(&mut self, last: bool, lost_total: u64) -> Result<(), ProfilerError> {
        let end = SystemTime::now();
        let start = std::mem::replace(&mut self.period_start, end);
        let period = self.aggregator.take_period(start, end);
        if period.stats.samples == 0 && !(last && self.profiles == 0) {
            return Ok(());
        }
        // The figures cover everything since the previous profile (an
        // empty period writes none), start-up included in the first.
        let overhead = self.overhead.end_period(lost_total);
        self.metadata.comments = overhead.comments();
        if let Some(sink) = &mut self.internal_stats {
            sink.send(&overhead);
        }
        let symbolizing = Instant::now();
        let symbolized = self.symbolizer.symbolize(period);
        let symbolize_time = symbolizing.elapsed();
        self.folded.add(&symbolized);
        let bytes = encode_pprof(&symbolized, &self.metadata)?;
        log::info!(
            "period: {overhead}; symbolized in {:.1} ms, pprof {} bytes",
            symbolize_time.as_secs_f64() * 1e3,
            bytes.len()
        );
        if let Some(output) = &mut self.output {
            match output.write_profile(bytes, start) {
                Ok(written) => {
                    for path in written {
                        log::info!("wrote {}", path.display());
                    }
                }
                // Kept in memory: the next period, or `finish`, tries again.
                Err(error) if !last => log::warn!("{error}; trying again at the next period"),
                Err(_) => {}
            }
        }
        self.profiles += 1;
        Ok(())
    }

    fn finish(&mut self, lost_total: u64) -> Result<(), ProfilerError> {
        self.flush_period(true, lost_total)?;
        if self.folded.total_samples() == 0 {
            // A flame graph of nothing cannot be drawn; the empty profile
            // above already says that the run took no samples.
            log::info!("no samples were taken: no flamegraph.svg or stacks.folded written");
        }
        if let Some(output) = &mut self.output {
            // Also writes the profiles earlier periods could not.
            for path in output.finish(&self.folded)? {
                log::info!("wrote {}", path.display());
            }
        }
        Ok(())
    }
}

/// `--internal-stats`: the DogStatsD socket, when one is configured and can
/// be opened (if not, one warning; profiling goes on without it).
fn internal_stats_sink(cli: &Cli) -> Option<StatsdSink> {
    let text = cli.internal_stats.as_deref()?;
    let address: StatsdAddress = text
        .parse()
        .map_err(|error| log::warn!("--internal-stats: {error}"))
        .ok()?;
    let service = cli.service_name();
    let tags = [
        ("service", service.as_str()),
        ("profiler_version", env!("CARGO_PKG_VERSION")),
    ];
    StatsdSink::connect(&address, &tags)
        .map_err(|error| log::warn!("--internal-stats {text}: {error}; not sending statistics"))
        .ok()
}

/// pprof's `period`: the CPU time a sample stands for at the configured rate.
fn nominal_period_nanos(cli: &Cli) -> u64 {
    let specs = crate::config::parse_events(&cli.events).unwrap_or_default();
    match specs.first().map(|spec| spec.rate) {
        Some(SampleRate::Frequency(hz)) => 1_000_000_000 / hz.max(1),
        Some(SampleRate::Period(period)) => period,
        None => 1_000_000_000 / crate::config::DEFAULT_CPU_FREQUENCY,
    }
}

/// Runs the profiler until the target is gone (or, for `--global`, until
/// SIGINT/SIGTERM), flushing the last period before returning.
pub fn run(cli: &Cli, target: Target, events: Vec<EventFd>) -> Result<(), ProfilerError> {
    launch::sandbox::one_malloc_arena();
    if cli.show_samples && log::max_level() < log::LevelFilter::Info {
        log::set_max_level(log::LevelFilter::Info);
    }
    let mut processes = ProcessTable::new();
    if let Target::Pid(pid) = target {
        // Mappings that existed before the events were opened.
        if let Err(error) = processes.load_from_proc(pid) {
            log::warn!("cannot read /proc/{pid}: {error}");
        }
    }
    let watch = match target {
        Target::Launched { pid } | Target::Pid(pid) => launch::target_watch(pid as i32).ok(),
        Target::Global => None,
    };
    let mut engine = Engine::start(cli, target, events)?;
    // (-p and --global opened the events in this process.)
    crate::events::warn_if_kernel_time_refused();
    if let Err(error) = launch::capabilities::drop_after_setup() {
        log::warn!("profiler: {error}");
    }
    let mut pipeline = Pipeline::new(cli)?;
    let period = cli.upload_period();
    let mut period_deadline = Instant::now() + period;
    loop {
        let timeout = period_deadline
            .saturating_duration_since(Instant::now())
            .min(MAX_POLL);
        let finished = engine.poll(&mut processes, timeout, &mut |table, sample| {
            pipeline.add(table, sample)
        })?;
        let target_gone = watch.as_ref().is_some_and(|w| w.has_exited());
        let stop = finished || target_gone || launch::stop::requested();
        if stop {
            engine.flush(&mut processes, &mut |table, sample| {
                pipeline.add(table, sample)
            });
            break;
        }
        if Instant::now() >= period_deadline {
            pipeline.flush_period(false, engine.lost())?;
            period_deadline += period;
        }
    }
    // The summary is worth printing even when some outputs could not be written.
    let finished = pipeline.finish(engine.lost());
    let summary = Summary::of_run(&pipeline.overhead.run(), pipeline.profiles);
    log::info!("{summary}");
    if summary.lost > 0 {
        log::warn!(
            "{} samples were lost (ring buffer full): raise --ring-buffer-kib or lower the frequency",
            summary.lost
        );
    }
    finished
}
