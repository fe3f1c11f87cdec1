//! The profiler: `Profiler::start` picks and sets up the engine; `run`
//! then splits the work between two processes.
//!
//! - The parent ([`parent`], comm `ddprof-profiler`) keeps what must
//!   survive: the sampler's descriptors, ring buffers and BPF program and
//!   maps, the exporter and its queue, the local outputs and the whole
//!   run's folded stacks and figures.
//! - A worker ([`worker`], comm `ddprof-worker`), forked from it, runs the
//!   loop: the engine applies process events to the [`ProcessTable`] and
//!   hands over samples, which the aggregator normalizes at once (so that
//!   processes that exit before the flush are still symbolized). At the end
//!   of each upload period, and when the target is gone, its publisher
//!   thread ([`publish`]) symbolizes and encodes the period while the loop
//!   goes on, and sends it to the parent ([`channel`]), which
//!   writes and uploads it; the whole run's folded stacks become
//!   `flamegraph.svg` and `stacks.folded` at exit.
//!
//! Workers are replaced every `--worker-period` periods, when their RSS
//! passes `--worker-max-rss`, and when they die; no sample in the shared
//! buffers is lost meanwhile.
pub mod channel;
mod losses;
pub mod parent;
mod publish;
pub mod stop;
pub mod target;
pub mod worker;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::aggregate::AggregatorOptions;
use crate::events::EventFd;
use crate::export::ExportOptions;
use crate::output::OutputError;
use crate::process::ProcessTable;
use crate::profile::ProfileError;
use crate::sampler::{Sampler, SamplerError, SamplerOptions};
use crate::statsd::StatsdAddress;
use crate::symbolize::{KallsymsSnapshot, SymbolizerOptions};

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
    /// The sampled events, in the order of their columns in the profile.
    pub events: Vec<crate::profile::ProfiledEvent>,
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
    /// The profiler stops rather than run where its seccomp filters cannot
    /// be installed (not `--no-sandbox`).
    pub require_sandbox: bool,
    /// When the worker process is replaced by a fresh one.
    pub worker: WorkerOptions,
}

/// `--worker-period`, `--worker-max-rss`: when a worker ends itself (after
/// sending its period) and the parent starts a fresh one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerOptions {
    /// Upload periods a worker lives (at least 1).
    pub restart_every_periods: u32,
    /// RSS, in KiB, past which a worker ends at the end of its period.
    pub max_rss_kib: u64,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            restart_every_periods: 240,
            max_rss_kib: 256 * 1024,
        }
    }
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

/// `options` with the caches on only if their directory may be used: one
/// that belongs to ddprof's user and that no other user can write (created
/// `0700` when missing). Another one is refused with one warning, and the
/// run keeps no cache, rather than write where someone else chooses or read
/// what someone else planted. Digests are remembered there too
/// ([`crate::files::digest`]).
fn with_usable_caches(mut options: ProfilerOptions) -> ProfilerOptions {
    use crate::files::digest::{self, DigestMemo};
    use crate::files::disk::PrivateDir;
    let Some(root) = options.symbolizer.debug_cache.clone() else {
        return options;
    };
    match PrivateDir::open(&root, true) {
        Ok(_) => {
            let memo = DigestMemo::new(root.join("digests"));
            memo.evict();
            digest::use_memo(memo);
        }
        Err(error) => {
            log::warn!(
                "not keeping caches: {error}; every run builds its unwind tables and names \
                 anew (--debug-cache DIR: another directory, `none`: no cache)"
            );
            options.sampler.table_store = None;
            options.symbolizer.debug_cache = None;
            options.symbolizer.symbol_store = None;
        }
    }
    options
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
    /// `sWALL`, when its program samples: what the worker's wall-time
    /// stage needs.
    wall: Option<WallSetup>,
    /// CPU time the profiler spent in other processes before this one ran
    /// (the launcher's), reported as its own.
    spent_before: Duration,
}

/// What a worker's wall-time stage ([`crate::wall::WallTime`]) is built with.
#[derive(Debug, Clone)]
pub struct WallSetup {
    pub sampling: crate::wall::WallSampling,
    /// The scheduler's functions, read from kallsyms once (empty when it
    /// is not readable: waits keep their kernel stacks whole).
    pub scheduler: crate::wall::SchedulerFunctions,
}

impl Profiler {
    /// Chooses and starts the engine for `target` on `events`.
    pub fn start(
        options: &ProfilerOptions,
        target: Target,
        events: Vec<EventFd>,
    ) -> Result<Self, ProfilerError> {
        let mut options = with_usable_caches(options.clone());
        let opened: std::collections::HashSet<u16> =
            events.iter().map(|event| event.spec.index()).collect();
        let mut processes = ProcessTable::new();
        // The running processes, to size the maps and load their tables
        // before their first sample. (A launched command has not exec'd
        // yet: its mappings come with its exec's records.)
        let workload_pids = match target {
            Target::Launched { .. } => Vec::new(),
            Target::Pid(pid) => vec![pid],
            Target::Global => all_pids(),
        };
        let wrapped_pid = match target {
            Target::Launched { pid } => Some(pid),
            Target::Pid(_) | Target::Global => None,
        };
        let sampler = Sampler::start(
            &options.sampler,
            events,
            workload_pids,
            wrapped_pid,
            &processes,
        )?;
        // The profile's columns are the events that opened (one refused
        // here was said in a warning and has no samples), and wall time
        // when its program samples.
        let wall_event = sampler.wall_event();
        options.events.retain(|profiled| {
            // A live heap's column is its sALLOC event's.
            let index =
                crate::events::allocation_of_live_heap(profiled.index).unwrap_or(profiled.index);
            opened.contains(&index) || Some(index) == wall_event
        });
        let options = &options;
        if let Target::Pid(pid) = target {
            // What the target maps, read once the sampler has mapped the
            // events' buffers and enabled them: an exec after this read is
            // in the records, one before it in what was read. (Read before,
            // an exec in between was in neither, and the table kept the old
            // image for good.)
            if let Err(error) = processes.load_from_proc(pid) {
                log::warn!("cannot read /proc/{pid}: {error}");
            }
        }
        // Kernel addresses are readable only until the set-up capabilities
        // are dropped.
        let copying = Instant::now();
        // Wall time's waits keep the kernel frame that names their reason.
        let kallsyms = (options.sampler.kernel_stacks || wall_event.is_some())
            .then(KallsymsSnapshot::take)
            .flatten();
        if kallsyms.is_some() {
            log::info!(
                "start-up: kallsyms copied in {:.0} ms",
                copying.elapsed().as_secs_f64() * 1e3
            );
        }
        let wall = options
            .sampler
            .wall
            .filter(|_| wall_event.is_some())
            .map(|sampling| {
                let scheduler = kallsyms
                    .as_ref()
                    .and_then(|snapshot| snapshot.listing().ok())
                    .map(crate::wall::SchedulerFunctions::from_kallsyms)
                    .unwrap_or_default();
                if scheduler.is_empty() {
                    log::warn!(
                        "wall time: the scheduler's functions are not in kallsyms here: waits \
                         keep their whole kernel stack"
                    );
                }
                WallSetup {
                    sampling,
                    scheduler,
                }
            });
        Ok(Self {
            options: options.clone(),
            target,
            processes,
            sampler,
            kallsyms,
            wall,
            spent_before: Duration::ZERO,
        })
    }

    /// Puts a table read ahead at start-up in the engine's maps (see
    /// [`Sampler::preload_table`]).
    pub fn preload_table(&mut self, read: crate::unwind::cache::StoredTableRead) {
        self.sampler.preload_table(read);
    }

    /// The engine that samples: `bpf` or `perf`.
    pub fn engine_name(&self) -> &'static str {
        self.sampler.engine_name()
    }

    /// Counts `cpu`, spent by the profiler in another process before this
    /// one (the launcher, for a launched command), with its own.
    pub fn spent_before(mut self, cpu: Duration) -> Self {
        self.spent_before = cpu;
        self
    }

    /// Runs until the target is gone (`watch`; without one, for
    /// `--global`, until SIGINT/SIGTERM), flushing the last period before
    /// returning: this process becomes the parent, and a worker process
    /// does the sampling, unwinding and symbolization ([`parent`]).
    pub fn run(self, watch: Option<TargetWatch>) -> Result<(), ProfilerError> {
        parent::run(self, watch)
    }
}
