//! Local outputs: pprof files per period, flamegraph.svg and stacks.folded,
//! and the summary line printed at exit.
//!
//! How the profiler's loop chains the stages:
//!
//! ```no_run
//! use std::time::SystemTime;
//! use ddprof::aggregate::{Aggregator, AggregatorOptions};
//! use ddprof::output::{FoldedStacks, LocalOutput, Summary};
//! use ddprof::process::ProcessTable;
//! use ddprof::profile::{encode_pprof, ProfileMetadata};
//! use ddprof::symbolize::{Symbolizer, SymbolizerOptions};
//!
//! # fn run(processes: &ProcessTable, samples: &[ddprof::sample::Sample]) -> Result<(), Box<dyn std::error::Error>> {
//! let mut aggregator = Aggregator::new(AggregatorOptions::new(/* --timeline */ true));
//! let mut symbolizer = Symbolizer::new(SymbolizerOptions {
//!     inlined_functions: false, // -I
//!     ..SymbolizerOptions::default()
//! });
//! let metadata = ProfileMetadata { events: Vec::new(), sampling_period_nanos: 1_000_000_000 / 99, comments: Vec::new() };
//! let output = LocalOutput::create("ddprof-out".as_ref(), "my-service")?;
//! let mut folded = FoldedStacks::default();
//! let (mut profiles, mut total, mut full) = (0, 0, 0);
//!
//! let start = SystemTime::now();
//! for sample in samples {
//!     aggregator.add(processes, sample); // with the table as of this sample
//! }
//! // Every upload period, and once more at exit:
//! let period = aggregator.take_period(start, SystemTime::now());
//! (total, full) = (total + period.stats.samples, full + period.stats.full_stacks);
//! let symbolized = symbolizer.symbolize(period);
//! folded.add(&symbolized);
//! let pprof = encode_pprof(&symbolized, &metadata)?; // gzip'd, also what the agent takes
//! output.write_profile(&pprof, symbolized.period.start)?;
//! profiles += 1;
//! // At exit:
//! output.finish(&folded)?;
//! log::info!("{}", Summary::measure(total, /* lost */ 0, full, profiles));
//! # Ok(())
//! # }
//! ```
use std::collections::VecDeque;
use std::fmt;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::files::disk::{DiskError, PrivateDir};
mod folded;
pub use folded::{FoldedStacks, DEFAULT_MAX_FOLDED_FRAMES, FLAME_GRAPH_LEGEND};

pub const FLAMEGRAPH_FILE: &str = "flamegraph.svg";
pub const FOLDED_FILE: &str = "stacks.folded";

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot use the output directory {0} (choose another one with --output)")]
    Directory(DiskError),
    #[error("cannot write {path}: {source} (check free space and permissions, or choose another directory with --output)")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Files that no directory accepted, each tried in every directory.
    #[error(
        "could not write {} ({}); free some space or fix the permissions, or choose another directory with --output",
        .files.join(", "),
        .causes.join("; ")
    )]
    NotWritten {
        /// The file names (`stacks.folded`, `flamegraph.svg`, `SERVICE-TIME.pprof`).
        files: Vec<String>,
        /// `DIR: error`, once per distinct cause.
        causes: Vec<String>,
    },
}

impl OutputError {
    /// `DIR: error`: where and why, without the file name.
    fn place_and_cause(&self) -> String {
        match self {
            OutputError::Directory(error) => error.to_string(),
            OutputError::Write { path, source } => format!(
                "{}: {source}",
                path.parent().unwrap_or(Path::new("")).display()
            ),
            OutputError::NotWritten { causes, .. } => causes.join("; "),
        }
    }
}

/// The local output directory: one that belongs to ddprof's user and that
/// no other user can write, held open; every file is written under a fresh
/// name and renamed into place (see [`crate::files::disk`]).
#[derive(Debug, Clone)]
pub struct LocalOutput {
    dir: PrivateDir,
    service: String,
}

/// Files written at exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalOutputs {
    pub flamegraph: PathBuf,
    pub folded: PathBuf,
}

impl LocalOutput {
    /// Opens the directory, creating it (and its parents, `0700`) if
    /// needed; refuses one another user owns or can write, or a link.
    pub fn create(dir: &Path, service: &str) -> Result<Self, OutputError> {
        Ok(Self {
            dir: PrivateDir::open(dir, true).map_err(OutputError::Directory)?,
            service: file_name_safe(service),
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Writes one gzip-compressed pprof profile as
    /// `<service>-<UTC start, 20261122T031500Z>.pprof`; a second profile
    /// starting in the same second gets a `-2` suffix.
    pub fn write_profile(
        &self,
        pprof_gz: &[u8],
        start: SystemTime,
    ) -> Result<PathBuf, OutputError> {
        self.write_service_profile(pprof_gz, start, None)
    }

    /// [`LocalOutput::write_profile`] of a service's own profile (`-p`,
    /// `--global`), named after it rather than the run's service.
    pub fn write_service_profile(
        &self,
        pprof_gz: &[u8],
        start: SystemTime,
        service: Option<&str>,
    ) -> Result<PathBuf, OutputError> {
        let stem = format!(
            "{}-{}",
            service.map_or_else(|| self.service.clone(), file_name_safe),
            crate::timestamp::utc_timestamp(start)
        );
        let mut name = format!("{stem}.pprof");
        let mut suffix = 2;
        while self.dir.has_file(&name) {
            name = format!("{stem}-{suffix}.pprof");
            suffix += 1;
        }
        self.write(&name, |file| file.write_all(pprof_gz))
    }

    /// Writes `flamegraph.svg` and `stacks.folded` for the whole run.
    pub fn finish(&self, folded: &FoldedStacks) -> Result<FinalOutputs, OutputError> {
        Ok(FinalOutputs {
            folded: self.write_folded(folded)?,
            flamegraph: self.write_flamegraph(folded)?,
        })
    }

    /// Writes `stacks.folded`.
    pub fn write_folded(&self, folded: &FoldedStacks) -> Result<PathBuf, OutputError> {
        self.write(FOLDED_FILE, |file| folded.write_folded(file))
    }

    /// Writes `flamegraph.svg`.
    pub fn write_flamegraph(&self, folded: &FoldedStacks) -> Result<PathBuf, OutputError> {
        let title = format!("{} (ddprof)", self.service);
        self.write(FLAMEGRAPH_FILE, |file| {
            folded.write_flamegraph(&title, file)
        })
    }

    /// Checks that files can be written here (creates, writes and removes
    /// a small one, under a fresh name).
    pub fn probe(&self) -> Result<(), OutputError> {
        let error = |source| OutputError::Write {
            path: self.dir.path().join(".ddprof-write-probe"),
            source,
        };
        let (name, mut file) = self
            .dir
            .create_temporary("ddprof-write-probe")
            .map_err(error)?;
        let written = file.write_all(b"ddprof").and_then(|()| file.flush());
        let _ = self.dir.remove(&name);
        written.map_err(error)
    }

    /// Writes `name` whole (a fresh file renamed into place).
    fn write(
        &self,
        name: &str,
        write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
    ) -> Result<PathBuf, OutputError> {
        let path = self.dir.path().join(name);
        self.dir
            .write_atomically(name, write)
            .map_err(|source| OutputError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(path)
    }
}

/// Unwritten profiles kept in memory at most, waiting for a directory that
/// accepts them; beyond it the oldest are dropped (with a warning).
pub const MAX_PENDING_BYTES: usize = 64 << 20;

/// A profile no directory has accepted yet.
struct PendingProfile {
    start: SystemTime,
    pprof_gz: Vec<u8>,
    /// A service's own profile: its name.
    service: Option<String>,
}

/// The outputs of a whole run, written where they can be: the requested
/// directory; when it cannot be written or is refused (checked at start,
/// and at every write), a fallback directory made for this run in
/// `$TMPDIR` (`ddprof-out-XXXXXX`, a fresh, unpredictable name, `0700`),
/// with one warning naming it; when neither can, the profiles stay in
/// memory and every later period tries again. At the end, the error names
/// every file that could not be written.
pub struct OutputWriter {
    service: String,
    requested: PathBuf,
    fallback: Fallback,
    /// The directory in use: 0, the requested one; 1, once it failed, the
    /// fallback.
    current: usize,
    pending: VecDeque<PendingProfile>,
    pending_bytes: usize,
}

/// Where the outputs go when the requested directory cannot take them.
enum Fallback {
    /// A fresh directory in this temporary directory, made when first
    /// needed (then `Made`).
    Fresh(PathBuf),
    Made(PathBuf),
    /// This one (tests).
    Given(PathBuf),
}

impl OutputWriter {
    /// Checks at once that `dir` can be written (creating it), and warns
    /// in one line, naming where the outputs go instead, when it cannot.
    pub fn start(dir: &Path, service: &str) -> Self {
        Self::new(dir, Fallback::Fresh(std::env::temp_dir()), service)
    }

    /// [`OutputWriter::start`] with an explicit fallback directory.
    pub fn with_fallback(dir: &Path, fallback: &Path, service: &str) -> Self {
        Self::new(dir, Fallback::Given(fallback.to_path_buf()), service)
    }

    fn new(dir: &Path, fallback: Fallback, service: &str) -> Self {
        let mut writer = Self {
            service: service.to_string(),
            requested: dir.to_path_buf(),
            fallback,
            current: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
        };
        if let Err(errors) =
            writer.write_somewhere(|output| output.probe().map(|()| output.dir().to_path_buf()))
        {
            log::warn!(
                "cannot write in {}; the profiles are kept in memory until a directory accepts them",
                causes(&errors).join("; ")
            );
        }
        writer
    }

    /// The directory the outputs go to now.
    pub fn dir(&self) -> &Path {
        match (self.current, &self.fallback) {
            (0, _) => &self.requested,
            (_, Fallback::Fresh(temporary)) => temporary,
            (_, Fallback::Made(dir) | Fallback::Given(dir)) => dir,
        }
    }

    /// The fallback directory, made now if it is to be a fresh one.
    fn fallback_dir(&mut self) -> Result<PathBuf, OutputError> {
        if let Fallback::Fresh(temporary) = &self.fallback {
            let template = temporary.join("ddprof-out-XXXXXX");
            let made = nix::unistd::mkdtemp(&template).map_err(|errno| OutputError::Write {
                path: template.clone(),
                source: errno.into(),
            })?;
            self.fallback = Fallback::Made(made);
        }
        Ok(match &self.fallback {
            Fallback::Made(dir) | Fallback::Given(dir) => dir.clone(),
            Fallback::Fresh(_) => unreachable!("made above"),
        })
    }

    /// Writes one gzip'd pprof profile, after those still waiting. On
    /// failure the profiles stay in memory for the next call (or
    /// [`OutputWriter::finish`]); the error says why.
    pub fn write_profile(
        &mut self,
        pprof_gz: Vec<u8>,
        start: SystemTime,
    ) -> Result<Vec<PathBuf>, OutputError> {
        self.write_service_profile(pprof_gz, start, None)
    }

    /// [`OutputWriter::write_profile`] of a service's own profile.
    pub fn write_service_profile(
        &mut self,
        pprof_gz: Vec<u8>,
        start: SystemTime,
        service: Option<String>,
    ) -> Result<Vec<PathBuf>, OutputError> {
        self.pending_bytes += pprof_gz.len();
        self.pending.push_back(PendingProfile {
            start,
            pprof_gz,
            service,
        });
        while self.pending_bytes > MAX_PENDING_BYTES && self.pending.len() > 1 {
            if let Some(dropped) = self.pending.pop_front() {
                self.pending_bytes -= dropped.pprof_gz.len();
                log::warn!(
                    "dropped the unwritten profile of {} (more than {} MiB of profiles wait for a directory)",
                    crate::timestamp::utc_timestamp(dropped.start),
                    MAX_PENDING_BYTES >> 20
                );
            }
        }
        self.write_pending()
    }

    fn write_pending(&mut self) -> Result<Vec<PathBuf>, OutputError> {
        let mut written = Vec::new();
        while let Some(profile) = self.pending.pop_front() {
            match self.write_somewhere(|output| {
                output.write_service_profile(
                    &profile.pprof_gz,
                    profile.start,
                    profile.service.as_deref(),
                )
            }) {
                Ok(path) => {
                    self.pending_bytes -= profile.pprof_gz.len();
                    written.push(path);
                }
                Err(errors) => {
                    self.pending.push_front(profile);
                    return Err(OutputError::NotWritten {
                        files: self.pending_names(),
                        causes: causes(&errors),
                    });
                }
            }
        }
        Ok(written)
    }

    /// Writes the profiles still waiting, then `stacks.folded` and
    /// `flamegraph.svg` when the run has samples; returns every file
    /// written, or an error naming every file that was not.
    pub fn finish(&mut self, folded: &FoldedStacks) -> Result<Vec<PathBuf>, OutputError> {
        let mut failed = Vec::new();
        let mut errors = Vec::new();
        let mut written = match self.write_pending() {
            Ok(written) => written,
            Err(error) => {
                failed.extend(self.pending_names());
                errors.push(error);
                Vec::new()
            }
        };
        if folded.total_samples() > 0 {
            // Both are tried, whatever happens to the first.
            let folded_file = self.write_somewhere(|output| output.write_folded(folded));
            let flamegraph = self.write_somewhere(|output| output.write_flamegraph(folded));
            for (name, result) in [(FOLDED_FILE, folded_file), (FLAMEGRAPH_FILE, flamegraph)] {
                match result {
                    Ok(path) => written.push(path),
                    Err(file_errors) => {
                        failed.push(name.to_string());
                        errors.extend(file_errors);
                    }
                }
            }
        }
        if failed.is_empty() {
            return Ok(written);
        }
        Err(OutputError::NotWritten {
            files: failed,
            causes: causes(&errors),
        })
    }

    fn pending_names(&self) -> Vec<String> {
        let service = file_name_safe(&self.service);
        self.pending
            .iter()
            .map(|profile| {
                let own = profile.service.as_deref().map(file_name_safe);
                profile_name(own.as_deref().unwrap_or(&service), profile.start)
            })
            .collect()
    }

    /// Runs `write` in the directory in use, and on failure in the next
    /// one, which then stays in use (one warning says so). Returns every
    /// error when no directory took it.
    fn write_somewhere(
        &mut self,
        write: impl Fn(&LocalOutput) -> Result<PathBuf, OutputError>,
    ) -> Result<PathBuf, Vec<OutputError>> {
        let mut errors = Vec::new();
        loop {
            let dir = match self.current {
                0 => Ok(self.requested.clone()),
                _ => self.fallback_dir(),
            };
            let attempt = dir
                .and_then(|dir| LocalOutput::create(&dir, &self.service))
                .and_then(|output| write(&output));
            match attempt {
                Ok(path) => {
                    if !errors.is_empty() {
                        log::warn!(
                            "cannot write in {}; the outputs go to {} instead",
                            causes(&errors).join("; "),
                            self.dir().display()
                        );
                    }
                    return Ok(path);
                }
                Err(error) => errors.push(error),
            }
            if self.current == 1 {
                return Err(errors);
            }
            self.current = 1;
        }
    }
}

/// `DIR: error` of each error, each once.
fn causes(errors: &[OutputError]) -> Vec<String> {
    let mut causes: Vec<String> = Vec::new();
    for cause in errors.iter().map(OutputError::place_and_cause) {
        if !causes.contains(&cause) {
            causes.push(cause);
        }
    }
    causes
}

/// The file name of a profile of `service` starting at `start` (before any
/// `-2` suffix).
fn profile_name(service: &str, start: SystemTime) -> String {
    format!("{service}-{}.pprof", crate::timestamp::utc_timestamp(start))
}

fn file_name_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("ddprof{safe}")
    } else {
        safe
    }
}

/// The line printed at exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// CPU samples (see [`crate::overhead::Overhead::samples`]).
    pub samples: u64,
    /// The allocation probes' samples (`sALLOC`): shown when there were any.
    pub heap: crate::overhead::HeapSamples,
    /// Samples due and not delivered, all causes (see `lost_by_cause`).
    pub lost: u64,
    pub lost_by_cause: crate::overhead::Lost,
    pub throttles: u64,
    pub full_stacks: u64,
    pub profiles: u64,
    pub profiler_cpu_ms: u64,
    pub peak_rss_kib: u64,
    /// CPU time of the profiled tasks (0: not known).
    pub target_cpu_ms: u64,
    /// Workers that replaced an earlier one (planned or after a crash).
    pub worker_restarts: u64,
    /// Peak RSS of the parent and of the largest worker, in KiB (0: the
    /// run had no worker); `peak_rss_kib` is the larger.
    pub parent_peak_rss_kib: u64,
    pub worker_peak_rss_kib: u64,
    /// How long the sampling loop waited for a CPU in the periods that
    /// lost samples in full buffers, in ms.
    pub ring_full_loop_wait_ms: u64,
    /// The profiler's CPU after its last period, at the run's end (the
    /// flame graph, the folded stacks, the export's end): in
    /// `profiler_cpu_ms`, in no period's figures.
    pub finish_cpu_ms: u64,
}

impl Summary {
    /// Fills in the profiler's own CPU time and peak RSS.
    pub fn measure(samples: u64, lost: u64, full_stacks: u64, profiles: u64) -> Self {
        Self {
            samples,
            lost,
            full_stacks,
            profiles,
            profiler_cpu_ms: crate::overhead::own_cpu_time().as_millis() as u64,
            peak_rss_kib: crate::overhead::peak_rss_kib(),
            target_cpu_ms: 0,
            ..Self::default()
        }
    }

    /// The run's figures, as the overhead meter counted them.
    pub fn of_run(run: &crate::overhead::Overhead, profiles: u64) -> Self {
        Self {
            samples: run.samples,
            heap: run.heap,
            lost: run.lost.total(),
            lost_by_cause: run.lost,
            throttles: run.throttles,
            full_stacks: run.samples - run.truncated,
            profiles,
            profiler_cpu_ms: run.profiler_cpu.as_millis() as u64,
            peak_rss_kib: run.peak_rss_kib,
            target_cpu_ms: run.target_cpu.as_millis() as u64,
            ring_full_loop_wait_ms: run.run.losing_loop.waiting.as_millis() as u64,
            ..Self::default()
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "summary: samples={} lost={} full_stacks={} profiles={} profiler_cpu_ms={} peak_rss_kib={}",
            self.samples,
            self.lost,
            self.full_stacks,
            self.profiles,
            self.profiler_cpu_ms,
            self.peak_rss_kib
        )?;
        if self.heap != crate::overhead::HeapSamples::default() {
            write!(
                f,
                " alloc_samples={} freed_samples={}",
                self.heap.allocations, self.heap.frees
            )?;
        }
        let lost = &self.lost_by_cause;
        if lost.total() > 0 || self.throttles > 0 {
            write!(
                f,
                " lost_ring_full={} lost_malformed={} lost_unsampled={} lost_worker={} \
                 lost_exiting={} throttles={}",
                lost.ring_full,
                lost.malformed,
                lost.unsampled,
                lost.worker,
                lost.exiting,
                self.throttles
            )?;
        }
        if lost.ring_full > 0 {
            write!(f, " ring_full_loop_wait_ms={}", self.ring_full_loop_wait_ms)?;
        }
        if self.target_cpu_ms > 0 {
            write!(
                f,
                " target_cpu_ms={} profiler_cpu_share={:.2}%",
                self.target_cpu_ms,
                100.0 * self.profiler_cpu_ms as f64 / self.target_cpu_ms as f64
            )?;
        }
        if self.worker_peak_rss_kib > 0 {
            write!(
                f,
                " worker_restarts={} parent_peak_rss_kib={} worker_peak_rss_kib={}",
                self.worker_restarts, self.parent_peak_rss_kib, self.worker_peak_rss_kib
            )?;
        }
        if self.finish_cpu_ms > 0 {
            write!(f, " finish_cpu_ms={}", self.finish_cpu_ms)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::folded::FOLDED_TABLE_FULL;
    use super::*;
    use crate::aggregate::{Frame, PeriodProfile, PeriodStats, StackSample};
    use crate::symbolize::{SymbolLine, SymbolizedProfile};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn sanitizes_service_names() {
        assert_eq!(file_name_safe("my svc/1"), "my_svc_1");
        assert_eq!(file_name_safe(""), "ddprof");
    }

    fn profile(names: &[&str], counts: &[(u32, u64)]) -> SymbolizedProfile {
        let now = SystemTime::now();
        let frames: Vec<Frame> = names
            .iter()
            .enumerate()
            .map(|(i, _)| Frame::Anonymous {
                pid: 0,
                addr: i as u64,
                region: None,
            })
            .collect();
        let symbols = names
            .iter()
            .map(|name| {
                Arc::from([SymbolLine {
                    function: Arc::from(*name),
                    system_name: Arc::from(*name),
                    file: Arc::from(""),
                    line: 0,
                }])
            })
            .collect();
        // Stack 0 is the whole list (innermost first), stack 1 its last frame.
        let all: Box<[u32]> = (0..names.len() as u32).collect();
        let root: Box<[u32]> = Box::new([names.len() as u32 - 1]);
        SymbolizedProfile {
            period: PeriodProfile {
                start: now,
                end: now,
                files: vec![],
                perf_maps: Default::default(),
                frames,
                stacks: vec![all, root],
                samples: counts
                    .iter()
                    .map(|&(stack, count)| StackSample {
                        event: 0,
                        pid: 5,
                        tid: 5,
                        process_name: Some("app".into()),
                        thread_name: None,
                        container_id: None,
                        trace: None,
                        stack,
                        count,
                        scaled_count: count * crate::events::COUNT_UNIT,
                        cpu_nanos: count,
                        timeline: vec![],
                    })
                    .collect(),
                stats: PeriodStats::default(),
            },
            frames: symbols,
        }
    }

    #[test]
    fn folds_across_periods_within_bounds() {
        let mut folded = FoldedStacks::new(100);
        folded.add(&profile(&["leaf", "mid;x", "main"], &[(0, 3), (1, 1)]));
        folded.add(&profile(&["leaf", "mid;x", "main"], &[(0, 2)]));
        assert_eq!(folded.lines(), ["app;main 1", "app;main;mid:x;leaf 5"]);
        assert_eq!(folded.total_samples(), 6);

        let mut small = FoldedStacks::new(3);
        small.add(&profile(&["leaf", "mid", "main"], &[(1, 1), (0, 2)]));
        assert_eq!(
            small.lines(),
            [
                format!("app;{FOLDED_TABLE_FULL} 2"),
                "app;main 1".to_string()
            ]
        );
        // Once full, new stacks add no names (only the marker, once).
        let names_before = small.names.len();
        for leaf in 0..100 {
            let name = |text: String| Arc::<str>::from(text);
            small.add_stack(&[name("app".into()), name(format!("leaf{leaf}"))], 1);
            small.add_stack(&[name(format!("process{leaf}")), name("main".into())], 1);
        }
        assert_eq!(small.names.len(), names_before);
        assert_eq!(small.total_samples(), 203);
    }

    #[test]
    fn writes_profiles_and_final_outputs() {
        let dir = std::env::temp_dir().join(format!("ddprof-output-test-{}", std::process::id()));
        let output = LocalOutput::create(&dir.join("nested"), "svc name").unwrap();
        let start = UNIX_EPOCH + Duration::from_secs(1_795_317_300);
        let first = output.write_profile(b"one", start).unwrap();
        let second = output.write_profile(b"two", start).unwrap();
        assert!(
            first.ends_with("svc_name-20261122T031500Z.pprof"),
            "{first:?}"
        );
        assert!(
            second.ends_with("svc_name-20261122T031500Z-2.pprof"),
            "{second:?}"
        );
        assert_eq!(std::fs::read(&second).unwrap(), b"two");

        let mut folded = FoldedStacks::default();
        folded.add(&profile(&["leaf", "main"], &[(0, 4)]));
        let outputs = output.finish(&folded).unwrap();
        let svg = std::fs::read_to_string(&outputs.flamegraph).unwrap();
        assert!(svg.contains("<svg") && svg.contains("leaf"));
        assert_eq!(
            std::fs::read_to_string(&outputs.folded).unwrap(),
            "app;main;leaf 4\n"
        );
        let empty = output.finish(&FoldedStacks::default()).unwrap();
        assert!(std::fs::read_to_string(empty.flamegraph)
            .unwrap()
            .contains("<svg"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scratch directory holding `blocker`, a plain file: directories
    /// "under" it cannot be created, even by root.
    fn scratch(test: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ddprof-writer-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let blocker = dir.join("blocker");
        std::fs::write(&blocker, "not a directory").unwrap();
        (dir, blocker)
    }

    fn file_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_unwritable_directory_sends_the_outputs_to_the_fallback() {
        let (dir, blocker) = scratch("fallback");
        let fallback = dir.join("fallback");
        let mut writer = OutputWriter::with_fallback(&blocker.join("out"), &fallback, "svc");
        // Found at start, not at the first write.
        assert_eq!(writer.dir(), fallback);
        let start = UNIX_EPOCH + Duration::from_secs(1_795_317_300);
        let written = writer.write_profile(b"one".to_vec(), start).unwrap();
        assert_eq!(written, [fallback.join("svc-20261122T031500Z.pprof")]);
        let mut folded = FoldedStacks::default();
        folded.add(&profile(&["leaf", "main"], &[(0, 4)]));
        writer.finish(&folded).unwrap();
        assert_eq!(
            file_names(&fallback),
            [
                FLAMEGRAPH_FILE,
                "stacks.folded",
                "svc-20261122T031500Z.pprof"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn profiles_wait_in_memory_and_the_final_error_names_every_file() {
        let (dir, blocker) = scratch("pending");
        let mut writer =
            OutputWriter::with_fallback(&blocker.join("out"), &blocker.join("fallback"), "svc");
        let first = UNIX_EPOCH + Duration::from_secs(1_795_317_300);
        let second = first + Duration::from_secs(60);
        let error = writer.write_profile(b"one".to_vec(), first).unwrap_err();
        assert!(
            matches!(&error, OutputError::NotWritten { files, .. } if files == &["svc-20261122T031500Z.pprof"]),
            "{error}"
        );
        writer.write_profile(b"two".to_vec(), second).unwrap_err();
        let mut folded = FoldedStacks::default();
        folded.add(&profile(&["leaf", "main"], &[(0, 4)]));
        let message = writer.finish(&folded).unwrap_err().to_string();
        assert!(
            message.starts_with(
                "could not write svc-20261122T031500Z.pprof, svc-20261122T031600Z.pprof, \
                 stacks.folded, flamegraph.svg ("
            ),
            "{message}"
        );
        assert!(
            message.contains(&blocker.display().to_string()),
            "{message}"
        );

        // Once a directory accepts them, every waiting profile is written.
        std::fs::remove_file(&blocker).unwrap();
        let written = writer.finish(&folded).unwrap();
        assert_eq!(written.len(), 4, "{written:?}");
        assert_eq!(
            std::fs::read(blocker.join("fallback/svc-20261122T031500Z.pprof")).unwrap(),
            b"one"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn summary_line_has_every_field() {
        let summary = Summary::measure(10, 1, 9, 2);
        assert!(summary.peak_rss_kib > 0);
        let line = summary.to_string();
        assert!(line
            .starts_with("summary: samples=10 lost=1 full_stacks=9 profiles=2 profiler_cpu_ms="));
        assert!(line.contains(" peak_rss_kib="));
    }
}
