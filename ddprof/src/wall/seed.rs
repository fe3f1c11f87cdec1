//! The threads already off a CPU when `sWALL` starts (a service's idle
//! workers under `-p` or `--global`, blocked since long before): the program
//! sees a wait at its switch-out, and these switched out before it was
//! attached. Without them, such a thread's wall time would be missing until
//! it next ran, and for ever for one that never runs again (a main thread
//! in `pthread_join`).
//!
//! For each thread of a profiled process that `/proc` says is sleeping
//! (`S`, `D`, and in a system call: `/proc/PID/task/TID/syscall` gives its
//! user stack pointer and program counter), the worker parks it in the
//! program's map as off a CPU since now (`BpfEngine::park_thread`, unless
//! the program parked it already), so that its switch-in ends the wait as
//! any other's, then checks that it is still in the same wait (its state,
//! and its count of switches, unchanged: else it is taken out again). Its
//! user stack is read from `/proc/PID/mem` and unwound by the user-side
//! unwinder; its other registers are not known, so a frame whose rule needs
//! the frame pointer ends the walk (`StackEnd::BadAddress`), which DWARF
//! code built without frame pointers (Debian's) never needs. Its kernel
//! stack is not read (`/proc/PID/task/TID/stack` needs `CAP_SYS_ADMIN`,
//! which the worker does not keep): the wait's frame is its user stack's.
//!
//! The target is hostile: a read of its memory must not block. A stack is
//! read only from private anonymous memory (a file mapping could be served
//! by the target itself, through FUSE, and never answer), and not at all
//! where unprivileged processes may handle the kernel's own faults in their
//! memory (`vm.unprivileged_userfaultfd=1`): then the stack is the program
//! counter's frame alone. Everything is bounded: at most
//! [`MAX_SEEDED_THREADS`] threads, [`MAX_TASKS_EXAMINED`] tasks and
//! [`MAX_MAPS_LINES`] mappings a process, a few small `/proc` files and
//! [`STACK_BYTES`] of stack a thread.
use std::io::Read;
use std::os::unix::fs::FileExt;

/// Threads seeded at most (the program's map holds `MAX_PARKED`).
pub const MAX_SEEDED_THREADS: usize = 4096;
/// Bytes of a seeded thread's stack read, from its stack pointer up.
pub const STACK_BYTES: usize = 16 << 10;
/// The most read of a `/proc` text file here.
const MAX_PROC_FILE: u64 = 4096;
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

fn read_small(path: &str) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
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

/// The threads of `pid` off a CPU in a system call now, at most `limit`.
pub fn blocked_threads(pid: u32, limit: usize) -> Vec<BlockedThread> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten().take(MAX_TASKS_EXAMINED) {
        if found.len() >= limit {
            break;
        }
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((state, switches)) = state_and_switches(pid, tid) else {
            continue;
        };
        if !waits(state) {
            continue;
        }
        let Some((sp, pc)) =
            read_small(&format!("/proc/{pid}/task/{tid}/syscall")).and_then(|t| parse_syscall(&t))
        else {
            continue;
        };
        found.push(BlockedThread {
            pid,
            tid,
            sp,
            pc,
            switches,
        });
    }
    found
}

impl BlockedThread {
    /// Whether it is still in the wait it was found in: off a CPU, and no
    /// switch since (a thread that ran and waits again is counted anew).
    pub fn still_blocked(&self) -> bool {
        state_and_switches(self.pid, self.tid)
            .is_some_and(|(state, switches)| waits(state) && switches == self.switches)
    }

    /// Up to [`STACK_BYTES`] of its stack from its stack pointer, if that
    /// lies in one of the private anonymous `ranges` (up to its end); none
    /// if not, or if the memory cannot be read.
    pub fn stack(&self, ranges: &AnonymousMemory) -> Vec<u8> {
        let Some(&(_, end)) = ranges
            .0
            .iter()
            .find(|&&(start, end)| (start..end).contains(&self.sp))
        else {
            return Vec::new();
        };
        let Ok(memory) = std::fs::File::open(format!("/proc/{}/mem", self.pid)) else {
            return Vec::new();
        };
        let length = STACK_BYTES.min(usize::try_from(end - self.sp).unwrap_or(STACK_BYTES));
        let mut stack = vec![0u8; length];
        match memory.read_at(&mut stack, self.sp) {
            Ok(read) => {
                stack.truncate(read);
                stack
            }
            Err(_) => Vec::new(),
        }
    }
}

/// A process's private anonymous memory, where its threads' stacks are
/// read (empty: none is).
#[derive(Debug, Default)]
pub struct AnonymousMemory(Vec<(u64, u64)>);

impl AnonymousMemory {
    /// `pid`'s, from its `maps`; none where unprivileged processes may
    /// handle the faults of the kernel's reads of their memory (a read
    /// could then wait on the target).
    pub fn of(pid: u32) -> Self {
        if unprivileged_userfaults() {
            return Self::default();
        }
        let Ok(maps) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
            return Self::default();
        };
        use std::io::BufRead;
        Self(
            std::io::BufReader::new(maps)
                .lines()
                .take(MAX_MAPS_LINES)
                .map_while(Result::ok)
                .filter_map(|line| anonymous_range(&line))
                .collect(),
        )
    }
}

/// `vm.unprivileged_userfaultfd` is 1 (it is 0 by default since Linux
/// 5.11: an unprivileged process's userfaultfd then handles only its own
/// faults in user mode, and a read of its memory by the kernel fails at
/// once where it would have waited).
fn unprivileged_userfaults() -> bool {
    read_small("/proc/sys/vm/unprivileged_userfaultfd").is_some_and(|value| value.trim() == "1")
}

/// A `maps` line's range, if it is private anonymous memory (no file: no
/// path, or a `[stack]`, `[anon:…]` name).
fn anonymous_range(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    let (range, perms, _, _, inode) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let path = fields.next().unwrap_or("");
    let named_anonymous = path.starts_with("[stack") || path.starts_with("[anon:");
    if inode != "0" || !perms.ends_with('p') || !(path.is_empty() || named_anonymous) {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
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
        let found: Vec<BlockedThread> = blocked_threads(pid, 1000)
            .into_iter()
            .filter(|thread| thread.tid == tid)
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].still_blocked());
        let stack = found[0].stack(&AnonymousMemory::of(pid));
        assert!(stack.len() >= 4096, "{}", stack.len());
        // Not where the memory is not private anonymous memory.
        assert!(found[0].stack(&AnonymousMemory::default()).is_empty());
        sleeper.join().unwrap();
        assert!(!found[0].still_blocked());
    }
}
