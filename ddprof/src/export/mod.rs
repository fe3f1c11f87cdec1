//! The export stage: each period's profile goes to the Datadog agent (HTTP
//! or a Unix socket) or straight to the intake (agentless), in the wire
//! format of Datadog's own exporter (libdatadog's `libdd-profiling`).
//!
//! Split by job:
//! - [`request`]: the request as pure functions of the profile and the
//!   settings (tags, event.json, multipart body, headers);
//! - [`endpoint`]: where requests go (agent URL, Unix socket, intake) and
//!   the API key, which never prints;
//! - [`entity`]: the target's container and cgroup, for the headers the
//!   agent uses to tag profiles with their container;
//! - [`uploader`]: a thread of its own with a tokio runtime and reqwest,
//!   fed through a bounded queue, with retries, backoff and the grace
//!   period at exit. The profiler loop only pushes into the queue: a slow
//!   or absent agent never delays the reading of the ring buffers.
//!
//! Nothing here sees the command line: `config::export_options` resolves
//! an [`ExportOptions`] once, at start.
pub mod endpoint;
pub mod entity;
pub mod request;
pub mod uploader;

use std::time::{Duration, SystemTime};

pub use endpoint::{ApiKey, Endpoint};
pub use uploader::Exporter;

/// Default bound of the queue of profiles waiting to go out, in profiles.
pub const DEFAULT_QUEUE_PROFILES: usize = 16;
/// Default bound of the queue of profiles waiting to go out, in MiB.
pub const DEFAULT_QUEUE_MIB: usize = 32;
/// Default time an upload may take before it counts as failed.
pub const DEFAULT_UPLOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time pending profiles get at exit.
pub const DEFAULT_EXIT_GRACE: Duration = Duration::from_secs(5);

/// A `key:value` tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    pub key: String,
    pub value: String,
}

impl Tag {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.key, self.value)
    }
}

/// How many profiles may wait to go out, and how many bytes they may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    pub profiles: usize,
    pub bytes: usize,
}

impl Default for QueueBounds {
    fn default() -> Self {
        Self {
            profiles: DEFAULT_QUEUE_PROFILES,
            bytes: DEFAULT_QUEUE_MIB << 20,
        }
    }
}

/// Everything the export stage needs, resolved and checked at start.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub endpoint: Endpoint,
    /// `service`, `env`, `version` and the user's tags (`-T`/`DD_TAGS`),
    /// in that order; the profiler's own tags are added per request.
    pub tags: Vec<Tag>,
    /// `runtime-id`: one per profiled run.
    pub runtime_id: String,
    /// event.json `process_tags` (e.g. the command's name).
    pub process_tags: Vec<Tag>,
    pub timeout: Duration,
    pub queue: QueueBounds,
    pub exit_grace: Duration,
    /// `--include-kernel`, said in every profile's `include_kernel` tag.
    pub include_kernel: bool,
    /// `DD_EXTERNAL_ENV`, sent as `Datadog-External-Env`.
    pub external_env: Option<String>,
}

/// The profiler's own figures for a period (event.json `internal`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodFigures {
    pub samples: u64,
    pub lost: u64,
    pub truncated: u64,
    pub profiler_cpu_nanos: u64,
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
}

/// One period's profile, handed by the profiler loop to the exporter.
#[derive(Debug, Clone)]
pub struct PeriodProfile {
    pub start: SystemTime,
    pub end: SystemTime,
    /// The pprof protobuf, zstd-compressed.
    pub pprof_zstd: Vec<u8>,
    /// `code-provenance.json` (uncompressed), when known.
    pub code_provenance_json: Option<Vec<u8>>,
    /// The service whose processes' samples it holds, when not the run's
    /// (`-p`, `--global`): its tags replace the run's `service`, `env` and
    /// `version`.
    pub service: Option<crate::identity::ServiceIdentity>,
    pub figures: PeriodFigures,
}
