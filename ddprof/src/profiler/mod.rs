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
pub mod stop;
pub mod target;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::aggregate::{Aggregator, AggregatorOptions};
use crate::events::EventFd;
use crate::export::entity::Entity;
use crate::export::request::RequestContext;
use crate::export::{ExportOptions, Exporter, PeriodFigures, PeriodProfile};
use crate::output::{FoldedStacks, OutputError, OutputWriter, Summary};
use crate::overhead::{OverheadMeter, StatsdAddress, StatsdSink};
use crate::process::ProcessTable;
use crate::profile::{encode_pprof_compressed, Compressions, ProfileError, ProfileMetadata};
use crate::sample::Sample;
use crate::sampler::{Sampler, SamplerError, SamplerOptions};
use crate::symbolize::{KallsymsSnapshot, Symbolizer, SymbolizerOptions};

pub use target::{Target, TargetWatch};

/// What the profiler loop and the stages after the sampler are asked to do.
#[derive(Debug, Clone)]
pub struct ProfilerOptions {
    pub sampler: SamplerOptions,
    pub aggregator: AggregatorOptions,
    pub symbolizer: SymbolizerOptions,
    /// `-u`: how long a profile's period lasts.
    pub upload_period: Duration,
    /// The CPU time one sample stands for at the configured rate (pprof's
    /// `period`).
    pub sampling_period_nanos: u64,
    /// The service the profiles are named after.
    pub service: String,
    /// Where local outputs go (`--output`, else `./ddprof-out` without an
    /// agent), if anywhere.
    pub output_dir: Option<PathBuf>,
    /// Where profiles are uploaded (an agent or `--agentless`), if anywhere.
    pub export: Option<ExportOptions>,
    /// `--internal-stats`: where the per-period figures go as DogStatsD.
    pub internal_stats: Option<StatsdAddress>,
    /// `--show-samples`: one log line per sample.
    pub show_samples: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

/// The longest the loop sleeps in the engine before it looks at the clock,
/// the target and stop requests again.
const MAX_POLL: Duration = Duration::from_millis(250);

/// Everything downstream of the engine: aggregation and outputs.
struct Pipeline {
    aggregator: Aggregator,
    symbolizer: Symbolizer,
    folded: FoldedStacks,
    output: Option<OutputWriter>,
    /// Uploads to the agent or intake, when one is configured.
    exporter: Option<Exporter>,
    metadata: ProfileMetadata,
    show_samples: bool,
    period_start: SystemTime,
    overhead: OverheadMeter,
    internal_stats: Option<StatsdSink>,
    profiles: u64,
    /// `--include-kernel`, said in every profile.
    kernel_stacks: bool,
}

impl Pipeline {
    fn new(options: &ProfilerOptions, target: Target, engine: &str) -> Result<Self, ProfilerError> {
        // Checks the directory now, not when the command has exited.
        let output = options
            .output_dir
            .as_ref()
            .map(|dir| OutputWriter::start(dir, &options.service));
        Ok(Self {
            exporter: start_exporter(options, target, engine),
            aggregator: Aggregator::new(options.aggregator),
            symbolizer: Symbolizer::new(options.symbolizer.clone()),
            folded: FoldedStacks::default(),
            output,
            metadata: ProfileMetadata {
                sampling_period_nanos: options.sampling_period_nanos,
                comments: Vec::new(),
            },
            show_samples: options.show_samples,
            period_start: SystemTime::now(),
            overhead: OverheadMeter::start(options.sampling_period_nanos),
            internal_stats: internal_stats_sink(options),
            profiles: 0,
            kernel_stacks: options.sampler.kernel_stacks,
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
            // The next profile covers this empty stretch too: each
            // profile's end stays the next one's start.
            self.period_start = start;
            return Ok(());
        }
        // The figures cover everything since the previous profile (an
        // empty period writes none), start-up included in the first.
        let overhead = self.overhead.end_period(lost_total);
        self.metadata.comments = overhead.comments();
        self.metadata
            .comments
            .push(format!("ddprof.include_kernel={}", self.kernel_stacks));
        if let Some(sink) = &mut self.internal_stats {
            sink.send(&overhead);
        }
        let symbolizing = Instant::now();
        let symbolized = self.symbolizer.symbolize(period);
        let symbolize_time = symbolizing.elapsed();
        self.folded.add(&symbolized);
        // Encoded once; gzip'd for files, zstd'd for the upload.
        let compressions = Compressions {
            gzip: self.output.is_some(),
            zstd: self.exporter.is_some(),
        };
        let encoded = encode_pprof_compressed(&symbolized, &self.metadata, compressions)?;
        log::info!(
            "period: {overhead}; symbolized in {:.1} ms, pprof {} bytes",
            symbolize_time.as_secs_f64() * 1e3,
            encoded
                .gzip
                .as_ref()
                .or(encoded.zstd.as_ref())
                .map_or(0, Vec::len)
        );
        if let (Some(exporter), Some(pprof_zstd)) = (&self.exporter, encoded.zstd) {
            exporter.submit(PeriodProfile {
                start,
                end,
                pprof_zstd,
                figures: PeriodFigures {
                    samples: overhead.samples,
                    lost: overhead.lost,
                    truncated: overhead.truncated,
                    profiler_cpu_nanos: overhead.profiler_cpu.as_nanos() as u64,
                    rss_kib: overhead.rss_kib,
                    peak_rss_kib: overhead.peak_rss_kib,
                },
            });
        }
        if let (Some(output), Some(bytes)) = (&mut self.output, encoded.gzip) {
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
        if let Some(exporter) = self.exporter.take() {
            let endpoint = exporter.endpoint().to_string();
            let totals = exporter.finish();
            log::info!(
                "export to {endpoint}: {} profiles sent, {} dropped, {} not sent at exit",
                totals.sent,
                totals.dropped,
                totals.unsent
            );
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

/// The exporter, when an agent or `--agentless` is configured (checked at
/// start; if the HTTP client cannot be set up, one warning and profiling
/// goes on without uploads).
fn start_exporter(options: &ProfilerOptions, target: Target, engine: &str) -> Option<Exporter> {
    let export = options.export.clone()?;
    // The profiled process's container, not the profiler's.
    let entity = match target {
        Target::Launched { pid } | Target::Pid(pid) => Entity::of_process(pid),
        Target::Global => Entity::default(),
    };
    let context = RequestContext {
        options: export,
        entity,
        engine: engine.to_string(),
        started: SystemTime::now(),
        // The machine's (the profiler itself is pinned to one CPU).
        cpu_cores: crate::export::request::online_cpus(),
    };
    Exporter::start(context)
        .map_err(|error| log::warn!("not uploading profiles: {error}"))
        .ok()
}

/// `--internal-stats`: the DogStatsD socket, when one is configured and can
/// be opened (if not, one warning; profiling goes on without it).
fn internal_stats_sink(options: &ProfilerOptions) -> Option<StatsdSink> {
    let address = options.internal_stats.as_ref()?;
    let tags = [
        ("service", options.service.as_str()),
        ("profiler_version", env!("CARGO_PKG_VERSION")),
    ];
    StatsdSink::connect(address, &tags)
        .map_err(|error| log::warn!("--internal-stats {address}: {error}; not sending statistics"))
        .ok()
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

/// A profiler whose engine is set up (BPF program loaded and attached,
/// buffers mapped), ready to [`run`](Profiler::run). The launcher drops the
/// capabilities it only needed for the set-up in between.
pub struct Profiler {
    options: ProfilerOptions,
    target: Target,
    processes: ProcessTable,
    sampler: Sampler,
    kallsyms: Option<KallsymsSnapshot>,
}

impl Profiler {
    /// Chooses and starts the engine for `target` on `events`.
    pub fn start(
        options: &ProfilerOptions,
        target: Target,
        events: Vec<EventFd>,
    ) -> Result<Self, ProfilerError> {
        let mut processes = ProcessTable::new();
        if let Target::Pid(pid) = target {
            // Mappings that existed before the events were opened.
            if let Err(error) = processes.load_from_proc(pid) {
                log::warn!("cannot read /proc/{pid}: {error}");
            }
        }
        // The running processes, to size the maps and load their tables
        // before their first sample. (A launched command has not exec'd
        // yet: its mappings come with its exec's records.)
        let workload_pids = match target {
            Target::Launched { .. } => Vec::new(),
            Target::Pid(pid) => vec![pid],
            Target::Global => all_pids(),
        };
        let sampler = Sampler::start(&options.sampler, events, workload_pids, &processes)?;
        // Kernel addresses are readable only until the set-up capabilities
        // are dropped.
        let copying = Instant::now();
        let kallsyms = options
            .sampler
            .kernel_stacks
            .then(KallsymsSnapshot::take)
            .flatten();
        if kallsyms.is_some() {
            log::info!(
                "start-up: kallsyms copied in {:.0} ms",
                copying.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(Self {
            options: options.clone(),
            target,
            processes,
            sampler,
            kallsyms,
        })
    }

    /// Runs until the target is gone (`watch`; without one, for
    /// `--global`, until SIGINT/SIGTERM), flushing the last period before
    /// returning.
    pub fn run(self, watch: Option<TargetWatch>) -> Result<(), ProfilerError> {
        let Self {
            options,
            target,
            mut processes,
            mut sampler,
            kallsyms,
        } = self;
        if options.show_samples && log::max_level() < log::LevelFilter::Info {
            log::set_max_level(log::LevelFilter::Info);
        }
        let mut pipeline = Pipeline::new(&options, target, sampler.engine_name())?;
        if let Some(snapshot) = kallsyms {
            pipeline.symbolizer.use_kallsyms(snapshot);
        }
        let period = options.upload_period;
        let mut period_deadline = Instant::now() + period;
        loop {
            let timeout = period_deadline
                .saturating_duration_since(Instant::now())
                .min(MAX_POLL);
            let finished = sampler.poll(&mut processes, timeout, &mut |table, sample| {
                pipeline.add(table, sample)
            })?;
            let target_gone = watch.as_ref().is_some_and(|w| w.has_exited());
            if finished || target_gone || stop::requested() {
                sampler.flush(&mut processes, &mut |table, sample| {
                    pipeline.add(table, sample)
                });
                break;
            }
            if Instant::now() >= period_deadline {
                pipeline.flush_period(false, sampler.lost())?;
                period_deadline += period;
            }
        }
        // The summary is worth printing even when some outputs could not be written.
        let finished = pipeline.finish(sampler.lost());
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
}
