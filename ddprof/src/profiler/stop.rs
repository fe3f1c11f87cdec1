//! SIGINT/SIGTERM as a stop request for the foreground profiler (`-p`,
//! `--global`): the first signal asks the loop to flush its last period and
//! return; the loop checks [`requested`] and can poll [`pending_wake_fd`].
//! A second signal, while the loop is still flushing, ends the process.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The read end of the self-pipe, for [`pending_wake_fd`].
static WAKE_READ_FD: AtomicI32 = AtomicI32::new(-1);

/// The installed handlers and the read end of their self-pipe.
#[derive(Debug)]
pub struct StopSignals {
    _wake_read: OwnedFd,
    _wake_write: OwnedFd,
}

extern "C" fn on_stop_signal(signal: libc::c_int) {
    if STOP_REQUESTED.swap(true, Ordering::SeqCst) {
        // Second request: the user insists.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(128 + signal) };
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write is async-signal-safe; the pipe is non-blocking, and a
        // full pipe already means "wake up".
        unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
    }
}

/// Installs the SIGINT/SIGTERM handlers.
pub fn install() -> io::Result<StopSignals> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are new and ours.
    let (wake_read, wake_write) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    WAKE_FD.store(wake_write.as_raw_fd(), Ordering::SeqCst);
    WAKE_READ_FD.store(wake_read.as_raw_fd(), Ordering::SeqCst);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches atomics and calls write/_exit,
        // which are async-signal-safe; `action` is fully initialised.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(StopSignals {
        _wake_read: wake_read,
        _wake_write: wake_write,
    })
}

/// Whether SIGINT or SIGTERM arrived.
pub fn requested() -> bool {
    STOP_REQUESTED.load(Ordering::SeqCst)
}

/// The read end of the handlers' self-pipe, while they are installed and no
/// stop has been requested yet: a loop that sleeps long adds it to its
/// poll(2) set to wake at once on a stop signal, whichever thread received
/// it. `None` once a stop was requested: the pipe then stays readable, and
/// waiting on it would spin (the caller checks [`requested`] instead).
pub fn pending_wake_fd() -> Option<RawFd> {
    let fd = WAKE_READ_FD.load(Ordering::SeqCst);
    (fd >= 0 && !requested()).then_some(fd)
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        // The handlers stay (a late signal still counts as a request), but
        // must not write to a descriptor number that may be reused.
        WAKE_FD.store(-1, Ordering::SeqCst);
        WAKE_READ_FD.store(-1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child (system calls only, so forking the multi-threaded
    /// test runner is safe): SIGINT becomes a stop request, not a death.
    #[test]
    fn sigint_requests_a_stop() {
        // SAFETY: the child only makes system calls and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let code = match install() {
                Err(_) => 10,
                Ok(_signals) => match pending_wake_fd() {
                    _ if requested() => 11,
                    None => 14,
                    Some(wake_fd) => {
                        // SAFETY: raise delivers SIGINT to this thread, whose
                        // handler was just installed.
                        unsafe { libc::raise(libc::SIGINT) };
                        let mut byte = [0u8; 1];
                        // SAFETY: reads one byte into a stack buffer.
                        let woken = unsafe { libc::read(wake_fd, byte.as_mut_ptr().cast(), 1) };
                        if !requested() {
                            12
                        } else if woken != 1 {
                            13
                        } else if pending_wake_fd().is_some() {
                            // Still offered once requested: a poll on it would spin.
                            15
                        } else {
                            0
                        }
                    }
                },
            };
            // SAFETY: ends the child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status), "killed by the signal: {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "see the exit codes above");
    }
}
