//! What is profiled, and watching it: when the profiled process exits, the
//! profiler stops.
//!
//! How the profiler loop detects the end of its target: it creates a
//! [`TargetWatch`] for the PID (for the launched command,
//! the daemon is given the descriptor the launcher opened
//! before the command existed, so PID reuse cannot fool it), adds
//! [`TargetWatch::poll_fd`] to the descriptors it polls (the ring buffers),
//! and stops once it is readable or [`TargetWatch::has_exited`] says so.
//! With `pidfd_open` (Linux 5.3+) readability is exact; without it the loop
//! must poll with a timeout and `has_exited` reads `/proc/PID/stat`.
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

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

/// How often the `/proc` fallback looks at the target.
const PROC_POLL_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct TargetWatch {
    pid: i32,
    pidfd: Option<OwnedFd>,
}

/// `pidfd_open(pid)`: a descriptor that becomes readable when `pid` exits.
/// `Ok(None)` when the kernel lacks the system call.
pub fn pidfd_open(pid: i32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor
    // (always close-on-exec) or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOSYS) => Ok(None),
            _ => Err(error),
        };
    }
    // SAFETY: the kernel just created this descriptor for us.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

impl TargetWatch {
    /// Starts watching `pid`; fails if there is no such process.
    pub fn new(pid: i32) -> io::Result<TargetWatch> {
        let pidfd = pidfd_open(pid)?;
        let watch = TargetWatch { pid, pidfd };
        if watch.pidfd.is_none() && watch.has_exited() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(watch)
    }

    /// A watch over a descriptor opened earlier by [`pidfd_open`].
    pub fn from_pidfd(pid: i32, pidfd: OwnedFd) -> TargetWatch {
        TargetWatch {
            pid,
            pidfd: Some(pidfd),
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Readable once the target has exited (None without pidfd support:
    /// then poll with a timeout and call [`TargetWatch::has_exited`]).
    pub fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|fd| fd.as_fd())
    }

    /// Whether the target has exited (a zombie counts as exited).
    pub fn has_exited(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
            }
            None => !proc_says_alive(self.pid),
        }
    }

    /// Waits until the target exits or `timeout` passes (forever if None);
    /// returns whether it exited.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.has_exited() {
                return true;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return false;
            }
            match &self.pidfd {
                Some(fd) => {
                    let millis = left.map_or(-1, |l| l.as_millis().clamp(1, 60_000) as i32);
                    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                    let timeout = PollTimeout::try_from(millis).unwrap_or(PollTimeout::NONE);
                    // EINTR or a timeout: loop and look again.
                    let _ = poll(&mut fds, timeout);
                }
                None => std::thread::sleep(
                    left.map_or(PROC_POLL_INTERVAL, |l| l.min(PROC_POLL_INTERVAL)),
                ),
            }
        }
    }
}

/// Blocks until `pid` exits (or returns at once if there is no such process).
pub fn wait_for_exit(pid: i32) {
    if let Ok(watch) = TargetWatch::new(pid) {
        watch.wait(None);
    }
}

/// `/proc/PID/stat` exists and its state is not zombie/dead.
fn proc_says_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may hold spaces.
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | Some("x") | None)
}

/// The thread IDs of `pid` (`/proc/PID/task`).
pub fn threads(pid: i32) -> io::Result<Vec<i32>> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The processes a profiler of `target` profiles now: the target and its
/// descendants (by `PPid` in `/proc/*/stat`), or every process for
/// `--global`. A profiler worker that replaces another reads these from
/// `/proc` again.
pub fn processes_in_scope(target: Target) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| {
                    let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                    let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                    let (_, fields) = stat.rsplit_once(')')?;
                    let ppid = fields.split_whitespace().nth(1)?.parse().ok()?;
                    Some((pid, ppid))
                })
                .collect()
        })
        .unwrap_or_default();
    let root = match target {
        Target::Launched { pid } | Target::Pid(pid) => pid,
        Target::Global => return parents.into_iter().map(|(pid, _)| pid).collect(),
    };
    let mut in_scope = vec![root];
    let mut index = 0;
    while index < in_scope.len() {
        let parent = in_scope[index];
        in_scope.extend(
            parents
                .iter()
                .filter(|&&(pid, ppid)| ppid == parent && pid != parent)
                .map(|&(pid, _)| pid),
        );
        index += 1;
    }
    in_scope
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_child_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let watch = TargetWatch::new(pid).unwrap();
        assert!(!watch.has_exited());
        assert!(!watch.wait(Some(Duration::from_millis(10))));
        assert!(watch.wait(Some(Duration::from_secs(10))));
        // Still a zombie (not reaped yet) and already counted as exited.
        assert!(!proc_says_alive(pid));
        child.wait().unwrap();
    }

    #[test]
    fn the_scope_of_a_process_holds_its_descendants() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let scope = processes_in_scope(Target::Pid(me));
        assert_eq!(scope[0], me);
        assert!(scope.contains(&child.id()), "{scope:?}");
        assert!(!scope.contains(&1));
        assert!(processes_in_scope(Target::Global).contains(&1));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn lists_threads_and_rejects_missing_processes() {
        let me = std::process::id() as i32;
        assert!(threads(me).unwrap().contains(&me));
        assert!(TargetWatch::new(i32::MAX).is_err());
        assert!(proc_says_alive(me));
    }
}
