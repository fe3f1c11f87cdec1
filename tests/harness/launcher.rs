//! Helpers for the launcher tests: a seccomp filter that makes
//! perf_event_open fail, line readers with timeouts, `/proc` probes.
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// `AUDIT_ARCH_X86_64` (linux/audit.h).
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

/// Makes every `perf_event_open` of the spawned process (and of its
/// children) fail with EACCES, the way a locked-down machine answers.
/// (`perf_event_paranoid=3` does not block anything on this kernel.)
pub fn deny_perf_event_open(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // two prctl calls on data that lives on its stack.
    unsafe { command.pre_exec(install_perf_event_open_filter) }
}

fn install_perf_event_open_filter() -> io::Result<()> {
    let statement = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    // seccomp_data: nr at offset 0, arch at offset 4.
    let mut filter = [
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jump(AUDIT_ARCH_X86_64, 0, 3),
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump(libc::SYS_perf_event_open as u32, 0, 1),
        statement(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | (libc::EACCES as u32 & libc::SECCOMP_RET_DATA),
        ),
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers; PR_SET_SECCOMP reads the
    // program, which outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The lines of a pipe, read by a thread, with timeouts for the reader.
pub struct Lines {
    receiver: Receiver<String>,
    /// Every line received so far.
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(pipe: impl Read + Send + 'static) -> Lines {
        let (sender, receiver) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            receiver,
            seen: Vec::new(),
        }
    }

    /// The next line, or None at end of stream or after `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Option<String> {
        let line = self.receiver.recv_timeout(timeout).ok()?;
        self.seen.push(line.clone());
        Some(line)
    }

    /// Reads until a line contains `needle` (None on timeout or end of stream).
    pub fn find(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.next(left)?;
            if line.contains(needle) {
                return Some(line);
            }
        }
    }

    /// Every remaining line until end of stream (or `timeout`).
    pub fn rest(&mut self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.receiver.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return self.seen.clone()
                }
            }
        }
    }
}

/// `/proc/PID/stat`'s state letter, None when the process is gone.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn is_running(pid: i32) -> bool {
    !matches!(process_state(pid), None | Some('Z') | Some('X'))
}

/// Waits until `pid` no longer runs; returns whether it stopped in time.
pub fn wait_until_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    !is_running(pid)
}

/// The `Cap*` lines of a `/proc/PID/status` text, e.g. `("CapEff", 0x1ff)`.
pub fn capability_lines(status: &str) -> Vec<(String, u64)> {
    hex_status_lines(status, "Cap")
}

/// The hexadecimal `/proc/PID/status` lines whose key starts with `prefix`
/// (`Cap` for capabilities, `Sig` for signal masks).
pub fn hex_status_lines(status: &str, prefix: &str) -> Vec<(String, u64)> {
    status
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            if !key.starts_with(prefix) {
                return None;
            }
            Some((key.to_string(), u64::from_str_radix(value.trim(), 16).ok()?))
        })
        .collect()
}

/// The value of `key=0x...` in a log line (e.g. `effective=0x1c000284004`).
pub fn hex_field(line: &str, key: &str) -> Option<u64> {
    let start = line.find(&format!("{key}=0x"))? + key.len() + 3;
    let digits: String = line[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&digits, 16).ok()
}

/// The value of `key=N` in a log line (e.g. `pid=1234`).
pub fn number_field(line: &str, key: &str) -> Option<u64> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let digits: String = line[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
