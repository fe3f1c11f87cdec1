//! The threads already off a CPU when `sWALL` starts (a service's idle
//! workers under `-p` or `--global`, blocked since long before): the program
//! sees a wait at its switch-out, and these switched out before it was
//! attached. Without them, such a thread's wall time would be missing until
//! it next ran, and for ever for one that never runs again (a main thread
//! in `pthread_join`).
//!
//! Before the program is attached, the engine notes each waiting thread's
//! count of switches ([`waiting_threads`]). After, the first worker takes
//! those of them still in that wait (the count unchanged: their wait began
//! before the program, which saw none of it; a wait that began after was
//! drawn or not by the program, and its weight is the program's to give),
//! sleeping (`S`, `D`) in a system call (`/proc/PID/task/TID/syscall` gives
//! the saved user stack pointer and program counter). It parks each in
//! the program's map as off a CPU since now (`BpfEngine::park_thread`), so
//! that its switch-in ends the wait as any other's, then checks that it is
//! still in the same wait (else it is taken out again). Its user stack is
//! read from `/proc/PID/mem` and unwound by the user-side unwinder; its
//! other registers are not known, so a frame whose rule needs the frame
//! pointer ends the walk (`StackEnd::BadAddress`), which code built
//! without frame pointers (Debian's) never needs. Its kernel stack is not
//! read (`/proc/PID/task/TID/stack` needs `CAP_SYS_ADMIN`, which the worker
//! does not keep): the wait is named by its user stack.
//!
//! The target is hostile. A stack is read only from private anonymous
//! memory (not a file the target could serve itself, through FUSE, and
//! never answer), and each read of its memory or its mappings runs under a
//! time bound (`files::bounded`: the target could map such a file there
//! between the two reads); after one overruns, no more stacks are read.
//! Everything is bounded: at most [`MAX_SEEDED_THREADS`] threads,
//! [`MAX_TASKS_EXAMINED`] tasks and [`MAX_MAPS_LINES`] mappings a process,
//! a few small `/proc` files and [`STACK_BYTES`] of stack a thread, and
//! [`SEEDING_BUDGET`] in all.
use std::io::Read;
use std::os::unix::fs::FileExt;

use crate::files::bounded::{self, Unanswered};

/// Threads seeded at most (the program's map holds `MAX_PARKED`).
pub const MAX_SEEDED_THREADS: usize = 4096;
/// Bytes of a seeded thread's stack read, from its stack pointer up.
pub const STACK_BYTES: usize = 16 << 10;
/// The most read of a `/proc` text file here (`status` lists the
/// thread's groups, up to 65,536).
const MAX_PROC_FILE: u64 = 1 << 20;
/// The longest a read of a target's memory or mappings may take.
const READ_BOUND: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest the seeding goes on (it runs before the first drain of the
/// buffers).
pub const SEEDING_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);
/// Tasks of a process looked at, at most (blocked or not).
pub const MAX_TASKS_EXAMINED: usize = 16_384;
/// Lines of a process's `maps` read, at most (the kernel's default
/// `vm.max_map_count` is 65,530).
pub const MAX_MAPS_LINES: usize = 65_536;

/// A thread off a CPU, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedThread {
    pub pid: u32,
    pub tid: u32,
    /// Its saved user stack pointer and program counter.
    pub sp: u64,
    pub pc: u64,
    /// Its count of switches (voluntary and not), to tell it ran since.
    switches: u64,
}

/// A `/proc` text file, its bytes that are not UTF-8 replaced (a thread's
/// name is the target's).
fn read_small(path: &str) -> Option<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_FILE)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A thread's state letter and its count of switches, from its `status`.
fn state_and_switches(pid: u32, tid: u32) -> Option<(char, u64)> {
    let status = read_small(&format!("/proc/{pid}/task/{tid}/status"))?;
    parse_status(&status)
}

fn parse_status(status: &str) -> Option<(char, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let state = field("State:")?.chars().next()?;
    let count = |name: &str| field(name)?.parse::<u64>().ok();
    let switches =
        count("voluntary_ctxt_switches:")?.checked_add(count("nonvoluntary_ctxt_switches:")?)?;
    Some((state, switches))
}

/// `/proc/PID/task/TID/syscall` of a thread in a system call: `NR ARG*6 SP
/// PC` (hex but NR), its stack pointer and program counter.
fn parse_syscall(text: &str) -> Option<(u64, u64)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() != 9 || words[0].starts_with('-') {
        return None;
    }
    let hex = |word: &str| u64::from_str_radix(word.strip_prefix("0x")?, 16).ok();
    // A kernel thread's are zero: it has no user stack.
    Some((hex(words[7])?, hex(words[8])?)).filter(|&(sp, pc)| sp != 0 && pc != 0)
}

/// Whether a thread in this state is off a CPU and will be until it is
/// woken: sleeping (`S`) or in an uninterruptible wait (`D`).
fn waits(state: char) -> bool {
    matches!(state, 'S' | 'D')
}

/// The ids of `pid`'s threads, at most [`MAX_TASKS_EXAMINED`].
fn thread_ids(pid: u32) -> impl Iterator<Item = u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .take(MAX_TASKS_EXAMINED)
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
}

/// The workload's threads waiting when the program was about to be
/// attached: (process, thread) and their counts of switches then.
pub type WaitingThreads = std::collections::BTreeMap<(u32, u32), u64>;

/// The threads of `pids` waiting now, with their counts of switches (at
/// most [`MAX_SEEDED_THREADS`]): taken before the program is attached.
pub fn waiting_threads(pids: &[u32]) -> WaitingThreads {
    let mut waiting = WaitingThreads::new();
    let started = std::time::Instant::now();
    for &pid in pids {
        if waiting.len() >= MAX_SEEDED_THREADS || started.elapsed() > SEEDING_BUDGET {
            break;
        }
        for tid in thread_ids(pid) {
            if let Some((state, switches)) = state_and_switches(pid, tid) {
                if waits(state) && waiting.len() < MAX_SEEDED_THREADS {
                    waiting.insert((pid, tid), switches);
                }
            }
        }
    }
    waiting
}

impl BlockedThread {
    /// Thread `tid` of `pid` if it is still in the wait it was in with
    /// `switches` switches ([`waiting_threads`]: since before the program
    /// started) and in a system call.
    pub fn still_from(pid: u32, tid: u32, switches: u64) -> Option<Self> {
        let (state, now) = state_and_switches(pid, tid)?;
        if !waits(state) || now != switches {
            return None;
        }
        let (sp, pc) = read_small(&format!("/proc/{pid}/task/{tid}/syscall"))
            .and_then(|t| parse_syscall(&t))?;
        Some(BlockedThread {
            pid,
            tid,
            sp,
            pc,
            switches,
        })
    }

    /// Whether it is still in the wait it was found in: off a CPU, and no
    /// switch since (a thread that ran and waits again is counted anew).
    pub fn still_blocked(&self) -> bool {
        state_and_switches(self.pid, self.tid)
            .is_some_and(|(state, switches)| waits(state) && switches == self.switches)
    }

    /// Up to [`STACK_BYTES`] of its stack from its stack pointer, if that
    /// lies in one of the private anonymous `ranges` (up to its end), read
    /// within [`READ_BOUND`]; empty if not, or if the memory cannot be
    /// read; `Err` if the read overran its bound.
    pub fn stack(&self, ranges: &AnonymousMemory) -> Result<Vec<u8>, Unanswered> {
        let Some(end) = ranges.end_of_range_at(self.sp) else {
            return Ok(Vec::new());
        };
        let length = STACK_BYTES.min(usize::try_from(end - self.sp).unwrap_or(STACK_BYTES));
        let (pid, sp) = (self.pid, self.sp);
        bounded::run(READ_BOUND, move || {
            let Ok(memory) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
                return Vec::new();
            };
            let mut stack = vec![0u8; length];
            match memory.read_at(&mut stack, sp) {
                Ok(read) => {
                    stack.truncate(read);
                    stack
                }
                Err(_) => Vec::new(),
            }
        })
    }
}

/// The reads of the targets' memory and mappings, each bounded: after one
/// overruns its bound, none is made any more (the stacks of the threads
/// left are not read).
#[derive(Debug, Default)]
pub struct MemoryReads {
    stopped: bool,
}

impl MemoryReads {
    /// `read`'s answer about process `pid`; `None` once a read overran.
    pub fn read<T>(&mut self, pid: u32, read: impl FnOnce() -> Result<T, Unanswered>) -> Option<T> {
        if self.stopped {
            return None;
        }
        match read() {
            Ok(answer) => Some(answer),
            Err(unanswered) => {
                log::warn!(
                    "wall time: a read of process {pid}'s memory or mappings: {unanswered}; the \
                     stacks of the threads off a CPU at the start are not read"
                );
                self.stopped = true;
                None
            }
        }
    }
}

/// A process's private anonymous memory, where its threads' stacks are
/// read (empty: none is), sorted by address.
#[derive(Debug, Default)]
pub struct AnonymousMemory(Vec<(u64, u64)>);

impl AnonymousMemory {
    /// `pid`'s, from its `maps`, read within [`READ_BOUND`] (`Err`: it
    /// overran it).
    pub fn of(pid: u32) -> Result<Self, Unanswered> {
        bounded::run(READ_BOUND, move || {
            let Ok(maps) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
                return Self::default();
            };
            use std::io::BufRead;
            let mut ranges: Vec<(u64, u64)> = std::io::BufReader::new(maps)
                .split(b'\n')
                .take(MAX_MAPS_LINES)
                .map_while(Result::ok)
                .filter_map(|line| anonymous_range(&String::from_utf8_lossy(&line)))
                .collect();
            ranges.sort_unstable();
            Self(ranges)
        })
    }

    /// The end of the range that holds `address`.
    fn end_of_range_at(&self, address: u64) -> Option<u64> {
        let after = self.0.partition_point(|&(start, _)| start <= address);
        let &(start, end) = self.0.get(after.checked_sub(1)?)?;
        (start..end).contains(&address).then_some(end)
    }
}

/// A `maps` line's range, if it is private anonymous memory (no file: no
/// path, or a `[stack]`, `[anon:…]` name).
fn anonymous_range(line: &str) -> Option<(u64, u64)> {
    let line = crate::process::MapsLine::parse(line)?;
    let named_anonymous = line.path.starts_with("[stack") || line.path.starts_with("[anon:");
    (line.is_private_unbacked() && (line.path.is_empty() || named_anonymous))
        .then_some((line.start, line.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_the_kernel_writes_them_and_refused_otherwise() {
        let status = "Name:\tsleeper\nState:\tS (sleeping)\nTgid:\t10\n\
                      voluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_status(status), Some(('S', 15)));
        assert_eq!(parse_status("State:\tR (running)\n"), None);
        assert_eq!(
            parse_syscall("230 0x1 0x0 0x7ffc 0x0 0x0 0x0 0x7ffd1000 0x7f0012345678\n"),
            Some((0x7ffd1000, 0x7f0012345678))
        );
        // Running, or blocked outside a system call: no registers here.
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffd1000 0x7f0012345678\n"), None);
        assert_eq!(parse_syscall("230 0x1 zz 0x0 0x0 0x0 0x0 0x0 nothex"), None);
        // A kernel thread.
        assert_eq!(parse_syscall("0 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0"), None);
        // Stacks are read from private anonymous memory only.
        let line = |rest: &str| format!("7ffd0000-7ffd8000 {rest}");
        assert_eq!(
            anonymous_range(&line("rw-p 00000000 00:00 0          [stack]")),
            Some((0x7ffd0000, 0x7ffd8000))
        );
        assert!(anonymous_range(&line("rw-p 00000000 00:00 0")).is_some());
        assert!(anonymous_range(&line("rw-p 00000000 00:2f 1234   /mnt/fuse/file")).is_none());
        assert!(anonymous_range(&line("rw-s 00000000 00:01 0      /dev/zero (deleted)")).is_none());
        assert!(anonymous_range(&line("rw-p 00000000 00:00 0      [vvar]")).is_none());
        let memory = AnonymousMemory(vec![(0x1000, 0x2000), (0x5000, 0x9000)]);
        assert_eq!(memory.end_of_range_at(0x1000), Some(0x2000));
        assert_eq!(memory.end_of_range_at(0x8fff), Some(0x9000));
        assert_eq!(memory.end_of_range_at(0x2000), None);
        assert_eq!(memory.end_of_range_at(0x10), None);
        // A thread name that is not UTF-8 does not hide its state.
        let status = "Name:\t\u{fffd}\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t1\n\
                      nonvoluntary_ctxt_switches:\t0\n";
        assert_eq!(parse_status(status), Some(('S', 1)));
    }

    /// A thread of this process asleep in `nanosleep` is found, with its
    /// stack, until it wakes.
    #[test]
    fn a_sleeping_thread_of_this_process_is_found_until_it_runs() {
        let (started, ready) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            started.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let tid = ready.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let pid = std::process::id();
        // Noted as waiting, then found in the same wait.
        let before = waiting_threads(&[pid]);
        let switches = before[&(pid, tid)];
        let found: Vec<BlockedThread> = BlockedThread::still_from(pid, tid, switches)
            .into_iter()
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].still_blocked());
        // Not with another count of switches: a wait begun since.
        assert_eq!(BlockedThread::still_from(pid, tid, switches + 1), None);
        let memory = AnonymousMemory::of(pid).unwrap();
        let stack = found[0].stack(&memory).unwrap();
        assert!(stack.len() >= 4096, "{}", stack.len());
        // Not where the memory is not private anonymous memory.
        assert_eq!(found[0].stack(&AnonymousMemory::default()), Ok(Vec::new()));
        sleeper.join().unwrap();
        assert!(!found[0].still_blocked());
    }
}
