//! The detached profiler daemon: a double-forked grandchild of the launcher.
//!
//! Why a grandchild: the launcher execs the command, which keeps its PID. If
//! the profiler were the command's child, its death would send the command a
//! SIGCHLD and leave a zombie the command never reaps. The intermediate child
//! exits at once and the launcher reaps it before the exec; the grandchild is
//! then re-parented to init (or the nearest subreaper), never to the command.
//! It calls `setsid`, so it is in neither the command's process group nor its
//! session: a Ctrl-C or a `kill -- -PGID` aimed at the command's group does
//! not reach it, and it holds no controlling terminal.
//!
//! Why the fork happens before the launcher opens its events: the events are
//! inherited by children created after they exist, and the profiler must not
//! profile itself.
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::handoff::{self, HandoffError};
use super::{signals, LaunchOptions};
use crate::logging::LogMode;
use crate::profiler::{stop, Target, TargetWatch};

/// The profiler's process name (`ps`, `/proc/PID/comm`).
pub const PROCESS_NAME: &std::ffi::CStr = c"ddprof-profiler";

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot fork the profiler: {0}")]
    Fork(nix::Error),
    #[error("the profiler's intermediate process failed ({0:?})")]
    Intermediate(WaitStatus),
    #[error("cannot wait for the profiler's intermediate process: {0}")]
    Wait(nix::Error),
}

/// What the daemon needs from the launcher.
pub struct DaemonSetup<'a> {
    pub options: &'a LaunchOptions,
    /// The command's PID: the launcher's (which the command keeps), or its
    /// child's with `--init`.
    pub target_pid: i32,
    /// A pidfd of the command, opened before the daemon's fork.
    pub target_pidfd: Option<OwnedFd>,
    /// The daemon's end of the hand-off socket.
    pub socket: OwnedFd,
    /// The launcher's end, which the daemon closes.
    pub launcher_socket: RawFd,
}

/// Forks the daemon; returns in the launcher once the intermediate child is
/// reaped, with the daemon's PID when the intermediate could say it. Never
/// returns in the daemon.
pub fn spawn(setup: DaemonSetup<'_>) -> Result<Option<i32>, SpawnError> {
    // With SIGCHLD ignored, the kernel would reap the intermediate child
    // itself and waitpid would wait for every other child: take the default
    // disposition while forking, and give the caller's back for the exec.
    let caller_sigchld = signals::is_ignored(libc::SIGCHLD)
        .then(|| signals::SavedDisposition::replace(libc::SIGCHLD, libc::SIG_DFL).ok())
        .flatten();
    let result = fork_twice(setup);
    if let Some(saved) = caller_sigchld {
        saved.restore();
    }
    result
}

fn fork_twice(setup: DaemonSetup<'_>) -> Result<Option<i32>, SpawnError> {
    // The intermediate process says the daemon's PID through this pipe.
    let said = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok();
    // SAFETY: the launcher is single-threaded here (nothing has spawned a
    // thread), so the child may run arbitrary code after the fork.
    match unsafe { fork() }.map_err(SpawnError::Fork)? {
        ForkResult::Child => {
            // SAFETY: as above, still single-threaded.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => {
                    drop(said);
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| daemon_main(setup)));
                    // Whatever happened, never return into the launcher's code
                    // (it would exec the command a second time).
                    // SAFETY: _exit ends this process without touching shared state.
                    unsafe { libc::_exit(if outcome.is_ok() { 0 } else { 101 }) }
                }
                Ok(ForkResult::Parent { child }) => {
                    if let Some((_, write_end)) = &said {
                        let _ = nix::unistd::write(write_end, &child.as_raw().to_ne_bytes());
                    }
                    // SAFETY: the intermediate process only exits.
                    unsafe { libc::_exit(0) }
                }
                // SAFETY: as above.
                Err(_) => unsafe { libc::_exit(1) },
            }
        }
        ForkResult::Parent { child } => {
            drop(setup.socket);
            drop(setup.target_pidfd);
            reap(child)?;
            let daemon = said.and_then(|(read_end, write_end)| {
                drop(write_end);
                let mut pid = [0u8; 4];
                (nix::unistd::read(&read_end, &mut pid).ok()? == 4).then(|| i32::from_ne_bytes(pid))
            });
            Ok(daemon)
        }
    }
}

fn reap(child: Pid) -> Result<(), SpawnError> {
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => break,
            Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => {
                return Err(SpawnError::Intermediate(status))
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(SpawnError::Wait(error)),
        }
    }
    discard_pending_sigchld();
    Ok(())
}

/// If the caller left SIGCHLD blocked, the intermediate child's SIGCHLD is
/// still pending, and a pending signal survives exec: take it out so the
/// command does not receive it when it unblocks SIGCHLD.
fn discard_pending_sigchld() {
    // SAFETY: the sigset_t values are initialised by sigemptyset/sigpending
    // before use; sigtimedwait with a zero timeout never blocks.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut pending) != 0 || libc::sigismember(&pending, libc::SIGCHLD) != 1 {
            return;
        }
        let mut only_sigchld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only_sigchld);
        libc::sigaddset(&mut only_sigchld, libc::SIGCHLD);
        let no_wait = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::sigtimedwait(&only_sigchld, std::ptr::null_mut(), &no_wait);
    }
}

/// How long the daemon waits for the launcher's CPU time once it said its
/// engine is ready (the launcher sends it at once; ~1 ms here).
const LAUNCHER_CPU_WAIT: Duration = Duration::from_millis(100);

fn daemon_main(setup: DaemonSetup<'_>) {
    let DaemonSetup {
        options,
        target_pid,
        target_pidfd,
        socket,
        launcher_socket,
    } = setup;
    // SAFETY: the launcher's end of the socket is a descriptor this process
    // inherited and never uses: closing it lets the daemon see end-of-file.
    unsafe { libc::close(launcher_socket) };
    // Fails only if already a group leader, which a fresh grandchild is not.
    let _ = nix::unistd::setsid();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, PROCESS_NAME.as_ptr(), 0, 0, 0) };
    let mut keep = vec![socket.as_raw_fd()];
    keep.extend(target_pidfd.as_ref().map(|fd| fd.as_raw_fd()));
    keep.extend(crate::logging::file_descriptor());
    // The allocation sampler's anonymous file: the library's frames are
    // unwound and named from it once the command is gone.
    keep.extend(
        crate::events::allocation::prepared()
            .map(|sampler| std::os::fd::AsRawFd::as_raw_fd(&sampler.file())),
    );
    let log_mode = crate::logging::mode().unwrap_or_else(|| options.log_mode.clone());
    detach_descriptors(&log_mode, &keep);

    let events = match handoff::receive_events(&socket, &options.events) {
        Ok(events) => events,
        // The launcher gave up and already said why.
        Err(HandoffError::NoEvents) => return,
        Err(error) => {
            log::warn!("profiler: {error}");
            return;
        }
    };
    if let Err(error) = handoff::acknowledge(&socket) {
        log::warn!("profiler: {error}");
        return;
    }
    // The pidfd was opened before the command existed: PID reuse cannot
    // fool the watch.
    let watch = match target_pidfd {
        Some(pidfd) => Some(TargetWatch::from_pidfd(target_pid, pidfd)),
        None => TargetWatch::new(target_pid).ok(),
    };
    // SIGTERM (e.g. from an administrator) flushes the last period too.
    let _stop = stop::install()
        .map_err(|error| log::warn!("profiler: cannot install its SIGTERM handler: {error}"))
        .ok();
    if let Err(error) = super::settle_profiler(options) {
        log::error!("profiler: {error}");
        return;
    }
    log::info!(
        "profiler started: pid={} target={} events={} {}",
        std::process::id(),
        target_pid,
        events.len(),
        super::describe_capabilities()
    );
    let target = Target::Launched {
        pid: target_pid as u32,
    };
    // The command waits for this (bounded) before it starts; then the
    // launcher says what it spent, and the socket closes with its exec.
    let engine_ready = move || {
        if let Err(error) = handoff::report_ready(&socket) {
            log::debug!("profiler: {error}");
            return Duration::ZERO;
        }
        handoff::receive_launcher_cpu(&socket, LAUNCHER_CPU_WAIT).unwrap_or_default()
    };
    let executable = options
        .command
        .first()
        .and_then(|command| crate::files::command_path(command));
    if let Err(error) = super::run_profiler(
        &options.profiler,
        target,
        events,
        watch,
        executable,
        engine_ready,
    ) {
        log::error!("profiler stopped: {error}");
    }
}

/// stdin (and stdout, unless the logs go there) → /dev/null; stderr stays for
/// the logs in stderr mode. Every other inherited descriptor is closed: the
/// caller may wait for end-of-file on a pipe the command holds, and the
/// profiler must not hold it open after the command exits.
fn detach_descriptors(log_mode: &LogMode, keep: &[RawFd]) {
    if *log_mode == LogMode::Syslog {
        // The syslog socket is about to be closed: let syslog() reopen it
        // rather than write to whatever later gets its number.
        // SAFETY: closelog only closes syslog's own descriptor.
        unsafe { libc::closelog() };
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    if let Ok(null) = null {
        let mut redirect = vec![libc::STDIN_FILENO];
        if *log_mode != LogMode::Stdout {
            redirect.push(libc::STDOUT_FILENO);
        }
        if *log_mode != LogMode::Stderr {
            redirect.push(libc::STDERR_FILENO);
        }
        for fd in redirect {
            // SAFETY: dup2 onto a standard descriptor number; `null` stays open
            // during the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let inherited: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in inherited {
        if fd > libc::STDERR_FILENO && !keep.contains(&fd) {
            // SAFETY: closing a descriptor nothing in this process uses (the
            // directory stream's own descriptor is gone by now, and closing a
            // stale number fails harmlessly with EBADF).
            unsafe { libc::close(fd) };
        }
    }
}
