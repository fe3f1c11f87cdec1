//! The uploader: its own thread, a tokio runtime and reqwest, fed through a
//! bounded queue.
//!
//! - The profiler loop calls [`Exporter::submit`], which only takes a
//!   mutex held for list operations (never across the network): sampling
//!   is never delayed by the agent.
//! - One profile is in flight at a time, oldest first, so profiles arrive
//!   in order. A refused connection, a timeout, a 408, 429 or 5xx puts it
//!   back at the head of the queue and the uploader waits (exponential
//!   backoff from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]) before trying again.
//!   Another 4xx is said once, with the response body, and not retried:
//!   sending the same request again would be refused again.
//! - The queue holds at most [`QueueBounds`] profiles and bytes (the one in
//!   flight included). Past them the oldest are dropped, said in one line
//!   and counted in the next profile's event.json (`internal.dropped_profiles`).
//! - [`Exporter::finish`] gives what is left a grace period, then returns
//!   whatever the agent does: an agent that accepts connections and never
//!   answers delays the profiler's exit by the grace period at most.
//! - One warning per failure streak, not per attempt; one notice line per
//!   profile sent.
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::request::{self, RequestContext};
use super::{Endpoint, PeriodProfile, QueueBounds};

/// The first wait after a failed attempt; it doubles per failure.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot set up the HTTP client for {endpoint}: {reason}")]
    Client { endpoint: String, reason: String },
    #[error("cannot start the upload thread: {0}")]
    Thread(std::io::Error),
}

/// A profile waiting to go out.
struct Queued {
    profile: PeriodProfile,
    sequence: u64,
    /// Profiles dropped before this one was queued (reported with it).
    dropped_before: u64,
}

impl Queued {
    fn bytes(&self) -> usize {
        self.profile.pprof_zstd.len()
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Bytes of the queued profiles and of the one in flight.
    bytes: usize,
    /// Bytes of the profile in flight (0: none).
    in_flight: Option<usize>,
    /// The start of the period of the profile in flight.
    in_flight_start: Option<std::time::SystemTime>,
    next_sequence: u64,
    /// Dropped since the last profile that carries the count.
    dropped_unreported: u64,
    dropped_total: u64,
    sent: u64,
    /// Set by `finish`: send what is left until then, and stop.
    deadline: Option<Instant>,
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the uploader: a new profile, or `finish`.
    wake: tokio::sync::Notify,
    /// Wakes `finish`: the queue is empty or the uploader has stopped.
    settled: Condvar,
    bounds: QueueBounds,
    endpoint: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while the lock was held leaves the queue usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops the oldest queued profiles past the bounds (never the newest,
    /// and never the one in flight), and says so.
    fn enforce_bounds(&self, state: &mut State) {
        let mut dropped = 0;
        loop {
            // A period's profiles (one per service with `-p`/`--global`)
            // count as one: the bound is in periods waiting.
            let mut periods: Vec<std::time::SystemTime> = state
                .queue
                .iter()
                .map(|queued| queued.profile.start)
                .chain(state.in_flight_start)
                .collect();
            periods.sort_unstable();
            periods.dedup();
            let count = periods.len();
            let over = count > self.bounds.profiles || state.bytes > self.bounds.bytes;
            if !over || state.queue.len() <= 1 {
                break;
            }
            let Some(oldest) = state.queue.pop_front() else {
                break;
            };
            state.bytes -= oldest.bytes();
            // Its own count of earlier drops goes to the next one.
            state.dropped_unreported += 1 + oldest.dropped_before;
            dropped += 1;
        }
        if dropped > 0 {
            state.dropped_total += dropped;
            log::warn!(
                "{} is not taking profiles: dropped the {dropped} oldest waiting to go out \
                 (the queue holds the profiles of at most {} periods / {} MiB; {} dropped in all)",
                self.endpoint,
                self.bounds.profiles,
                self.bounds.bytes >> 20,
                state.dropped_total
            );
        }
    }
}

/// Totals of a run, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportTotals {
    pub sent: u64,
    pub dropped: u64,
    /// Still waiting when the grace period ended.
    pub unsent: u64,
}

/// The handle the profiler loop holds.
pub struct Exporter {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    exit_grace: Duration,
}

impl Exporter {
    /// Builds the HTTP client (a bad TLS set-up is said now, not at the
    /// first period) and starts the upload thread.
    pub fn start(context: RequestContext) -> Result<Self, ExportError> {
        let options = &context.options;
        let endpoint = options.endpoint.describe();
        let client = http_client(&options.endpoint, options.timeout).map_err(|error| {
            ExportError::Client {
                endpoint: endpoint.clone(),
                reason: error.to_string(),
            }
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ExportError::Thread)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: tokio::sync::Notify::new(),
            settled: Condvar::new(),
            bounds: options.queue,
            endpoint,
        });
        let exit_grace = options.exit_grace;
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ddprof-export".into())
            .spawn(move || {
                runtime.block_on(upload_loop(&for_thread, &client, &context));
                for_thread.lock().stopped = true;
                for_thread.settled.notify_all();
            })
            .map_err(ExportError::Thread)?;
        Ok(Self {
            shared,
            thread: Some(thread),
            exit_grace,
        })
    }

    /// Where profiles go, for log lines.
    pub fn endpoint(&self) -> &str {
        &self.shared.endpoint
    }

    /// Queues a profile (never waits for the network). Returns its
    /// sequence number (`profile_seq`).
    pub fn submit(&self, profile: PeriodProfile) -> u64 {
        let mut state = self.shared.lock();
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        state.bytes += profile.pprof_zstd.len();
        state.queue.push_back(Queued {
            profile,
            sequence,
            dropped_before: 0,
        });
        self.shared.enforce_bounds(&mut state);
        let dropped = std::mem::take(&mut state.dropped_unreported);
        if let Some(newest) = state.queue.back_mut() {
            newest.dropped_before = dropped;
        }
        drop(state);
        self.shared.wake.notify_one();
        sequence
    }

    /// Gives the profiles still waiting the grace period, then returns
    /// (the upload thread is left behind if the agent still holds it).
    pub fn finish(mut self) -> ExportTotals {
        let deadline = Instant::now() + self.exit_grace;
        let mut state = self.shared.lock();
        state.deadline = Some(deadline);
        self.shared.wake.notify_one();
        loop {
            let idle = state.queue.is_empty() && state.in_flight.is_none();
            let now = Instant::now();
            if idle || state.stopped || now >= deadline {
                break;
            }
            state = self
                .shared
                .settled
                .wait_timeout(state, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
        let unsent = (state.queue.len() + usize::from(state.in_flight.is_some())) as u64;
        let totals = ExportTotals {
            sent: state.sent,
            dropped: state.dropped_total,
            unsent,
        };
        let stopped = state.stopped;
        drop(state);
        if unsent > 0 {
            log::warn!(
                "{unsent} profile(s) not sent: {} did not take them within the {:.1} s grace \
                 period at exit (raise --upload-exit-grace to wait longer)",
                self.shared.endpoint,
                self.exit_grace.as_secs_f64()
            );
        }
        if stopped {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        totals
    }
}

/// reqwest with rustls on the ring provider; a Unix socket endpoint sends
/// every request through the socket.
fn http_client(endpoint: &Endpoint, timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    // Several providers may be compiled in (ring here; aws-lc in some test
    // builds): name the one to use. Fails only if one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .pool_max_idle_per_host(0);
    if let Endpoint::AgentSocket { path } = endpoint {
        builder = builder.unix_socket(path.clone());
    }
    builder.build()
}

/// What became of one attempt.
enum Outcome {
    Accepted(u16),
    /// Refused for good (a 4xx other than 408/429), with the response body.
    Rejected(u16, String),
    /// Worth another try.
    Failed(String),
}

async fn send(client: &reqwest::Client, url: &str, request: &request::Request) -> Outcome {
    let mut builder = client
        .post(url)
        .header("Content-Type", &request.content_type)
        .body(request.body.clone());
    for (name, value) in &request.headers {
        builder = builder.header(*name, value);
    }
    let response = match builder.send().await {
        Ok(response) => response,
        Err(error) => return Outcome::Failed(describe_error(&error)),
    };
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Outcome::Accepted(status);
    }
    let body = match response.text().await {
        Ok(text) => text.chars().take(512).collect::<String>(),
        Err(error) => format!("(unreadable body: {})", describe_error(&error)),
    };
    match status {
        408 | 429 | 500..=599 => Outcome::Failed(format!("HTTP {status}: {}", body.trim())),
        _ => Outcome::Rejected(status, body),
    }
}

/// reqwest's error with its causes (e.g. "connection refused").
fn describe_error(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "no answer within the upload timeout".to_string();
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// What the uploader does next.
enum Next {
    /// Send this profile (`deadline`: `finish` has been called).
    Send(Box<Queued>, Option<Instant>),
    /// Nothing queued: wait for a profile or `finish`.
    Wait,
    /// Done (everything sent at exit, or the grace period is over).
    Stop,
}

/// Takes the oldest profile for sending (it counts as in flight).
fn take_next(shared: &Shared) -> Next {
    let mut state = shared.lock();
    let deadline = state.deadline;
    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
        return Next::Stop;
    }
    match state.queue.pop_front() {
        Some(next) => {
            state.in_flight = Some(next.bytes());
            state.in_flight_start = Some(next.profile.start);
            Next::Send(Box::new(next), deadline)
        }
        None if deadline.is_some() => Next::Stop,
        None => Next::Wait,
    }
}

/// The uploader's memory of the current streak of failures.
struct Streak {
    backoff: Duration,
    /// Failed attempts in the current streak (0: the last one worked).
    failures: u64,
    /// The last profile was refused for good.
    rejected: bool,
}

/// Applies an attempt's outcome to the queue and says what happened.
/// Returns `true` when the profile went back to the queue (retry later).
fn settle(shared: &Shared, streak: &mut Streak, sent: Queued, outcome: Outcome) -> bool {
    let mut state = shared.lock();
    state.in_flight = None;
    state.in_flight_start = None;
    let retry = match outcome {
        Outcome::Accepted(status) => {
            state.bytes -= sent.bytes();
            state.sent += 1;
            if streak.failures > 0 {
                log::info!(
                    "{} takes profiles again (after {} failed attempts)",
                    shared.endpoint,
                    streak.failures
                );
            }
            *streak = Streak::new();
            log::info!(
                "profile #{} ({} to {}) sent to {}: {} bytes of pprof, HTTP {status}",
                sent.sequence,
                crate::timestamp::rfc3339_nanos(sent.profile.start),
                crate::timestamp::rfc3339_nanos(sent.profile.end),
                shared.endpoint,
                sent.profile.pprof_zstd.len()
            );
            false
        }
        Outcome::Rejected(status, body) => {
            state.bytes -= sent.bytes();
            let message = format!(
                "{} refused profile #{} with HTTP {status} (not sent again): {}",
                shared.endpoint,
                sent.sequence,
                body.trim()
            );
            // Once per streak: every profile would be refused the same way.
            if streak.rejected {
                log::debug!("{message}");
            } else {
                log::warn!("{message}");
            }
            streak.rejected = true;
            false
        }
        Outcome::Failed(reason) => {
            state.queue.push_front(sent);
            shared.enforce_bounds(&mut state);
            streak.failures += 1;
            if streak.failures == 1 {
                log::warn!(
                    "cannot upload profiles to {}: {reason}; retrying with backoff (up to \
                     {} profiles / {} MiB wait meanwhile)",
                    shared.endpoint,
                    shared.bounds.profiles,
                    shared.bounds.bytes >> 20
                );
            } else {
                log::debug!(
                    "upload attempt {} to {} failed: {reason}",
                    streak.failures,
                    shared.endpoint
                );
            }
            true
        }
    };
    if state.queue.is_empty() {
        shared.settled.notify_all();
    }
    retry
}

impl Streak {
    fn new() -> Self {
        Self {
            backoff: FIRST_BACKOFF,
            failures: 0,
            rejected: false,
        }
    }
}

async fn upload_loop(shared: &Shared, client: &reqwest::Client, context: &RequestContext) {
    let url = context.options.endpoint.url();
    let mut streak = Streak::new();
    loop {
        let (next, deadline) = match take_next(shared) {
            Next::Send(next, deadline) => (*next, deadline),
            Next::Wait => {
                shared.wake.notified().await;
                continue;
            }
            Next::Stop => return,
        };
        let request = request::build(context, &next.profile, next.sequence, next.dropped_before);
        let outcome = match deadline {
            // At exit an attempt gets what is left of the grace period.
            Some(deadline) => tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()),
                send(client, &url, &request),
            )
            .await
            .unwrap_or_else(|_| Outcome::Failed("the grace period at exit ended".into())),
            None => send(client, &url, &request).await,
        };
        if settle(shared, &mut streak, next, outcome) {
            let retry_at = Instant::now() + streak.backoff;
            streak.backoff = (streak.backoff * 2).min(MAX_BACKOFF);
            wait_before_retry(shared, retry_at).await;
        }
    }
}

/// Waits until `retry_at`. Once `finish` has been called the wait is
/// short (the grace period is short) and ends with it. New profiles
/// arriving meanwhile do not cut the backoff.
async fn wait_before_retry(shared: &Shared, retry_at: Instant) {
    loop {
        let deadline = shared.lock().deadline;
        let now = Instant::now();
        let until = match deadline {
            Some(deadline) => retry_at.min(deadline).min(now + FIRST_BACKOFF),
            None => retry_at,
        };
        if now >= until {
            return;
        }
        if deadline.is_some() {
            tokio::time::sleep(until - now).await;
            return;
        }
        let _ = tokio::time::timeout(until - now, shared.wake.notified()).await;
    }
}
