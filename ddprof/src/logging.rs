//! ddprof's logger: the `log` facade written to stderr, stdout or syslog.
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

#[derive(clap::ValueEnum, serde::Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogMode {
    Stdout,
    Stderr,
    Syslog,
    Disabled,
}

/// The syslog identity: `openlog` keeps the pointer, so it must live forever.
const SYSLOG_IDENT: &std::ffi::CStr = c"ddprof";

struct Logger {
    mode: LogMode,
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

/// Installs the logger. Later calls only change the level (the first mode stays).
pub fn init(level: LogLevel, mode: LogMode) {
    let logger = LOGGER.get_or_init(|| {
        if mode == LogMode::Syslog {
            // SAFETY: the identity is a 'static C string; openlog keeps the pointer.
            unsafe { libc::openlog(SYSLOG_IDENT.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        }
        Logger { mode }
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
        match self.mode {
            LogMode::Disabled => {}
            LogMode::Stderr => {
                let line = format_line(std::process::id(), record.level(), &message);
                write_line(libc::STDERR_FILENO, line.as_bytes());
            }
            LogMode::Stdout => {
                let line = format_line(std::process::id(), record.level(), &message);
                write_line(libc::STDOUT_FILENO, line.as_bytes());
            }
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
            }
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
    fn levels_map_to_filters() {
        assert_eq!(level_filter(LogLevel::Error), LevelFilter::Error);
        assert_eq!(level_filter(LogLevel::Notice), LevelFilter::Info);
        assert_eq!(level_filter(LogLevel::Debug), LevelFilter::Trace);
    }
}
