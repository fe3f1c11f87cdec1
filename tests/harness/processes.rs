//! The processes of a profiled run: which they were, from the kernel's
//! process connector (`cn_proc`: a netlink multicast of every fork and exec
//! on the machine; needs CAP_NET_ADMIN), and the CPU time they used, from
//! `wait4`.
//!
//! The corpus compares profilers on the samples of the profiled command and
//! its descendants only. A profiler's own processes (ddprof's daemon, forked
//! by the launcher before it execs the command) descend from the process the
//! test spawned too, so the tree alone does not tell them apart; the time of
//! the command's exec does: see [`workload_processes`].
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `CN_IDX_PROC` and `CN_VAL_PROC` (linux/connector.h).
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
/// `PROC_CN_MCAST_LISTEN` (linux/cn_proc.h).
const PROC_CN_MCAST_LISTEN: u32 = 1;
/// `PROC_EVENT_FORK`, `PROC_EVENT_EXEC` (linux/cn_proc.h).
const PROC_EVENT_FORK: u32 = 0x1;
const PROC_EVENT_EXEC: u32 = 0x2;
/// `struct nlmsghdr` and `struct cn_msg` sizes; `struct proc_event` follows.
const NLMSG_HEADER: usize = 16;
const CN_MSG_HEADER: usize = 20;
/// The socket's receive buffer: other users' builds fork too, and a full
/// buffer drops events (ENOBUFS), which the run then reports.
const RECEIVE_BUFFER_BYTES: libc::c_int = 32 << 20;

/// A fork or exec, as the kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEvent {
    /// A new task. `child_pid != child_tgid` for a new thread.
    Fork {
        time_ns: u64,
        parent_tgid: u32,
        child_pid: u32,
        child_tgid: u32,
    },
    Exec {
        time_ns: u64,
        tgid: u32,
    },
}

impl ProcessEvent {
    fn time_ns(&self) -> u64 {
        match *self {
            ProcessEvent::Fork { time_ns, .. } | ProcessEvent::Exec { time_ns, .. } => time_ns,
        }
    }
}

/// Records every fork and exec of the machine from [`ProcessEvents::listen`]
/// until [`ProcessEvents::stop`].
pub struct ProcessEvents {
    stop: Arc<AtomicBool>,
    reader: JoinHandle<io::Result<Vec<ProcessEvent>>>,
}

impl ProcessEvents {
    /// Subscribes to the process connector; events are recorded from the
    /// moment this returns.
    pub fn listen() -> io::Result<ProcessEvents> {
        let socket = subscribe()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_reader = Arc::clone(&stop);
        let reader = std::thread::spawn(move || read_events(&socket, &stop_reader));
        Ok(ProcessEvents { stop, reader })
    }

    /// Stops recording and returns the events in time order; an error when
    /// events were lost (the receive buffer overflowed) or the socket failed.
    pub fn stop(self) -> io::Result<Vec<ProcessEvent>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut events = self
            .reader
            .join()
            .map_err(|_| io::Error::other("the process event reader panicked"))??;
        events.sort_by_key(ProcessEvent::time_ns);
        Ok(events)
    }
}

/// The processes (tgids) of the command started by the tool the test
/// spawned as `tool_pid`: the command starts at the first exec after the
/// tool's own, by `tool_pid` itself (ddprof's launcher execs into the
/// command) or by a child it forked (perf record forks the command); the
/// workload is that process and every process forked, after that exec, by a
/// process of the workload. Processes the tool forked before the command's
/// exec (ddprof's daemon) are not part of it. Empty when no command started.
pub fn workload_processes(events: &[ProcessEvent], tool_pid: u32) -> HashSet<u32> {
    let mut tool_execs = 0;
    let mut tool_children = HashSet::new();
    let mut workload = HashSet::new();
    for event in events {
        if workload.is_empty() {
            match *event {
                ProcessEvent::Fork {
                    parent_tgid,
                    child_pid,
                    child_tgid,
                    ..
                } if parent_tgid == tool_pid && child_pid == child_tgid => {
                    tool_children.insert(child_tgid);
                }
                ProcessEvent::Exec { tgid, .. } if tgid == tool_pid => {
                    tool_execs += 1;
                    if tool_execs == 2 {
                        workload.insert(tgid);
                    }
                }
                ProcessEvent::Exec { tgid, .. }
                    if tool_execs >= 1 && tool_children.contains(&tgid) =>
                {
                    workload.insert(tgid);
                }
                _ => {}
            }
            continue;
        }
        if let ProcessEvent::Fork {
            parent_tgid,
            child_pid,
            child_tgid,
            ..
        } = *event
        {
            if child_pid == child_tgid && workload.contains(&parent_tgid) {
                workload.insert(child_tgid);
            }
        }
    }
    workload
}

/// How a child ended and the CPU time (user + system) it used.
pub struct Reaped {
    pub status: std::process::ExitStatus,
    /// The child's own CPU time and that of the descendants it waited for
    /// (`wait4`'s rusage, in microseconds).
    pub cpu: Duration,
    /// The CPU time of the descendants it waited for only (`cutime` +
    /// `cstime` of its `/proc/PID/stat` once it exited, in clock ticks):
    /// for a tool that forks the command and waits for it (perf record),
    /// the command's CPU time without the tool's.
    pub children_cpu: Duration,
}

/// Reaps the child `pid` (spawned by this process and not waited for
/// otherwise), killing it with SIGKILL if it runs longer than `timeout`.
pub fn wait_with_cpu_time(pid: u32, timeout: Duration) -> io::Result<Reaped> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let raw_pid = nix::unistd::Pid::from_raw(pid as libc::pid_t);
    let deadline = Instant::now() + timeout;
    let mut killed = false;
    // Wait for the exit without reaping: the zombie's /proc/PID/stat
    // still holds its children's CPU time.
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(raw_pid), flags) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(error.into()),
        }
        if !killed && Instant::now() > deadline {
            let _ = nix::sys::signal::kill(raw_pid, nix::sys::signal::Signal::SIGKILL);
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let children_cpu = children_cpu_time(pid)?;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain integers: all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes into two locals that live across the call.
    let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    if reaped != pid as libc::pid_t {
        return Err(io::Error::last_os_error());
    }
    if killed {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("killed after {} s", timeout.as_secs()),
        ));
    }
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    use std::os::unix::process::ExitStatusExt;
    Ok(Reaped {
        status: std::process::ExitStatus::from_raw(status),
        cpu: Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime)),
        children_cpu,
    })
}

/// `cutime + cstime` of `/proc/PID/stat` (fields 16 and 17).
fn children_cpu_time(pid: u32) -> io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or_else(|| io::Error::other(format!("unexpected /proc/{pid}/stat: {stat}")))?;
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |field: usize| -> io::Result<u64> {
        fields
            .get(field - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::other(format!("unexpected /proc/{pid}/stat: {stat}")))
    };
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?
        .filter(|&t| t > 0)
        .unwrap_or(100) as u64;
    let total = ticks(16)? + ticks(17)?;
    Ok(Duration::from_micros(total * 1_000_000 / per_second))
}

/// Runs `command` with address space layout randomization off (the
/// `ADDR_NO_RANDOMIZE` personality, inherited by its children, as
/// `setarch --addr-no-randomize` does).
pub fn without_address_randomization(
    command: &mut std::process::Command,
) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two personality(2) calls, which take and return integers.
    unsafe {
        command.pre_exec(|| {
            let current = libc::personality(0xffff_ffff);
            if current == -1
                || libc::personality((current | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong) == -1
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

fn subscribe() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integers; the descriptor it returns is owned
    // by the OwnedFd from here on.
    let socket = unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_CONNECTOR,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let fd = socket.as_raw_fd();
    set_option(fd, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
        .or_else(|_| set_option(fd, libc::SO_RCVBUF, RECEIVE_BUFFER_BYTES))?;
    // A receive timeout, so that the reader sees the stop flag.
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: the option value is a timeval that lives across the call.
    if unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_nl is valid; its fields are set below.
    let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    address.nl_groups = CN_IDX_PROC;
    // SAFETY: bind reads the sockaddr_nl, which lives across the call.
    if unsafe {
        libc::bind(
            fd,
            (&address as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // nlmsghdr, cn_msg { id, seq, ack, len, flags }, then the operation.
    let mut message = Vec::with_capacity(NLMSG_HEADER + CN_MSG_HEADER + 4);
    let total = (NLMSG_HEADER + CN_MSG_HEADER + 4) as u32;
    message.extend_from_slice(&total.to_ne_bytes());
    message.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    message.extend_from_slice(&0u16.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&std::process::id().to_ne_bytes());
    message.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    message.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&4u16.to_ne_bytes());
    message.extend_from_slice(&0u16.to_ne_bytes());
    message.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: send reads `message.len()` bytes of the vector.
    let sent = unsafe { libc::send(fd, message.as_ptr().cast(), message.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

fn set_option(fd: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is an int that lives across the call.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn read_events(socket: &OwnedFd, stop: &AtomicBool) -> io::Result<Vec<ProcessEvent>> {
    let mut events = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    // Drain what is queued once the stop flag is seen: the last events of
    // the run may still be in the buffer.
    let mut draining = false;
    loop {
        // SAFETY: recv writes at most `buffer.len()` bytes into the buffer.
        let received = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                if draining { libc::MSG_DONTWAIT } else { 0 },
            )
        };
        if received < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {
                    if draining {
                        return Ok(events);
                    }
                    draining = stop.load(Ordering::Relaxed);
                    continue;
                }
                Some(libc::ENOBUFS) => {
                    return Err(io::Error::other(
                        "process events were lost (netlink receive buffer full)",
                    ))
                }
                _ => return Err(error),
            }
        }
        parse_messages(&buffer[..received as usize], &mut events);
        if !draining && stop.load(Ordering::Relaxed) {
            draining = true;
        }
    }
}

fn parse_messages(mut bytes: &[u8], events: &mut Vec<ProcessEvent>) {
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    while let Some(length) = u32_at(bytes, 0) {
        let length = length as usize;
        if length < NLMSG_HEADER || length > bytes.len() {
            return;
        }
        // struct proc_event: what, cpu, timestamp_ns, then the event's data
        // (shorter messages, e.g. the subscription's acknowledgement, give
        // None below).
        let event = bytes
            .get(NLMSG_HEADER + CN_MSG_HEADER..length)
            .unwrap_or_default();
        let parsed = match (u32_at(event, 0), u64_at(event, 8)) {
            (Some(PROC_EVENT_FORK), Some(time_ns)) => (|| {
                Some(ProcessEvent::Fork {
                    time_ns,
                    parent_tgid: u32_at(event, 20)?,
                    child_pid: u32_at(event, 24)?,
                    child_tgid: u32_at(event, 28)?,
                })
            })(),
            (Some(PROC_EVENT_EXEC), Some(time_ns)) => {
                u32_at(event, 20).map(|tgid| ProcessEvent::Exec { time_ns, tgid })
            }
            _ => None,
        };
        events.extend(parsed);
        let aligned = (length + 3) & !3;
        bytes = &bytes[aligned.min(bytes.len())..];
    }
}

/// What [`run_reaped`] left: how the command ended, its CPU time, its stderr.
pub struct RunOutcome {
    pub pid: u32,
    pub reaped: Reaped,
    pub stderr: String,
}

/// Runs `command` (stdin and stdout null, stderr piped), reaps it with
/// [`wait_with_cpu_time`] and reads its stderr to the end. ddprof's profiler
/// shares the command's stderr and writes its summary after the command
/// exits: the end of stderr comes when the profiler has exited too, at most
/// `timeout` after the command.
pub fn run_reaped(
    command: &mut std::process::Command,
    timeout: Duration,
) -> Result<RunOutcome, String> {
    use std::io::Read;
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let pid = child.id();
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut text);
        let _ = sender.send(String::from_utf8_lossy(&text).into_owned());
    });
    // Reaped here (wait4, for the CPU time), not through `child`.
    let reaped = wait_with_cpu_time(pid, timeout).map_err(|e| format!("{command:?}: {e}"))?;
    let stderr = receiver.recv_timeout(timeout).map_err(|_| {
        format!(
            "{command:?}: stderr still open {} s after the command exited (profiler hung?)",
            timeout.as_secs()
        )
    })?;
    Ok(RunOutcome {
        pid,
        reaped,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(time_ns: u64, parent_tgid: u32, child: u32) -> ProcessEvent {
        ProcessEvent::Fork {
            time_ns,
            parent_tgid,
            child_pid: child,
            child_tgid: child,
        }
    }

    fn exec(time_ns: u64, tgid: u32) -> ProcessEvent {
        ProcessEvent::Exec { time_ns, tgid }
    }

    #[test]
    fn a_launcher_that_execs_into_the_command_leaves_its_daemon_out() {
        let events = [
            fork(1, 1, 10),  // the test spawns the tool
            exec(2, 10),     // ddprof
            fork(3, 10, 11), // launcher → intermediate
            fork(4, 11, 12), // intermediate → daemon
            exec(5, 10),     // the command
            fork(6, 10, 13),
            fork(7, 13, 14),
            fork(8, 12, 15), // the daemon's child
        ];
        let workload = workload_processes(&events, 10);
        assert_eq!(workload, HashSet::from([10, 13, 14]));
    }

    #[test]
    fn a_tool_that_forks_the_command_is_left_out() {
        let events = [
            fork(1, 1, 10),
            exec(2, 10), // perf
            fork(3, 10, 11),
            exec(4, 11), // the command
            ProcessEvent::Fork {
                time_ns: 5,
                parent_tgid: 11,
                child_pid: 16,
                child_tgid: 11, // a thread
            },
            fork(6, 11, 17),
        ];
        assert_eq!(workload_processes(&events, 10), HashSet::from([11, 17]));
        assert!(workload_processes(&events[..3], 10).is_empty());
    }
}
