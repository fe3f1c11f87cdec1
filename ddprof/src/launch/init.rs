//! `--init`: the command runs as ddprof's child, and ddprof stays as its
//! init.
//!
//! A container's entry point is PID 1 of its PID namespace, and when PID 1
//! exits the kernel ends every other process of the namespace at once: the
//! profiler, a process of the namespace too, would die before it wrote its
//! last period (up to `--upload-period` of samples), its `stacks.folded`,
//! `flamegraph.svg` and summary. With `--init`, ddprof is that PID 1 and
//! the command its child; ddprof does what an init does (as `tini` does):
//! - every signal sent to it by a process (`docker stop`'s SIGTERM, a
//!   SIGHUP, SIGUSR1…) goes to the command; signals a terminal sends
//!   (Ctrl-C) reach the command by themselves, in the same process group;
//! - it reaps every process reparented to it (orphans of the command);
//! - when the command has exited, it waits for the profiler (at most
//!   [`PROFILER_GRACE`]) and exits with the command's status (128 + the
//!   signal when a signal ended it, as a shell says).
//!
//! The command is profiled from its exec, as in the default mode: it waits
//! for ddprof's go-ahead (a pipe) until the profiler has set its engine up.
//! What `--init` gives up is the command's PID: it is not ddprof's (which
//! is why it is not the default).
use std::ffi::CString;
use std::time::{Duration, Instant};

use super::{become_command, exec_command, profile, signals, LaunchOptions, Profiled};
use crate::user;

/// How long ddprof waits, once the command has exited, for the profiler to
/// write its last period and upload it (its own bounds: 30 s for the
/// worker's last period, `--upload-exit-grace` for the upload).
pub const PROFILER_GRACE: Duration = Duration::from_secs(60);

/// Runs the command as a child and waits as its init; returns ddprof's
/// exit status.
pub(super) fn run(
    options: &LaunchOptions,
    not_profiled: Option<String>,
    argv: &[CString],
    switch_user: Option<&user::TargetUser>,
    caller_sigpipe: Option<signals::SavedDisposition>,
) -> u8 {
    let program = options.command.first().map(String::as_str).unwrap_or("");
    // Orphans come here even where ddprof is not PID 1 (the daemon, once
    // its intermediate process exits, among them).
    // SAFETY: PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // Every signal waits in the mask for the loop below, which forwards it;
    // the command gets the caller's mask back before its exec.
    let mut all: libc::sigset_t = unsafe_zeroed_sigset();
    let mut caller_mask: libc::sigset_t = unsafe_zeroed_sigset();
    // SAFETY: sigfillset and sigprocmask on local sigsets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut caller_mask);
    }
    let Ok((go_read, go_write)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        crate::logging::print_error(format_args!("--init: cannot create a pipe"));
        return 1;
    };
    // SAFETY: the launcher is single-threaded: the child may run anything
    // until its exec.
    let child = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(go_write);
            // The go-ahead: one byte once the profiler is ready (or the end
            // of the pipe if ddprof gave up on profiling).
            let mut byte = [0u8; 1];
            let _ = nix::unistd::read(&go_read, &mut byte);
            // SAFETY: restores the caller's mask for the command.
            unsafe { libc::sigprocmask(libc::SIG_SETMASK, &caller_mask, std::ptr::null_mut()) };
            become_command(options, switch_user, caller_sigpipe);
            std::process::exit(i32::from(exec_command(program, argv)));
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child.as_raw(),
        Err(error) => {
            crate::logging::print_error(format_args!("--init: cannot fork: {error}"));
            return 1;
        }
    };
    drop(go_read);
    let mut daemon = None;
    if options.enabled {
        let profiled = match not_profiled {
            Some(reason) => Err(reason),
            None => profile(options, Profiled::Child(child)).map_err(|cause| cause.to_string()),
        };
        match profiled {
            Ok(pid) => daemon = pid,
            Err(cause) => log::warn!("running the command without profiling: {cause}"),
        }
    }
    let _ = nix::unistd::write(&go_write, b"g");
    drop(go_write);
    wait_as_init(child, daemon)
}

fn unsafe_zeroed_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is a plain bit set: all zeroes is the empty set.
    unsafe { std::mem::zeroed() }
}

/// Forwards signals to `command` and reaps children until the command has
/// exited and the profiler (`daemon`) too, or [`PROFILER_GRACE`] passed;
/// the command's exit status.
fn wait_as_init(command: i32, daemon: Option<i32>) -> u8 {
    let mut all = unsafe_zeroed_sigset();
    // SAFETY: sigfillset on a local sigset.
    unsafe { libc::sigfillset(&mut all) };
    let mut command_status: Option<u8> = None;
    let mut daemon_done = daemon.is_none();
    let mut deadline: Option<Instant> = None;
    loop {
        // Reap whatever ended (SIGCHLD may have been merged with others).
        loop {
            let mut status = 0;
            // SAFETY: waits for any child without blocking; writes `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == command {
                command_status = Some(exit_status(status));
                deadline = Some(Instant::now() + PROFILER_GRACE);
            } else if Some(pid) == daemon {
                daemon_done = true;
            }
        }
        if let Some(status) = command_status {
            if daemon_done {
                return status;
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                log::warn!(
                    "--init: the profiler did not finish within {} s of the command's exit; \
                     exiting without it",
                    PROFILER_GRACE.as_secs()
                );
                return status;
            }
        }
        let mut info: libc::siginfo_t = unsafe_zeroed_siginfo();
        let timeout = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: waits for a blocked signal into `info`, at most `timeout`.
        let signal = unsafe { libc::sigtimedwait(&all, &mut info, &timeout) };
        if signal <= 0 || signal == libc::SIGCHLD {
            continue;
        }
        // Sent by a process (kill, sigqueue): the command's. One a terminal
        // generated (SI_KERNEL) already reached the command's process group.
        if command_status.is_none() && info.si_code <= 0 {
            // SAFETY: kill sends a signal to our own child.
            unsafe { libc::kill(command, signal) };
        }
    }
}

fn unsafe_zeroed_siginfo() -> libc::siginfo_t {
    // SAFETY: siginfo_t is plain data; sigtimedwait fills it.
    unsafe { std::mem::zeroed() }
}

/// A wait status as an exit status: the code, or 128 + the signal.
fn exit_status(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        (128 + libc::WTERMSIG(status)).min(255) as u8
    } else {
        1
    }
}
