//! Command line and environment configuration.
//!
//! Every option reads a Datadog environment variable as its default and is
//! overridden by the flag; `--config FILE` (TOML, the same keys as the long
//! flag names) sits between the two: flag > environment > file > default.
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
//! Values are strings, numbers or booleans and are checked like flags (the
//! error names the option and what it expects); unknown keys are rejected.
//! `config`, `command`, `help` and `version` cannot be set from a file.
use std::path::PathBuf;
use std::time::Duration;

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};

/// Default sampling frequency of `sCPU` in Hz (what Datadog's ddprof uses).
pub const DEFAULT_CPU_FREQUENCY: u64 = 99;
/// Default size of the user stack copied per sample by the perf engine.
pub const DEFAULT_STACK_SAMPLE_SIZE: u32 = 32000;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "ddprof",
    version,
    // `-V` is the service version (as in Datadog's profilers): `--version` stays long-only.
    disable_version_flag = true,
    about = "A native CPU profiler for Linux",
    long_about = "Runs COMMAND as if ddprof were not there (same PID, same exit status) and profiles it and its children. \
                  Also attaches to a running process (-p) or the whole machine (-g).",
    after_help = "Examples:\n  ddprof -- ./my-service --port 8080\n  ddprof --output /tmp/prof -e 'sCPU freq=999' -- make -j2\n  ddprof -p 1234\n  ddprof --global --upload-period 10"
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
    #[arg(short = 'T', long, env = "DD_TAGS")]
    pub tags: Option<String>,

    /// Full URL of the Datadog agent (overrides host and port)
    #[arg(short = 'U', long, env = "DD_TRACE_AGENT_URL")]
    pub url: Option<String>,

    /// Host of the Datadog agent
    #[arg(short = 'H', long, env = "DD_AGENT_HOST")]
    pub host: Option<String>,

    /// Port of the Datadog agent
    #[arg(short = 'P', long, env = "DD_TRACE_AGENT_PORT", value_parser = parse_port)]
    pub port: Option<u16>,

    /// Seconds between two profiles
    #[arg(short = 'u', long, env = "DD_PROFILING_UPLOAD_PERIOD", default_value_t = 59, value_parser = parse_upload_period)]
    pub upload_period: u64,

    /// Events to sample: `sCPU` (task-clock, 99 Hz), optionally `freq=HZ` or `period=NS`; several separated by `;`
    #[arg(
        short = 'e',
        long = "event",
        env = "DD_PROFILING_NATIVE_EVENTS",
        default_value = "sCPU",
        value_parser = parse_event_list
    )]
    pub events: String,

    /// Sampling engine: eBPF in-kernel unwinding, perf ring buffer with user-side unwinding, or the best available
    #[arg(long, env = "DD_PROFILING_ENGINE", value_enum, default_value_t = EngineChoice::Auto)]
    pub engine: EngineChoice,

    /// Write profiles here (default `./ddprof-out` when no agent is configured)
    #[arg(long = "output", env = "DD_PROFILING_OUTPUT_DIR")]
    pub output: Option<PathBuf>,

    /// Bytes of user stack copied per sample by the perf engine (multiple of 8, below 65536)
    #[arg(long, env = "DD_PROFILING_SAMPLE_STACK_USER", default_value_t = DEFAULT_STACK_SAMPLE_SIZE, value_parser = parse_stack_size)]
    pub stack_sample_size: u32,

    /// KiB of perf ring buffer per event and CPU (perf engine; rounded up to a power of two pages).
    /// Hidden: for tests that force sample loss, and for machines short of locked memory.
    #[arg(long, hide = true, env = "DD_PROFILING_RING_BUFFER_KIB", value_parser = clap::value_parser!(u32).range(4..=1048576))]
    pub ring_buffer_kib: Option<u32>,

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

    /// Keep sample timestamps for the timeline view
    #[arg(long, env = "DD_PROFILING_TIMELINE", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub timeline: bool,

    /// Print each sample on a line of the log
    #[arg(long, env = "DD_PROFILING_SHOW_SAMPLES", default_value_t = false)]
    pub show_samples: bool,

    /// Niceness of the profiler process
    #[arg(long, env = "DD_PROFILING_NICE", allow_negative_numbers = true, value_parser = parse_nice)]
    pub nice: Option<i32>,

    /// Remove CAP_SYS_ADMIN, CAP_PERFMON and CAP_BPF from the command before it starts
    #[arg(long, env = "DD_PROFILING_DROP_CAPABILITIES", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub drop_capabilities: bool,

    /// Run the command as this user
    #[arg(long, env = "DD_PROFILING_SWITCH_USER")]
    pub switch_user: Option<String>,

    /// Log level
    #[arg(short = 'l', long, env = "DD_PROFILING_LOG_LEVEL", value_enum, default_value_t = LogLevel::Warn)]
    pub log_level: LogLevel,

    /// Where logs go
    #[arg(long, env = "DD_PROFILING_LOG_MODE", value_enum, default_value_t = LogMode::Stderr)]
    pub log_mode: LogMode,

    /// Print the resolved configuration and exit
    #[arg(long, default_value_t = false)]
    pub show_config: bool,

    /// Read options from this TOML file (keys are the long option names)
    #[arg(long, env = "DD_PROFILING_CONFIG")]
    pub config: Option<PathBuf>,

    /// Print the version and exit
    #[arg(long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,

    /// The command to run and profile
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    Auto,
    Bpf,
    Perf,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Notice,
    Info,
    Debug,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    Stdout,
    Stderr,
    Syslog,
    Disabled,
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

fn parse_upload_period(value: &str) -> Result<u64, String> {
    parse_number_in(value, 1, 3600, "a number of seconds")
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

/// Checks `-e` when the command line is read; the value stays text.
fn parse_event_list(value: &str) -> Result<String, String> {
    parse_events(value)
        .map(|_| value.to_string())
        .map_err(|error| error.to_string())
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

/// How often an event samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleRate {
    /// Samples per second (the kernel adjusts the period).
    Frequency(u64),
    /// One sample every N units of the event (nanoseconds for CPU time).
    Period(u64),
}

/// The kinds of event ddprof samples on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// `sCPU`: CPU time of the profiled tasks (the task-clock software event).
    CpuTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSpec {
    pub kind: EventKind,
    pub rate: SampleRate,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventSpecError {
    #[error("unknown event `{0}` (expected sCPU)")]
    UnknownEvent(String),
    #[error("malformed event option `{0}` (expected freq=HZ or period=N)")]
    BadOption(String),
    #[error("no event given (expected e.g. `sCPU` or `sCPU freq=999`)")]
    Empty,
}

/// Parses `-e` values: `sCPU`, `sCPU freq=999`, `sCPU period=1000000`,
/// several separated by `;`.
pub fn parse_events(text: &str) -> Result<Vec<EventSpec>, EventSpecError> {
    let mut specs = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let mut words = part.split_whitespace();
        let name = words.next().ok_or(EventSpecError::Empty)?;
        let kind = match name {
            "sCPU" => EventKind::CpuTime,
            other => return Err(EventSpecError::UnknownEvent(other.to_string())),
        };
        let mut rate = SampleRate::Frequency(DEFAULT_CPU_FREQUENCY);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| EventSpecError::BadOption(word.to_string()))?;
            let number: u64 = value
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| EventSpecError::BadOption(word.to_string()))?;
            rate = match key {
                "freq" | "f" => SampleRate::Frequency(number),
                "period" | "p" => SampleRate::Period(number),
                _ => return Err(EventSpecError::BadOption(word.to_string())),
            };
        }
        specs.push(EventSpec { kind, rate });
    }
    if specs.is_empty() {
        return Err(EventSpecError::Empty);
    }
    Ok(specs)
}

impl Cli {
    pub fn upload_period(&self) -> Duration {
        Duration::from_secs(self.upload_period)
    }

    /// The agent to upload to, if one is configured by flag or environment.
    pub fn agent_url(&self) -> Option<String> {
        if let Some(url) = &self.url {
            return Some(url.clone());
        }
        if self.host.is_none() && self.port.is_none() {
            return None;
        }
        let host = self.host.as_deref().unwrap_or("localhost");
        let port = self.port.unwrap_or(8126);
        Some(format!("http://{host}:{port}"))
    }

    /// Where local outputs go: `--output`, else `./ddprof-out` when no agent
    /// is configured, else nowhere.
    pub fn output_dir(&self) -> Option<PathBuf> {
        match (&self.output, self.agent_url()) {
            (Some(dir), _) => Some(dir.clone()),
            (None, None) => Some(PathBuf::from("ddprof-out")),
            (None, Some(_)) => None,
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

/// Why the configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A bad command line or environment variable (also `--help`, which clap
    /// reports as an "error" that prints the help and exits 0).
    #[error(transparent)]
    Args(#[from] clap::Error),
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
}

/// Options that make no sense in a config file.
const NOT_IN_FILE: &[&str] = &["config", "help", "version", "command"];

impl Cli {
    /// Reads the command line, the environment and `--config FILE`, with the
    /// precedence flag > environment > file > default.
    pub fn load() -> Result<Cli, ConfigError> {
        Self::load_from(std::env::args_os())
    }

    /// [`Cli::load`] with explicit arguments (the first is the program name).
    ///
    /// The file is applied by re-reading the command line with the file's
    /// settings inserted as `--name=value` flags in front of it, for every
    /// option whose value so far only came from its default: clap then checks
    /// file values exactly like flags, and flags and environment variables
    /// keep their precedence.
    pub fn load_from<I, T>(args: I) -> Result<Cli, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let command = Cli::command();
        let matches = command.clone().try_get_matches_from(&args)?;
        let cli = Cli::from_arg_matches(&matches)?;
        let Some(path) = cli.config.clone() else {
            return Ok(cli);
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        let file_error = |message: String| ConfigError::File {
            path: path.clone(),
            message,
        };
        let table: toml::Table = text
            .parse()
            .map_err(|error: toml::de::Error| file_error(error.message().to_string()))?;
        let mut file_flags: Vec<OsString> = Vec::new();
        for (key, value) in &table {
            let long = key.replace('_', "-");
            let arg = command
                .get_arguments()
                .find(|arg| arg.get_long() == Some(long.as_str()))
                .filter(|arg| !NOT_IN_FILE.contains(&arg.get_id().as_str()))
                .ok_or_else(|| {
                    file_error(format!(
                        "unknown key `{key}` (expected a long option name such as `upload_period`)"
                    ))
                })?;
            let set_elsewhere = matches!(
                matches.value_source(arg.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            if set_elsewhere {
                continue;
            }
            let text = match value {
                toml::Value::String(text) => text.clone(),
                toml::Value::Integer(number) => number.to_string(),
                toml::Value::Float(number) => number.to_string(),
                toml::Value::Boolean(flag) => flag.to_string(),
                other => {
                    return Err(file_error(format!(
                        "`{key}` must be a string, a number or a boolean, not a {}",
                        other.type_str()
                    )))
                }
            };
            if matches!(arg.get_action(), ArgAction::SetTrue) {
                match value.as_bool() {
                    Some(true) => file_flags.push(format!("--{long}").into()),
                    Some(false) => {}
                    None => {
                        return Err(file_error(format!(
                            "invalid value '{text}' for `{key}`: expected true or false"
                        )))
                    }
                }
                continue;
            }
            // A file value equal to the default changes nothing, and must not
            // make clap see e.g. `global = false` as conflicting with `-p`.
            let is_default = arg
                .get_default_values()
                .iter()
                .any(|default| default.to_str() == Some(text.as_str()));
            if !is_default {
                file_flags.push(format!("--{long}={text}").into());
            }
        }
        if file_flags.is_empty() {
            return Ok(cli);
        }
        let mut merged = Vec::with_capacity(args.len() + file_flags.len());
        merged.extend(args.first().cloned());
        merged.extend(file_flags);
        merged.extend(args.iter().skip(1).cloned());
        let matches = command.try_get_matches_from(merged).map_err(|error| {
            let rendered = error.render().to_string();
            let first_line = rendered.lines().next().unwrap_or_default();
            file_error(
                first_line
                    .strip_prefix("error: ")
                    .unwrap_or(first_line)
                    .to_string(),
            )
        })?;
        Ok(Cli::from_arg_matches(&matches)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_config(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("ddprof-config-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn config_file_sits_between_flags_and_defaults() {
        let path = write_config(
            "precedence",
            "service = \"from-file\"\nupload_period = 10\ninlined_functions = true\nshow-samples = true\n",
        );
        let cli =
            Cli::load_from(["ddprof", "--config", path.to_str().unwrap(), "--", "true"]).unwrap();
        assert_eq!(cli.service.as_deref(), Some("from-file"));
        assert_eq!(cli.upload_period, 10);
        assert!(cli.inlined_functions);
        assert!(cli.show_samples);
        assert_eq!(cli.command, vec!["true".to_string()]);

        let cli = Cli::load_from([
            "ddprof",
            "--config",
            path.to_str().unwrap(),
            "-u",
            "20",
            "--service=flag",
            "true",
        ])
        .unwrap();
        assert_eq!(cli.upload_period, 20);
        assert_eq!(cli.service.as_deref(), Some("flag"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn config_file_errors_name_the_option() {
        let path = write_config("bad-value", "upload_period = 0\n");
        let error = Cli::load_from(["ddprof", "--config", path.to_str().unwrap(), "true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--upload-period"), "{error}");
        assert!(
            error.contains("expected a number of seconds from 1 to 3600"),
            "{error}"
        );

        std::fs::write(&path, "no_such_option = 1\n").unwrap();
        let error = Cli::load_from(["ddprof", "--config", path.to_str().unwrap(), "true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown key `no_such_option`"), "{error}");

        std::fs::write(&path, "tags = [1, 2]\n").unwrap();
        let error = Cli::load_from(["ddprof", "--config", path.to_str().unwrap(), "true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("`tags` must be a string"), "{error}");

        std::fs::write(&path, "service = \n").unwrap();
        let error = Cli::load_from(["ddprof", "--config", path.to_str().unwrap(), "true"])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("config file"), "{error}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn flag_errors_say_what_was_expected() {
        let error = Cli::load_from(["ddprof", "--nice", "40", "true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--nice"), "{error}");
        assert!(
            error.contains("expected a niceness from -20 to 19"),
            "{error}"
        );
        let error = Cli::load_from(["ddprof", "-e", "sFOO", "true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--event"), "{error}");
    }

    #[test]
    fn parses_event_specs() {
        assert_eq!(
            parse_events("sCPU").unwrap(),
            vec![EventSpec {
                kind: EventKind::CpuTime,
                rate: SampleRate::Frequency(99)
            }]
        );
        assert_eq!(
            parse_events("sCPU freq=999").unwrap()[0].rate,
            SampleRate::Frequency(999)
        );
        assert_eq!(
            parse_events(" sCPU period=1000000 ;").unwrap()[0].rate,
            SampleRate::Period(1_000_000)
        );
        assert_eq!(
            parse_events("sFOO"),
            Err(EventSpecError::UnknownEvent("sFOO".into()))
        );
        assert_eq!(
            parse_events("sCPU freq=0"),
            Err(EventSpecError::BadOption("freq=0".into()))
        );
        assert_eq!(
            parse_events("sCPU hz"),
            Err(EventSpecError::BadOption("hz".into()))
        );
        assert_eq!(parse_events(" ; "), Err(EventSpecError::Empty));
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
