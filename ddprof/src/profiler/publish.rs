//! The worker's publisher: a thread of its own that symbolizes and encodes
//! each closed period and writes every message to the parent, so that the
//! sampling loop goes on draining the ring buffers meanwhile.
//!
//! Symbolizing a period takes tens of milliseconds with warm caches and
//! from hundreds of milliseconds to seconds with cold ones (a big
//! program's debug information, a busy machine); the buffers hold far less
//! than that in stack copies (a sample the BPF engine hands over carries
//! one): done on the sampling thread, every such pause lost samples in
//! full buffers (38 of 498 in a CI run whose first period took 770 ms).
//!
//! Every message to the parent goes through this thread, in the order the
//! loop gave them, so frames never interleave on the socket and a period
//! always precedes the `Exiting` that follows it. At most one closed period
//! waits while another is symbolized: a loop that closes periods faster
//! than they are published waits for the publisher (its watchdog still
//! runs), so memory stays bounded.
//!
//! A worker that retires waits, still draining, until the publisher is idle
//! before it drains the last time and says `Retiring`: the parent starts
//! the next worker on that message, so nothing may wait ahead of it.
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::channel::{EncodedPeriod, ServiceProfile, ToParent};
use super::worker::{ClosedPeriod, WorkerError};
use super::ProfilerError;
use crate::output::FoldedStacks;
use crate::overhead::{CacheFigures, ThreadTimes};
use crate::profile::{encode_pprof_compressed, Compressions, ProfileMetadata};
use crate::provenance::Provenance;
use crate::symbolize::{KallsymsSnapshot, Symbolizer, SymbolizerOptions};

/// What the publisher is given, in order.
enum Job {
    /// A period to symbolize, encode and send.
    Period(Box<ClosedPeriod>),
    /// A message to send as it is.
    Message(ToParent),
}

/// What a period's profile says about the worker besides its samples.
pub(super) struct PublisherSetup {
    pub symbolizer: SymbolizerOptions,
    pub kallsyms: Option<KallsymsSnapshot>,
    pub sampling_period_nanos: u64,
    /// The sampled events, for the profile's columns.
    pub events: Vec<crate::profile::ProfiledEvent>,
    pub kernel_stacks: bool,
    pub restarts: u64,
    pub compressions: Compressions,
}

/// The sampling loop's end of the publisher thread.
pub(super) struct Publisher {
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<Result<(), WorkerError>>>,
    /// Jobs handed over and not yet sent.
    pending: Arc<AtomicUsize>,
}

impl Publisher {
    /// Starts the thread (named `ddprof-publish`), which owns the
    /// symbolizer and writes to `socket`.
    pub(super) fn start(setup: PublisherSetup, socket: UnixStream) -> std::io::Result<Self> {
        // One period symbolized, one waiting: see the module documentation.
        let (jobs, waiting) = sync_channel(1);
        let pending = Arc::new(AtomicUsize::new(0));
        let sent = pending.clone();
        let thread = std::thread::Builder::new()
            .name("ddprof-publish".into())
            .spawn(move || publish(setup, socket, waiting, &sent))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
            pending,
        })
    }

    /// Whether everything handed over has been sent.
    pub(super) fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// The thread's error if it stopped (the parent gone, an encoding that
    /// failed): the loop has no reason to go on sampling.
    pub(super) fn check(&mut self) -> Result<(), WorkerError> {
        if self.thread.as_ref().is_some_and(JoinHandle::is_finished) {
            return self.stopped();
        }
        Ok(())
    }

    /// Hands over a closed period; waits while another one already waits.
    pub(super) fn period(&mut self, closed: ClosedPeriod) -> Result<(), WorkerError> {
        self.give(Job::Period(Box::new(closed)))
    }

    /// Hands over a message, sent after everything handed over before it.
    pub(super) fn message(&mut self, message: ToParent) -> Result<(), WorkerError> {
        self.give(Job::Message(message))
    }

    /// Waits until everything handed over is sent (the worker exits next).
    pub(super) fn finish(mut self) -> Result<(), WorkerError> {
        self.jobs = None;
        self.join()
    }

    fn give(&mut self, job: Job) -> Result<(), WorkerError> {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job).is_ok());
        match sent {
            Some(true) => Ok(()),
            _ => self.stopped(),
        }
    }

    /// The thread stopped while the loop runs: its error says why (one
    /// that ended without one can only have lost the parent).
    fn stopped(&mut self) -> Result<(), WorkerError> {
        self.jobs = None;
        self.join().and(Err(WorkerError::ParentGone))
    }

    fn join(&mut self) -> Result<(), WorkerError> {
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            None => Err(WorkerError::ParentGone),
        }
    }
}

/// The thread: publishes each job in turn until the loop's end is dropped
/// or the parent is gone.
fn publish(
    setup: PublisherSetup,
    mut socket: UnixStream,
    jobs: Receiver<Job>,
    pending: &AtomicUsize,
) -> Result<(), WorkerError> {
    let mut symbolizer = Symbolizer::new(setup.symbolizer);
    if let Some(snapshot) = setup.kallsyms {
        symbolizer.use_kallsyms(snapshot);
    }
    let mut provenance = Provenance::default();
    let mut metadata = ProfileMetadata {
        events: setup.events,
        sampling_period_nanos: setup.sampling_period_nanos,
        comments: Vec::new(),
    };
    for job in jobs {
        let message = match job {
            Job::Message(message) => message,
            Job::Period(closed) => encode(
                *closed,
                &mut symbolizer,
                &mut provenance,
                &mut metadata,
                &setup.compressions,
                setup.kernel_stacks,
                setup.restarts,
            )?,
        };
        socket
            .write_all(&message.to_frame())
            .map_err(|_| WorkerError::ParentGone)?;
        pending.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// Symbolizes and encodes a closed period into its message to the parent.
fn encode(
    closed: ClosedPeriod,
    symbolizer: &mut Symbolizer,
    provenance: &mut Provenance,
    metadata: &mut ProfileMetadata,
    compressions: &Compressions,
    kernel_stacks: bool,
    restarts: u64,
) -> Result<ToParent, WorkerError> {
    let ClosedPeriod {
        start,
        end,
        period,
        wall,
        overhead,
        last,
        mut caches,
        keeping_up,
        services,
    } = closed;
    let Some(overhead) = overhead else {
        return Ok(ToParent::PeriodEnd {
            start,
            end,
            profile: None,
        });
    };
    metadata.comments = overhead.comments();
    metadata
        .comments
        .push(format!("ddprof.include_kernel={kernel_stacks}"));
    metadata
        .comments
        .push(format!("ddprof.worker_restarts={restarts}"));
    // How the wall time was sampled: a reader of the profile sees what its
    // `wall-time` stands for.
    if let Some(wall) = wall {
        metadata.comments.extend(wall.comments());
    }
    let (symbolizing, times_before) = (Instant::now(), ThreadTimes::now());
    let symbolized = symbolizer.symbolize(period);
    let symbolize_time = symbolizing.elapsed();
    let symbolize_times = ThreadTimes::now().since(times_before);
    // The caches' figures go with the overhead's: in the profile and in
    // the log, after the period's line.
    caches.extend(symbolizer.cache_figures());
    metadata.comments.extend(CacheFigures::comments(&caches));
    // The flame graph holds every process's samples, whatever its service;
    // the parts keep the period's files, so its origins serve them all.
    let folded = FoldedStacks::stacks_of(&symbolized, folded_event(&metadata.events, &symbolized));
    let origins = provenance.of_period(&symbolized);
    let sources = origins.function_sources(&symbolized).into_iter().collect();
    let (symbolized, service_parts) = crate::identity::split::by_service(symbolized, &services);
    let encoding = Instant::now();
    let encoded = encode_pprof_compressed(&symbolized, metadata, *compressions)
        .map_err(ProfilerError::from)?;
    let mut service_profiles = Vec::with_capacity(service_parts.len());
    for (identity, part) in service_parts {
        let encoded =
            encode_pprof_compressed(&part, metadata, *compressions).map_err(ProfilerError::from)?;
        service_profiles.push(ServiceProfile {
            identity,
            pprof_gzip: encoded.gzip,
            pprof_zstd: encoded.zstd,
            code_provenance: compressions.zstd.then(|| origins.json(&part).into_bytes()),
        });
    }
    if !service_profiles.is_empty() {
        log::info!(
            "period: {} services of their own ({}), the other processes' samples under the \
             run's",
            service_profiles.len(),
            service_profiles
                .iter()
                .map(|profile| profile.identity.service.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let encode_time = encoding.elapsed();
    // How the loop kept up and where the symbolization's time went: when
    // samples are lost in full buffers, this says whether the profiler was
    // busy, kept off a CPU, or waiting on a disk.
    let keeping_up = keeping_up.map(|k| format!("; {k}")).unwrap_or_default();
    log::info!(
        "period: {overhead}; symbolized in {:.1} ms ({symbolize_times}), encoded in {:.1} ms, \
         pprof {} bytes{keeping_up}",
        symbolize_time.as_secs_f64() * 1e3,
        encode_time.as_secs_f64() * 1e3,
        encoded
            .gzip
            .as_ref()
            .or(encoded.zstd.as_ref())
            .map_or(0, Vec::len)
    );
    log::info!("caches: {}", CacheFigures::describe(&caches));
    let profile = EncodedPeriod {
        sources,
        code_provenance: compressions
            .zstd
            .then(|| origins.json(&symbolized).into_bytes()),
        figures: overhead,
        worker_peak_rss_kib: crate::overhead::peak_rss_kib(),
        last_of_run: last,
        folded,
        pprof_gzip: encoded.gzip,
        pprof_zstd: encoded.zstd,
        services: service_profiles,
    };
    Ok(ToParent::PeriodEnd {
        start,
        end,
        profile: Some(Box::new(profile)),
    })
}

/// The event whose samples make the flame graph and `stacks.folded`: the
/// CPU-time event when sampled, else the first event with samples (the
/// others' stacks are in the pprof, each event in its columns).
fn folded_event(
    events: &[crate::profile::ProfiledEvent],
    profile: &crate::symbolize::SymbolizedProfile,
) -> u16 {
    match events.iter().find(|event| event.cpu_time) {
        Some(event) => event.index,
        None => profile
            .period
            .samples
            .iter()
            .map(|sample| sample.event)
            .min()
            .unwrap_or(0),
    }
}
