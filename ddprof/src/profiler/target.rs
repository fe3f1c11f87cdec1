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

use crate::files::target::stat_field;

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
    let state = stat_field(&stat, 3);
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

/// `tids`, threads of `pid`, in the order to profile them when not all
/// can be: the ones that used the most CPU first, then the oldest (a
/// thread-per-request server's long-lived threads before the requests'
/// short-lived ones, which end soon anyway). By thread ID alone, a busy
/// thread started before the IDs wrapped around `pid_max` (32,768 here)
/// came after a thousand short-lived ones and was left out. A thread whose
/// `stat` cannot be read (it ended) comes last.
pub fn busiest_and_oldest_first(pid: i32, tids: &mut [i32]) {
    tids.sort_by_cached_key(|&tid| {
        let (cpu_ticks, start_ticks) =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|stat| cpu_and_start_ticks(&stat))
                .unwrap_or((0, u64::MAX));
        (std::cmp::Reverse(cpu_ticks), start_ticks, tid)
    });
}

/// From a `/proc/…/stat` line: utime + stime and the start time (fields
/// 14, 15 and 22), in clock ticks.
fn cpu_and_start_ticks(stat: &str) -> Option<(u64, u64)> {
    let field = |number: usize| stat_field(stat, number)?.parse::<u64>().ok();
    Some((field(14)?.saturating_add(field(15)?), field(22)?))
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
                    let ppid = stat_field(&stat, 4)?.parse().ok()?;
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
    fn reads_cpu_and_start_ticks_past_a_hostile_command_name() {
        // A thread named ") S 1 2 3" by its program, as the kernel prints it.
        let stat = "4242 () S 1 2 3) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 17 0 0 20 0 3 0 98765 1000000 200 18446744073709551615";
        assert_eq!(cpu_and_start_ticks(stat), Some((267, 98765)));
        assert_eq!(cpu_and_start_ticks("4242 (cut short) S 1"), None);
        assert_eq!(cpu_and_start_ticks("no name at all"), None);
    }

    #[test]
    fn a_busy_thread_comes_before_idle_ones_and_the_older_idle_one_first() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{mpsc, Arc};
        let stop = Arc::new(AtomicBool::new(false));
        // Two idle threads, started 50 ms apart (start times are in clock
        // ticks of 10 ms), the younger with the smaller ID if IDs wrapped.
        let idle = |stop: Arc<AtomicBool>| {
            let (tid_tx, tid_rx) = mpsc::channel();
            let thread = std::thread::spawn(move || {
                // SAFETY: gettid has no memory effects.
                tid_tx.send(unsafe { libc::gettid() }).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            (thread, tid_rx.recv().unwrap())
        };
        let (older, older_tid) = idle(stop.clone());
        std::thread::sleep(Duration::from_millis(50));
        let (younger, younger_tid) = idle(stop.clone());
        let busy_stop = stop.clone();
        let (busy_tid_tx, busy_tid_rx) = mpsc::channel();
        let busy = std::thread::spawn(move || {
            // SAFETY: gettid has no memory effects.
            busy_tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let mut sink = 0u64;
            while !busy_stop.load(Ordering::Relaxed) {
                sink = std::hint::black_box(sink.wrapping_add(1));
            }
        });
        let busy_tid = busy_tid_rx.recv().unwrap();
        let me = std::process::id() as i32;
        let ticks_of = |tid: i32| {
            std::fs::read_to_string(format!("/proc/{me}/task/{tid}/stat"))
                .ok()
                .and_then(|stat| cpu_and_start_ticks(&stat))
        };
        // Until the kernel has counted some of its CPU time.
        let started = std::time::Instant::now();
        while ticks_of(busy_tid).is_none_or(|(cpu, _)| cpu < 5) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the busy thread never ran"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut tids = threads(me).unwrap();
        tids.push(i32::MAX);
        busiest_and_oldest_first(me, &mut tids);
        let (older_ticks, younger_ticks) = (ticks_of(older_tid), ticks_of(younger_tid));
        stop.store(true, Ordering::Relaxed);
        for thread in [busy, older, younger] {
            thread.join().unwrap();
        }
        // (The test runner's other threads may have used more CPU.)
        let position = |tid: i32| tids.iter().position(|&t| t == tid).unwrap();
        assert!(
            position(busy_tid) < position(older_tid).min(position(younger_tid)),
            "{busy_tid} before {older_tid} and {younger_tid}: {tids:?}"
        );
        assert_eq!(tids.last(), Some(&i32::MAX), "no such thread: last");
        // Both idle: no CPU tick counted (else the order is by CPU first).
        if older_ticks.is_some_and(|(cpu, _)| cpu == 0)
            && younger_ticks.is_some_and(|(cpu, _)| cpu == 0)
        {
            assert!(
                position(older_tid) < position(younger_tid),
                "{older_ticks:?} {younger_ticks:?} {tids:?}"
            );
        }
    }

    #[test]
    fn lists_threads_and_rejects_missing_processes() {
        let me = std::process::id() as i32;
        assert!(threads(me).unwrap().contains(&me));
        assert!(TargetWatch::new(i32::MAX).is_err());
        assert!(proc_says_alive(me));
    }
}
