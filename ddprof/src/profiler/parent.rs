//! The profiler parent (comm `ddprof-profiler`): keeps what must survive a
//! worker — the sampler's descriptors, ring buffers and BPF program and
//! maps (all shared with the worker through the fork), the exporter and its
//! queue, the local outputs, the whole run's folded stacks and figures — and
//! supervises the worker ([`super::worker`]) that does the rest.
//!
//! Restarts: a worker ends itself after `--worker-period` periods or when
//! its RSS passed `--worker-max-rss` at the end of a period: it drains the
//! buffers, closes the period and says so (`Retiring`); the parent forks the
//! next worker at once, then reads the old one's last period while the new
//! one already reads the buffers. A worker that
//! dies otherwise (a crash, SIGKILL, its watchdog) is restarted after a
//! backoff of 0 s, 1 s, 2 s, 4 s … capped at [`MAX_BACKOFF`] (back to 0 once
//! a worker has delivered a period), and after [`MAX_CONSECUTIVE_FAILURES`]
//! failures in a row the parent stops profiling with one error line; the
//! target never notices. A new worker's first profile starts where the last
//! one received ended, so a dead worker's unfinished period is exported
//! with the samples read since its death.
//!
//! Stop: on SIGINT/SIGTERM the parent asks the worker for its last period
//! (one byte on the socket), waits for it at most [`STOP_GRACE`], then
//! finishes the outputs and the export.
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant, SystemTime};

use super::channel::{EncodedPeriod, FrameReader, ToParent, WorkerExit, STOP_REQUEST};
use super::worker::{self, Handover, WorkerSetup};
use super::{stop, Profiler, ProfilerError, ProfilerOptions, Target, TargetWatch};
use crate::export::entity::Entity;
use crate::export::request::RequestContext;
use crate::export::{Exporter, PeriodFigures, PeriodProfile};
use crate::output::{FoldedStacks, OutputWriter, Summary};
use crate::overhead::{Overhead, RunTotals};
use crate::statsd::StatsdSink;

/// The comm of the profiler parent.
pub const PARENT_NAME: &std::ffi::CStr = c"ddprof-profiler";
/// The longest wait between two restarts after failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Workers that may fail in a row before the parent gives up.
pub const MAX_CONSECUTIVE_FAILURES: u32 = 8;
/// How long a stopping parent waits for the worker's last period.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// Runs the parent and its workers until the target is gone or a stop is
/// requested; flushes the last period and finishes the outputs.
pub fn run(profiler: Profiler, watch: Option<TargetWatch>) -> Result<(), ProfilerError> {
    let Profiler {
        options,
        target,
        mut processes,
        mut sampler,
        mut kallsyms,
        wall,
        spent_before,
    } = profiler;
    if options.show_samples && log::max_level() < log::LevelFilter::Info {
        log::set_max_level(log::LevelFilter::Info);
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, PARENT_NAME.as_ptr(), 0, 0, 0) };
    let run_start = Instant::now();
    let mut outputs = Outputs::new(&options, target, sampler.engine_name());
    let now = Instant::now();
    let mut handover = Handover {
        period_start: SystemTime::now(),
        period_deadline: now + options.upload_period,
        profiles: 0,
        restarts: 0,
        cpu_counted: Duration::ZERO,
        totals: RunTotals::default(),
        after_a_dead_worker: false,
        spent_before,
        parent: std::process::id(),
    };
    // What goes from a worker to the next: the live heap (`sALLOC mode=l`)
    // and the waits under way (`sWALL`).
    let carried = |wanted: bool, name: &str, magic: &[u8; 8], what: &str| {
        wanted
            .then(|| crate::carried::CarriedFile::create(name, magic))?
            .inspect_err(|error| log::warn!("{what}: {error}; a restarted worker starts it empty"))
            .ok()
    };
    let live_heap = carried(
        options.events.iter().any(|event| event.live_heap),
        "ddprof-live-heap",
        crate::live_heap::SNAPSHOT_MAGIC,
        "live heap",
    );
    let waits = carried(
        wall.is_some(),
        "ddprof-waits",
        crate::wall::SNAPSHOT_MAGIC,
        "wall time's waits under way",
    );
    let mut failures = 0u32;
    let mut cause = String::from("first");
    // A worker that handed over and is finishing its last period.
    let mut retiring: Option<Connection> = None;
    loop {
        let (socket, worker_socket) = UnixStream::pair()?;
        // The worker's cache writes, which this process makes for it (see
        // `files::cache_dir`): one message each, a file with it.
        let (cache_writes, worker_cache_writes) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        sampler.settle_before_fork();
        // SAFETY: the child runs only this thread (see worker.rs for what
        // it may touch) and leaves with _exit, never returning here.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if pid == 0 {
            drop(socket);
            drop(cache_writes);
            crate::files::cache_dir::route_writes_to(worker_cache_writes);
            // The retiring worker's sockets are the parent's business.
            drop(retiring.take().map(|old| (old.socket, old.cache_writes)));
            let setup = WorkerSetup {
                options: &options,
                target,
                processes: &mut processes,
                sampler: &mut sampler,
                kallsyms: kallsyms.take(),
                wall: wall.clone(),
                watch: watch.as_ref(),
                handover,
                socket: worker_socket,
                live_heap: live_heap.as_ref(),
                waits: waits.as_ref(),
            };
            let status =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(setup)))
                    .unwrap_or(101);
            // SAFETY: ends the worker without running the parent's
            // destructors (the exporter's runtime, the descriptors).
            unsafe { libc::_exit(status) };
        }
        drop(worker_socket);
        drop(worker_cache_writes);
        sampler.release_worker_resources();
        log::info!(
            "worker started pid={pid} (restart #{}, cause {cause})",
            handover.restarts
        );
        if let Some(old) = retiring.take() {
            // Its last period, while the new worker reads the buffers.
            let old_pid = old.pid;
            let end = receive(old, &options, &mut outputs, None);
            if end.exit.is_none() {
                log::warn!(
                    "profiler worker pid={old_pid} {} before it sent its last period",
                    end.status
                );
            }
        }
        let mut connection = Connection {
            socket,
            cache_writes,
            cache_root: options.symbolizer.debug_cache.clone(),
            reader: FrameReader::default(),
            pid,
        };
        let end = supervise(&mut connection, &options, &mut outputs, &mut handover);
        if end.retiring {
            retiring = Some(connection);
        } else {
            drop(connection);
        }
        match end.exit {
            Some(WorkerExit::Finished) => break,
            Some(WorkerExit::Periods(periods)) => {
                cause = format!("period: {periods} upload periods done");
                failures = 0;
                handover.after_a_dead_worker = false;
            }
            Some(WorkerExit::Rss(kib)) => {
                cause = format!(
                    "rss: {} MiB over --worker-max-rss {} MiB",
                    kib / 1024,
                    options.worker.max_rss_kib / 1024
                );
                failures = 0;
                handover.after_a_dead_worker = false;
            }
            None if end.abandoned => break,
            None => {
                if end.periods > 0 {
                    failures = 0;
                }
                failures += 1;
                if failures >= MAX_CONSECUTIVE_FAILURES {
                    log::error!(
                        "profiler worker: {failures} failures in a row (last: pid {pid} {}); \
                         profiling stops here, the profiled command is not affected",
                        end.status
                    );
                    break;
                }
                let delay = backoff(failures);
                log::warn!(
                    "profiler worker pid={pid} {}; restarting it in {} s",
                    end.status,
                    delay.as_secs()
                );
                cause = format!("crash: {}", end.status);
                handover.after_a_dead_worker = true;
                wait_before_restart(delay, watch.as_ref());
            }
        }
        handover.restarts += 1;
    }
    // The kernel's count once every worker is done: what the run's samples
    // and losses must add up to (a last worker that died before sending its
    // period lost its samples: they count as unsampled).
    let counted = sampler.counted_task_nanos();
    // Unmapped and closed before the summary measures the profiler's CPU:
    // tearing down the buffers and the BPF maps is work of the run too.
    drop(sampler);
    drop(processes);
    drop(kallsyms);
    outputs.finish(run_start, &handover, counted)
}

/// 0 s after the first failure, then 1 s, 2 s, 4 s … up to [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    Duration::from_secs(1u64 << (failures - 2).min(16)).min(MAX_BACKOFF)
}

/// Sleeps `delay`, or less when the target exits or a stop is requested
/// (the next worker then flushes at once).
fn wait_before_restart(delay: Duration, watch: Option<&TargetWatch>) {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        if stop::requested() || watch.is_some_and(TargetWatch::has_exited) {
            return;
        }
        std::thread::sleep(until.saturating_duration_since(Instant::now()).min(STEP));
    }
}

/// How often the parent looks at stop requests while it waits before a
/// restart.
const STEP: Duration = Duration::from_millis(100);

/// The longest the parent sleeps waiting for its worker. The worker's
/// messages and its end (the socket's end of file) wake it at once, and so
/// does a stop signal (the handlers' self-pipe is in the same poll): this is
/// only how late it sees the stop grace run out. Each timed wake-up costs
/// ~50 µs of CPU on a VM (measured with a bare poll loop on the bench
/// machine): at the former 100 ms, ~2 ms of a 4 s run.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// How a worker ended.
#[derive(Default)]
struct WorkerEnd {
    /// What it said before exiting (None: it died).
    exit: Option<WorkerExit>,
    /// Its wait status, in words (empty while it is retiring).
    status: String,
    /// Periods it delivered.
    periods: u64,
    /// The parent stopped waiting for it (stop grace passed): it dies with
    /// the parent.
    abandoned: bool,
    /// It handed over and is finishing its last period: not reaped yet.
    retiring: bool,
}

/// The parent's end of a worker's sockets.
struct Connection {
    socket: UnixStream,
    /// Where the worker's cache writes arrive, and the caches' root they
    /// must stay under.
    cache_writes: std::os::fd::OwnedFd,
    cache_root: Option<std::path::PathBuf>,
    reader: FrameReader,
    pid: libc::pid_t,
}

/// Receives the worker's periods until it exits or hands over
/// ([`ToParent::Retiring`]: the caller starts the next worker, then reads
/// this one's last period with [`receive`]).
fn supervise(
    connection: &mut Connection,
    options: &ProfilerOptions,
    outputs: &mut Outputs,
    handover: &mut Handover,
) -> WorkerEnd {
    let pid = connection.pid;
    let mut stop_deadline: Option<Instant> = None;
    let mut end = WorkerEnd::default();
    loop {
        if stop_deadline.is_none() && stop::requested() {
            // A worker that is gone already cannot read it: its end is seen below.
            let _ = connection.socket.write_all(&[STOP_REQUEST]);
            stop_deadline = Some(Instant::now() + STOP_GRACE);
        }
        if stop_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            log::warn!(
                "profiler worker pid={pid} did not send its last period within {} s; \
                 exiting without it",
                STOP_GRACE.as_secs()
            );
            end.abandoned = true;
            return end;
        }
        match next_message(connection) {
            Received::Nothing => {}
            Received::End => break,
            Received::Message(ToParent::Exiting(exit)) => end.exit = Some(exit),
            Received::Message(ToParent::Retiring(retirement)) => {
                handover.period_deadline += options.upload_period;
                handover.period_start = retirement.next_period_start;
                handover.profiles += u64::from(retirement.profile_follows);
                handover.cpu_counted += retirement.reported_cpu;
                handover.totals = retirement.totals;
                end.exit = Some(retirement.exit);
                end.retiring = true;
                return end;
            }
            Received::Message(ToParent::PeriodEnd {
                start,
                end: period_end,
                profile,
            }) => {
                handover.period_deadline += options.upload_period;
                if let Some(profile) = profile {
                    end.periods += 1;
                    handover.period_start = period_end;
                    handover.profiles += 1;
                    handover.cpu_counted += profile.figures.profiler_cpu;
                    handover.totals = profile.figures.run;
                    outputs.publish(start, period_end, *profile);
                }
            }
        }
    }
    end.status = close_and_reap(connection);
    end
}

/// Reads a retiring worker's last period and its exit.
fn receive(
    mut connection: Connection,
    options: &ProfilerOptions,
    outputs: &mut Outputs,
    until: Option<Instant>,
) -> WorkerEnd {
    let mut end = WorkerEnd::default();
    // As long as a period may take to symbolize.
    let until = until.unwrap_or_else(|| Instant::now() + options.upload_period + STOP_GRACE);
    while Instant::now() < until {
        match next_message(&mut connection) {
            Received::Nothing => {}
            Received::End => break,
            Received::Message(ToParent::Exiting(exit)) => end.exit = Some(exit),
            Received::Message(ToParent::PeriodEnd {
                start,
                end: period_end,
                profile: Some(profile),
            }) => {
                end.periods += 1;
                outputs.publish(start, period_end, *profile);
            }
            Received::Message(_) => {}
        }
    }
    end.status = close_and_reap(&mut connection);
    end
}

enum Received {
    Nothing,
    /// End of file, a read error or garbage (said in a log line).
    End,
    Message(ToParent),
}

/// The next message of the worker, waiting at most [`IDLE_WAIT`] for input.
fn next_message(connection: &mut Connection) -> Received {
    loop {
        match connection.reader.next_message() {
            Ok(Some(message)) => return Received::Message(message),
            Ok(None) => {}
            Err(error) => {
                log::warn!(
                    "profiler worker pid={}: {error}; replacing it",
                    connection.pid
                );
                return Received::End;
            }
        }
        let ready = wait_readable(&connection.socket, &connection.cache_writes, IDLE_WAIT);
        if ready.cache_writes {
            crate::files::cache_dir::serve_writes(
                &connection.cache_writes,
                connection.cache_root.as_deref(),
            );
        }
        if !ready.socket {
            if ready.cache_writes {
                continue;
            }
            return Received::Nothing;
        }
        let mut buffer = [0u8; 64 * 1024];
        match connection.socket.read(&mut buffer) {
            Ok(0) => return Received::End,
            Ok(read) => connection.reader.extend(&buffer[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Received::End,
        }
    }
}

/// Shuts the socket (a worker still running, one that sent garbage, sees
/// the end of file at its next look and exits) and reaps the worker.
fn close_and_reap(connection: &mut Connection) -> String {
    if connection.reader.pending_bytes() > 0 {
        log::debug!(
            "profiler worker pid={} ended in the middle of a message ({} bytes)",
            connection.pid,
            connection.reader.pending_bytes()
        );
    }
    let _ = connection.socket.shutdown(std::net::Shutdown::Both);
    // What the worker sent last (its last period's names) is written too.
    crate::files::cache_dir::serve_writes(
        &connection.cache_writes,
        connection.cache_root.as_deref(),
    );
    reap(connection.pid)
}

/// Which of a worker's sockets have input.
struct Ready {
    socket: bool,
    cache_writes: bool,
}

/// poll(2) for input on a worker's sockets, returning early on a stop
/// signal.
fn wait_readable(
    socket: &UnixStream,
    cache_writes: &std::os::fd::OwnedFd,
    timeout: Duration,
) -> Ready {
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // A negative descriptor is skipped by poll(2).
    let mut fds = [
        pollfd(socket.as_raw_fd()),
        pollfd(cache_writes.as_raw_fd()),
        pollfd(stop::pending_wake_fd().unwrap_or(-1)),
    ];
    // SAFETY: `fds` is an array of three valid pollfd for the duration of
    // the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout.as_millis() as libc::c_int) };
    Ready {
        socket: ready > 0 && fds[0].revents != 0,
        cache_writes: ready > 0 && fds[1].revents & libc::POLLIN != 0,
    }
}

/// Waits for the worker to end; its wait status in words.
fn reap(pid: libc::pid_t) -> String {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child and writes its status to `status`.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid {
            return describe_status(status);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return "was not found to wait for".to_string();
        }
    }
}

/// A wait status in words, for the log.
pub fn describe_status(status: libc::c_int) -> String {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let name = match signal {
            libc::SIGKILL => "SIGKILL",
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGABRT => "SIGABRT",
            libc::SIGBUS => "SIGBUS",
            libc::SIGPIPE => "SIGPIPE",
            libc::SIGALRM => "SIGALRM: its watchdog, it made no progress",
            _ => "",
        };
        format!("was killed by signal {signal} ({name})")
    } else if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            0 => "exited without saying why".to_string(),
            worker::EXIT_FAILED => "exited after an error (logged above)".to_string(),
            101 => "panicked".to_string(),
            code => format!("exited with status {code}"),
        }
    } else {
        format!("ended with wait status {status:#x}")
    }
}

/// What the parent does with the workers' periods: local files, upload,
/// DogStatsD, the whole run's folded stacks and figures.
struct Outputs {
    folded: FoldedStacks,
    output: Option<OutputWriter>,
    exporter: Option<Exporter>,
    internal_stats: Option<StatsdSink>,
    /// The run's totals as the last period received says them.
    totals: RunTotals,
    /// The CPU time one sample stands for at the configured rate.
    sampling_period_nanos: u64,
    /// Profiles received.
    profiles: u64,
    worker_peak_rss_kib: u64,
}

impl Outputs {
    fn new(options: &ProfilerOptions, target: Target, engine: &str) -> Self {
        Self {
            // Checks the directory now, not when the command has exited.
            output: options
                .output_dir
                .as_ref()
                .map(|dir| OutputWriter::start(dir, &options.service)),
            exporter: start_exporter(options, target, engine),
            internal_stats: internal_stats_sink(options),
            folded: FoldedStacks::default(),
            totals: RunTotals::default(),
            sampling_period_nanos: options.sampling_period_nanos,
            profiles: 0,
            worker_peak_rss_kib: 0,
        }
    }

    fn publish(&mut self, start: SystemTime, end: SystemTime, profile: EncodedPeriod) {
        let figures = profile.figures;
        self.profiles += 1;
        self.totals = figures.run;
        self.worker_peak_rss_kib = self.worker_peak_rss_kib.max(profile.worker_peak_rss_kib);
        if let Some(sink) = &mut self.internal_stats {
            let pprof_bytes = profile
                .pprof_zstd
                .as_ref()
                .or(profile.pprof_gzip.as_ref())
                .map_or(0, Vec::len);
            sink.send(&figures, pprof_bytes);
        }
        for (names, count) in &profile.folded {
            self.folded.add_stack(names, *count);
        }
        self.folded.add_sources(&profile.sources);
        let period_figures = PeriodFigures {
            samples: figures.samples,
            lost: figures.lost.total(),
            truncated: figures.truncated,
            profiler_cpu_nanos: figures.profiler_cpu.as_nanos() as u64,
            rss_kib: figures.rss_kib,
            peak_rss_kib: figures.peak_rss_kib,
        };
        if let (Some(exporter), Some(pprof_zstd)) = (&self.exporter, profile.pprof_zstd) {
            exporter.submit(PeriodProfile {
                start,
                end,
                pprof_zstd,
                code_provenance_json: profile.code_provenance,
                service: None,
                figures: period_figures,
            });
        }
        // Each service's own profile: uploaded under its tags, written
        // under its name.
        for service in profile.services {
            if let (Some(exporter), Some(pprof_zstd)) = (&self.exporter, service.pprof_zstd) {
                exporter.submit(PeriodProfile {
                    start,
                    end,
                    pprof_zstd,
                    code_provenance_json: service.code_provenance,
                    service: Some(service.identity.clone()),
                    // The profiler's figures go with the run's profile.
                    figures: PeriodFigures::default(),
                });
            }
            if let (Some(output), Some(bytes)) = (&mut self.output, service.pprof_gzip) {
                let written =
                    output.write_service_profile(bytes, start, Some(service.identity.service));
                say_written(written, profile.last_of_run);
            }
        }
        if let (Some(output), Some(bytes)) = (&mut self.output, profile.pprof_gzip) {
            say_written(output.write_profile(bytes, start), profile.last_of_run);
        }
    }

    /// Ends the export and writes the run's files and summary.
    fn finish(
        &mut self,
        run_start: Instant,
        handover: &Handover,
        counted_nanos: Option<u64>,
    ) -> Result<(), ProfilerError> {
        // The workers are reaped: what follows is the run's own end.
        let cpu_at_finish = crate::overhead::own_cpu_time();
        if self.folded.total_samples() == 0 {
            // A flame graph of nothing cannot be drawn; the empty profile
            // already says that the run took no samples.
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
        let finished = match &mut self.output {
            // Also writes the profiles earlier periods could not.
            Some(output) => output.finish(&self.folded).map(|written| {
                for path in written {
                    log::info!("wrote {}", path.display());
                }
            }),
            None => Ok(()),
        };
        // The summary is worth printing even when some outputs could not
        // be written. The CPU time covers the workers, all reaped by now.
        let parent_peak_rss_kib = crate::overhead::peak_rss_kib();
        if counted_nanos.is_some() {
            self.totals.counted_nanos = counted_nanos;
        }
        let run = Overhead {
            duration: run_start.elapsed(),
            profiler_cpu: crate::overhead::own_cpu_time() + handover.spent_before,
            peak_rss_kib: parent_peak_rss_kib.max(self.worker_peak_rss_kib),
            ..Overhead::of_run(&self.totals, self.sampling_period_nanos)
        };
        let summary = Summary {
            worker_restarts: handover.restarts,
            parent_peak_rss_kib,
            worker_peak_rss_kib: self.worker_peak_rss_kib,
            finish_cpu_ms: (crate::overhead::own_cpu_time().saturating_sub(cpu_at_finish))
                .as_millis() as u64,
            ..Summary::of_run(&run, self.profiles)
        };
        log::info!("{summary}");
        super::losses::warn_of_losses(
            &run.lost,
            self.totals.losing_loop,
            run.throttles,
            run.samples,
        );
        Ok(finished?)
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

/// Says which files a period's profile went to, or that it could not be
/// written: kept in memory, the next period, or `finish`, tries again
/// (after the run's last period, the files not written are named at exit
/// in one line, not here).
fn say_written(written: Result<Vec<std::path::PathBuf>, crate::output::OutputError>, last: bool) {
    match written {
        Ok(paths) => {
            for path in paths {
                log::info!("wrote {}", path.display());
            }
        }
        Err(error) if !last => log::warn!("{error}; trying again at the next period"),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let delays: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 30, 30]);
    }

    #[test]
    fn wait_statuses_in_words() {
        // Raw statuses as waitpid reports them.
        assert!(describe_status(libc::SIGKILL).contains("signal 9 (SIGKILL)"));
        assert!(describe_status(libc::SIGALRM).contains("watchdog"));
        assert_eq!(
            describe_status(3 << 8),
            "exited after an error (logged above)"
        );
        assert_eq!(describe_status(7 << 8), "exited with status 7");
    }
}
