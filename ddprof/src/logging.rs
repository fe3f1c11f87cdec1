//! ddprof's logger: the `log` facade written to stderr, stdout, syslog or a
//! file (`--log-mode PATH`, as Datadog's C++ ddprof's `-o PATH`).
//!
//! Every line is prefixed `ddprof[PID]: ` with the PID of the process that
//! writes it, so the launcher's lines (which carry the command's PID) and the
//! profiler daemon's lines can be told apart. Each line is written with a
//! single `write(2)` so that lines of the two processes never interleave.
//!
//! `log` has no `notice` level: `--log-level notice` and `--log-level info`
//! both show `info!` lines; `--log-level debug` also shows `trace!` lines.
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

#[derive(clap::ValueEnum, serde::Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Notice,
    /// (`informational`: the C++ ddprof's name.)
    #[value(alias = "informational")]
    Info,
    Debug,
}

/// Where logs go: `stdout`, `stderr`, `syslog`, `disabled`, or a file they
/// are appended to (see [`LogMode::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogMode {
    Stdout,
    Stderr,
    Syslog,
    Disabled,
    File(PathBuf),
}

impl LogMode {
    /// `--log-mode`'s value: a mode's name, else a file path. The C++
    /// ddprof takes any other value for a path; here a path has a `/` or a
    /// `.` (`/var/log/ddprof.log`, `ddprof.log`), so that a misspelt mode
    /// (`stdrr`) is an error rather than a file created where ddprof runs.
    pub fn parse(value: &str) -> Result<LogMode, String> {
        Ok(match value {
            "stdout" => LogMode::Stdout,
            "stderr" => LogMode::Stderr,
            "syslog" => LogMode::Syslog,
            "disabled" => LogMode::Disabled,
            path if path.contains(['/', '.']) => LogMode::File(PathBuf::from(path)),
            _ => {
                return Err(
                    "expected stdout, stderr, syslog, disabled or a file path with a `/` \
                     or a `.` (`ddprof.log`)"
                        .into(),
                )
            }
        })
    }
}

impl std::fmt::Display for LogMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogMode::Stdout => f.write_str("stdout"),
            LogMode::Stderr => f.write_str("stderr"),
            LogMode::Syslog => f.write_str("syslog"),
            LogMode::Disabled => f.write_str("disabled"),
            LogMode::File(path) => write!(f, "{}", path.display()),
        }
    }
}

impl serde::Serialize for LogMode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Opens the log file for appending. ddprof often runs as root, and the
/// path may lie where another user can write (a working directory, `/tmp`):
/// a symbolic link there is not followed, a FIFO or device is not written
/// to (nor waited on: the open does not block), and a file that belongs to
/// another user is refused. A new file is `0600`.
pub fn open_log_file(path: &Path) -> Result<OwnedFd, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| match error.raw_os_error() {
            Some(libc::ELOOP) => "it is a symbolic link".to_string(),
            _ => error.to_string(),
        })?;
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if !metadata.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    let euid = nix::unistd::geteuid().as_raw();
    if metadata.uid() != euid {
        return Err(format!(
            "it belongs to uid {}, not to this user (uid {euid})",
            metadata.uid()
        ));
    }
    Ok(OwnedFd::from(file))
}

/// Where the logs go since [`init`] (stderr when a log file could not be
/// opened).
pub fn mode() -> Option<LogMode> {
    LOGGER.get().map(|logger| logger.mode.clone())
}

/// The log file's descriptor, once [`init`] opened one: a daemon that
/// closes what it inherited keeps it.
pub fn file_descriptor() -> Option<RawFd> {
    LOGGER.get()?.file.as_ref().map(AsRawFd::as_raw_fd)
}

/// The syslog identity: `openlog` keeps the pointer, so it must live forever.
const SYSLOG_IDENT: &std::ffi::CStr = c"ddprof";

struct Logger {
    mode: LogMode,
    /// The open log file in `LogMode::File` (stderr when it could not be
    /// opened).
    file: Option<OwnedFd>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

/// The `log` filter a `--log-level` stands for.
pub fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Error => LevelFilter::Error,
        LogLevel::Warn => LevelFilter::Warn,
        LogLevel::Notice | LogLevel::Info => LevelFilter::Info,
        LogLevel::Debug => LevelFilter::Trace,
    }
}

/// Installs the logger. Later calls only change the level (the first mode
/// stays). A log file that cannot be opened is said on stderr, where the
/// logs then go.
pub fn init(level: LogLevel, mode: &LogMode) {
    let logger = LOGGER.get_or_init(|| {
        if *mode == LogMode::Syslog {
            // SAFETY: the identity is a 'static C string; openlog keeps the pointer.
            unsafe { libc::openlog(SYSLOG_IDENT.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        }
        match mode {
            LogMode::File(path) => match open_log_file(path) {
                Ok(file) => Logger {
                    mode: mode.clone(),
                    file: Some(file),
                },
                Err(why) => {
                    print_error(format_args!(
                        "warning: cannot log to {}: {why}; logging to stderr",
                        path.display()
                    ));
                    Logger {
                        mode: LogMode::Stderr,
                        file: None,
                    }
                }
            },
            _ => Logger {
                mode: mode.clone(),
                file: None,
            },
        }
    });
    // set_logger fails only when a logger is already installed: then it is ours.
    let _ = log::set_logger(logger);
    let filter = if logger.mode == LogMode::Disabled {
        LevelFilter::Off
    } else {
        level_filter(level)
    };
    log::set_max_level(filter);
}

/// One log line, as written to stderr or stdout (with its newline).
pub fn format_line(pid: u32, level: Level, message: &str) -> String {
    let label = match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "notice",
        Level::Debug => "debug",
        Level::Trace => "trace",
    };
    // A message spanning lines stays one log line.
    let message = message.replace('\n', " ");
    format!("ddprof[{pid}]: {label}: {message}\n")
}

/// Prints `ddprof: MESSAGE` on stderr whatever the log mode (for errors that
/// end ddprof, like a shell's "command not found"). A closed or broken
/// stderr is ignored: this never panics.
pub fn print_error(message: std::fmt::Arguments<'_>) {
    let line = format!("ddprof: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn syslog_priority(level: Level) -> libc::c_int {
    match level {
        Level::Error => libc::LOG_ERR,
        Level::Warn => libc::LOG_WARNING,
        Level::Info => libc::LOG_NOTICE,
        Level::Debug | Level::Trace => libc::LOG_DEBUG,
    }
}

/// Writes one log line to `fd` with `write(2)`, without the standard
/// library's stdout/stderr locks: the profiler worker is forked from a
/// process with other threads (the exporter's), and a lock one of them held
/// at the fork would stay held in the worker forever. A line that cannot be
/// written has nowhere else to go.
fn write_line(fd: libc::c_int, mut line: &[u8]) {
    while !line.is_empty() {
        // SAFETY: writes from a live slice of `line.len()` bytes.
        let written = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
        if written > 0 {
            line = &line[written as usize..];
        } else if written < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.mode != LogMode::Disabled && metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let message = record.args().to_string();
        let descriptor = match self.mode {
            LogMode::Disabled => None,
            LogMode::Stderr => Some(libc::STDERR_FILENO),
            LogMode::Stdout => Some(libc::STDOUT_FILENO),
            LogMode::File(_) => self.file.as_ref().map(AsRawFd::as_raw_fd),
            LogMode::Syslog => {
                let text = CString::new(message.replace('\0', " "))
                    .unwrap_or_else(|_| c"(unprintable message)".to_owned());
                // SAFETY: both strings are NUL-terminated and outlive the call;
                // the "%s" format consumes exactly the one argument given.
                unsafe {
                    libc::syslog(
                        syslog_priority(record.level()),
                        c"%s".as_ptr(),
                        text.as_ptr(),
                    )
                };
                None
            }
        };
        if let Some(descriptor) = descriptor {
            let line = format_line(std::process::id(), record.level(), &message);
            write_line(descriptor, line.as_bytes());
        }
    }

    fn flush(&self) {
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_the_pid_and_level() {
        assert_eq!(
            format_line(42, Level::Warn, "no events\nat all"),
            "ddprof[42]: warning: no events at all\n"
        );
        assert_eq!(format_line(7, Level::Info, "x"), "ddprof[7]: notice: x\n");
    }

    #[test]
    fn log_modes_are_names_or_paths_with_a_slash() {
        assert_eq!(LogMode::parse("syslog"), Ok(LogMode::Syslog));
        assert_eq!(
            LogMode::parse("/var/log/ddprof.log"),
            Ok(LogMode::File("/var/log/ddprof.log".into()))
        );
        assert_eq!(
            LogMode::parse("./ddprof.log"),
            Ok(LogMode::File("./ddprof.log".into()))
        );
        assert_eq!(
            LogMode::parse("ddprof.log"),
            Ok(LogMode::File("ddprof.log".into()))
        );
        assert!(LogMode::parse("stdrr").is_err());
        assert!(LogMode::parse("").is_err());
        assert_eq!(LogMode::File("/a/b".into()).to_string(), "/a/b");
    }

    #[test]
    fn log_files_are_regular_files_of_this_user_never_waited_on() {
        let dir = std::env::temp_dir().join(format!("ddprof-log-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO without a reader: refused at once, not waited on.
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open_log_file(&fifo).is_err());
        // A directory, a link.
        assert!(open_log_file(&dir).is_err());
        let link = dir.join("link");
        std::os::unix::fs::symlink(dir.join("target"), &link).unwrap();
        assert_eq!(
            open_log_file(&link).err().as_deref(),
            Some("it is a symbolic link")
        );
        assert!(!dir.join("target").exists());
        // A new file: 0600.
        use std::os::unix::fs::PermissionsExt;
        let new = dir.join("new.log");
        open_log_file(&new).unwrap();
        let mode = std::fs::metadata(&new).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn levels_map_to_filters() {
        assert_eq!(level_filter(LogLevel::Error), LevelFilter::Error);
        assert_eq!(level_filter(LogLevel::Notice), LevelFilter::Info);
        assert_eq!(level_filter(LogLevel::Debug), LevelFilter::Trace);
    }
}
