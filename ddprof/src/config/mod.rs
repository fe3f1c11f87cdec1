//! Command line, config file and environment configuration.
//!
//! Every option can be set three ways, in this order of precedence:
//! the flag on the command line, then the `--config FILE` (TOML), then its
//! Datadog environment variable, then the default ([`sources`] does the
//! layering and remembers where each setting came from).
//!
//! A config file uses the long option names as keys, with `_` or `-`:
//!
//! ```toml
//! service = "checkout"
//! upload_period = 10
//! event = "sCPU freq=999"
//! inlined_functions = true
//! ```
//!
//! Values are strings, numbers or booleans and are checked like flags;
//! unknown keys are refused. `config`, `command`, `show_config`, `print_config`, `check`, `help` and
//! `version` cannot be set from a file.
pub mod cpp;
mod export;
mod resolve;
pub mod sources;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

pub use export::{export_options, ExportConfigError};
pub use resolve::{resolve, resolve_with, ResolveError, Resolved};
pub use sources::{Config, ConfigProblem, Origin};

use crate::bpf::EngineChoice;
use crate::logging::{LogLevel, LogMode};

use crate::events::{check_frequencies, parse_events};

/// Default size of the user stack copied per sample by the perf engine.
pub const DEFAULT_STACK_SAMPLE_SIZE: u32 = 32000;

#[derive(Parser, Serialize, Debug, Clone)]
#[command(
    name = "ddprof",
    version,
    // `-V` is the service version (as in Datadog's profilers): `--version` stays long-only.
    disable_version_flag = true,
    about = "A native CPU profiler for Linux",
    long_about = "Runs COMMAND as if ddprof were not there (same PID, same exit status) and profiles it and its children. \
                  Also attaches to a running process (-p) or the whole machine (-g).",
    after_help = "Examples:\n  ddprof -- ./my-service --port 8080\n  ddprof --output /tmp/prof -e 'sCPU freq=999' -- make -j2\n  ddprof -p 1234\n  ddprof --global --upload-period 10",
    after_long_help = "Examples:\n  ddprof -- ./my-service --port 8080\n  ddprof --output /tmp/prof -e 'sCPU freq=999' -- make -j2\n  ddprof -p 1234\n  ddprof --global --upload-period 10\n\n\
                       Datadog's C++ ddprof spellings are accepted too: every long option with `_` for `-` \
                       (`--worker_period`, `--switch_user`), `-v` for `--version`, `informational` for the `info` log level, \
                       `-o` for `--log-mode`, `--preset`, and its variables DD_PROFILING_NATIVE_LOG_LEVEL and \
                       DD_PROFILING_NATIVE_LOG_MODE when ours are not set."
)]
pub struct Cli {
    /// Service name reported with profiles
    #[arg(short = 'S', long, env = "DD_SERVICE")]
    pub service: Option<String>,

    /// Environment name reported with profiles
    #[arg(short = 'E', long, env = "DD_ENV")]
    pub environment: Option<String>,

    /// Version of the service reported with profiles
    #[arg(short = 'V', long, env = "DD_VERSION")]
    pub service_version: Option<String>,

    /// Extra tags, `key:value` separated by commas
    #[arg(short = 'T', long, env = "DD_TAGS", value_parser = parse_tags)]
    pub tags: Option<String>,

    /// Full URL of the Datadog agent (overrides host and port): `http://HOST:PORT`, `https://HOST[:PORT]`, `unix:///PATH` or `/PATH` (a Unix socket)
    #[arg(short = 'U', long, env = "DD_TRACE_AGENT_URL", value_parser = parse_agent_url)]
    pub url: Option<String>,

    /// Host of the Datadog agent
    #[arg(short = 'H', long, env = "DD_AGENT_HOST")]
    pub host: Option<String>,

    /// Port of the Datadog agent
    #[arg(short = 'P', long, env = "DD_TRACE_AGENT_PORT", value_parser = parse_port)]
    pub port: Option<u16>,

    /// Upload straight to Datadog's intake, without an agent (needs DD_API_KEY)
    #[arg(long, env = "DD_PROFILING_AGENTLESS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub agentless: bool,

    /// Datadog site of agentless uploads (default datadoghq.com)
    #[arg(long, env = "DD_SITE")]
    pub site: Option<String>,

    /// Seconds an upload may take before it is retried
    #[arg(long, env = "DD_PROFILING_UPLOAD_TIMEOUT", default_value_t = 10, value_parser = parse_upload_timeout)]
    pub upload_timeout: u64,

    /// Periods of profiles kept while the agent cannot take them (past it the oldest are dropped; with -p or --global a period's profiles, one per service, count as one)
    #[arg(long, env = "DD_PROFILING_UPLOAD_QUEUE_PROFILES", default_value_t = 16, value_parser = parse_queue_profiles)]
    pub upload_queue_profiles: u32,

    /// MiB of profiles kept while the agent cannot take them (past it the oldest are dropped)
    #[arg(long, env = "DD_PROFILING_UPLOAD_QUEUE_MIB", default_value_t = 32, value_parser = parse_queue_mib)]
    pub upload_queue_mib: u32,

    /// Seconds the profiles still waiting get at exit before the profiler exits anyway
    #[arg(long, env = "DD_PROFILING_UPLOAD_EXIT_GRACE", default_value_t = 5, value_parser = parse_exit_grace)]
    pub upload_exit_grace: u64,

    /// Seconds between two profiles
    #[arg(short = 'u', long, env = "DD_PROFILING_UPLOAD_PERIOD", default_value_t = 59, value_parser = parse_upload_period)]
    pub upload_period: u64,

    /// Upload periods after which the worker process (unwinding, symbolization, aggregation) is replaced by a fresh one
    #[arg(long, env = "DD_PROFILING_WORKER_PERIOD", default_value_t = 240, value_parser = parse_worker_period)]
    pub worker_period: u32,

    /// MiB of RSS past which the worker process is replaced by a fresh one at the end of its period
    #[arg(long = "worker-max-rss", env = "DD_PROFILING_WORKER_MAX_RSS", default_value_t = 256, value_parser = parse_worker_max_rss)]
    pub worker_max_rss_mib: u32,

    /// Events to sample, separated by `;`, as the C++ ddprof takes them: `sCPU` (CPU time, 99 Hz), software events (`sPF` page faults, `sPFMAJ`, `sPFMIN`, `sCS` context switches, `sMig`, `sALGN`, `sEMU`), hardware counters (`hCPU`, `hREF`, `hINST`, `hCREF`, `hCMISS`, `hBRANCH`, `hBMISS`, `hBUS`, `hBSTF`, `hBSTB`) and kernel tracepoints (`group:name`, or `i=ID`), each with options `KEY=VALUE` separated by spaces or commas: `f`/`freq` (Hz, at most `kernel.perf_event_max_sample_rate`) or `p`/`period`, `l`/`label`, `s`/`scale`, `n`/`arg_num` or `r`/`register` (weigh by a register), `o`/`raw_offset` and `z`/`raw_size` (weigh a tracepoint by a field of its record), `st`/`stack_sample_size`. Default `sCPU`, or the preset's. Each event is its own sample type in the profile; one this machine cannot open is left out with a warning. `sALLOC` samples the wrapped command's allocations (`p=` mean bytes between samples, 512 KiB by default; `alloc-samples` and `alloc-space`); with `-p`/`--global` or a statically linked command it is left out with a warning
    #[arg(
        short = 'e',
        long = "event",
        env = "DD_PROFILING_NATIVE_EVENTS",
        value_parser = parse_event_list
    )]
    pub events: Option<String>,

    /// Events by name, as Datadog's C++ ddprof names them, when no `--event` is given: `cpu_only` (and `default` with `-p`) samples CPU time; `default` and `alloc_only` also sample allocations, `cpu_live_heap` and `alloc_live_heap` the live heap (`sALLOC mode=l`); `cpu_wall` CPU time and wall time (`sWALL`)
    #[arg(long, env = "DD_PROFILING_NATIVE_PRESET", value_enum)]
    pub preset: Option<crate::events::Preset>,

    /// Sampling engine: eBPF in-kernel unwinding, perf ring buffer with user-side unwinding, or the best available
    #[arg(long, env = "DD_PROFILING_ENGINE", value_enum, default_value_t = EngineChoice::Auto)]
    pub engine: EngineChoice,

    /// Write profiles here (default `./ddprof-out` when no agent is configured)
    #[arg(long = "output", env = "DD_PROFILING_OUTPUT_DIR")]
    pub output: Option<PathBuf>,

    /// Bytes of user stack copied per sample by the perf engine (multiple of 8, below 65536)
    #[arg(long, env = "DD_PROFILING_SAMPLE_STACK_USER", default_value_t = DEFAULT_STACK_SAMPLE_SIZE, value_parser = parse_stack_size)]
    pub stack_sample_size: u32,

    /// KiB of ring buffer per event and CPU (perf engine) or in all (BPF engine), rounded up to a
    /// power of two pages; default from the sampling rate. Raise it when samples are lost with a
    /// full ring buffer
    #[arg(long, env = "DD_PROFILING_RING_BUFFER_KIB", value_parser = clap::value_parser!(u32).range(4..=1048576))]
    pub ring_buffer_kib: Option<u32>,

    /// MiB of kernel memory the BPF engine may spend on unwind tables, taken per file as
    /// programs and libraries are first sampled (about 12 MiB per million rows: libc 0.1 MiB,
    /// libLLVM 10-16 MiB). A file whose table does not fit is unwound in userspace, with a warning
    #[arg(long, env = "DD_PROFILING_BPF_TABLE_MIB", default_value_t = (crate::bpf::DEFAULT_MAX_TABLE_BYTES >> 20) as u32, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub bpf_table_mib: u32,

    /// Profile a running process and its future children
    #[arg(short = 'p', long, env = "DD_PROFILING_PID", conflicts_with = "global", value_parser = parse_pid)]
    pub pid: Option<i32>,

    /// Profile every process of the machine (root or CAP_PERFMON)
    #[arg(short = 'g', long, env = "DD_PROFILING_GLOBAL", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub global: bool,

    /// Whether to profile at all; `false` makes ddprof a pure pass-through
    #[arg(long = "enable", env = "DD_PROFILING_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,

    /// Report inlined functions as their own frames
    #[arg(short = 'I', long, env = "DD_PROFILING_INLINED_FUNCTIONS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub inlined_functions: bool,

    /// Keep ddprof's caches here (decompressed copies of compressed split debug files; in `unwind/` the unwind tables compiled from, and in `symbols/` the names resolved in, files with a build id), so that later runs need not build them again; `none` keeps none (default `$XDG_CACHE_HOME/ddprof`, else `~/.cache/ddprof`)
    #[arg(long, env = "DD_PROFILING_DEBUG_CACHE")]
    pub debug_cache: Option<PathBuf>,

    /// Also report the kernel frames of samples taken in the kernel, named from kallsyms (default: off for a COMMAND or -p, on with --global)
    #[arg(long, env = "DD_PROFILING_INCLUDE_KERNEL", action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub include_kernel: Option<bool>,

    /// Keep sample timestamps for the timeline view
    #[arg(long, env = "DD_PROFILING_TIMELINE", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub timeline: bool,

    /// Print each sample on a line of the log
    #[arg(long, env = "DD_PROFILING_SHOW_SAMPLES", default_value_t = false)]
    pub show_samples: bool,

    /// Also send each period's figures as DogStatsD gauges to this socket: `unix:///PATH`, `/PATH` (Unix datagram), `udp://HOST:PORT` or `HOST:PORT`. The C++ ddprof's gauges keep its names (`datadog.profiling.native.sample.count`, `.event.lost`, `.unwind.*`, `.profiler.rss`, `.profiler.cpu_usage.millicores`, ...); the losses by cause, throttles and the CPU share are `datadog.profiling.ddprof.*`
    #[arg(short = 'b', long, env = "DD_PROFILING_INTERNAL_STATS", value_parser = parse_internal_stats)]
    pub internal_stats: Option<String>,

    /// Niceness of the profiler process
    #[arg(long, env = "DD_PROFILING_NICE", allow_negative_numbers = true, value_parser = parse_nice)]
    pub nice: Option<i32>,

    /// Remove CAP_SYS_ADMIN, CAP_PERFMON and CAP_BPF from the command before it starts
    #[arg(long, env = "DD_PROFILING_DROP_CAPABILITIES", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub drop_capabilities: bool,

    /// Profile even where the kernel refuses the profiler its seccomp filters (the parent's, which keeps it from signalling or tracing other processes, and the worker's allow-list, which keeps what parses the profiled programs' files from writing, running programs or opening sockets); without this the profiler stops there (the command runs on)
    #[arg(long, env = "DD_PROFILING_NO_SANDBOX", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub no_sandbox: bool,

    /// Run the command as a child and stay as its init: signals sent to ddprof go to the command, orphans are reaped, and ddprof exits with the command's status once the profiler has written its last period. For a container's entry point (PID 1), where the command's exit would otherwise end the profiler before its last period
    #[arg(long, env = "DD_PROFILING_INIT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub init: bool,

    /// Run the command as this user (name or UID); if there is no such user the command does not run
    #[arg(long, env = "DD_PROFILING_SWITCH_USER", value_parser = parse_user)]
    pub switch_user: Option<String>,

    /// Log level
    #[arg(short = 'l', long, env = "DD_PROFILING_LOG_LEVEL", value_enum, default_value_t = LogLevel::Warn)]
    pub log_level: LogLevel,

    /// Where logs go: stdout, stderr, syslog, disabled, or a file (a path with a `/` or a `.`) they are appended to; a link, a FIFO or another user's file is refused (logs go to stderr, said once)
    #[arg(short = 'o', long, env = "DD_PROFILING_LOG_MODE", value_parser = LogMode::parse, default_value = "stderr")]
    pub log_mode: LogMode,

    /// Print the resolved settings as TOML, each with where it came from, then profile as asked, as the C++ ddprof does (to stderr: stdout is the command's); with nothing to profile (no command, `-p` or `--global`), print them and exit as `--print-config`
    #[arg(long, default_value_t = false)]
    #[serde(skip)]
    pub show_config: bool,

    /// Print the resolved settings as TOML (to stdout), each with where it came from, and exit without running anything
    #[arg(long, default_value_t = false)]
    #[serde(skip)]
    pub print_config: bool,

    /// Print what this machine allows (kernel, BTF, perf_event_paranoid, capabilities, perf_event_open, each BPF program variant) and which engine `auto` picks, one line each, and exit (non-zero when profiling is impossible)
    #[arg(long, default_value_t = false)]
    #[serde(skip)]
    pub check: bool,

    /// Read options from this TOML file (keys are the long option names, e.g. `upload_period = 10`); flags override it, and it overrides the environment. Without it, `./ddprof.toml` is read when present and safe: a regular file (no link) of root or of this user that nobody else may write
    #[arg(long, env = "DD_PROFILING_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Print the version and exit
    #[arg(long, action = clap::ArgAction::Version)]
    #[serde(skip)]
    pub version: Option<bool>,

    /// The command to run and profile, with its arguments (options after it, or after `--`, are its own)
    // No `allow_hyphen_values`: an unknown option before the command is an
    // error, not the command; once the command has started, everything
    // after it is its arguments.
    #[arg(trailing_var_arg = true, value_name = "COMMAND")]
    #[serde(skip)]
    pub command: Vec<String>,
}

/// `$XDG_CACHE_HOME/ddprof`, else `$HOME/.cache/ddprof`, when that
/// directory (or the first of its ancestors that exists) belongs to
/// ddprof's user; else `.cache/ddprof` in the user's home directory from
/// the password database.
fn default_cache_dir(environment: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let user = nix::unistd::geteuid();
    let owned_by_user = |dir: &std::path::Path| {
        dir.ancestors()
            .find_map(|ancestor| std::fs::metadata(ancestor).ok())
            .is_some_and(|metadata| metadata.uid() == user.as_raw())
    };
    let from_environment = |name: &str| {
        environment(name)
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute())
    };
    let candidates = [
        from_environment("XDG_CACHE_HOME"),
        from_environment("HOME").map(|home| home.join(".cache")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|cache| owned_by_user(cache))
        .or_else(|| {
            let home = nix::unistd::User::from_uid(user).ok()??.dir;
            (home.is_absolute() && owned_by_user(&home)).then(|| home.join(".cache"))
        })
        .map(|cache| cache.join("ddprof"))
}

/// Parses a number within `min..=max`; the error says what was expected.
fn parse_number_in<T>(value: &str, min: T, max: T, what: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match value.trim().parse::<T>() {
        Ok(number) if number >= min && number <= max => Ok(number),
        _ => Err(format!("expected {what} from {min} to {max}")),
    }
}

fn parse_internal_stats(value: &str) -> Result<String, String> {
    value
        .parse::<crate::statsd::StatsdAddress>()
        .map(|_| value.to_string())
}

fn parse_upload_period(value: &str) -> Result<u64, String> {
    parse_number_in(value, 1, 3600, "a number of seconds")
}

fn parse_worker_period(value: &str) -> Result<u32, String> {
    parse_number_in(value, 1, 1_000_000, "a number of upload periods")
}

fn parse_worker_max_rss(value: &str) -> Result<u32, String> {
    parse_number_in(value, 4, 1 << 20, "a number of MiB")
}

fn parse_upload_timeout(value: &str) -> Result<u64, String> {
    parse_number_in(value, 1, 600, "a number of seconds")
}

fn parse_exit_grace(value: &str) -> Result<u64, String> {
    parse_number_in(value, 0, 600, "a number of seconds")
}

fn parse_queue_profiles(value: &str) -> Result<u32, String> {
    parse_number_in(value, 1, 1024, "a number of profiles")
}

fn parse_queue_mib(value: &str) -> Result<u32, String> {
    parse_number_in(value, 1, 4096, "a number of MiB")
}

fn parse_port(value: &str) -> Result<u16, String> {
    parse_number_in(value, 1, u16::MAX, "a TCP port")
}

fn parse_pid(value: &str) -> Result<i32, String> {
    parse_number_in(value, 1, i32::MAX, "a process ID")
}

fn parse_nice(value: &str) -> Result<i32, String> {
    parse_number_in(value, -20, 19, "a niceness")
}

/// Checks `-e` when the configuration is read (syntax, and frequencies
/// against this machine's limit); the value stays text.
fn parse_event_list(value: &str) -> Result<String, String> {
    let specs = match parse_events(value) {
        Ok(specs) => specs,
        // Known events, none sampled yet: said when the settings are
        // resolved, and the command runs unprofiled.
        Err(crate::events::EventSpecError::NoneAvailable(_)) => Vec::new(),
        Err(error) => return Err(error.to_string()),
    };
    if let Some(max) = crate::events::max_sample_rate() {
        check_frequencies(&specs, max).map_err(|error| error.to_string())?;
    }
    Ok(value.to_string())
}

/// `--switch-user`: the user must exist (it is looked up again just before
/// the switch).
fn parse_user(value: &str) -> Result<String, String> {
    crate::user::resolve(value)
        .map(|_| value.to_string())
        .map_err(|error| error.to_string())
}

/// `-T`: `key:value` tags separated by commas (a value may contain `:`).
fn parse_tags(value: &str) -> Result<String, String> {
    for tag in value.split(',').map(str::trim) {
        let well_formed = tag
            .split_once(':')
            .is_some_and(|(key, value)| !key.trim().is_empty() && !value.trim().is_empty());
        if !well_formed {
            return Err(format!(
                "`{tag}` is not a key:value tag (expected key:value pairs separated by commas, \
                 e.g. team:core,region:eu)"
            ));
        }
    }
    Ok(value.to_string())
}

/// `-U`: `http://HOST[:PORT][/…]`, `https://…`, `unix:///PATH` or a bare
/// absolute `/PATH` (a Unix socket).
fn parse_agent_url(value: &str) -> Result<String, String> {
    let refused = || {
        format!(
            "`{value}` is not an agent URL (expected http://HOST:PORT, https://HOST[:PORT], \
             unix:///PATH or an absolute /PATH to a Unix socket)"
        )
    };
    let is_socket_path = |path: &str| path.len() > 1 && path.starts_with('/');
    if let Some(path) = value.strip_prefix("unix://") {
        return if is_socket_path(path) {
            Ok(value.to_string())
        } else {
            Err(refused())
        };
    }
    if value.starts_with('/') {
        return if is_socket_path(value) {
            Ok(value.to_string())
        } else {
            Err(refused())
        };
    }
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"))
        .ok_or_else(refused)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // `[::1]:8126` (IPv6) or `host:8126`.
    let (host_ok, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (address, after) = bracketed.split_once(']').ok_or_else(refused)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(refused)?),
            };
            (address.parse::<std::net::Ipv6Addr>().is_ok(), port)
        }
        None => {
            let (host, port) = match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let host_ok = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
            (host_ok, port)
        }
    };
    let port_ok = port.is_none_or(|port| port.parse::<u16>().is_ok_and(|port| port > 0));
    if host_ok && port_ok {
        Ok(value.to_string())
    } else {
        Err(refused())
    }
}

fn parse_stack_size(value: &str) -> Result<u32, String> {
    let size: u32 = value
        .parse()
        .map_err(|_| format!("`{value}` is not a number of bytes"))?;
    if size == 0 || !size.is_multiple_of(8) || size >= 65536 {
        return Err(format!(
            "{size} must be a non-zero multiple of 8 below 65536"
        ));
    }
    Ok(size)
}

impl Cli {
    pub fn upload_period(&self) -> Duration {
        Duration::from_secs(self.upload_period)
    }

    /// The agent to upload to, if one is configured (a bare `/PATH` is
    /// written as `unix:///PATH`).
    pub fn agent_url(&self) -> Option<String> {
        if let Some(url) = &self.url {
            return Some(match url.starts_with('/') {
                true => format!("unix://{url}"),
                false => url.clone(),
            });
        }
        if self.host.is_none() && self.port.is_none() {
            return None;
        }
        let host = self.host.as_deref().unwrap_or("localhost");
        let port = self.port.unwrap_or(8126);
        Some(format!("http://{host}:{port}"))
    }

    /// Where local outputs go: `--output`, else `./ddprof-out` when no agent
    /// (nor `--agentless`) is configured, else nowhere.
    pub fn output_dir(&self) -> Option<PathBuf> {
        match (&self.output, self.agent_url()) {
            (Some(dir), _) => Some(dir.clone()),
            (None, None) if !self.agentless => Some(PathBuf::from("ddprof-out")),
            (None, _) => None,
        }
    }

    /// Where decompressed debug files and compiled unwind tables are kept:
    /// `--debug-cache`, `none` for nowhere, else the user's cache directory
    /// (nowhere without one). The user is ddprof's own: an inherited
    /// `XDG_CACHE_HOME` or `HOME` that belongs to someone else (`sudo`
    /// keeps the caller's) is not used; the home directory of ddprof's user
    /// is, as the password database gives it.
    pub fn debug_cache_dir(&self) -> Option<PathBuf> {
        match &self.debug_cache {
            Some(dir) if dir.as_os_str() == "none" || dir.as_os_str().is_empty() => None,
            Some(dir) => Some(dir.clone()),
            None => default_cache_dir(&|name| std::env::var_os(name)),
        }
    }

    pub fn service_name(&self) -> String {
        if let Some(service) = &self.service {
            return service.clone();
        }
        self.command
            .first()
            .and_then(|c| std::path::Path::new(c).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ddprof".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An inherited `XDG_CACHE_HOME` or `HOME` of another user (`sudo -E`,
    /// a service manager's environment) is not ddprof's cache: as root,
    /// directories that `nobody` owns are passed over for ddprof's own.
    #[test]
    fn another_users_cache_home_is_not_followed() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test gives nobody a directory: run it as root (cargo xtask test does)"
        );
        let base = std::env::temp_dir().join(format!("ddprof-cache-home-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (theirs, own) = (base.join("nobody"), base.join("root"));
        for dir in [&theirs, &own] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let from = |xdg: &std::path::Path, home: &std::path::Path| {
            default_cache_dir(&|name| match name {
                "XDG_CACHE_HOME" => Some(xdg.into()),
                "HOME" => Some(home.into()),
                _ => None,
            })
        };
        // Control: ddprof's own directories are taken as they come.
        assert_eq!(from(&own, &theirs), Some(own.join("ddprof")));
        assert_eq!(from(&theirs, &own), Some(own.join(".cache/ddprof")));
        // Nobody's, both: neither, whatever ddprof falls back to.
        let fallback = from(&theirs, &theirs).expect("root has a home directory");
        assert!(!fallback.starts_with(&theirs), "{fallback:?}");
        // Nor a directory of nobody's to be made inside.
        let planted = theirs.join("not-yet");
        let fallback = from(&planted, &planted).expect("root has a home directory");
        assert!(!fallback.starts_with(&theirs), "{fallback:?}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn tags_are_key_value_pairs() {
        assert!(parse_tags("team:core").is_ok());
        assert!(parse_tags("team:core, url:http://x:1").is_ok());
        for bad in ["notakeyvalue", "a:b,c", ":x", "k:", "a:b,,c:d"] {
            let error = parse_tags(bad).unwrap_err();
            assert!(error.contains("is not a key:value tag"), "{bad}: {error}");
        }
        assert!(parse_tags("a:b,oops").unwrap_err().starts_with("`oops`"));
    }

    #[test]
    fn agent_urls_are_http_https_or_unix_sockets() {
        for good in [
            "http://localhost:8126",
            "https://agent.example.com",
            "http://10.0.0.1:8126/",
            "http://[::1]:8126",
            "unix:///var/run/datadog/apm.socket",
            "/var/run/datadog/apm.socket",
        ] {
            assert_eq!(parse_agent_url(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "not a url",
            "localhost:8126",
            "http://",
            "http://host:port",
            "http://host:0",
            "http://host:70000",
            "ftp://host",
            "unix://relative",
            "/",
            "http://[nope]:1",
        ] {
            let error = parse_agent_url(bad).unwrap_err();
            assert!(
                error.starts_with(&format!("`{bad}` is not an agent URL")),
                "{error}"
            );
        }
    }

    #[test]
    fn a_bare_socket_path_is_a_unix_url() {
        let cli = Cli::parse_from(["ddprof", "-U", "/run/agent.sock", "true"]);
        assert_eq!(cli.agent_url().as_deref(), Some("unix:///run/agent.sock"));
    }

    #[test]
    fn rejects_bad_stack_sizes() {
        assert!(parse_stack_size("32000").is_ok());
        assert!(parse_stack_size("65536").is_err());
        assert!(parse_stack_size("31").is_err());
        assert!(parse_stack_size("x").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
