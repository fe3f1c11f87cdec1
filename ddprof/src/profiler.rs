//! The profiler's main loop: picks the engine, drives it, and feeds
//! aggregation, symbolization and outputs.
use crate::config::Cli;
use crate::events::EventFd;

/// What is being profiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The command the launcher exec'd (it keeps this PID), and its children.
    Launched { pid: u32 },
    /// A running process (`-p`) and its children.
    Pid(u32),
    /// Every process (`--global`).
    Global,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Runs the profiler until the target is gone (or, for `--global`, until
/// SIGINT/SIGTERM), flushing the last period before returning.
pub fn run(_cli: &Cli, _target: Target, _events: Vec<EventFd>) -> Result<(), ProfilerError> {
    Err(ProfilerError::Setup(
        "the profiler loop is not implemented yet".into(),
    ))
}
